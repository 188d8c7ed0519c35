// The AdamW element loop (levanter/optim/adamw_kernel.hpp). This file is compiled with -fno-math-errno
// (CMakeLists.txt): with errno semantics, GCC keeps a scalar call path for sqrt of a negative number and will
// not vectorise the loop at all.
#include <levanter/optim/adamw_kernel.hpp>

#include <Kokkos_Core.hpp>
#include <haliax/core.hpp>
#include <haliax/detail/math.hpp>
#include <haliax/detail/portable.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace levanter::optim::detail::adamw {
namespace {

inline constexpr int64_t block_elems = 256;

// One block: the update of n <= block_elems elements, the squares to `out`. Forced inline so that each ISA
// wrapper below compiles (and vectorises) it with its own target.
template <pass P, bool Nesterov, bool Decay, bool Clip>
[[gnu::always_inline]] inline void block(const consts& c, float* __restrict p, const float* __restrict g_,
                                         float* __restrict m_, float* __restrict v_, int64_t n, float div,
                                         float mul, float* __restrict out) {
  for (int64_t i = 0; i < n; ++i) {
    float g = g_[i];
    if constexpr (Clip) g = g / c.clip_den * c.clip_num;  // optax: t / g_norm * max_norm
    float m = m_[i], v = v_[i];
    if constexpr (P != pass::apply) {
      m = c.omb1 * g + c.b1 * m;  // optax: (1 - b) * g^k + b * moment
      v = c.omb2 * (g * g) + c.b2 * v;
      m_[i] = m;
      v_[i] = v;
    }
    float mh;
    if constexpr (Nesterov)
      mh = c.b1 * (m / c.bc1_next) + c.omb1 * (g / c.bc1);
    else
      mh = m / c.bc1;
    float u = mh / (std::sqrt(v / c.bc2) + c.eps);
    if constexpr (Decay) u = u + c.wd * p[i];
    if constexpr (P == pass::moments) {
      out[i] = u * u;
    } else {
      const float step = (P == pass::apply ? (u / div) * mul : u) * c.neg_lr;
      p[i] = p[i] + step;
      out[i] = step * step;
    }
  }
}

template <pass P, bool Nesterov, bool Decay, bool Clip>
[[gnu::always_inline]] inline double range(const consts& c, float* p, const float* g, float* m, float* v, int64_t n,
                                           float div, float mul) {
  alignas(64) float sq[block_elems];
  double total = 0;
  for (int64_t i = 0; i < n; i += block_elems) {
    const int64_t k = std::min(block_elems, n - i);
    block<P, Nesterov, Decay, Clip>(c, p + i, g + i, m + i, v + i, k, div, mul, sq);
    double acc[4] = {0, 0, 0, 0};
    int64_t j = 0;
    for (; j + 4 <= k; j += 4)
      for (int q = 0; q < 4; ++q) acc[q] += static_cast<double>(sq[j + q]);
    for (; j < k; ++j) acc[0] += static_cast<double>(sq[j]);
    total += (acc[0] + acc[1]) + (acc[2] + acc[3]);
  }
  return total;
}

// The 24 variants (pass x nesterov x decay x clip) behind one switch; all forced inline, so that each ISA
// wrapper below holds its own copy of every loop.
#define LEVANTER_ADAMW_ARGS const consts &c, bool nesterov, bool decay, float *p, const float *g, float *m, float *v, \
                            int64_t n, float div, float mul
template <pass P, bool N, bool D>
[[gnu::always_inline]] inline double by_clip(LEVANTER_ADAMW_ARGS) {
  (void)nesterov, (void)decay;
  return c.clip ? range<P, N, D, true>(c, p, g, m, v, n, div, mul) : range<P, N, D, false>(c, p, g, m, v, n, div, mul);
}
template <pass P, bool N>
[[gnu::always_inline]] inline double by_decay(LEVANTER_ADAMW_ARGS) {
  return decay ? by_clip<P, N, true>(c, nesterov, decay, p, g, m, v, n, div, mul)
               : by_clip<P, N, false>(c, nesterov, decay, p, g, m, v, n, div, mul);
}
template <pass P>
[[gnu::always_inline]] inline double by_nesterov(LEVANTER_ADAMW_ARGS) {
  return nesterov ? by_decay<P, true>(c, nesterov, decay, p, g, m, v, n, div, mul)
                  : by_decay<P, false>(c, nesterov, decay, p, g, m, v, n, div, mul);
}
[[gnu::always_inline]] inline double select(pass kind, LEVANTER_ADAMW_ARGS) {
  switch (kind) {
    case pass::fused: return by_nesterov<pass::fused>(c, nesterov, decay, p, g, m, v, n, div, mul);
    case pass::moments: return by_nesterov<pass::moments>(c, nesterov, decay, p, g, m, v, n, div, mul);
    case pass::apply: break;
  }
  return by_nesterov<pass::apply>(c, nesterov, decay, p, g, m, v, n, div, mul);
}
#undef LEVANTER_ADAMW_ARGS

double run_baseline(const consts& c, pass kind, bool nesterov, bool decay, float* p, const float* g, float* m,
                    float* v, int64_t n, float div, float mul) {
  return select(kind, c, nesterov, decay, p, g, m, v, n, div, mul);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LEVANTER_ADAMW_AVX2 1
// AVX2 without FMA (target "avx2" does not imply "fma"), so the arithmetic is the baseline's, eight lanes wide.
[[gnu::target("avx2")]] double run_avx2(const consts& c, pass kind, bool nesterov, bool decay, float* p,
                                        const float* g, float* m, float* v, int64_t n, float div, float mul) {
  return select(kind, c, nesterov, decay, p, g, m, v, n, div, mul);
}
#endif

bool use_avx2() {
#ifdef LEVANTER_ADAMW_AVX2
  const char* forced = std::getenv("LEVANTER_ISA");
  if (forced && std::strcmp(forced, "baseline") == 0) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

}  // namespace

double run_range(const consts& c, pass kind, bool nesterov, bool decay, float* p, const float* g, float* m, float* v,
                 int64_t n, float div, float mul) {
  static const bool avx2 = use_avx2();
  return run_range_on(avx2 ? isa::avx2 : isa::baseline, c, kind, nesterov, decay, p, g, m, v, n, div, mul);
}

double run_range_on(isa which, const consts& c, pass kind, bool nesterov, bool decay, float* p, const float* g,
                    float* m, float* v, int64_t n, float div, float mul) {
#ifdef LEVANTER_ADAMW_AVX2
  if (which == isa::avx2) return run_avx2(c, kind, nesterov, decay, p, g, m, v, n, div, mul);
#endif
  (void)which;
  return run_baseline(c, kind, nesterov, decay, p, g, m, v, n, div, mul);
}

bool isa_available(isa which) {
  if (which == isa::baseline) return true;
#ifdef LEVANTER_ADAMW_AVX2
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

namespace {

// One element of run_range's block, as a device function: the same float operations in the same order.
KOKKOS_INLINE_FUNCTION float portable_element(const consts& c, chunk_job job, bool nesterov, bool decay, float* p,
                                              const float* g_, float* m_, float* v_, int64_t i, float div,
                                              float mul) {
  float g = g_[i];
  if (c.clip) g = g / c.clip_den * c.clip_num;
  float m = m_[i], v = v_[i];
  if (job != chunk_job::apply) {
    m = c.omb1 * g + c.b1 * m;
    v = c.omb2 * (g * g) + c.b2 * v;
    m_[i] = m;
    v_[i] = v;
  }
  float mh;
  if (nesterov)
    mh = c.b1 * (m / c.bc1_next) + c.omb1 * (g / c.bc1);
  else
    mh = m / c.bc1;
  float u = mh / (haliax::detail::math::sqrt(v / c.bc2) + c.eps);
  if (decay) u = u + c.wd * p[i];
  if (job == chunk_job::moments) return u * u;
  const float step = (job == chunk_job::apply ? (u / div) * mul : u) * c.neg_lr;
  p[i] = p[i] + step;
  return step * step;
}

}  // namespace

namespace {

using chunk_view = Kokkos::View<chunk_ref*, Kokkos::DefaultExecutionSpace::memory_space>;

/// `chunks` copied into a buffer from the buffer cache (held by the lease until the kernels are enqueued): one
/// copy per call, no allocation in a steady state. Keeping tables by content would save the copy only where the
/// gradients land at the same addresses every step, which the buffer cache does not promise (the small Llama's
/// move from step to step).
void copy_chunk_table(const std::vector<chunk_ref>& chunks, haliax::detail::buffer_lease<chunk_ref>& lease) {
  lease.view = haliax::detail::buffer_cache<chunk_ref>::take(chunks.size(), "adamw chunks");
  Kokkos::deep_copy(lease.view, Kokkos::View<const chunk_ref*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                                    chunks.data(), chunks.size()));
}

using sums_view = haliax::detail::buffer_cache<double>::view_type;

/// Runs `job` over the chunks of `refs` and writes each chunk's sum to sums(ci) (on the device; nothing is read
/// back). With `clip` (two floats on the device: 1 or 0, then the gradient norm), the update kernels take the
/// clipping decision from there instead of from c.clip and c.clip_den.
void chunk_sums(const consts& c, chunk_job job, bool nesterov, const std::vector<chunk_ref>& chunks,
                const chunk_view& refs, const sums_view& sums, const float* clip) {
  using exec = Kokkos::DefaultExecutionSpace;
  namespace hd = haliax::detail;
  const int64_t nc = static_cast<int64_t>(chunks.size());
  constexpr int64_t chunk_cap = int64_t{1} << 15;
  constexpr int64_t per_chunk = chunk_cap / block_elems;
  for (const auto& r : chunks)
    if (r.n > chunk_cap) Kokkos::abort("levanter::adamw: a chunk larger than the portable loop's 2^15 elements");
  hd::buffer_lease<double> blocks_lease;
  blocks_lease.view = hd::buffer_cache<double>::take(static_cast<std::size_t>(nc * per_chunk), "adamw block sums");
  const auto blocks = blocks_lease.view;
  if (job == chunk_job::grad_squares) {
    // As grad_squares: each 256-element block's squares in order (one work item per block, 128 per chunk, where
    // one thread walked a whole chunk), then each chunk's blocks in order (below).
    Kokkos::parallel_for(
        "levanter::adamw(grad squares)", Kokkos::RangePolicy<exec, Kokkos::IndexType<std::int64_t>>(0, nc * per_chunk), KOKKOS_LAMBDA(int64_t w) {
          const int64_t ci = w / per_chunk, b = w - ci * per_chunk;
          const chunk_ref r = refs(ci);
          const int64_t i0 = b * block_elems;
          const int64_t i1 = i0 + block_elems < r.n ? i0 + block_elems : r.n;
          double s = 0;
          for (int64_t k = i0; k < i1; ++k) s += static_cast<double>(r.g[k]) * r.g[k];
          blocks(w) = s;
        });
  } else {
    // Three kernels: the elements (one work item each, so a GPU's accesses coalesce), each writing its square;
    // the squares of each block of block_elems in four interleaved double accumulators, as run_range sums
    // them; then each chunk's blocks in order.
    hd::buffer_lease<float> squares_lease;
    squares_lease.view = hd::buffer_cache<float>::take(static_cast<std::size_t>(nc * chunk_cap), "adamw squares");
    const auto squares = squares_lease.view;
    const consts cc = c;
    Kokkos::parallel_for(
        "levanter::adamw(update)", Kokkos::RangePolicy<exec, Kokkos::IndexType<std::int64_t>>(0, nc * chunk_cap), KOKKOS_LAMBDA(int64_t e) {
          const int64_t ci = e / chunk_cap, j = e - ci * chunk_cap;
          const chunk_ref r = refs(ci);
          if (j >= r.n) return;
          consts ce = cc;
          if (clip != nullptr) {
            ce.clip = clip[0] != 0.0f;
            ce.clip_den = clip[1];
          }
          squares(e) = portable_element(ce, job, nesterov, r.decay, r.p, r.g, r.m, r.v, j, r.div, r.mul);
        });
    Kokkos::parallel_for(
        "levanter::adamw(block sums)", Kokkos::RangePolicy<exec, Kokkos::IndexType<std::int64_t>>(0, nc * per_chunk), KOKKOS_LAMBDA(int64_t w) {
          const int64_t ci = w / per_chunk, b = w - ci * per_chunk;
          const int64_t n = refs(ci).n;
          const int64_t i0 = b * block_elems;
          if (i0 >= n) {
            blocks(w) = 0;
            return;
          }
          const int64_t k = n - i0 < block_elems ? n - i0 : block_elems;
          const int64_t k4 = k - k % 4;
          const int64_t base = ci * chunk_cap + i0;
          double acc[4] = {0, 0, 0, 0};
          for (int64_t j = 0; j < k; ++j) acc[j < k4 ? j % 4 : 0] += static_cast<double>(squares(base + j));
          blocks(w) = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        });
  }
  Kokkos::parallel_for(
      "levanter::adamw(chunk sums)", Kokkos::RangePolicy<exec, Kokkos::IndexType<std::int64_t>>(0, nc), KOKKOS_LAMBDA(int64_t ci) {
        const int64_t nb = (refs(ci).n + block_elems - 1) / block_elems;
        double total = 0;
        for (int64_t b = 0; b < nb; ++b) total += blocks(ci * per_chunk + b);
        sums(ci) = total;
      });
}

}  // namespace

std::vector<double> run_chunks_portable(const consts& c, chunk_job job, bool nesterov,
                                        const std::vector<chunk_ref>& chunks) {
  if (chunks.empty()) return {};
  // Scratch and the chunk table from haliax's buffer cache (given back on return, in stream order): a
  // steady-state step allocates nothing here.
  namespace hd = haliax::detail;
  hd::buffer_lease<double> sums_lease;
  sums_lease.view = hd::buffer_cache<double>::take(chunks.size(), "adamw chunk sums");
  hd::buffer_lease<chunk_ref> refs;
  copy_chunk_table(chunks, refs);
  chunk_sums(c, job, nesterov, chunks, refs.view, sums_lease.view, nullptr);
  return hd::read_back(sums_lease.view);
}

std::vector<double> run_clipped_fused_portable(const consts& c, bool nesterov, const std::vector<chunk_ref>& chunks,
                                               bool clip_on, float max_grad_norm) {
  if (chunks.empty()) return {0.0};
  using exec = Kokkos::DefaultExecutionSpace;
  namespace hd = haliax::detail;
  const int64_t nc = static_cast<int64_t>(chunks.size());
  hd::buffer_lease<chunk_ref> table;  // one table for both passes
  copy_chunk_table(chunks, table);
  const chunk_view refs = table.view;
  // out: the update's chunk sums, then the gradient norm, read back together; clip: the decision, on the device.
  hd::buffer_lease<double> gsq_lease, out_lease;
  hd::buffer_lease<float> clip_lease;
  gsq_lease.view = hd::buffer_cache<double>::take(chunks.size(), "adamw chunk sums");
  out_lease.view = hd::buffer_cache<double>::take(chunks.size() + 1, "adamw chunk sums");
  clip_lease.view = hd::buffer_cache<float>::take(2, "adamw clip");
  const auto gsq = gsq_lease.view;
  const auto out = out_lease.view;
  const auto clip = clip_lease.view;
  chunk_sums(consts{}, chunk_job::grad_squares, nesterov, chunks, refs, gsq, nullptr);
  // As the host does: the chunks' squares summed in chunk order, the square root in double, and clipping when
  // float(norm) is not below float(max_grad_norm) (optax's clip_by_global_norm, NaN included).
  Kokkos::parallel_for(
      "levanter::adamw(grad norm)", Kokkos::RangePolicy<exec, Kokkos::IndexType<std::int64_t>>(0, 1), KOKKOS_LAMBDA(int64_t) {
        double total = 0;
        for (int64_t ci = 0; ci < nc; ++ci) total += gsq(ci);
        const double norm = haliax::detail::math::sqrt(total);
        out(nc) = norm;
        clip(0) = clip_on && !(static_cast<float>(norm) < max_grad_norm) ? 1.0f : 0.0f;
        clip(1) = static_cast<float>(norm);
      });
  chunk_sums(c, chunk_job::fused, nesterov, chunks, refs, out, clip.data());  // writes out(0 .. nc-1)
  return hd::read_back(out);
}

double grad_squares(const float* g, int64_t n) {
  double total = 0;
  for (int64_t i = 0; i < n; i += block_elems) {
    const int64_t k = std::min(block_elems, n - i);
    double s = 0;
    for (int64_t j = i; j < i + k; ++j) s += static_cast<double>(g[j]) * g[j];
    total += s;
  }
  return total;
}

const char* kernel_isa() {
  static const bool avx2 = use_avx2();
  return avx2 ? "avx2" : "baseline";
}

}  // namespace levanter::optim::detail::adamw
