// device_session --stage step / repro: training steps of GPT-2 124M and a 1B Llama as train_lm runs them (flash
// attention, the LM head's cross-entropy, AdamW with upstream's defaults; no gradient checkpointing, as the
// PyTorch peer), timed and counted.
#include <algorithm>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include <haliax/detail/tool_counters.hpp>
#include <levanter/models/gpt2.hpp>
#include <levanter/models/llama.hpp>
#include <levanter/optim/adamw.hpp>

#include "kit.hpp"

namespace kit {

namespace {

using shape_list = std::vector<std::array<std::int64_t, 3>>;

/// A model size for the stage: its config, vocabulary and the GEMM shapes of one layer and of the head (per token
/// count), with how many of each a forward pass runs.
struct gpt2_setup {
  using model = levanter::gpt2::LMHeadModel;
  levanter::Gpt2Config cfg;
  std::int64_t vocab = 50257;
  static gpt2_setup make(bool small, std::int64_t seq) {
    gpt2_setup s;
    if (small) {
      s.cfg.hidden_dim = 128;
      s.cfg.num_layers = 2;
      s.cfg.num_heads = 4;
      s.vocab = 2048;
    }
    s.cfg.seq_len = int(seq);
    s.cfg.gradient_checkpointing = false;
    return s;
  }
  std::string name(bool small) const { return small ? "GPT-2 (2 layers, 128 wide)" : "GPT-2 124M"; }
  void gemms(std::int64_t t, shape_list& shapes, std::vector<double>& counts) const {
    const std::int64_t E = cfg.hidden_dim, L = cfg.num_layers;
    shapes = {{t, 3 * E, E}, {t, E, E}, {t, 4 * E, E}, {t, E, 4 * E}, {t, vocab, E}};
    counts = {double(L), double(L), double(L), double(L), 1.0};
  }
  model init() const { return model::init(cfg, vocab, hax::random::make_key(0)); }
};

struct llama_setup {
  using model = levanter::llama::LMHeadModel;
  levanter::LlamaConfig cfg;
  std::int64_t vocab = 32000;
  static llama_setup make(bool small, std::int64_t seq) {
    llama_setup s;
    s.cfg.hidden_dim = small ? 128 : 2048;
    s.cfg.intermediate_dim = small ? 256 : 8192;
    s.cfg.num_layers = small ? 2 : 16;
    s.cfg.num_heads = small ? 4 : 32;
    s.cfg.num_kv_heads = small ? 2 : 8;
    if (small) s.vocab = 2048;
    s.cfg.seq_len = int(seq);
    s.cfg.gradient_checkpointing = false;
    return s;
  }
  std::string name(bool small) const { return small ? "Llama (2 layers, 128 wide, GQA)" : "Llama 1B (2048 x 16, GQA 32/8)"; }
  void gemms(std::int64_t t, shape_list& shapes, std::vector<double>& counts) const {
    const std::int64_t E = cfg.hidden_dim, I = cfg.intermediate_dim, L = cfg.num_layers;
    const std::int64_t kv = std::int64_t(cfg.num_kv_heads) * cfg.head_size();
    shapes = {{t, E, E}, {t, kv, E}, {t, I, E}, {t, E, I}, {t, vocab, E}};
    counts = {2.0 * double(L), 2.0 * double(L), 2.0 * double(L), double(L), 1.0};
  }
  model init() const { return model::init(cfg, vocab, hax::random::make_key(0)); }
};

/// FLOP-weighted rate of the vendor GEMM over `shapes`, each counted `counts[i]` times.
double weighted_rate(const shape_list& shapes, const std::vector<double>& counts, gemm_kind kind) {
  double flops = 0, secs = 0;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const auto& s = shapes[i];
    const double f = 2.0 * double(s[0]) * double(s[1]) * double(s[2]);
    const double r = vendor_gemm_rate({s}, kind);
    flops += counts[i] * f;
    secs += counts[i] * f / r;
  }
  return flops / secs;
}

std::uint64_t fnv1a(std::uint64_t h, const void* p, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001B3ull;
  return h;
}

template <class M>
std::uint64_t parameter_hash(const M& m) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  hax::tree::for_each_leaf(m, [&](const std::string&, const auto& leaf) {
    const auto v = leaf.to_host();
    h = fnv1a(h, v.data(), v.size() * sizeof(v[0]));
  });
  return h;
}

std::string hex_float(double x) {
  const float f = float(x);
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return fmt("%08x", u);
}

/// One model, optimizer and batch: a training step as train_lm runs it.
template <class Setup>
struct trainer {
  using M = typename Setup::model;
  const Setup& s;
  M model;
  levanter::optim::adamw opt;
  levanter::optim::adamw_state<M> st;
  levanter::lm_example ex;
  levanter::forward_options fo;

  trainer(const Setup& setup, std::int64_t batch, std::int64_t seq)
      : s(setup), model(setup.init()), opt(levanter::AdamConfig{}, 1000), st(opt.init(model)),
        ex(levanter::lm_example::causal(tokens(setup.vocab, batch, seq), 0)) {
    fo.inference = false;
  }
  static levanter::token_batch tokens(std::int64_t vocab, std::int64_t batch, std::int64_t seq) {
    std::vector<std::int32_t> t(std::size_t(batch * seq));
    // Token ids spread over the vocabulary, with no end-of-text token (id 0 is never drawn): one document a row.
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = std::int32_t(1 + (i * 2654435761u) % std::uint64_t(vocab - 1));
    return hax::from_host<std::int32_t>(t, batch * levanter::Batch, seq * levanter::Pos);
  }
  levanter::scalar loss(const M& m) const { return levanter::compute_next_token_loss(m, s.cfg, ex, 0.0, fo); }
  /// One step; returns the loss and adds the seconds of forward+backward and of the update (each fenced).
  double step(double* fwd_bwd = nullptr, double* update = nullptr) {
    Kokkos::fence();
    const double t0 = now_s();
    auto [l, g] = hax::value_and_grad([&](const M& m) { return loss(m); })(model);
    Kokkos::fence();
    const double t1 = now_s();
    const double value = l.item();
    opt.update(model, g, st, value);
    Kokkos::fence();
    if (fwd_bwd) *fwd_bwd += t1 - t0;
    if (update) *update += now_s() - t1;
    hax::buffer_cache_step_boundary();  // as the Trainer marks its steps
    return value;
  }
  double forward_only() {
    return timed([&] { (void)loss(model).item(); });
  }
};

template <class T>
T median(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// The largest batch whose step fits in 85% of the device's memory, from the arrays' peak at batch 1 and 2.
template <class Setup>
std::int64_t largest_batch(const Setup& setup, std::int64_t seq, bool small) {
  std::int64_t peak[2] = {0, 0};
  for (std::int64_t b : {1, 2}) {
    trainer<Setup> t(setup, b, seq);
    t.step();
    hax::reset_buffer_cache_peak();
    t.step();
    peak[b - 1] = std::int64_t(hax::buffer_cache_statistics().peak_leased_bytes);
  }
  hax::clear_buffer_cache();
  const std::int64_t per_seq = std::max<std::int64_t>(1, peak[1] - peak[0]);
  const std::int64_t base = peak[0] - per_seq;
  const auto mem = device_memory();
  const double avail = 0.85 * double(on_gpu() ? mem[0] : mem[1]);
  std::int64_t b = std::int64_t((avail - double(base)) / double(per_seq));
  b = std::min<std::int64_t>(b, small ? 16 : 512);
  if (b >= 16) b = b / 8 * 8;
  std::printf("largest batch: %.1f MiB per sequence, %.1f MiB fixed, %.1f GiB usable -> batch %lld\n",
              double(per_seq) / (1 << 20), double(base) / (1 << 20), avail / (1 << 30), (long long)b);
  return std::max<std::int64_t>(1, b);
}

template <class Setup>
int run_steps(const options& o, const Setup& setup, std::int64_t batch) {
  const std::string tag = !o.tag.empty() ? o.tag
                                         : fmt("%s-%s-%lldx%lld", o.model.c_str(), o.precision.c_str(),
                                               (long long)batch, (long long)o.seq);
  const std::string what = setup.name(o.small) + fmt(", %lld x %lld, %s", (long long)batch, (long long)o.seq,
                                                     o.precision.c_str());
  const bool bf16 = o.precision == "bf16";
  hax::matmul_precision_scope precision(bf16 ? hax::matmul_precision::bf16 : hax::matmul_precision::f32);
  const double t_init0 = now_s();
  trainer<Setup> t(setup, batch, o.seq);
  Kokkos::fence();
  const double init_s = now_s() - t_init0;
  const double params = double(hax::tree::parameter_count(t.model));
  const double tokens = double(batch * o.seq);

  const double first = timed([&] { t.step(); });
  std::vector<double> fb, up, total, losses;
  hax::reset_buffer_cache_peak();
  const auto cache0 = hax::buffer_cache_statistics();
  for (int i = 0; i < o.steps; ++i) {
    double a = 0, b = 0;
    const double t0 = now_s();
    losses.push_back(t.step(&a, &b));
    total.push_back(now_s() - t0);
    fb.push_back(a);
    up.push_back(b);
  }
  const auto cache1 = hax::buffer_cache_statistics();
  std::vector<double> fwd;
  for (int i = 0; i < std::max(1, o.steps); ++i) fwd.push_back(t.forward_only());

  // One more step with the counters listening (Kokkos then fences after each kernel: not timed).
  hax::detail::tools::counter counter;
  const auto cache2 = hax::buffer_cache_statistics();
  const auto dispatch0 = hax::kernels::dispatched();
  counter.start();
  t.step();
  const auto n = counter.stop();
  const auto dispatch = hax::kernels::dispatched() - dispatch0;
  const auto cache3 = hax::buffer_cache_statistics();
  // what the step allocated besides the buffer cache's misses (scratch views, mirrors, tables): none is the aim
  const std::int64_t outside_cache = n.allocations - (cache3.misses - cache2.misses);

  const double s_step = median(total), s_fb = median(fb), s_up = median(up), s_fwd = median(fwd);
  const double tps = tokens / s_step;
  const double model_flops = 6.0 * params * tokens / s_step;
  shape_list shapes;
  std::vector<double> counts;
  setup.gemms(std::int64_t(tokens), shapes, counts);
  const gemm_kind ref_kind = gemm_available(gemm_kind::bf16) ? gemm_kind::bf16 : gemm_kind::f32;
  const double ref_rate = weighted_rate(shapes, counts, ref_kind);
  const std::string sec = "step: " + what;
  std::printf("%s: %.4f s/step (first %.3f s, init %.2f s), %.0f tokens/s, forward %.4f s, backward %.4f s, update %.4f s\n",
              what.c_str(), s_step, first, init_s, tps, s_fwd, s_fb - s_fwd, s_up);
  row(sec, "time per step", fmt("%.4f s", s_step), fmt("%.0f tokens/s", tps),
      fmt("median of %d; first step %.2f s", o.steps, first));
  row(sec, "forward / backward / update", fmt("%.4f / %.4f / %.4f s", s_fwd, s_fb - s_fwd, s_up), "",
      "backward = forward+backward - a forward alone");
  row(sec, "MFU (6 x params x tokens/s)", fmt("%.4f", model_flops / ref_rate),
      on_gpu() ? fmt("%.4f of 989 TFLOP/s", model_flops / 989e12) : "",
      rate_str(model_flops) + " of model arithmetic; vendor " + name_of(ref_kind) + " GEMM on these shapes " +
          rate_str(ref_rate));
  row(sec, "per step: kernels, GEMMs, fences, deep copies",
      fmt("%lld, %lld, %lld, %lld", (long long)n.kernels, (long long)n.gemms, (long long)n.fences, (long long)n.deep_copies));
  row(sec, "per step: allocations, cache misses",
      fmt("%lld (%.0f MB), %.1f (%.0f MB)", (long long)n.allocations, double(n.allocated_bytes) * 1e-6,
          double(cache1.misses - cache0.misses) / o.steps, double(cache1.miss_bytes - cache0.miss_bytes) * 1e-6 / o.steps),
      "", fmt("arrays' peak %.2f GiB", double(cache1.peak_leased_bytes) / (1 << 30)));
  row(sec, "per step: allocations besides buffer-cache misses", fmt("%lld", (long long)outside_cache), "",
      "scratch views, mirrors and tables allocated in a steady-state step (the aim is none)");
  row(sec, "per step: device synchronisations (fences + deep copies + allocations)",
      fmt("%lld", (long long)(n.fences + n.deep_copies + n.allocations)), "",
      "each fences a GPU; the deep copies by label are in the log (the aim is one read-back a step)");
  {
    // Which implementation each kernel family ran (haliax/kernels.hpp): cuBLAS shows as gemm's vendor dispatches.
    std::string fam;
    for (int f = 0; f < hax::kernels::family_count; ++f) {
      const auto kf = static_cast<hax::kernels::family>(f);
      fam += fmt("%s%s %lld/%lld/%lld", f ? ", " : "", hax::kernels::family_name(kf),
                 (long long)dispatch(kf, hax::kernels::impl::vendor), (long long)dispatch(kf, hax::kernels::impl::host),
                 (long long)dispatch(kf, hax::kernels::impl::portable));
    }
    row(sec, "per step: kernel families, vendor/host/portable dispatches", fam, "",
        "HALIAX_VENDOR_KERNELS=0 runs every family portable (docs/haliax.md, \"Kernels and the vendor seam\")");
  }
  {
    std::vector<std::pair<std::int64_t, std::string>> by_count;
    for (const auto& [label, k] : n.allocation_labels) by_count.push_back({k, label});
    std::sort(by_count.rbegin(), by_count.rend());
    std::string top;
    for (std::size_t i = 0; i < by_count.size() && i < 12; ++i)
      top += fmt("%s%s x%lld", i ? ", " : "", by_count[i].second.c_str(), (long long)by_count[i].first);
    std::printf("allocations in the counted step by label: %s\n", top.empty() ? "none" : top.c_str());
    by_count.clear();
    for (const auto& [label, k] : n.copy_labels) by_count.push_back({k, label});
    std::sort(by_count.rbegin(), by_count.rend());
    top.clear();
    for (std::size_t i = 0; i < by_count.size() && i < 12; ++i)
      top += fmt("%s%s x%lld", i ? ", " : "", by_count[i].second.c_str(), (long long)by_count[i].first);
    std::printf("deep copies in the counted step by label: %s\n", top.empty() ? "none" : top.c_str());
  }
  std::string lossline;
  for (double l : losses) lossline += fmt("%.4f ", l);
  std::printf("losses: %s\n", lossline.c_str());

  if (o.kernels) {
    hax::detail::tools::kernel_timer timer;
    timer.start();
    const double t0 = now_s();
    t.step();
    const double wall = now_s() - t0;
    const auto rows = timer.stop();
    double sum = 0;
    for (const auto& r : rows) sum += r.self_seconds;
    const std::string path = o.out + "/kernels-" + tag + ".tsv";
    std::ofstream f(path);
    f << "name\tcalls\tself_ms\tinclusive_ms\tshare_of_step\n";
    for (const auto& r : rows)
      f << r.name << '\t' << r.calls << '\t' << r.self_seconds * 1e3 << '\t' << r.seconds * 1e3 << '\t'
        << (sum > 0 ? r.self_seconds / sum : 0.0) << '\n';
    std::printf("device time of one step by kernel (self, %.1f ms in all, %.1f ms wall with fences): %s\n", sum * 1e3,
                wall * 1e3, path.c_str());
    for (std::size_t i = 0; i < rows.size() && i < 25; ++i)
      std::printf("  %8.3f ms %6.1f%% %5lld x  %s\n", rows[i].self_seconds * 1e3, 100 * rows[i].self_seconds / sum,
                  (long long)rows[i].calls, rows[i].name.c_str());
    for (std::size_t i = 0; i < rows.size() && i < 6; ++i)
      row("kernels: " + what, rows[i].name, fmt("%.2f ms", rows[i].self_seconds * 1e3),
          fmt("%.1f%% of the step's device time", 100 * rows[i].self_seconds / sum), fmt("%lld calls", (long long)rows[i].calls));
  }
  return 0;
}

template <class Setup>
int step_stage(const options& o, const Setup& setup) {
  if (o.batch > 0) return run_steps(o, setup, o.batch);
  std::int64_t b = largest_batch(setup, o.seq, o.small);
  for (int attempt = 0; attempt < 3; ++attempt) {
    try {
      return run_steps(o, setup, b);
    } catch (const std::exception& e) {
      std::printf("batch %lld did not fit (%s)\n", (long long)b, e.what());
      hax::clear_buffer_cache();
      b = std::max<std::int64_t>(1, b * 3 / 4 / 8 * 8);
    }
  }
  throw std::runtime_error("no batch size fitted after three tries");
}

}  // namespace

int stage_step(const options& o) {
  if (o.model == "gpt2") return step_stage(o, gpt2_setup::make(o.small, o.seq));
  return step_stage(o, llama_setup::make(o.small, o.seq));
}

int stage_repro(const options& o) {
  // A short run whose losses and final parameters two fresh processes must reproduce bit for bit.
  const auto setup = gpt2_setup::make(o.small, o.seq);
  hax::matmul_precision_scope precision(o.precision == "bf16" ? hax::matmul_precision::bf16 : hax::matmul_precision::f32);
  trainer<gpt2_setup> t(setup, o.batch, o.seq);
  std::string losses;
  for (int i = 0; i < o.steps; ++i) {
    const double l = t.step();
    std::printf("@repro loss %d %s %.6f\n", i, hex_float(l).c_str(), l);
    losses += hex_float(l) + " ";
  }
  const std::uint64_t h = parameter_hash(t.model);
  std::printf("@repro params %016llx\n", (unsigned long long)h);
  row("reproducibility", fmt("%s, %lld x %lld, %s, %d steps", setup.name(o.small).c_str(), (long long)o.batch,
                             (long long)o.seq, o.precision.c_str(), o.steps),
      fmt("parameters %016llx", (unsigned long long)h), "", "losses " + losses);
  return 0;
}

}  // namespace kit
