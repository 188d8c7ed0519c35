// haliax::dot against cblas_sgemm on the GPT-2-small projection shapes (tokens = 4096, embed = 768 against
// 768, 2304 and 3072): the forward product and both backward forms. Run the pair for each shape and read
// the ratio of their FLOP/s; the target is dot >= 90% of sgemm.
//
//   build/bench/bench_dot --benchmark_min_time=1
#include <cblas.h>

#include <vector>

#include "bench_common.hpp"

namespace hax = haliax;
inline constexpr struct Tok final : hax::axis<"token"> {
} Tok;
inline constexpr struct Embed final : hax::axis<"embed"> {
} Embed;
inline constexpr struct Out final : hax::axis<"out"> {
} Out;

namespace {
constexpr std::int64_t tokens = 4096, embed = 768;

enum form { forward = 0, grad_input = 1, grad_weight = 2 };

// forward:     y[T,O]  = x[T,E] . w[E,O]     (contract embed)
// grad_input:  dx[T,E] = dy[T,O] . w[E,O]    (contract out: w used transposed)
// grad_weight: dw[E,O] = x[T,E] . dy[T,O]    (contract tokens: x used transposed)
void BM_haliax_dot(benchmark::State& state) {
  const auto out = state.range(0);
  const auto f = static_cast<form>(state.range(1));
  auto x = hax::full<float>(0.5f, tokens * Tok, embed * Embed);
  auto w = hax::full<float>(0.25f, embed * Embed, out * Out);
  auto dy = hax::full<float>(0.125f, tokens * Tok, out * Out);
  for (auto _ : state) {
    if (f == forward) {
      auto y = hax::dot(x, w, Embed);
      benchmark::DoNotOptimize(y.data());
    } else if (f == grad_input) {
      auto dx = hax::dot(dy, w, Out);
      benchmark::DoNotOptimize(dx.data());
    } else {
      auto dw = hax::dot(x, dy, Tok);
      benchmark::DoNotOptimize(dw.data());
    }
    Kokkos::fence();
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * tokens * embed * out, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_cblas_sgemm(benchmark::State& state) {
  const auto out = state.range(0);
  const auto f = static_cast<form>(state.range(1));
  std::vector<float> x(tokens * embed, 0.5f), w(embed * out, 0.25f), dy(tokens * out, 0.125f);
  std::vector<float> c(std::max(tokens * out, std::max(tokens * embed, embed * out)));
  // The reference uses OpenBLAS's own threading with as many threads as haliax's pool.
  openblas_set_num_threads(hax::num_threads());
  for (auto _ : state) {
    if (f == forward) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, tokens, out, embed, 1.0f, x.data(), embed, w.data(), out,
                  0.0f, c.data(), out);
    } else if (f == grad_input) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, tokens, embed, out, 1.0f, dy.data(), out, w.data(), out,
                  0.0f, c.data(), embed);
    } else {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, embed, out, tokens, 1.0f, x.data(), embed, dy.data(), out,
                  0.0f, c.data(), out);
    }
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * tokens * embed * out, benchmark::Counter::kIsIterationInvariantRate);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"out", "form"});
  for (std::int64_t out : {768, 2304, 3072})
    for (std::int64_t f : {0, 1, 2}) b->Args({out, f});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
}  // namespace

BENCHMARK(BM_cblas_sgemm)->Apply(shapes);
BENCHMARK(BM_haliax_dot)->Apply(shapes);

HALIAX_BENCHMARK_MAIN();
