// Memory-bound ops against a plain copy of the same bytes: the fused softmax over 4096 x 50257 logits, and
// elementwise ops (x * 2 + 1 style, and a broadcast add) on the same array. Each reads the input and writes
// an output, like the copy. Read `bytes_per_second` of each against BM_copy; the target is >= 50%.
//
//   build/bench/bench_softmax --benchmark_min_time=1
#include <cstring>
#include <haliax/nn/functions.hpp>

#include "bench_common.hpp"

namespace hax = haliax;
inline constexpr struct Tok final : hax::axis<"token"> {
} Tok;
inline constexpr struct Vocab final : hax::axis<"vocab"> {
} Vocab;

namespace {
constexpr std::int64_t tokens = 4096, vocab = 50257;
constexpr double bytes_moved = 2.0 * tokens * vocab * sizeof(float);  // read once + write once

void report(benchmark::State& state) {
  state.counters["bytes_per_second"] = benchmark::Counter(bytes_moved, benchmark::Counter::kIsIterationInvariantRate);
}

// The reference: copy the same bytes into a destination that already exists, as a memcpy.
void BM_copy(benchmark::State& state) {
  auto x = hax::full<float>(0.5f, tokens * Tok, vocab * Vocab);
  auto y = hax::zeros<float>(tokens * Tok, vocab * Vocab);
  for (auto _ : state) {
    std::memcpy(y.data(), x.data(), sizeof(float) * tokens * vocab);
    benchmark::DoNotOptimize(y.data());
  }
  report(state);
}

// Copy into a freshly allocated array each time, as every haliax op does (the allocation is part of the op).
void BM_copy_new_array(benchmark::State& state) {
  auto x = hax::full<float>(0.5f, tokens * Tok, vocab * Vocab);
  for (auto _ : state) {
    auto y = hax::copy(x);
    benchmark::DoNotOptimize(y.data());
  }
  report(state);
}

void BM_softmax(benchmark::State& state) {
  auto x = hax::arange<float>(vocab * Vocab, 0.0f, 1e-4f);
  auto logits = hax::broadcast_axis(x, tokens * Tok);
  for (auto _ : state) {
    auto p = hax::nn::softmax(logits, Vocab);
    benchmark::DoNotOptimize(p.data());
  }
  report(state);
}

void BM_scale_shift(benchmark::State& state) {
  auto x = hax::full<float>(0.5f, tokens * Tok, vocab * Vocab);
  for (auto _ : state) {
    auto y = x * 2.0f;
    benchmark::DoNotOptimize(y.data());
  }
  report(state);
}

void BM_broadcast_add(benchmark::State& state) {
  auto x = hax::full<float>(0.5f, tokens * Tok, vocab * Vocab);
  auto b = hax::full<float>(0.25f, vocab * Vocab);
  for (auto _ : state) {
    auto y = x + b;
    benchmark::DoNotOptimize(y.data());
  }
  report(state);
}
}  // namespace

BENCHMARK(BM_copy)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_copy_new_array)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_softmax)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_scale_shift)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_broadcast_add)->Unit(benchmark::kMillisecond)->UseRealTime();

HALIAX_BENCHMARK_MAIN();
