// One training step of a Llama of GPT-2-small size (12 layers, 768 wide, SwiGLU MLP 2048, 12 query heads, 4 or 12
// KV heads, vocab 32000): forward, backward and the AdamW update, as train_lm runs it (grouped-query flash
// attention, RoPE, untied head). Reported as bench_gpt2_step: seconds per step, tokens/s, model FLOP/s (6 x
// parameters x tokens / step time) and MFU = that over the 2-thread cblas_sgemm rate measured in the same run on
// this model's GEMM shapes.
//
//   build/bench/bench_llama_step --benchmark_min_time=1x
#include <algorithm>
#include <chrono>
#include <vector>

#include <levanter/models/llama.hpp>
#include <levanter/optim/adamw.hpp>

#include "bench_common.hpp"

namespace {

using levanter::llama::LMHeadModel;
namespace hax = haliax;

/// The 2-thread sgemm rate on the model's training GEMM shapes (tokens x 768 x {768 (q, o), 256 (k, v with 4
/// KV heads), 2048 (gate, up)}, tokens x 2048 x 768, tokens x 768 x 32000).
double sgemm_peak(std::int64_t tokens) {
  return sgemm2_rate(
      {{tokens, 768, 768}, {tokens, 256, 768}, {tokens, 2048, 768}, {tokens, 768, 2048}, {tokens, 32000, 768}});
}

void BM_LlamaStep(benchmark::State& state) {
  const std::int64_t B = state.range(0), P = state.range(1);
  const bool checkpointing = false;
  levanter::LlamaConfig cfg;
  cfg.seq_len = static_cast<int>(P);
  cfg.hidden_dim = 768;
  cfg.intermediate_dim = 2048;
  cfg.num_layers = 12;
  cfg.num_heads = 12;
  cfg.num_kv_heads = static_cast<int>(state.range(2));
  cfg.gradient_checkpointing = checkpointing;
  const std::int64_t V = 32000;
  auto model = LMHeadModel::init(cfg, V, hax::random::make_key(0));
  levanter::AdamConfig ac;
  levanter::optim::adamw opt(ac, 1000);
  auto st = opt.init(model);
  std::vector<std::int32_t> t(std::size_t(B * P));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = std::int32_t((i * 2654435761u) % V);
  auto ex = levanter::lm_example::causal(hax::from_host<std::int32_t>(t, B * levanter::Batch, P * levanter::Pos), 2);
  levanter::forward_options fo;
  fo.inference = false;
  fo.checkpointing = checkpointing ? hax::nn::checkpoint_policy::per_layer : hax::nn::checkpoint_policy::none;
  auto step = [&](double& fwd_bwd, double& update) {
    const auto t0 = std::chrono::steady_clock::now();
    auto [loss, g] = hax::value_and_grad(
        [&](const LMHeadModel& m) { return levanter::compute_next_token_loss(m, cfg, ex, 0.0, fo); })(model);
    const auto t1 = std::chrono::steady_clock::now();
    opt.update(model, g, st, loss.item());
    fwd_bwd += std::chrono::duration<double>(t1 - t0).count();
    update += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  };
  time_training_steps(state, double(hax::tree::parameter_count(model)), B * P, step, [&] { return sgemm_peak(B * P); });
}

}  // namespace

BENCHMARK(BM_LlamaStep)
    ->ArgNames({"batch", "pos", "kv_heads"})
    ->Args({8, 256, 4})
    ->Args({8, 256, 12})
    ->Unit(benchmark::kSecond)
    ->UseRealTime()
    ->Iterations(3);

HALIAX_BENCHMARK_MAIN();
