// Forward + backward of one GPT-2-small-shaped transformer block (embed 768, 12 heads, mlp 3072, flash
// attention), and how its time splits between GEMM (every haliax::dot, forward and backward) and the rest
// (norms, GELU, attention kernels, adds, the tape). Reports gemm_fraction = GEMM time / step time, the GEMM
// rate, and the whole step's rate counting the block's matmul FLOPs (6 x tokens x parameters) plus attention.
#include <haliax/haliax.hpp>

#include "bench_common.hpp"
// after bench_common.hpp: the other order makes nvcc 13 mis-print bench_common.hpp's GEMM-shape functions
#include "../tests/toy_transformer.hpp"

namespace {
using namespace toy;

void BM_block_forward_backward(benchmark::State& state) {
  const std::int64_t batch = state.range(0), pos = state.range(1);
  config c;
  c.embed = 768;
  c.heads = 12;
  c.mlp = 3072;
  auto b = block<>::init(hax::random::make_key(0), c);
  auto x = hax::random::normal(hax::random::make_key(1), batch * Batch, pos * Pos, c.embed * Embed);
  auto loss_fn = [&](const block<>& m) { return hax::sum(m(x, true)); };
  auto& prof = hax::detail::gemm_profile::enabled;
  {
    auto [l, g] = hax::value_and_grad(loss_fn)(b);  // warm-up: buffer cache, BLAS buffers
    benchmark::DoNotOptimize(g.mlp.c_fc.weight.data());
  }
  hax::detail::gemm_profile::reset();
  prof = true;
  double total_ns = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    auto [l, g] = hax::value_and_grad(loss_fn)(b);
    benchmark::DoNotOptimize(g.mlp.c_fc.weight.data());
    total_ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  }
  prof = false;
  const double gemm_ns = static_cast<double>(hax::detail::gemm_profile::nanoseconds.load());
  const double gemm_flops = static_cast<double>(hax::detail::gemm_profile::flops.load());
  const double tokens = static_cast<double>(batch * pos);
  const double params = static_cast<double>(hax::tree::parameter_count(b));
  // causal attention: QK^T and PV, forward 2 x 2 x T x P x d / 2 (half the tiles), backward twice that
  const double attn = 3.0 * 2.0 * tokens * static_cast<double>(pos) * static_cast<double>(c.embed);
  state.counters["gemm_fraction"] = gemm_ns / total_ns;
  state.counters["gemm_GFLOPs"] = gemm_flops / gemm_ns;
  state.counters["step_GFLOPs"] =
      benchmark::Counter((6.0 * tokens * params + attn) * static_cast<double>(state.iterations()) / 1e9,
                         benchmark::Counter::kIsRate);
  state.counters["nongemm_ms"] = (total_ns - gemm_ns) / 1e6 / static_cast<double>(state.iterations());
}
BENCHMARK(BM_block_forward_backward)->Args({8, 512})->Args({4, 1024})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

HALIAX_BENCHMARK_MAIN();
