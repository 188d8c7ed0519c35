// Optimizer updates (AdamW, and every rule optimizer through make_optimizer) over GPT-2-small-sized parameters (124,439,808 floats in GPT-2's 148 leaves), against a copy of
// the same bytes. The update is memory-bound: it reads p, g, m, v and writes p, m, v (28 bytes per parameter),
// after one read of g for the global gradient norm (4 more). `bytes_per_second` counts all 32 bytes; compare it
// with BM_copy_parallel (the same thread pool copying chunks, 8 bytes per float moved) and BM_memcpy (one thread).
//
//   ninja -C build bench_adamw && build/bench/bench_adamw      (LEVANTER_ISA=baseline: the SSE2 loop)
#include <boost/hana/define_struct.hpp>
#include <cstring>
#include <haliax/detail/thread_pool.hpp>
#include <levanter/config/yaml.hpp>
#include <levanter/optim/adamw.hpp>
#include <levanter/optim/optimizer.hpp>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace hax = haliax;

namespace {

inline constexpr struct Flat final : haliax::axis<"flat"> {
} Flat;

using leaf = hax::named_array<float, hax::axes<Flat>>;
struct gpt2_small {
  BOOST_HANA_DEFINE_STRUCT(gpt2_small, (std::vector<leaf>, leaves));
};

// GPT-2 small's parameter sizes: embeddings, 12 blocks (ln_1, c_attn, c_proj, ln_2, c_fc, c_proj; weights and
// biases), ln_f.
std::vector<int64_t> gpt2_sizes() {
  const int64_t E = 768, V = 50257, P = 1024;
  std::vector<int64_t> s{V * E, P * E};
  for (int l = 0; l < 12; ++l) {
    for (int64_t n : {E, E, E * 3 * E, 3 * E, E * E, E, E, E, E * 4 * E, 4 * E, 4 * E * E, E}) s.push_back(n);
  }
  s.push_back(E);
  s.push_back(E);
  return s;
}

gpt2_small make(float value) {
  gpt2_small m;
  for (int64_t n : gpt2_sizes()) {
    auto x = leaf::allocate({n}, "bench::param");
    float* p = x.data();
    hax::detail::thread_pool::instance().run((n + 65535) / 65536, [&](int64_t c) {
      for (int64_t i = c * 65536; i < std::min(n, (c + 1) * 65536); ++i) p[i] = value * static_cast<float>((i % 97) - 48);
    });
    m.leaves.push_back(x);
  }
  return m;
}

int64_t total() {
  int64_t t = 0;
  for (auto n : gpt2_sizes()) t += n;
  return t;
}

void run_adamw(benchmark::State& state, levanter::AdamConfig cfg) {
  levanter::optim::adamw opt(cfg, 1000000);
  auto params = make(1e-3f);
  auto grads = make(1e-4f);
  auto st = opt.init(params);
  for (auto _ : state) {
    auto s = opt.update(params, grads, st, 1.0);
    benchmark::DoNotOptimize(s);
  }
  // floats moved per parameter: norm pass 1; fused pass 4 + 3; or moments pass 4 + 2 and apply pass 4 + 1
  const double passes = (cfg.update_rms_clipping || cfg.clip_update_norm) ? 12 : 8;
  state.SetLabel(std::string("loop: ") + levanter::optim::detail::adamw::kernel_isa());  // LEVANTER_ISA=baseline
  state.counters["params"] = static_cast<double>(total());
  state.counters["bytes_per_second"] =
      benchmark::Counter(passes * 4.0 * static_cast<double>(total()), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_adamw(benchmark::State& state) { run_adamw(state, levanter::AdamConfig{}); }

void BM_adamw_nesterov_noclip(benchmark::State& state) {
  levanter::AdamConfig c;
  c.nesterov = true;
  c.max_grad_norm.reset();
  run_adamw(state, c);
}

// Two passes: moments + update norms, then the clipped parameter update.
void BM_adamw_rms_clipping(benchmark::State& state) {
  levanter::AdamConfig c;
  c.update_rms_clipping = 1.0;
  run_adamw(state, c);
}

// The optimizers written as rules (levanter/optim/rules.hpp) through make_optimizer, as train_lm makes them, and
// AdamW the same way. Floats moved per parameter: the gradient norm's read of g, then each rule's passes (p read and
// written, g read, each state buffer read and written; Cautious's leaf pass reads g and updates m, v, and its main
// pass reads them again; MARS reads g and the previous g once more for its own norm).
void run_type(benchmark::State& state, const char* type, double floats_moved) {
  levanter::config::source_map sources;
  const auto node = levanter::config::load_yaml_string(std::string("{type: ") + type + "}", "bench", sources);
  const auto choice = levanter::config::decode<levanter::OptimizerChoice>(node, "optimizer", sources);
  auto params = make(1e-3f);
  auto grads = make(1e-4f);
  auto opt = levanter::optim::make_optimizer(choice, 1000000, params);
  for (auto _ : state) {
    auto s = opt->update(params, grads, 1.0);
    benchmark::DoNotOptimize(s);
  }
  state.counters["params"] = static_cast<double>(total());
  state.counters["bytes_per_second"] = benchmark::Counter(floats_moved * 4.0 * static_cast<double>(total()),
                                                          benchmark::Counter::kIsIterationInvariantRate);
}
void BM_opt_adam(benchmark::State& s) { run_type(s, "adam", 8); }
void BM_opt_lion(benchmark::State& s) { run_type(s, "lion", 1 + 5); }
void BM_opt_adopt(benchmark::State& s) { run_type(s, "adopt", 1 + 7); }
void BM_opt_rmsprop(benchmark::State& s) { run_type(s, "rmsprop", 1 + 7); }
void BM_opt_cautious(benchmark::State& s) { run_type(s, "cautious", 1 + 5 + 5); }
void BM_opt_mars(benchmark::State& s) { run_type(s, "mars", 1 + 2 + 9); }

void BM_memcpy(benchmark::State& state) {
  auto x = make(1.0f), y = make(2.0f);
  for (auto _ : state) {
    for (std::size_t i = 0; i < x.leaves.size(); ++i)
      std::memcpy(y.leaves[i].data(), x.leaves[i].data(), sizeof(float) * x.leaves[i].element_count());
    benchmark::ClobberMemory();
  }
  state.counters["bytes_per_second"] =
      benchmark::Counter(8.0 * static_cast<double>(total()), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_copy_parallel(benchmark::State& state) {
  auto x = make(1.0f), y = make(2.0f);
  struct chunk {
    const float* s;
    float* d;
    int64_t n;
  };
  std::vector<chunk> chunks;
  for (std::size_t i = 0; i < x.leaves.size(); ++i) {
    const int64_t n = x.leaves[i].element_count();
    for (int64_t b = 0; b < n; b += 32768)
      chunks.push_back({x.leaves[i].data() + b, y.leaves[i].data() + b, std::min<int64_t>(32768, n - b)});
  }
  for (auto _ : state) {
    hax::detail::thread_pool::instance().run(static_cast<int64_t>(chunks.size()), [&](int64_t c) {
      const auto& k = chunks[static_cast<std::size_t>(c)];
      std::memcpy(k.d, k.s, sizeof(float) * k.n);
    });
    benchmark::ClobberMemory();
  }
  state.counters["bytes_per_second"] =
      benchmark::Counter(8.0 * static_cast<double>(total()), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_memcpy)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_copy_parallel)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_adamw)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_adamw_nesterov_noclip)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_adamw_rms_clipping)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_opt_adam)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_opt_lion)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_opt_adopt)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_opt_rmsprop)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_opt_cautious)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_opt_mars)->Unit(benchmark::kMillisecond)->UseRealTime();

HALIAX_BENCHMARK_MAIN();
