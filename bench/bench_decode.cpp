// One decode step of GPT-2 124M (12 layers, 768 wide, vocab 50257) over a KV cache, as generate() and serve_lm run
// it: B sequences at `len` cached positions each take one new token (forward with the cache, LM head on the new
// position). Reported: ms per step, tokens/s (B per step), and the memory floor: the bytes a step must read at least
// (the f32 weights once, the cache's keys and values) over the copy rate measured in the same run (memcpy of 512 MiB,
// one thread, best of 3), with floor_ratio = floor / step time (1.0: as fast as memory allows).
//
//   build/bench/bench_decode --benchmark_min_time=1x
#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include <levanter/inference/generate.hpp>
#include <levanter/models/gpt2.hpp>

#include "bench_common.hpp"

namespace {

using levanter::gpt2::LMHeadModel;
namespace hax = haliax;

/// Bytes per second of a single-threaded memcpy of 512 MiB (best of 3), counting the bytes read.
double copy_rate() {
  static const double rate = [] {
    const std::size_t n = std::size_t(512) << 20;
    std::vector<char> a(n, 1), b(n, 0);
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      std::memcpy(b.data(), a.data(), n);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    benchmark::DoNotOptimize(b.data());
    return double(n) / best;
  }();
  return rate;
}

void BM_DecodeStep(benchmark::State& state) {
  const std::int64_t B = state.range(0), len = state.range(1);
  levanter::Gpt2Config cfg;  // GPT-2 small
  const std::int64_t V = 50257;
  const auto model = LMHeadModel::init(cfg, V, hax::random::make_key(0));
  std::vector<std::int32_t> prompt(std::size_t(B * len));
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = std::int32_t((i * 2654435761u) % V);
  // Prefill once; each timed step then runs on a copy of the cache, so every step sees `len` positions.
  levanter::kv_cache filled;
  {
    levanter::forward_options o;
    o.cache = &filled;
    (void)model.activations(cfg, hax::from_host<std::int32_t>(prompt, B * levanter::Batch, len * levanter::Pos),
                            hax::zeros<std::int32_t>(B * levanter::Batch, len * levanter::Pos), o);
  }
  std::vector<std::int32_t> next(std::size_t(B), 464);
  const auto tokens = hax::from_host<std::int32_t>(next, B * levanter::Batch, 1 * levanter::Pos);
  const auto segments = hax::zeros<std::int32_t>(B * levanter::Batch, 1 * levanter::Pos);
  double secs = 0;
  std::int64_t steps = 0;
  for (auto _ : state) {
    levanter::kv_cache cache = filled;
    levanter::forward_options o;
    o.cache = &cache;
    const auto t0 = std::chrono::steady_clock::now();
    const auto h = model.activations(cfg, tokens, segments, o);
    const auto logits = levanter::lm_head_logits(h, model.get_lm_head(), levanter::final_logit_soft_cap_of(cfg));
    benchmark::DoNotOptimize(logits.to_host().data());
    secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++steps;
  }
  const double per_step = secs / double(steps);
  const double params = double(hax::tree::parameter_count(model));
  const double cache_bytes = 2.0 * cfg.num_layers * double(B) * double(len + 1) * cfg.hidden_dim * 4.0;
  const double floor = (params * 4.0 + cache_bytes) / copy_rate();
  state.counters["ms_per_step"] = per_step * 1e3;
  state.counters["tokens_per_s"] = double(B) / per_step;
  state.counters["floor_ms"] = floor * 1e3;
  state.counters["floor_ratio"] = floor / per_step;
  state.counters["copy_GBs"] = copy_rate() / 1e9;
}

}  // namespace

BENCHMARK(BM_DecodeStep)
    ->ArgNames({"B", "len"})
    ->Args({1, 128})
    ->Args({16, 128})
    ->Args({1, 1000})
    ->Args({16, 1000})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(5);

HALIAX_BENCHMARK_MAIN();
