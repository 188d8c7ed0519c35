// Shared bits of the benchmarks: runtime set-up and the environment context printed with every figure.
#pragma once

#include <cblas.h>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <haliax/haliax.hpp>
#if defined(KOKKOS_ENABLE_CUDA)
#include <cublas_v2.h>
#endif

namespace bench {

/// Records what the figures depend on: OpenBLAS core type and threads, Kokkos backend.
inline void add_context() {
  benchmark::AddCustomContext("openblas_corename", openblas_get_corename());
  benchmark::AddCustomContext("openblas_threads_at_start", std::to_string(openblas_get_num_threads()));
  benchmark::AddCustomContext("haliax_threads", std::to_string(haliax::num_threads()));
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  benchmark::AddCustomContext("OPENBLAS_CORETYPE", env ? env : "(unset)");
  benchmark::AddCustomContext("kokkos_execution_space", haliax::execution_space::name());
  benchmark::AddCustomContext("bf16_matmul", haliax::bf16_matmul_backend());
}

}  // namespace bench

/// main() for a haliax benchmark: Kokkos initialised, context recorded.
/// Best-of-3 FLOP/s of `gemm(m, n, k, a, b, c)` (row-major, no transposes) over shapes {m, n, k}, time-weighted by
/// FLOPs.
inline double gemm_rate(const std::vector<std::array<std::int64_t, 3>>& shapes,
                        const std::function<void(std::int64_t, std::int64_t, std::int64_t, const float*, const float*,
                                                 float*)>& gemm) {
  double flops = 0, secs = 0;
  for (const auto& s : shapes) {
    const auto m = s[0], n = s[1], k = s[2];
    // In the arrays' memory space (a GPU's memory under a CUDA Kokkos), fenced around each timing.
    haliax::detail::ensure_initialized();
    using view = Kokkos::View<float*, haliax::memory_space>;
    view a("bench(a)", std::size_t(m * k)), b("bench(b)", std::size_t(k * n)), c("bench(c)", std::size_t(m * n));
    Kokkos::deep_copy(a, 0.01f);
    Kokkos::deep_copy(b, 0.02f);
    double best = 1e30;
    for (int r = 0; r < 4; ++r) {
      Kokkos::fence();
      const auto t0 = std::chrono::steady_clock::now();
      gemm(m, n, k, a.data(), b.data(), c.data());
      Kokkos::fence();
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) best = std::min(best, t);
    }
    flops += 2.0 * double(m) * double(n) * double(k);
    secs += best;
  }
  return flops / secs;
}

/// The rate of cblas_sgemm with 2 OpenBLAS threads over GEMM shapes {m, n, k} (on a GPU: cuBLAS's f32 GEMM): the
/// reference rate a model step's MFU is measured against.
inline double sgemm2_rate(const std::vector<std::array<std::int64_t, 3>>& shapes) {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (!haliax::detail::host_memory) {
    // On a GPU the reference is cuBLAS's f32 GEMM called directly (CUBLAS_COMPUTE_32F, no TF32).
    static cublasHandle_t h = [] {
      cublasHandle_t x;
      cublasCreate(&x);
      return x;
    }();
    return gemm_rate(shapes, [](std::int64_t m, std::int64_t n, std::int64_t k, const float* a, const float* b,
                                float* c) {
      const float one = 1, zero = 0;
      cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(m), int(k), &one, b, CUDA_R_32F, int(n), a, CUDA_R_32F,
                   int(k), &zero, c, CUDA_R_32F, int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });
  }
#endif
  const int saved = openblas_get_num_threads();
  openblas_set_num_threads(2);
  const double r = gemm_rate(shapes, [](std::int64_t m, std::int64_t n, std::int64_t k, const float* a, const float* b,
                                        float* c) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(n), int(k), 1.0f, a, int(k), b, int(n), 0.0f, c,
                int(n));
  });
  openblas_set_num_threads(saved);
  return r;
}

/// The rate of haliax's float GEMM (the pool's threads) over shapes {m, n, k} in matmul precision `p`: under bf16
/// (where it runs) the rate of the bfloat16 GEMM, operand rounding included.
inline double haliax_gemm_rate(const std::vector<std::array<std::int64_t, 3>>& shapes, haliax::matmul_precision p) {
  haliax::matmul_precision_scope scope(p);
  return gemm_rate(shapes, [](std::int64_t m, std::int64_t n, std::int64_t k, const float* a, const float* b,
                              float* c) { haliax::detail::gemm_batched<float>(false, false, 1, m, n, k, a, b, c); });
}

/// Times training steps of a model with `params` parameters on `tokens` tokens per step: `step(fwd_bwd, update)`
/// runs one step and adds its forward+backward and optimizer seconds. One warm-up step, then the benchmark's
/// iterations. Counters: s_per_step, fwd_bwd_s, adamw_s, tokens_per_s, model_GFLOPs (6 x params x tokens / step
/// time), gemm_s (seconds per step inside haliax's GEMMs, `detail::gemm_profile`) with their rate gemm_GFLOPs,
/// cache_misses and cache_miss_MB (buffers per step that haliax's buffer cache had to allocate afresh),
/// and MFU over `peak()` (the larger of a measurement before and after the steps: the machine is shared,
/// so this is the conservative denominator).
inline void time_training_steps(benchmark::State& state, double params, std::int64_t tokens,
                                const std::function<void(double&, double&)>& step,
                                const std::function<double()>& peak) {
  const double peak_before = peak();
  double fwd_bwd = 0, update = 0;
  step(fwd_bwd, update);  // warm-up: buffer cache, page faults
  fwd_bwd = update = 0;
  haliax::detail::gemm_profile::reset();
  haliax::detail::gemm_profile::enabled = true;
  const auto cache0 = haliax::buffer_cache_statistics();
  double total = 0;
  std::int64_t steps = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    step(fwd_bwd, update);
    Kokkos::fence();
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++steps;
  }
  haliax::detail::gemm_profile::enabled = false;
  const auto cache1 = haliax::buffer_cache_statistics();
  const double per_step = total / double(steps);
  const double gemm_s = double(haliax::detail::gemm_profile::nanoseconds.load()) * 1e-9;
  const double gemm_flops = double(haliax::detail::gemm_profile::flops.load());
  const double model_flops = 6.0 * params * double(tokens) / per_step;
  const double p = std::max(peak_before, peak());
  state.counters["s_per_step"] = per_step;
  state.counters["fwd_bwd_s"] = fwd_bwd / double(steps);
  state.counters["adamw_s"] = update / double(steps);
  state.counters["tokens_per_s"] = double(tokens) / per_step;
  state.counters["model_GFLOPs"] = model_flops / 1e9;
  state.counters["sgemm2_GFLOPs"] = p / 1e9;
  state.counters["MFU"] = model_flops / p;
  state.counters["gemm_s"] = gemm_s / double(steps);
  state.counters["cache_miss_MB"] = double(cache1.miss_bytes - cache0.miss_bytes) / 1e6 / double(steps);
  state.counters["cache_misses"] = double(cache1.misses - cache0.misses) / double(steps);
  state.counters["gemm_GFLOPs"] = gemm_s > 0 ? gemm_flops / gemm_s / 1e9 : 0.0;
}

#define HALIAX_BENCHMARK_MAIN()                                       \
  int main(int argc, char** argv) {                                   \
    haliax::runtime rt;                                               \
    bench::add_context();                                             \
    benchmark::Initialize(&argc, argv);                               \
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1; \
    benchmark::RunSpecifiedBenchmarks();                              \
    benchmark::Shutdown();                                            \
    return 0;                                                         \
  }
