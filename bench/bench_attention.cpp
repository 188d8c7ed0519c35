// Causal self-attention at GPT-2-small head shapes (12 heads x 64, 1024 positions, batch 1 and 2): the plain
// `dot_product_attention` (scores materialised, gradient through its ops) against the blocked
// `flash_attention`, forward and forward+backward (value_and_grad of sum(attention * w) with respect to q, k
// and v). Read the times of each pair; the target is flash <= plain.
//
// BM_attention_gqa: grouped-query attention (Llama's layout: 12 query heads in 4 key/value heads of 3) against
// multi-head attention with 12 heads, both `flash_attention`, at batch 8 x 256 positions x head size 64,
// forward and forward+backward. The same FLOPs; GQA reads a third of the keys and values, so the target is
// gqa <= mha.
//
// Memory: every figure carries `peak_MB`, the peak of haliax (Kokkos) bytes live during one call above what
// was live before it, measured in a child process run with HALIAX_CACHE_MB=0 (no buffer cache, so every
// release is a real free) and Kokkos allocation callbacks; and `scores_MB`, the bytes allocated for
// score-shaped data in one call: [batch, head, pos, key_pos] arrays for the plain version, per-thread tiles
// for the flash one. Set HALIAX_BENCH_SKIP_MEMORY=1 to skip the child run (e.g. under a profiler).
//
//   build/bench/bench_attention --benchmark_min_time=1
#include <Kokkos_Core.hpp>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <haliax/autodiff.hpp>
#include <haliax/nn/attention.hpp>
#include <map>
#include <string>

#include "bench_common.hpp"

namespace hax = haliax;
namespace nn = haliax::nn;
inline constexpr struct Batch final : hax::axis<"batch"> {
} Batch;
inline constexpr struct Pos final : hax::axis<"position"> {
} Pos;
inline constexpr struct KPos final : hax::axis<"key_position"> {
} KPos;
inline constexpr struct Head final : hax::axis<"head"> {
} Head;
inline constexpr struct Key final : hax::axis<"head_size"> {
} Key;
inline constexpr struct KvHead final : hax::axis<"kv_head"> {
} KvHead;
inline constexpr struct QGroup final : hax::axis<"q_heads_per_group"> {
} QGroup;

namespace {
constexpr std::int64_t positions = 1024, heads = 12, head_size = 64;

using q_array = hax::named_array<float, hax::axes<Batch, Pos, Head, Key>>;
using kv_array = hax::named_array<float, hax::axes<Batch, KPos, Head, Key>>;
struct qkv {
  BOOST_HANA_DEFINE_STRUCT(qkv, (q_array, q), (kv_array, k), (kv_array, v));
};

q_array random_q(std::uint32_t seed, std::int64_t batch) {
  return hax::random::normal<float>(hax::random::make_key(seed), batch * Batch, positions * Pos, heads * Head,
                                    head_size * Key);
}
kv_array random_kv(std::uint32_t seed, std::int64_t batch) {
  return hax::random::normal<float>(hax::random::make_key(seed), batch * Batch, positions * KPos, heads * Head,
                                    head_size * Key);
}

enum variant { plain = 0, flash = 1 };
enum pass { forward = 0, forward_backward = 1 };

struct problem {
  qkv x;
  q_array w;  // cotangent for the loss sum(attention * w)
  hax::named_array<bool, hax::axes<Pos, KPos>> mask;
  explicit problem(std::int64_t batch)
      : x{random_q(1, batch), random_kv(2, batch), random_kv(3, batch)},
        w(random_q(4, batch)),
        mask(nn::causal_mask(positions * Pos, positions * KPos)) {}

  q_array attend(variant v, const qkv& m) const {
    if (v == plain) return nn::dot_product_attention(m.q, m.k, m.v, KPos, Key, mask);
    return nn::flash_attention(m.q, m.k, m.v, Pos, KPos, Key);
  }
  /// One call of the measured work; returns something to keep alive.
  float run(variant v, pass p) const {
    if (p == forward) {
      auto y = attend(v, x);
      return y.data()[0];
    }
    auto [loss, g] = hax::value_and_grad([&](const qkv& m) { return hax::sum(attend(v, m) * w); })(x);
    return loss.item() + g.q.data()[0] + g.k.data()[0] + g.v.data()[0];
  }
};

// ---- memory measurement (child process) -------------------------------------------------------------------

std::atomic<std::int64_t> live_bytes{0}, peak_bytes{0};

void on_allocate(Kokkos::Profiling::SpaceHandle, const char*, const void*, std::uint64_t size) {
  const auto now = live_bytes.fetch_add(static_cast<std::int64_t>(size)) + static_cast<std::int64_t>(size);
  std::int64_t p = peak_bytes.load();
  while (now > p && !peak_bytes.compare_exchange_weak(p, now)) {
  }
}
void on_deallocate(Kokkos::Profiling::SpaceHandle, const char*, const void*, std::uint64_t size) {
  live_bytes.fetch_sub(static_cast<std::int64_t>(size));
}
void on_init(int, std::uint64_t, std::uint32_t, Kokkos_Profiling_KokkosPDeviceInfo*) {}

/// Prints "<variant> <pass> <batch> <peak bytes above the start>" for every case.
int measure_memory() {
  Kokkos::Tools::Experimental::set_init_callback(on_init);
  Kokkos::Tools::Experimental::set_allocate_data_callback(on_allocate);
  Kokkos::Tools::Experimental::set_deallocate_data_callback(on_deallocate);
  for (std::int64_t batch : {1, 2}) {
    problem pr(batch);
    for (int v : {plain, flash})
      for (int p : {forward, forward_backward}) {
        pr.run(static_cast<variant>(v), static_cast<pass>(p));  // warm-up (thread-local scratch, BLAS buffers)
        const std::int64_t start = live_bytes.load();
        peak_bytes.store(start);
        volatile float sink = pr.run(static_cast<variant>(v), static_cast<pass>(p));
        (void)sink;
        std::printf("%d %d %lld %lld\n", v, p, static_cast<long long>(batch),
                    static_cast<long long>(peak_bytes.load() - start));
      }
  }
  return 0;
}

/// Peak bytes by (variant, pass, batch), read from a child run of this program with the cache off.
std::map<std::string, double>& peaks() {
  static std::map<std::string, double> m;
  return m;
}
std::string peak_key(int v, int p, std::int64_t batch) {
  return std::to_string(v) + "/" + std::to_string(p) + "/" + std::to_string(batch);
}

void load_peaks(const char* self) {
  const std::string cmd = std::string("HALIAX_CACHE_MB=0 '") + self + "' --measure_memory";
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return;
  int v = 0, p = 0;
  long long b = 0, bytes = 0;
  while (std::fscanf(f, "%d %d %lld %lld", &v, &p, &b, &bytes) == 4) peaks()[peak_key(v, p, b)] = double(bytes);
  pclose(f);
}

// ---- timed benchmarks --------------------------------------------------------------------------------------

void BM_attention(benchmark::State& state) {
  const auto v = static_cast<variant>(state.range(0));
  const auto p = static_cast<pass>(state.range(1));
  const std::int64_t batch = state.range(2);
  problem pr(batch);
  for (auto _ : state) {
    benchmark::DoNotOptimize(pr.run(v, p));
    Kokkos::fence();
  }
  // Bytes allocated for score-shaped data in one call. Plain: [batch, head, pos, key_pos] arrays: scores,
  // masked scores, weights, and in backward the gradients of those three. Flash: per-thread 128 x 128 tiles,
  // one in forward and two (probabilities, their gradient) in backward.
  const double score_bytes = double(batch) * heads * positions * positions * sizeof(float);
  const double tiles = double(hax::num_threads()) * (p == forward ? 1 : 3) * 128 * 128 * sizeof(float);
  state.counters["scores_MB"] = (v == plain ? (p == forward ? 3 : 6) * score_bytes : tiles) / 1e6;
  auto it = peaks().find(peak_key(v, p, batch));
  if (it != peaks().end()) state.counters["peak_MB"] = it->second / 1e6;
  // Model FLOPs of causal attention (the two products over the visible half), for comparison between variants.
  const double flops = 2.0 * 2.0 * batch * heads * head_size * positions * (positions + 1) / 2.0;
  state.counters["causal_FLOP/s"] =
      benchmark::Counter(p == forward ? flops : 3.5 * flops, benchmark::Counter::kIsIterationInvariantRate);
}

void cases(benchmark::internal::Benchmark* b) {
  b->ArgNames({"flash", "backward", "batch"});
  for (std::int64_t batch : {1, 2})
    for (std::int64_t p : {0, 1})
      for (std::int64_t v : {0, 1}) b->Args({v, p, batch});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
}  // namespace

BENCHMARK(BM_attention)->Apply(cases);

// ---- grouped-query attention -------------------------------------------------------------------------------

namespace {
constexpr std::int64_t gqa_batch = 8, gqa_positions = 256, gqa_heads = 12, gqa_kv_heads = 4;

/// q, k, v (and the cotangent w) of one layout: MHA {batch, pos, head, key} with 12 heads, or GQA q {batch,
/// pos, kv_head, q_heads_per_group, key} with 4 x 3 heads and k, v {batch, key_pos, kv_head, key}.
template <class Q, class KV>
struct gqa_problem {
  struct operands {
    BOOST_HANA_DEFINE_STRUCT(operands, (Q, q), (KV, k), (KV, v));
  };
  operands x;
  Q w;
  gqa_problem(Q q, KV k, KV v, Q w) : x{std::move(q), std::move(k), std::move(v)}, w(std::move(w)) {}

  float run(pass p) const {
    if (p == forward) return nn::flash_attention(x.q, x.k, x.v, Pos, KPos, Key).data()[0];
    auto [loss, g] = hax::value_and_grad(
        [&](const operands& m) { return hax::sum(nn::flash_attention(m.q, m.k, m.v, Pos, KPos, Key) * w); })(x);
    return loss.item() + g.q.data()[0] + g.k.data()[0] + g.v.data()[0];
  }
};

auto normal(std::uint32_t seed, auto... s) { return hax::random::normal<float>(hax::random::make_key(seed), s...); }

template <class P>
void time_problem(benchmark::State& state, const P& pr, pass p) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(pr.run(p));
    Kokkos::fence();
  }
  // Model FLOPs of causal attention over all 12 query heads (the same for both layouts).
  const double flops = 2.0 * 2.0 * gqa_batch * gqa_heads * head_size * gqa_positions * (gqa_positions + 1) / 2.0;
  state.counters["causal_FLOP/s"] =
      benchmark::Counter(p == forward ? flops : 3.5 * flops, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_attention_gqa(benchmark::State& state) {
  const bool gqa = state.range(0) != 0;
  const auto p = static_cast<pass>(state.range(1));
  const auto B = gqa_batch * Batch;
  const auto P = gqa_positions * Pos;
  const auto N = gqa_positions * KPos;
  const auto D = head_size * Key;
  if (gqa) {
    const auto H = gqa_kv_heads * KvHead;
    const auto G = (gqa_heads / gqa_kv_heads) * QGroup;
    gqa_problem pr(normal(1, B, P, H, G, D), normal(2, B, N, H, D), normal(3, B, N, H, D), normal(4, B, P, H, G, D));
    time_problem(state, pr, p);
  } else {
    const auto H = gqa_heads * Head;
    gqa_problem pr(normal(1, B, P, H, D), normal(2, B, N, H, D), normal(3, B, N, H, D), normal(4, B, P, H, D));
    time_problem(state, pr, p);
  }
}
}  // namespace

BENCHMARK(BM_attention_gqa)
    ->ArgNames({"gqa", "backward"})
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({0, 1})
    ->Args({1, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--measure_memory") == 0) {
    haliax::runtime rt;
    return measure_memory();
  }
  if (std::getenv("HALIAX_BENCH_SKIP_MEMORY") == nullptr) load_peaks(argv[0]);
  haliax::runtime rt;
  bench::add_context();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
