// A Mixtral-style training step against the dense step with the same active parameters, in one run: both are the
// Llama model at GPT-2-small width (12 layers, 768 wide, 12 query heads over 4 KV heads, vocab 32000, batch 8 x 256);
// the dense one has a SwiGLU MLP of 2048, the Mixtral one 8 experts of 1024 with top-2 routing (so each token runs
// 2 x 1024 of MLP, as the dense one) and both auxiliary losses. Forward, backward and the AdamW update, as train_lm
// runs them. Counters: seconds per step of each and their ratio (moe_over_dense; the target is at most 1.3), and the
// router + dispatch overhead share.
//
// BM_GroupedMatmul: the experts' product alone (4096 rows sorted into 8 equal groups, 768 -> 1024, as the step's
// w1) in GFLOP/s, against the 2-thread cblas_sgemm rate on the same per-expert shapes measured in the same run.
//
//   build/bench/bench_moe_step --benchmark_min_time=1x
#include <algorithm>
#include <chrono>
#include <vector>

#include <haliax/nn/moe.hpp>
#include <levanter/models/llama.hpp>
#include <levanter/optim/adamw.hpp>

#include "bench_common.hpp"

namespace {

using levanter::llama::LMHeadModel;
namespace hax = haliax;

levanter::LlamaConfig gpt2_small_width(levanter::LlamaConfig cfg, std::int64_t P) {
  cfg.seq_len = static_cast<int>(P);
  cfg.hidden_dim = 768;
  cfg.num_layers = 12;
  cfg.num_heads = 12;
  cfg.num_kv_heads = 4;
  cfg.gradient_checkpointing = false;
  cfg.sliding_window.reset();
  return cfg;
}

/// Seconds per training step (best of `reps` after one warm-up) of the model of `cfg`.
double step_seconds(const levanter::LlamaConfig& cfg, std::int64_t B, std::int64_t P, int reps, double* params) {
  const std::int64_t V = 32000;
  auto model = LMHeadModel::init(cfg, V, hax::random::make_key(0));
  *params = double(hax::tree::parameter_count(model));
  levanter::AdamConfig ac;
  levanter::optim::adamw opt(ac, 1000);
  auto st = opt.init(model);
  std::vector<std::int32_t> t(std::size_t(B * P));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = std::int32_t((i * 2654435761u) % V);
  auto ex = levanter::lm_example::causal(hax::from_host<std::int32_t>(t, B * levanter::Batch, P * levanter::Pos), 2);
  levanter::forward_options fo;
  fo.inference = false;
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    auto [loss, g] = hax::value_and_grad(
        [&](const LMHeadModel& m) { return levanter::compute_next_token_loss(m, cfg, ex, 0.0, fo); })(model);
    opt.update(model, g, st, loss.item());
    Kokkos::fence();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, s);  // r = 0 warms the buffer cache
  }
  return best;
}

void BM_MoeStepVsDense(benchmark::State& state) {
  const std::int64_t B = 8, P = 256;
  auto dense = gpt2_small_width(levanter::LlamaConfig{}, P);
  dense.intermediate_dim = 2048;
  auto moe = gpt2_small_width(levanter::MixtralConfig{}, P);
  moe.intermediate_dim = 1024;
  moe.n_routed_experts = 8;
  moe.num_experts_per_tok = 2;
  double dense_params = 0, moe_params = 0, dense_s = 0, moe_s = 0;
  for (auto _ : state) {
    dense_s = step_seconds(dense, B, P, 2, &dense_params);
    moe_s = step_seconds(moe, B, P, 2, &moe_params);
  }
  state.counters["dense_s_per_step"] = dense_s;
  state.counters["moe_s_per_step"] = moe_s;
  state.counters["moe_over_dense"] = moe_s / dense_s;
  state.counters["dense_params_M"] = dense_params / 1e6;
  state.counters["moe_params_M"] = moe_params / 1e6;
  state.counters["active_flops_ratio"] = moe.flops_per_token(32000) / dense.flops_per_token(32000);
}

inline constexpr struct Rows final : hax::axis<"rows"> {
} Rows;

void BM_GroupedMatmul(benchmark::State& state) {
  const std::int64_t rows = 4096, E = 8, in = 768, out = 1024;
  auto x = hax::random::normal(hax::random::make_key(1), rows * Rows, in * levanter::Embed);
  auto w = hax::random::normal(hax::random::make_key(2), E * levanter::Experts, out * levanter::Mlp,
                               in * levanter::Embed);
  const std::vector<std::int64_t> groups(std::size_t(E), rows / E);
  double best = 1e30;
  for (auto _ : state) {
    for (int r = 0; r < 4; ++r) {
      Kokkos::fence();
      const auto t0 = std::chrono::steady_clock::now();
      auto y = hax::nn::grouped_matmul(x, w, groups);
      Kokkos::fence();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) best = std::min(best, s);
      benchmark::DoNotOptimize(y.data());
    }
  }
  const double flops = 2.0 * double(rows) * double(out) * double(in);
  const double peak = sgemm2_rate(std::vector<std::array<std::int64_t, 3>>(std::size_t(E), {rows / E, out, in}));
  state.counters["grouped_GFLOPs"] = flops / best / 1e9;
  state.counters["sgemm_GFLOPs"] = peak / 1e9;
  state.counters["over_sgemm"] = flops / best / peak;
}

}  // namespace

BENCHMARK(BM_GroupedMatmul)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
BENCHMARK(BM_MoeStepVsDense)->Unit(benchmark::kSecond)->UseRealTime()->Iterations(1);

HALIAX_BENCHMARK_MAIN();
