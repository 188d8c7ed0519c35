// The AdamW element loop (levanter/optim/adamw_kernel.hpp). This file is compiled with -fno-math-errno
// (CMakeLists.txt): with errno semantics, GCC keeps a scalar call path for sqrt of a negative number and will
// not vectorise the loop at all.
#include <levanter/optim/adamw_kernel.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

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

const char* kernel_isa() {
  static const bool avx2 = use_avx2();
  return avx2 ? "avx2" : "baseline";
}

}  // namespace levanter::optim::detail::adamw
