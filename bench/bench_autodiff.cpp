// Autodiff costs: the tape's per-op overhead (the same tiny op with and without recording, so the
// difference is the bookkeeping: node allocation, closure, tape push), and the backward pass per op.
#include <haliax/haliax.hpp>

#include "bench_common.hpp"

namespace {
inline constexpr struct X final : haliax::axis<"x"> {
} X;

// One-element arrays: the kernel itself costs next to nothing, so the time is the per-op fixed cost.
void BM_op_untracked(benchmark::State& state) {
  auto a = haliax::ones<float>(1 * X);
  auto b = haliax::ones<float>(1 * X);
  for (auto _ : state) {
    auto c = a * b;
    benchmark::DoNotOptimize(c.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_op_untracked);

void BM_op_recorded(benchmark::State& state) {
  auto b = haliax::ones<float>(1 * X);
  constexpr int ops_per_tape = 1000;
  for (auto _ : state) {
    state.PauseTiming();
    {
      haliax::detail::ad::tape_scope scope;
      auto a = haliax::ones<float>(1 * X);
      haliax::detail::ad::make_leaf(a);
      state.ResumeTiming();
      for (int i = 0; i < ops_per_tape; ++i) {
        auto c = a * b;
        benchmark::DoNotOptimize(c.data());
      }
      state.PauseTiming();
    }
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * ops_per_tape);
}
BENCHMARK(BM_op_recorded);

// Forward + backward of a chain of n recorded multiplies (per-op cost of recording and running backward).
void BM_chain_value_and_grad(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  auto x = haliax::ones<float>(1 * X);
  auto w = haliax::full<float>(1.0001f, 1 * X);
  auto f = [&](const auto& v) {
    auto h = v;
    for (int i = 0; i < n; ++i) h = h * w;
    return haliax::sum(h);
  };
  for (auto _ : state) {
    auto [loss, g] = haliax::value_and_grad(f)(x);
    benchmark::DoNotOptimize(g.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_chain_value_and_grad)->Arg(1000);

void BM_chain_forward_only(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  auto x = haliax::ones<float>(1 * X);
  auto w = haliax::full<float>(1.0001f, 1 * X);
  for (auto _ : state) {
    auto h = x;
    for (int i = 0; i < n; ++i) h = h * w;
    benchmark::DoNotOptimize(haliax::sum(h).data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_chain_forward_only)->Arg(1000);

}  // namespace

HALIAX_BENCHMARK_MAIN();
