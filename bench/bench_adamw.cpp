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
#include <levanter/distributed/tree_comm.hpp>
#include <levanter/optim/adamw.hpp>
#include <levanter/optim/hessian.hpp>
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

// The same model with its matrices as Linear weights (what Muon, Scion and Adam-mini group by): the embeddings as
// {vocab, embed} and {position, embed} tables, the norms and biases as flat leaves, each block's c_attn, c_proj, c_fc and mlp c_proj as {in, out} Linears
// (GPT-2's layout), one per layer (not Stacked).
inline constexpr struct E final : haliax::axis<"embed"> {
} E;
inline constexpr struct EOut final : haliax::axis<"embed_out"> {
} EOut;
inline constexpr struct Qkv final : haliax::axis<"qkv"> {
} Qkv;
inline constexpr struct Mlp final : haliax::axis<"mlp"> {
} Mlp;
struct gpt2_block {
  BOOST_HANA_DEFINE_STRUCT(gpt2_block, (hax::nn::Linear<hax::axes<E>, hax::axes<Qkv>>, c_attn),
                           (hax::nn::Linear<hax::axes<E>, hax::axes<EOut>>, c_proj),
                           (hax::nn::Linear<hax::axes<E>, hax::axes<Mlp>>, c_fc),
                           (hax::nn::Linear<hax::axes<Mlp>, hax::axes<EOut>>, mlp_proj));
};
inline constexpr struct Vocab final : haliax::axis<"vocab"> {
} Vocab;
inline constexpr struct Pos final : haliax::axis<"position"> {
} Pos;
using table = hax::named_array<float, hax::axes<Vocab, E>>;
using positions = hax::named_array<float, hax::axes<Pos, E>>;
struct gpt2_linears {
  BOOST_HANA_DEFINE_STRUCT(gpt2_linears, (table, wte), (positions, wpe), (std::vector<leaf>, flat),
                           (std::vector<gpt2_block>, blocks));
};

template <class A>
void fill(A& x, float value) {
  float* p = x.data();
  const int64_t n = x.element_count();
  hax::detail::thread_pool::instance().run((n + 65535) / 65536, [&](int64_t c) {
    for (int64_t i = c * 65536; i < std::min(n, (c + 1) * 65536); ++i) p[i] = value * static_cast<float>((i % 97) - 48);
  });
}

gpt2_linears make_linears(float value) {
  const int64_t e = 768, v = 50257, pos = 1024;
  gpt2_linears m;
  m.wte = table::allocate({v, e}, "bench::param");
  m.wpe = positions::allocate({pos, e}, "bench::param");
  fill(m.wte, value);
  fill(m.wpe, value);
  std::vector<int64_t> flat;
  for (int l = 0; l < 12; ++l)
    for (int64_t n : {e, e, 3 * e, e, e, e, 4 * e, e}) flat.push_back(n);  // ln_1, c_attn/c_proj biases, ln_2, ...
  flat.push_back(e);
  flat.push_back(e);
  for (int64_t n : flat) {
    auto x = leaf::allocate({n}, "bench::param");
    fill(x, value);
    m.flat.push_back(x);
  }
  for (int l = 0; l < 12; ++l) {
    gpt2_block b;
    b.c_attn.weight = decltype(b.c_attn.weight)::allocate({e, 3 * e}, "bench::param");
    b.c_proj.weight = decltype(b.c_proj.weight)::allocate({e, e}, "bench::param");
    b.c_fc.weight = decltype(b.c_fc.weight)::allocate({e, 4 * e}, "bench::param");
    b.mlp_proj.weight = decltype(b.mlp_proj.weight)::allocate({4 * e, e}, "bench::param");
    fill(b.c_attn.weight, value);
    fill(b.c_proj.weight, value);
    fill(b.c_fc.weight, value);
    fill(b.mlp_proj.weight, value);
    m.blocks.push_back(std::move(b));
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
template <class Model>
void run_model(benchmark::State& state, const levanter::OptimizerChoice& choice, Model params, Model grads) {
  auto opt = levanter::optim::make_optimizer(choice, 1000000, params);
  for (auto _ : state) {
    auto s = opt->update(params, grads, 1.0);
    benchmark::DoNotOptimize(s);
  }
  state.counters["params"] = static_cast<double>(hax::tree::parameter_count(params));
}
// `linears`: GPT-2's matrices as Linear weights (gpt2_linears), for the optimizers that treat them apart.
void run_type(benchmark::State& state, const char* type, double floats_moved, bool linears = false,
              const std::string& keys = "") {
  levanter::config::source_map sources;
  const auto node = levanter::config::load_yaml_string(std::string("{type: ") + type + keys + "}", "bench", sources);
  const auto choice = levanter::config::decode<levanter::OptimizerChoice>(node, "optimizer", sources);
  if (linears)
    run_model(state, choice, make_linears(1e-3f), make_linears(1e-4f));
  else
    run_model(state, choice, make(1e-3f), make(1e-4f));
  state.counters["bytes_per_second"] = benchmark::Counter(floats_moved * 4.0 * static_cast<double>(total()),
                                                          benchmark::Counter::kIsIterationInvariantRate);
}
void BM_opt_adam(benchmark::State& s) { run_type(s, "adam", 8); }
void BM_opt_lion(benchmark::State& s) { run_type(s, "lion", 1 + 5); }
void BM_opt_adopt(benchmark::State& s) { run_type(s, "adopt", 1 + 7); }
void BM_opt_rmsprop(benchmark::State& s) { run_type(s, "rmsprop", 1 + 7); }
void BM_opt_cautious(benchmark::State& s) { run_type(s, "cautious", 1 + 5 + 5); }
void BM_opt_mars(benchmark::State& s) { run_type(s, "mars", 1 + 2 + 9); }
// Muon and Scion: momentum into the scratch (buffer read and written, g read, scratch written), Newton-Schulz on the
// scratch (read and written, besides its GEMMs' flops), then p read and written and the scratch read. Adam-mini: the
// momentum and g^2 into the scratch, its means (scratch read and written), then p, the second moment and the
// momentum. (Counted for the matrices; the other leaves, Adam or signum, move 7 or 5.)
void BM_opt_muon(benchmark::State& s) { run_type(s, "muon", 1 + 4 + 2 + 3, true); }
void BM_opt_scion(benchmark::State& s) { run_type(s, "scion", 1 + 4 + 2 + 3, true); }
void BM_opt_mini(benchmark::State& s) { run_type(s, "mini", 1 + 4 + 2 + 6, true); }
// SOAP and Kron: the clipped gradient into the scratch, gathered whole, then per leaf their own state in blocks of
// 256 (counted: g read, scratch written and read twice, the moments or momentum read and written, p read and written;
// the GEMMs on the blocks are most of the time). SOAP's first update takes the eigenbases (eigh per factor).
void BM_opt_soap(benchmark::State& s) { run_type(s, "soap", 1 + 3 + 4 + 2, true); }
void BM_opt_kron(benchmark::State& s) { run_type(s, "kron", 1 + 3 + 2 + 2, true); }
// Sophia-H between re-estimates (update_interval out of reach): g read for its norm, then p read and written, g read,
// mu read and written, h read.
void BM_opt_sophia(benchmark::State& s) { run_type(s, "sophia-h", 1 + 6, false, ", update_interval: 1000000000"); }
// Sophia-H's probe direction alone: jax.random.normal per leaf, one threefry block and one inverse erf per parameter.
void BM_hessian_probe_direction(benchmark::State& state) {
  auto params = make(1e-3f);
  std::vector<std::int64_t> sizes;
  hax::tree::for_each_leaf(params, [&](const std::string&, const auto& l) { sizes.push_back(l.element_count()); });
  std::vector<float> v(static_cast<std::size_t>(total()));
  for (auto _ : state) {
    levanter::optim::hessian_probe_direction({1u, 2u}, sizes, 0, total(), v.data());
    benchmark::DoNotOptimize(v.data());
  }
  state.counters["params"] = static_cast<double>(total());
}
// A re-estimating update (every one here): h written too, and the product d read; plus, before it, what the trainer
// does besides its two extra gradients: the probe direction (a normal per parameter, threefry), the parameters
// perturbed twice and restored, and d from the two gradients (here the gradient stands in for both).
void BM_opt_sophia_reestimate(benchmark::State& state) {
  levanter::config::source_map sources;
  const auto node = levanter::config::load_yaml_string("{type: sophia-h, update_interval: 1}", "bench", sources);
  const auto choice = levanter::config::decode<levanter::OptimizerChoice>(node, "optimizer", sources);
  auto params = make(1e-3f), grads = make(1e-4f);
  auto opt = levanter::optim::make_optimizer(choice, 1000000, params);
  std::vector<std::int64_t> sizes;
  hax::tree::for_each_leaf(params, [&](const std::string&, const auto& l) { sizes.push_back(l.element_count()); });
  const std::int64_t n = total();
  std::vector<float> theta(static_cast<std::size_t>(n)), v(theta.size()), x(theta.size()), d(theta.size()),
      g(theta.size());
  levanter::distributed::copy_flat_range(params, theta.data(), 0, n, true);
  levanter::distributed::copy_flat_range(grads, g.data(), 0, n, true);
  for (auto _ : state) {
    const auto probe = opt->hessian_probe();
    levanter::optim::hessian_probe_direction(*probe, sizes, 0, n, v.data());
    for (float sgn : {1.0f, -1.0f}) {
      for (std::int64_t i = 0; i < n; ++i) x[i] = theta[i] + sgn * 1e-4f * v[i];
      levanter::distributed::copy_flat_range(params, x.data(), 0, n, false);
    }
    levanter::distributed::copy_flat_range(params, theta.data(), 0, n, false);
    levanter::optim::hessian_product(v.data(), g.data(), g.data(), 1e-4, n, d.data());
    opt->set_hessian_product(d, 0);
    auto s = opt->update(params, grads, 1.0);
    benchmark::DoNotOptimize(s);
    levanter::distributed::copy_flat_range(params, theta.data(), 0, n, true);
  }
  state.counters["params"] = static_cast<double>(n);
}

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
BENCHMARK(BM_opt_muon)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_opt_scion)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_opt_mini)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_opt_soap)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
BENCHMARK(BM_opt_kron)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
BENCHMARK(BM_hessian_probe_direction)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_opt_sophia)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_opt_sophia_reestimate)->Unit(benchmark::kMillisecond)->UseRealTime();

HALIAX_BENCHMARK_MAIN();
