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

/// Best-of-3 FLOP/s of cblas_sgemm with 2 OpenBLAS threads over the model's training GEMM shapes (tokens x 768 x
/// {768 (q, o), 256 (k, v with 4 KV heads), 2048 (gate, up)}, tokens x 2048 x 768, tokens x 768 x 32000), time-
/// weighted by FLOPs.
double sgemm_peak(std::int64_t tokens) {
  const int saved = openblas_get_num_threads();
  openblas_set_num_threads(2);
  const std::int64_t shapes[][3] = {{tokens, 768, 768}, {tokens, 256, 768}, {tokens, 2048, 768},
                                    {tokens, 768, 2048}, {tokens, 32000, 768}};
  double flops = 0, secs = 0;
  for (auto& s : shapes) {
    const auto m = s[0], n = s[1], k = s[2];
    std::vector<float> a(std::size_t(m * k), 0.01f), b(std::size_t(k * n), 0.02f), c(std::size_t(m * n));
    double best = 1e30;
    for (int r = 0; r < 4; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(n), int(k), 1.0f, a.data(), int(k), b.data(),
                  int(n), 0.0f, c.data(), int(n));
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) best = std::min(best, t);
    }
    flops += 2.0 * double(m) * double(n) * double(k);
    secs += best;
  }
  openblas_set_num_threads(saved);
  return flops / secs;
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
  double fwd_bwd = 0, update = 0;
  auto step = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    auto [loss, g] = hax::value_and_grad([&](const LMHeadModel& m) {
      return levanter::compute_next_token_loss(m, cfg, ex, 0.0, fo);
    })(model);
    const auto t1 = std::chrono::steady_clock::now();
    opt.update(model, g, st, loss.item());
    fwd_bwd += std::chrono::duration<double>(t1 - t0).count();
    update += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  };
  const double peak_before = sgemm_peak(B * P);
  step();  // warm-up: buffer cache, page faults
  fwd_bwd = update = 0;
  double total = 0;
  std::int64_t steps = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++steps;
  }
  const double per_step = total / double(steps);
  const double params = double(hax::tree::parameter_count(model));
  const double model_flops = 6.0 * params * double(B * P) / per_step;
  // The larger of two measurements (before and after the steps): the machine is shared, so this is the
  // conservative denominator.
  const double peak = std::max(peak_before, sgemm_peak(B * P));
  state.counters["s_per_step"] = per_step;
  state.counters["fwd_bwd_s"] = fwd_bwd / double(steps);
  state.counters["adamw_s"] = update / double(steps);
  state.counters["tokens_per_s"] = double(B * P) / per_step;
  state.counters["model_GFLOPs"] = model_flops / 1e9;
  state.counters["sgemm2_GFLOPs"] = peak / 1e9;
  state.counters["MFU"] = model_flops / peak;
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
