// Shared bits of the benchmarks: runtime set-up and the environment context printed with every figure.
#pragma once

#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdlib>
#include <haliax/haliax.hpp>
#include <string>

namespace bench {

/// Records what the figures depend on: OpenBLAS core type and threads, Kokkos backend.
inline void add_context() {
  benchmark::AddCustomContext("openblas_corename", openblas_get_corename());
  benchmark::AddCustomContext("openblas_threads_at_start", std::to_string(openblas_get_num_threads()));
  benchmark::AddCustomContext("haliax_threads", std::to_string(haliax::num_threads()));
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  benchmark::AddCustomContext("OPENBLAS_CORETYPE", env ? env : "(unset)");
  benchmark::AddCustomContext("kokkos_execution_space", haliax::execution_space::name());
}

}  // namespace bench

/// main() for a haliax benchmark: Kokkos initialised, context recorded.
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
