// One training step of GPT-2 124M (12 layers, 768 wide, 12 heads, vocab 50257): forward, backward and the AdamW
// update, as train_lm runs it (flash attention, fused cross-entropy, per-layer gradient checkpointing off/on).
// Reported: seconds per step, tokens/s, model FLOP/s (6 x parameters x tokens / step time, the llm.c/PaLM MFU
// convention) and MFU = that over the 2-thread cblas_sgemm rate measured in the same run on GPT-2's GEMM shapes.
// With bf16=1 the step runs under matmul_precision::bf16 (trainer.mp p=f32,c=bfloat16): bf16gemm_GFLOPs is then
// haliax's bfloat16 GEMM rate on the same shapes (operand rounding included) and MFU_bf16 the model rate over it.
//
//   build/bench/bench_gpt2_step --benchmark_min_time=1x          (run once more with OPENBLAS_CORETYPE=SkylakeX)
#include <algorithm>
#include <chrono>
#include <vector>

#include <levanter/models/gpt2.hpp>
#include <levanter/optim/adamw.hpp>

#include "bench_common.hpp"

namespace {

using levanter::gpt2::LMHeadModel;
namespace hax = haliax;

/// The 2-thread sgemm rate on GPT-2-small's training GEMM shapes (tokens x 768 x {768, 2304, 3072},
/// tokens x 3072 x 768, tokens x 768 x 50257).
double sgemm_peak(std::int64_t tokens) {
  return sgemm2_rate(
      {{tokens, 768, 768}, {tokens, 2304, 768}, {tokens, 3072, 768}, {tokens, 768, 3072}, {tokens, 50257, 768}});
}

void BM_Gpt2Step(benchmark::State& state) {
  const std::int64_t B = state.range(0), P = state.range(1);
  const bool checkpointing = state.range(2) != 0;
  const bool bf16 = state.range(3) != 0;
  if (bf16 && !hax::bf16_matmul_available()) {
    state.SkipWithError(("no bfloat16 GEMM here: " + hax::bf16_matmul_backend()).c_str());
    return;
  }
  hax::matmul_precision_scope precision(bf16 ? hax::matmul_precision::bf16 : hax::matmul_precision::f32);
  levanter::Gpt2Config cfg;  // GPT-2 small
  cfg.gradient_checkpointing = checkpointing;
  const std::int64_t V = 50257;
  auto model = LMHeadModel::init(cfg, V, hax::random::make_key(0));
  levanter::AdamConfig ac;
  levanter::optim::adamw opt(ac, 1000);
  auto st = opt.init(model);
  std::vector<std::int32_t> t(std::size_t(B * P));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = std::int32_t((i * 2654435761u) % V);
  auto ex =
      levanter::lm_example::causal(hax::from_host<std::int32_t>(t, B * levanter::Batch, P * levanter::Pos), 50256);
  levanter::forward_options fo;
  fo.inference = false;
  fo.checkpointing = checkpointing ? hax::nn::checkpoint_policy::per_layer : hax::nn::checkpoint_policy::none;
  auto step = [&](double& fwd_bwd, double& update) {
    const auto t0 = std::chrono::steady_clock::now();
    auto [loss, g] = hax::value_and_grad(
        [&](const LMHeadModel& m) { return levanter::gpt2::next_token_loss(m, cfg, ex, 0.0, fo); })(model);
    const auto t1 = std::chrono::steady_clock::now();
    opt.update(model, g, st, loss.item());
    fwd_bwd += std::chrono::duration<double>(t1 - t0).count();
    update += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  };
  const double params = double(hax::tree::parameter_count(model));
  time_training_steps(state, params, B * P, step, [&] { return sgemm_peak(B * P); });
  if (bf16) {
    const std::int64_t n = B * P;
    const double rate = haliax_gemm_rate(
        {{n, 768, 768}, {n, 2304, 768}, {n, 3072, 768}, {n, 768, 3072}, {n, 50257, 768}}, hax::matmul_precision::bf16);
    state.counters["bf16gemm_GFLOPs"] = rate / 1e9;
    state.counters["MFU_bf16"] = 6.0 * params * double(n) / state.counters["s_per_step"] / rate;
  }
}

}  // namespace

BENCHMARK(BM_Gpt2Step)
    ->ArgNames({"batch", "pos", "ckpt", "bf16"})
    ->Args({4, 64, 0, 0})
    ->Args({8, 256, 0, 0})
    ->Args({8, 256, 1, 0})
    ->Args({4, 64, 0, 1})
    ->Args({8, 256, 0, 1})
    ->Apply([](benchmark::internal::Benchmark* b) {
      // GPT-2's training length, 8 x 1024 tokens: on a GPU (about a minute a step on a 2-core CPU).
      if (!haliax::detail::host_memory) b->Args({8, 1024, 0, 0})->Args({8, 1024, 0, 1});
    })
    ->Unit(benchmark::kSecond)
    ->UseRealTime()
    ->Iterations(3);

HALIAX_BENCHMARK_MAIN();
