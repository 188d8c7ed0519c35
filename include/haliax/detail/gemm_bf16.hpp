// bfloat16 GEMMs on the host for matmul_precision::bf16 (haliax/precision.hpp): operands rounded to bfloat16,
// products summed in f32 by oneDNN's matmul (its AVX512_BF16 / AMX kernels), f32 results. Private.
//
// Determinism: C is cut into gemm_tiling's tiles (a function of the shape only) and each tile is one oneDNN call
// made with one OpenMP thread, so which and how many threads run the tiles never changes a result. oneDNN chooses
// its blocking when a primitive is made, from the tile's shape and the thread count it sees (one), so the same
// tile always gets the same kernel.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "../precision.hpp"
#include "thread_pool.hpp"

#if defined(HALIAX_HAVE_ONEDNN)
#include <oneapi/dnnl/dnnl.h>
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
extern "C" {
int omp_get_max_threads(void);
void omp_set_num_threads(int);
}
#endif
#endif

namespace haliax::detail {

/// float to bfloat16 bits, nearest even; NaN stays a (quiet) NaN. Written without branches so the loop vectorises.
inline std::uint16_t bf16_bits_nearest_even(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t quiet = (u >> 16) | 0x40u;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// Only called where bfloat16 GEMMs run, i.e. on CPUs with AVX512_BF16 (which implies AVX-512 F/BW/VL).
[[gnu::target("avx512f,avx512bw,avx512vl")]] inline void round_to_bf16_wide(const float* __restrict x,
                                                                          std::uint16_t* __restrict y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = bf16_bits_nearest_even(x[i]);
}
#else
inline void round_to_bf16_wide(const float* __restrict x, std::uint16_t* __restrict y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = bf16_bits_nearest_even(x[i]);
}
#endif

/// y = bf16(x) elementwise, over the pool for large n (disjoint chunks: the same bits on any thread count).
inline void round_to_bf16(const float* x, std::uint16_t* y, std::int64_t n) {
  constexpr std::int64_t chunk = 1 << 18;
  if (n < 2 * chunk) {
    round_to_bf16_wide(x, y, n);
    return;
  }
  const std::int64_t chunks = (n + chunk - 1) / chunk;
  thread_pool::instance().run(chunks, [=](std::int64_t c) {
    const std::int64_t b = c * chunk, e = b + chunk < n ? b + chunk : n;
    round_to_bf16_wide(x + b, y + b, e - b);
  });
}

#if defined(HALIAX_HAVE_ONEDNN)

namespace onednn {

/// The CPU engine, a probe of what a bfloat16 matmul runs on, and the primitives made so far (one per tile shape).
struct context {
  dnnl_engine_t engine = nullptr;
  bool available = false;
  std::string backend;  // what runs bf16 products, or why nothing does

  struct key {
    bool ta, tb;
    std::int64_t m, n, k, lda, ldb, ldc;
    bool operator==(const key&) const = default;
  };
  struct key_hash {
    std::size_t operator()(const key& x) const {
      std::size_t h = (x.ta ? 1u : 0u) | (x.tb ? 2u : 0u);
      for (std::int64_t v : {x.m, x.n, x.k, x.lda, x.ldb, x.ldc}) h = h * 1000003u ^ std::hash<std::int64_t>{}(v);
      return h;
    }
  };
  /// A primitive and the scratchpad it needs. Primitives are made with a user scratchpad: the tiles of one GEMM
  /// run the same primitive on several threads at once, each with its own scratchpad (with oneDNN's library
  /// scratchpad the concurrent runs would share the primitive's).
  struct tile_kernel {
    std::shared_ptr<dnnl_primitive> primitive;
    dnnl_memory_desc_t scratchpad_md{};
    std::size_t scratchpad_bytes = 0;
  };
  std::mutex mutex;
  std::unordered_map<key, std::shared_ptr<const tile_kernel>, key_hash> primitives;

  static context& get() {
    static context* c = new context();  // never destroyed: tiles may run while statics are torn down
    return *c;
  }

  /// The primitive for one tile: C[m, n] (row stride ldc) = A[m, k] B[k, n], A and B bfloat16 with the given
  /// transposes and leading dimensions (as cblas), C f32. Made with one OpenMP thread; null if oneDNN refuses.
  std::shared_ptr<const tile_kernel> primitive(const key& kk) {
    {
      std::lock_guard<std::mutex> lk(mutex);
      auto it = primitives.find(kk);
      if (it != primitives.end()) return it->second;
    }
    dnnl_memory_desc_t a_md, b_md, c_md;
    const dnnl_dims_t a_dims{kk.m, kk.k}, b_dims{kk.k, kk.n}, c_dims{kk.m, kk.n};
    const dnnl_dims_t a_str{kk.ta ? 1 : kk.lda, kk.ta ? kk.lda : 1};
    const dnnl_dims_t b_str{kk.tb ? 1 : kk.ldb, kk.tb ? kk.ldb : 1};
    const dnnl_dims_t c_str{kk.ldc, 1};
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = nullptr;
    dnnl_primitive_desc_t pd = nullptr;
    dnnl_primitive_t prim = nullptr;
    const bool described =
        dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, dnnl_bf16, a_str) == dnnl_success &&
        dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, dnnl_bf16, b_str) == dnnl_success &&
        dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, dnnl_f32, c_str) == dnnl_success &&
        dnnl_matmul_desc_init(&desc, &a_md, &b_md, nullptr, &c_md) == dnnl_success &&
        dnnl_primitive_attr_create(&attr) == dnnl_success &&
        dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success &&
        dnnl_primitive_desc_create(&pd, &desc, attr, engine, nullptr) == dnnl_success;
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (!described) return nullptr;
    auto kernel = std::make_shared<tile_kernel>();
    if (const dnnl_memory_desc_t* smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0)) {
      kernel->scratchpad_md = *smd;
      kernel->scratchpad_bytes = dnnl_memory_desc_get_size(smd);
    }
    const bool made = dnnl_primitive_create(&prim, pd) == dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    if (!made) return nullptr;
    kernel->primitive.reset(prim, [](dnnl_primitive_t x) { dnnl_primitive_destroy(x); });
    std::lock_guard<std::mutex> lk(mutex);
    if (primitives.size() > 4096) primitives.clear();  // shapes are few in training; bound it for odd programs
    return primitives.emplace(kk, std::move(kernel)).first->second;
  }

 private:
  context() {
    if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) {
      backend = "oneDNN could not create its CPU engine";
      return;
    }
    const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    const auto* v = dnnl_version();
    const std::string version =
        "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
    if ((isa & dnnl_cpu_isa_avx512_core_bf16) != dnnl_cpu_isa_avx512_core_bf16) {
      backend = version + " may not use bfloat16 instructions here (the CPU has no AVX512_BF16 or AMX-BF16, or "
                          "ONEDNN_MAX_CPU_ISA is below AVX512_CORE_BF16)";
      return;
    }
    // Probe: a small product must get a bfloat16 kernel, not oneDNN's reference loops.
    single_thread one;
    dnnl_memory_desc_t a_md, b_md, c_md;
    const dnnl_dims_t d{64, 64}, s{64, 1};
    dnnl_matmul_desc_t desc;
    dnnl_primitive_desc_t pd = nullptr;
    const char* impl = nullptr;
    if (dnnl_memory_desc_init_by_strides(&a_md, 2, d, dnnl_bf16, s) == dnnl_success &&
        dnnl_memory_desc_init_by_strides(&b_md, 2, d, dnnl_bf16, s) == dnnl_success &&
        dnnl_memory_desc_init_by_strides(&c_md, 2, d, dnnl_f32, s) == dnnl_success &&
        dnnl_matmul_desc_init(&desc, &a_md, &b_md, nullptr, &c_md) == dnnl_success &&
        dnnl_primitive_desc_create(&pd, &desc, nullptr, engine, nullptr) == dnnl_success) {
      dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
      const std::string name = impl ? impl : "";
      dnnl_primitive_desc_destroy(pd);
      if (name.find("ref") != std::string::npos || name.empty()) {
        backend = version + " has only its reference matmul for bfloat16 here (" + name + ")";
        return;
      }
      available = true;
      backend = version + " (" + name + ")";
    } else {
      backend = version + " refused a bfloat16 matmul";
    }
  }

 public:
  /// Makes oneDNN see one thread on this thread for its lifetime (oneDNN's OpenMP runtime sizes its work by
  /// omp_get_max_threads, a per-thread setting).
  struct single_thread {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    int previous = omp_get_max_threads();
    single_thread() {
      if (previous != 1) omp_set_num_threads(1);
    }
    ~single_thread() {
      if (previous != 1) omp_set_num_threads(previous);
    }
#endif
  };
};

/// The calling thread's scratchpad for oneDNN (grown as needed, kept for reuse), 64-byte aligned.
inline void* thread_scratchpad(std::size_t bytes) {
  static thread_local std::vector<std::uint64_t> buf;
  const std::size_t words = (bytes + 64 + 7) / 8;
  if (buf.size() < words) buf.resize(words);
  const auto p = reinterpret_cast<std::uintptr_t>(buf.data());
  return reinterpret_cast<void*>((p + 63) & ~std::uintptr_t(63));
}

/// One stream per thread that runs tiles.
inline dnnl_stream_t thread_stream() {
  struct holder {
    dnnl_stream_t s = nullptr;
    ~holder() {
      if (s) dnnl_stream_destroy(s);
    }
  };
  static thread_local holder h;
  if (!h.s && dnnl_stream_create(&h.s, context::get().engine, dnnl_stream_default_flags) != dnnl_success)
    h.s = nullptr;
  return h.s;
}

}  // namespace onednn

#endif  // HALIAX_HAVE_ONEDNN

}  // namespace haliax::detail

namespace haliax {

/// Whether `matmul_precision::bf16` runs bfloat16 GEMMs here (oneDNN built in, a CPU with AVX512_BF16 or AMX-BF16
/// that oneDNN may use, and a bfloat16 kernel that is not oneDNN's reference loop).
inline bool bf16_matmul_available() {
#if defined(KOKKOS_ENABLE_CUDA)
  // Arrays in CUDA memory: cuBLAS's bfloat16 tensor-core path (gemm.hpp), on every GPU Kokkos runs on.
  if constexpr (!Kokkos::SpaceAccessibility<Kokkos::HostSpace, Kokkos::DefaultExecutionSpace::memory_space>::accessible)
    return true;
#endif
#if defined(HALIAX_HAVE_ONEDNN)
  return detail::onednn::context::get().available;
#else
  return false;
#endif
}

/// What runs a bfloat16 product here, for notes and benchmark logs ("oneDNN 2.6.3 (brg:avx512_core_bf16)"), or why
/// nothing does.
inline std::string bf16_matmul_backend() {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (!Kokkos::SpaceAccessibility<Kokkos::HostSpace, Kokkos::DefaultExecutionSpace::memory_space>::accessible)
    return "cuBLAS (CUBLAS_COMPUTE_32F_FAST_16BF: bfloat16 operands on the tensor cores, f32 sums)";
#endif
#if defined(HALIAX_HAVE_ONEDNN)
  return detail::onednn::context::get().backend;
#else
  return "haliax was built without oneDNN (configure with libdnnl-dev installed)";
#endif
}

}  // namespace haliax
