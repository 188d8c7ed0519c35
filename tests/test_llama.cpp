// The Llama family (levanter/models/llama*.hpp) against the goldens of tests/oracle/gen_hf_llama_golden.py and
// gen_levanter_llama_grads.py (tests/golden/hf_llama/): tiny random Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma 2 and
// Gemma 3 models (gen_hf_gemma_golden.py) written
// by `transformers`, their logits and next-token-loss gradients on fixed tokens (torch), and the same gradients
// from upstream Levanter (JAX) where upstream computes the same function. Cases cover MHA, GQA, MQA, every RoPE
// type, sliding windows, q/k/v biases, QK norm, an explicit head_dim, tied and untied heads, Gemma's (1 + w) norms,
// soft-capping, query_pre_attn_scalar and local layers with their own RoPE, OLMo 2's post-norm layers and
// whole-projection QK norms. Also: RoPE tables,
// RoPE's finite-difference gradient, upstream's init from PRNGKey(0), Hugging Face export → import bitwise, and
// config checks.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <haliax/haliax.hpp>
#include <levanter/checkpoint/h5.hpp>
#include <levanter/config/validate.hpp>
#include <levanter/layers/attention.hpp>
#include <levanter/layers/moe.hpp>
#include <levanter/models/llama_hf.hpp>
#include <levanter/models/registry.hpp>

#include "gradcheck.hpp"
#include "h5_golden.hpp"
#include "llama_configs.hpp"

namespace fs = std::filesystem;
namespace hax = haliax;
namespace nn = haliax::nn;
using levanter::LlamaConfig;
using levanter::llama::LMHeadModel;

namespace {

const std::string golden = std::string(HALIAX_GOLDEN_DIR) + "/hf_llama";

// The Gemma and OLMo 2 cases come from gen_hf_gemma_golden.py and gen_hf_olmo2_golden.py (this model with another
// config).
const char* const cases[] = {"llama_mha", "llama_gqa_tied_linear", "llama_mqa_llama3", "llama_yarn_headdim",
                             "mistral_sw", "qwen2_sw",          "qwen3",           "gemma_mqa",
                             "gemma_gqa", "gemma2_softcap", "gemma3_local", "olmo2_gqa", "olmo2_tied_llama3",
                             "mixtral_top2", "mixtral_top1"};

using test_llama::base_for;

struct imported {
  LlamaConfig cfg;
  LMHeadModel model;
  std::int64_t vocab = 0;
};

imported import_case(const std::string& name) {
  auto d = levanter::hf::open_dir(golden + "/" + name, "test");
  imported r;
  r.cfg = levanter::hf::config_from_hf<LMHeadModel>(base_for(d.model_type), d);
  r.vocab = d.vocab_size;
  r.model = LMHeadModel::init(r.cfg, r.vocab, hax::random::make_key(0));
  levanter::hf::load(d, r.model, r.cfg);
  return r;
}

struct batch {
  levanter::token_batch tokens;
  levanter::lm_example ex;
  std::int64_t b = 0, s = 0;
};

/// The golden tokens as one document per row, the loss over positions 0..s-2 (as the generator's loss).
batch golden_batch(const h5golden::file& f) {
  std::vector<std::int64_t> dims;
  auto t = f.ints("tokens", &dims);
  batch r;
  r.b = dims[0];
  r.s = dims[1];
  r.tokens = hax::from_host<std::int32_t>(t, r.b * levanter::Batch, r.s * levanter::Pos);
  r.ex.tokens = r.tokens;
  r.ex.segment_ids = hax::zeros<std::int32_t>(r.b * levanter::Batch, r.s * levanter::Pos);
  std::vector<bool> mask(static_cast<std::size_t>(r.b * r.s));
  for (std::int64_t i = 0; i < r.b; ++i)
    for (std::int64_t j = 0; j < r.s; ++j) mask[i * r.s + j] = j + 1 < r.s;
  r.ex.loss_mask = hax::from_host(mask, r.b * levanter::Batch, r.s * levanter::Pos);
  return r;
}

double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float x : a) m = std::max(m, double(std::fabs(x)));
  return m;
}
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

/// Every float leaf of a model by Hugging Face tensor name (stacked leaves split per layer).
std::map<std::string, std::vector<float>> by_hf_name(const LMHeadModel& m) {
  using A = levanter::hf::hf_adapter<LMHeadModel>;
  std::map<std::string, std::vector<float>> out;
  hax::tree::for_each_leaf(m, [&](const std::string& name, const auto& leaf) {
    const auto host = leaf.to_host();
    levanter::hf::detail::host_copy(name, host.data(), host.size(), A::hf_name(name), leaf.sizes()[0], out,
                                    levanter::hf::detail::second_axis(leaf));
  });
  return out;
}

/// The loss's derivative along its own (normalised) gradient, by central differences of step h, against |g|: a
/// check of the whole model's gradient that needs no double build.
void check_gradient_by_finite_differences(const LMHeadModel& model, const LlamaConfig& cfg,
                                          const levanter::lm_example& ex, double h = 1e-2) {
  auto loss_of = [&](const LMHeadModel& p) { return levanter::compute_next_token_loss(p, cfg, ex); };
  auto loss_grads = hax::value_and_grad(loss_of)(model);  // not a structured binding: clang before 16 cannot capture one
  auto& grads = std::get<1>(loss_grads);
  double gnorm2 = 0;
  hax::tree::for_each_leaf(grads, [&](const std::string&, const auto& g) {
    for (float x : g.to_host()) gnorm2 += double(x) * x;
  });
  const double gnorm = std::sqrt(gnorm2);
  auto shifted = [&](double t) {
    LMHeadModel out = model;
    LMHeadModel g = grads;
    hax::tree::zip_leaves(out, g, [&](const std::string&, auto& p, auto& gl) { p = p + gl * float(t / gnorm); });
    return out;
  };
  hax::no_grad_guard ng;
  const double fd = (double(loss_of(shifted(h)).item()) - double(loss_of(shifted(-h)).item())) / (2 * h);
  CHECK(fd == doctest::Approx(gnorm).epsilon(2e-2));
}

/// `c` at a tiny size (16 wide, 2 layers, 4 heads over 2 KV heads).
LlamaConfig tiny_of(LlamaConfig c) {
  c.seq_len = 16;
  c.hidden_dim = 16;
  c.intermediate_dim = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  return c;
}

levanter::config::validation_result validate_cfg(const LlamaConfig& c) {
  const levanter::config::source_map none;
  levanter::config::validator v{none, {}};
  levanter::validate(v, c);
  return v.result;
}

}  // namespace

TEST_CASE("llama family: Hugging Face import reproduces transformers' logits for every case") {
  for (const char* name : cases) {
    CAPTURE(name);
    auto [cfg, model, vocab] = import_case(name);
    h5golden::file f(golden + "/" + std::string(name) + "_golden.h5");
    auto b = golden_batch(f);
    hax::no_grad_guard ng;
    const auto ours = levanter::lm_logits(model, cfg, b.tokens, b.ex.segment_ids).to_host();
    const auto want = f.floats("logits");
    const double tol = 1e-5 * std::max(1.0, max_abs(want));
    CHECK(max_abs_diff(ours, want) <= tol);
    // the plain attention path computes the same function
    auto vanilla = cfg;
    vanilla.attn_backend = "vanilla";
    CHECK(max_abs_diff(levanter::lm_logits(model, vanilla, b.tokens, b.ex.segment_ids).to_host(), want) <= tol);
  }
}

TEST_CASE("llama family: the next-token loss and its gradients equal torch's and upstream Levanter's") {
  for (const char* name : cases) {
    CAPTURE(name);
    auto ic = import_case(name);  // not a structured binding: clang before 16 cannot capture one
    auto& cfg = ic.cfg;
    auto& model = ic.model;
    const auto vocab = ic.vocab;
    h5golden::file f(golden + "/" + std::string(name) + "_golden.h5");
    auto b = golden_batch(f);
    cfg.lbl_coef.reset();  // Mixtral: torch's loss is the cross-entropy alone (the auxiliary losses: below)
    cfg.rzl_coef.reset();
    auto [loss, grads] = hax::value_and_grad(
        [&](const LMHeadModel& p) { return levanter::compute_next_token_loss(p, cfg, b.ex); })(model);
    CHECK(std::fabs(loss.item() - f.floats("loss")[0]) <= 1e-5 * std::max(1.0f, std::fabs(f.floats("loss")[0])));
    const auto ours = by_hf_name(grads);
    const bool lev = f.has("levanter_grads") && f.attr("levanter_matches_torch") == 1.0;
    int compared = 0;
    for (const auto& hf_g : ours) {
      const auto& hf = hf_g.first;  // not a structured binding: clang before 16 cannot capture one
      const auto& g = hf_g.second;
      CAPTURE(hf);
      const auto want = f.floats("grads/" + hf);
      CHECK(max_abs_diff(g, want) <= 1e-4 * std::max(1e-3, max_abs(want)));
      if (lev) {
        const auto lw = f.floats("levanter_grads/" + hf);
        CHECK(max_abs_diff(g, lw) <= 1e-4 * std::max(1e-3, max_abs(lw)));
      }
      ++compared;
    }
    CHECK(compared == static_cast<int>(levanter::hf::hf_adapter<LMHeadModel>::hf_layout(cfg, vocab).size()));
  }
}

TEST_CASE("llama family: RoPE frequencies and tables equal transformers' for every type") {
  for (const char* name : cases) {
    CAPTURE(name);
    auto d = levanter::hf::open_dir(golden + "/" + std::string(name), "test");
    auto cfg = levanter::hf::config_from_hf<LMHeadModel>(base_for(d.model_type), d);
    h5golden::file f(golden + "/" + std::string(name) + "_golden.h5");
    const auto spec = levanter::rope_spec_of(cfg.rope);
    const auto inv = nn::rope_inv_freq(spec, cfg.head_size());
    const auto want = f.floats("rope_inv_freq");
    REQUIRE(inv.size() == want.size());
    for (std::size_t i = 0; i < inv.size(); ++i) CHECK(inv[i] == doctest::Approx(want[i]).epsilon(1e-6));
    CHECK(nn::rope_attention_scaling(spec) == doctest::Approx(f.floats("rope_attention_scaling")[0]).epsilon(1e-6));
  }
}

TEST_CASE("rotary embeddings: gradient by finite differences, inverse rotation, errors") {
  struct P final : hax::axis<"position"> {};
  struct H final : hax::axis<"head_size"> {};
  struct B final : hax::axis<"batch"> {};
  nn::rope_spec s;
  s.kind = nn::rope_kind::llama3;
  s.theta = 100.0;
  s.original_max_position_embeddings = 8;
  auto tf = nn::rope_tables(5 * P{}, 6 * H{}, s, 3);
  // double tables for the check (the kernel is generic over the element type)
  auto x = hax::astype<double>(hax::random::normal(hax::random::make_key(3), 2 * B{}, 5 * P{}, 6 * H{}));
  gradcheck::check_output_gradient([&](const auto& v) { return nn::apply_rotary(v, tf, P{}, H{}); }, x);
  // a rotation keeps the norm of each pair
  hax::no_grad_guard ng;
  auto y = nn::apply_rotary(x, tf, P{}, H{});
  CHECK(hax::sum(hax::square(y)).item() == doctest::Approx(hax::sum(hax::square(x)).item()).epsilon(1e-5));
  auto wrong = nn::rope_tables(4 * P{}, 6 * H{}, s);
  CHECK_THROWS_AS(nn::apply_rotary(x, wrong, P{}, H{}), hax::shape_error);
  CHECK_THROWS_AS(nn::rope_inv_freq(s, 5), std::invalid_argument);
}

TEST_CASE("llama family: Hugging Face export then import is bitwise, config.json round-trips") {
  for (const char* name : cases) {
    CAPTURE(name);
    auto [cfg, model, vocab] = import_case(name);
    const fs::path dir =
        fs::temp_directory_path() / ("levanter_test_llama_" + std::string(name) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    levanter::hf::save(model, cfg, vocab, dir.string(), {0, 1});
    auto d = levanter::hf::open_dir(dir.string(), "test");
    auto cfg2 = levanter::hf::config_from_hf<LMHeadModel>(base_for(d.model_type), d);
    CHECK_NOTHROW(levanter::hf::check_matches<LMHeadModel>(cfg, d, "export"));
    auto back = LMHeadModel::init(cfg2, vocab, hax::random::make_key(1));
    levanter::hf::load(d, back, cfg2);
    const auto a = by_hf_name(model), b = by_hf_name(back);
    REQUIRE(a.size() == b.size());
    for (const auto& kv : a) {
      const auto& k = kv.first;  // not a structured binding: clang before 16 cannot capture one
      CAPTURE(k);
      CHECK(kv.second == b.at(k));
    }
    fs::remove_all(dir);

    // For the transformers oracle (tests/oracle/check_hf_llama_export.py): an export of a model of ours (the
    // golden weights scaled, so it is not transformers' own model) with our logits.
    if (const char* out = std::getenv("LEVANTER_HF_EXPORT_CHECK_DIR")) {
      const fs::path o = fs::path(out) / name;
      fs::remove_all(o);
      const auto ours = hax::tree::map(model, [](const std::string&, const auto& x) { return x * 1.25f; });
      levanter::hf::save(ours, cfg, vocab, o.string(), {0, 1});
      h5golden::file f(golden + "/" + std::string(name) + "_golden.h5");
      auto b = golden_batch(f);
      hax::no_grad_guard ng;
      levanter::checkpoint::snapshot snap;
      snap.add("tokens", b.tokens);
      snap.add("logits", levanter::lm_logits(ours, cfg, b.tokens, b.ex.segment_ids));
      snap.write((o / "levanter_logits.h5").string());
      MESSAGE("wrote an export for check_hf_llama_export.py to " << o.string());
    }
  }
}

TEST_CASE("llama family: a directory of another model_type or architecture is refused, naming it") {
  auto d = levanter::hf::open_dir(golden + "/mistral_sw", "test");
  CHECK_THROWS_WITH_AS(levanter::hf::config_from_hf<LMHeadModel>(LlamaConfig{}, d),
                       doctest::Contains("set model.type: mistral"), levanter::hf::error);
  auto q = levanter::hf::open_dir(golden + "/qwen2_sw", "test");
  CHECK_THROWS_WITH_AS(levanter::hf::config_from_hf<LMHeadModel>(levanter::Qwen3Config{}, q),
                       doctest::Contains("set model.type: qwen"), levanter::hf::error);
  auto l = levanter::hf::open_dir(golden + "/llama_mha", "test");
  auto cfg = levanter::hf::config_from_hf<LMHeadModel>(LlamaConfig{}, l);
  cfg.num_kv_heads = 2;
  CHECK_THROWS_WITH_AS(levanter::hf::check_matches<LMHeadModel>(cfg, l, "here"),
                       doctest::Contains("num_key_value_heads"), levanter::hf::error);
  // the choice for a directory follows its model_type
  CHECK(levanter::as_model_choice(levanter::hf::config_from_hf<LMHeadModel>(levanter::QwenConfig{}, q)).type_name() ==
        "qwen");
}

TEST_CASE("llama family: upstream init from PRNGKey(0) equals upstream Levanter's parameters") {
  const std::string path = golden + "/levanter_init.h5";
  REQUIRE(fs::exists(path));
  h5golden::file f(path);
  LlamaConfig c;
  c.seq_len = 64;
  c.hidden_dim = 32;
  c.intermediate_dim = 40;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  auto m = LMHeadModel::init(c, 64, hax::random::make_key(0));
  int compared = 0;
  hax::tree::for_each_leaf(m, [&](const std::string& name, const auto& leaf) {
    CAPTURE(name);
    std::string path = "params/" + name;
    std::replace(path.begin(), path.end(), '.', '/');
    REQUIRE(f.has(path));
    std::vector<std::int64_t> dims;
    const auto want = f.floats(path, &dims);
    CHECK(dims == std::vector<std::int64_t>(leaf.sizes().begin(), leaf.sizes().end()));
    CHECK(max_abs_diff(leaf.to_host(), want) <= 1e-6 * std::max(1.0, max_abs(want)));
    ++compared;
  });
  CHECK(compared == 12);
}

TEST_CASE("llama family: config checks name the key") {
  LlamaConfig c;
  c.num_heads = 6;
  c.num_kv_heads = 4;
  auto r = validate_cfg(c);
  REQUIRE(!r.errors.empty());
  CHECK(r.errors[0].find("model.num_kv_heads") != std::string::npos);
  LlamaConfig odd;
  odd.hidden_dim = 36;
  odd.num_heads = 4;
  odd.num_kv_heads = 4;  // head size 9
  CHECK(!validate_cfg(odd).errors.empty());
  levanter::MistralConfig m;
  m.tie_word_embeddings = true;
  CHECK(!validate_cfg(m).errors.empty());
  levanter::QwenConfig q;
  q.use_sliding_window = true;
  q.sliding_window.reset();
  CHECK(!validate_cfg(q).errors.empty());
  LlamaConfig ok;
  CHECK(validate_cfg(ok).errors.empty());
  // parameter counts: tied vs untied differ by the head
  LlamaConfig t = ok;
  t.tie_word_embeddings = true;
  CHECK(ok.parameter_count(1000) - t.parameter_count(1000) == 1000 * ok.hidden_dim);
  // a real tiny model has exactly the counted parameters
  LlamaConfig tiny = tiny_of(LlamaConfig{});
  for (auto fam : {&levanter::llama_family::llama, &levanter::llama_family::qwen2, &levanter::llama_family::qwen3}) {
    tiny.family = fam;
    auto mm = LMHeadModel::init(tiny, 50, hax::random::make_key(2));
    CHECK(hax::tree::parameter_count(mm) == tiny.parameter_count(50));
  }
}

TEST_CASE("gemma: the cases exercise what they claim (soft caps bite, local layers and their RoPE, norms)") {
  {
    auto [cfg, model, vocab] = import_case("gemma2_softcap");
    CHECK(cfg.family == &levanter::llama_family::gemma2);
    CHECK(cfg.attn_logit_softcapping == 0.5);
    CHECK(cfg.final_logit_softcapping == 1.0);
    CHECK(cfg.query_pre_attn_scalar == 12.0);
    CHECK(cfg.window_of_layer(0) == 4);
    CHECK(cfg.window_of_layer(1) == 0);
    CHECK(cfg.tied());
    CHECK(cfg.activation_function == "gelu_new");
    h5golden::file f(golden + "/gemma2_softcap_golden.h5");
    auto b = golden_batch(f);
    const auto want = f.floats("logits");
    hax::no_grad_guard ng;
    // each of the three changes the logits by far more than the tolerance: dropping one is caught
    for (int drop = 0; drop < 3; ++drop) {
      auto c = cfg;
      if (drop == 0) c.attn_logit_softcapping.reset();
      if (drop == 1) c.final_logit_softcapping.reset();
      if (drop == 2) c.query_pre_attn_scalar.reset();
      CAPTURE(drop);
      CHECK(max_abs_diff(levanter::lm_logits(model, c, b.tokens, b.ex.segment_ids).to_host(), want) > 1e-3);
    }
    // the final soft cap bounds the logits
    for (float z : levanter::lm_logits(model, cfg, b.tokens, b.ex.segment_ids).to_host()) CHECK(std::fabs(z) < 1.0f);
    // with a block size the loss is computed unblocked (the cap needs every logit), and equals torch's
    auto blocked = cfg;
    blocked.cross_entropy_block_size = 16;
    CHECK(std::fabs(levanter::compute_next_token_loss(model, blocked, b.ex).item() - f.floats("loss")[0]) <= 1e-5);
    auto r = validate_cfg(blocked);
    CHECK(r.errors.empty());
  }
  {
    auto [cfg, model, vocab] = import_case("gemma3_local");
    CHECK(cfg.family == &levanter::llama_family::gemma3);
    CHECK(cfg.sliding_window_pattern == 3);
    CHECK(cfg.rope_local_base_freq == 100.0);
    CHECK(cfg.qk_norm());
    CHECK((cfg.local_layer(0) && cfg.local_layer(1) && !cfg.local_layer(2)));
    CHECK(std::get<levanter::DefaultRopeConfig>(cfg.rope_of_layer(0).value).theta == 100.0);
    CHECK(std::holds_alternative<levanter::LinearRopeConfig>(cfg.rope_of_layer(2).value));
    // Upstream treats every layer as global: that computes another function (recorded in docs/models.md).
    h5golden::file f(golden + "/gemma3_local_golden.h5");
    auto b = golden_batch(f);
    hax::no_grad_guard ng;
    auto all_global = cfg;
    all_global.sliding_window_pattern.reset();
    CHECK(max_abs_diff(levanter::lm_logits(model, all_global, b.tokens, b.ex.segment_ids).to_host(),
                       f.floats("logits")) > 1e-3);
  }
  {
    auto [cfg, model, vocab] = import_case("gemma_mqa");
    CHECK(cfg.family == &levanter::llama_family::gemma);
    CHECK(cfg.num_kv_heads == 1);
    CHECK(cfg.head_size() == 16);
    // the norms are Gemma's: stored weight w, scale 1 + w
    CHECK(model.transformer.norm.unit_offset);
    CHECK(cfg.embedding_scale() == double(std::sqrt(32.0f)));
  }
}

TEST_CASE("gemma and olmo2: upstream Levanter computes the same function where it should, and not where recorded") {
  // gen_levanter_llama_grads.py: upstream's gradients are compared in the loss/gradient test above when it matches.
  for (const char* name : {"gemma_gqa", "olmo2_gqa"}) {
    CAPTURE(name);
    h5golden::file f(golden + "/" + std::string(name) + "_golden.h5");
    REQUIRE(f.has("levanter_grads"));
    CHECK(f.attr("levanter_matches_torch") == 1.0);
  }
  // upstream ignores query_pre_attn_scalar, the final cap and the windows (Gemma 2), and local layers (Gemma 3)
  for (const char* name : {"gemma2_softcap", "gemma3_local"}) {
    CAPTURE(name);
    h5golden::file f(golden + "/" + std::string(name) + "_golden.h5");
    REQUIRE(f.has("levanter_grads"));
    CHECK(f.attr("levanter_matches_torch") == 0.0);
  }
}

TEST_CASE("gemma: upstream defaults, init, parameter counts and config checks") {
  levanter::GemmaConfig g;
  CHECK(g.seq_len == 8192);
  CHECK(g.hidden_dim == 2048);
  CHECK(g.intermediate_dim == 16384);
  CHECK(g.num_layers == 18);
  CHECK(g.num_heads == 8);
  CHECK(g.head_size() == 256);
  CHECK(g.num_kv_heads == 1);
  CHECK(g.activation_function == "gelu_new");
  CHECK(g.tied());
  CHECK(validate_cfg(g).errors.empty());
  levanter::Gemma2Config g2;
  CHECK(g2.query_pre_attn_scalar == 256.0);
  CHECK(g2.attn_logit_softcapping == 50.0);
  CHECK(g2.final_logit_softcapping == 30.0);
  CHECK(!g2.sliding_window);
  levanter::Gemma3Config g3;
  CHECK(g3.qk_norm());
  CHECK((!g3.attn_logit_softcapping && !g3.final_logit_softcapping && !g3.sliding_window_pattern));
  CHECK(g3.rope_local_base_freq == 10000.0);
  // tiny models: exactly the counted parameters; norms start at 0 (scale 1); the four norms of Gemma 2/3
  for (LlamaConfig c : {tiny_of(levanter::GemmaConfig{}), tiny_of(levanter::Gemma2Config{}),
                        tiny_of(levanter::Gemma3Config{})}) {
    c.head_dim = 8;
    CAPTURE(levanter::family_type_name(c.family));
    auto m = LMHeadModel::init(c, 50, hax::random::make_key(2));
    CHECK(hax::tree::parameter_count(m) == c.parameter_count(50));
    for (float w : m.transformer.norm.weight->to_host()) CHECK(w == 0.0f);
    CHECK(m.transformer.layers.stacked.pre_feedforward_layernorm.has_value() == c.sandwich_norms());
    CHECK(!m.lm_head);
  }
  // the checks name the key
  levanter::GemmaConfig bad;
  bad.use_bias = true;
  bad.hybrid_norm = true;
  bad.use_layer_norm_weight = false;
  auto r = validate_cfg(bad);
  REQUIRE(r.errors.size() >= 3);
  std::string all;
  for (const auto& e : r.errors) all += e + "\n";
  CHECK(all.find("model.use_bias") != std::string::npos);
  CHECK(all.find("model.hybrid_norm") != std::string::npos);
  CHECK(all.find("model.use_layer_norm_weight") != std::string::npos);
  levanter::Gemma2Config neg;
  neg.attn_logit_softcapping = -1.0;
  neg.query_pre_attn_scalar = 0.0;
  auto rn = validate_cfg(neg);
  REQUIRE(rn.errors.size() >= 2);
  CHECK(rn.errors[0].find("model.") != std::string::npos);
  // a Gemma 2 directory is not a Gemma 3 one
  auto d = levanter::hf::open_dir(golden + "/gemma2_softcap", "test");
  CHECK_THROWS_WITH_AS(levanter::hf::config_from_hf<LMHeadModel>(levanter::Gemma3Config{}, d),
                       doctest::Contains("set model.type: gemma2"), levanter::hf::error);
  auto d3 = levanter::hf::open_dir(golden + "/gemma3_local", "test");
  CHECK_THROWS_WITH_AS(levanter::hf::config_from_hf<LMHeadModel>(LlamaConfig{}, d3),
                       doctest::Contains("set model.type: gemma3"), levanter::hf::error);
}

TEST_CASE("gemma: the gradient of the whole model by finite differences (soft caps, local layers, (1 + w) norms)") {
  for (const char* name : {"gemma2_softcap", "gemma3_local"}) {
    CAPTURE(name);
    auto [cfg, model, vocab] = import_case(name);
    h5golden::file f(golden + "/" + std::string(name) + "_golden.h5");
    check_gradient_by_finite_differences(model, cfg, golden_batch(f).ex);
  }
}

TEST_CASE("olmo2: post-norm layers and whole-projection QK norms, defaults, counts, checks") {
  auto [cfg, model, vocab] = import_case("olmo2_gqa");
  CHECK(cfg.family == &levanter::llama_family::olmo2);
  const auto& layer = model.transformer.layers.stacked;
  CHECK(!layer.input_layernorm);
  CHECK(layer.post_feedforward_layernorm.has_value());
  REQUIRE(layer.self_attn.q_proj_norm.has_value());
  CHECK(layer.self_attn.q_proj_norm->weight->size(levanter::llama::QFeatures) == 32);
  CHECK(layer.self_attn.k_proj_norm->weight->size(levanter::llama::KFeatures) == 16);
  CHECK(!layer.self_attn.q_norm);
  // the norms are over the whole projection: dropping them changes the logits
  h5golden::file f(golden + "/olmo2_gqa_golden.h5");
  auto b = golden_batch(f);
  {
    hax::no_grad_guard ng;
    auto plain = model;
    plain.transformer.layers.stacked.self_attn.q_proj_norm.reset();
    plain.transformer.layers.stacked.self_attn.k_proj_norm.reset();
    CHECK(max_abs_diff(levanter::lm_logits(plain, cfg, b.tokens, b.ex.segment_ids).to_host(), f.floats("logits")) >
          1e-3);
  }
  check_gradient_by_finite_differences(model, cfg, b.ex);

  levanter::Olmo2Config d;
  CHECK(d.seq_len == 4096);
  CHECK(d.hidden_dim == 4096);
  CHECK(d.num_kv_heads == 32);
  CHECK(d.layer_norm_epsilon == 1e-6);
  CHECK(!d.tied());
  CHECK(d.activation_function == "silu");
  CHECK(validate_cfg(d).errors.empty());
  const LlamaConfig tiny = tiny_of(levanter::Olmo2Config{});
  auto m = LMHeadModel::init(tiny, 50, hax::random::make_key(2));
  CHECK(hax::tree::parameter_count(m) == tiny.parameter_count(50));
  levanter::Olmo2Config bad;
  bad.hybrid_norm = true;
  bad.use_qk_norm = true;
  bad.attention_bias = true;
  const levanter::config::source_map none;
  levanter::config::validator v{none, {}};
  levanter::validate(v, bad);
  std::string all;
  for (const auto& e : v.result.errors) all += e + "\n";
  CHECK(all.find("model.hybrid_norm") != std::string::npos);
  CHECK(all.find("model.use_qk_norm") != std::string::npos);
  CHECK(all.find("model.attention_bias") != std::string::npos);
}

TEST_CASE("mixtral: routing, auxiliary losses and gradients equal the goldens (top-1 and top-2)") {
  for (const char* name : {"mixtral_top2", "mixtral_top1"}) {
    CAPTURE(name);
    auto ic = import_case(name);  // not a structured binding: clang before 16 cannot capture one
    auto& cfg = ic.cfg;
    auto& model = ic.model;
    CHECK(cfg.family == &levanter::llama_family::mixtral);
    h5golden::file f(golden + "/" + std::string(name) + "_golden.h5");
    const int K = static_cast<int>(f.attr("num_experts_per_tok"));
    CHECK(cfg.num_experts_per_tok == K);
    CHECK(cfg.n_routed_experts == static_cast<int>(f.attr("num_local_experts")));
    CHECK(*cfg.lbl_coef == doctest::Approx(f.attr("hf_router_aux_loss_coef")));  // upstream's from_hf_config
    CHECK(model.transformer.layers.stacked.block_sparse_moe->experts.w1.weight.shape_string() ==
          "{layers=2, experts=4, mlp=40, embed=32}");
    CHECK(!model.transformer.layers.stacked.mlp);

    // the router on its own, from transformers' router logits: choices, weights, counts
    std::vector<std::int64_t> dims;
    const auto logits = f.floats("moe_router_logits", &dims);  // [layers, tokens, experts]
    const auto topk = f.ints("moe_topk"), counts = f.ints("moe_counts");
    const auto weights = f.floats("moe_weights");
    const std::int64_t L = dims[0], T = dims[1], E = dims[2];
    for (std::int64_t l = 0; l < L; ++l) {
      std::vector<float> part(logits.begin() + l * T * E, logits.begin() + (l + 1) * T * E);
      auto r = levanter::layers::route(hax::from_host<float>(part, T * levanter::Token, E * levanter::Experts), K,
                                       0.01, 0.001);
      const auto ex = r.experts.to_host();
      const auto w = r.weights.to_host();
      for (std::int64_t i = 0; i < T * K; ++i) {
        CHECK(ex[i] == topk[l * T * K + i]);
        CHECK(w[i] == doctest::Approx(weights[l * T * K + i]).epsilon(1e-6));
      }
      for (std::int64_t e = 0; e < E; ++e) CHECK(r.group_sizes[e] == counts[l * E + e]);
      CHECK(r.load_balancing == doctest::Approx(0.01 * f.floats("moe_lbl")[l]).epsilon(1e-5));
      CHECK(r.router_z == doctest::Approx(0.001 * f.floats("moe_rzl")[l]).epsilon(1e-5));
      // the sorted rows: expert by expert, (token, choice) order within one, and row_of inverts token_of_row
      const auto rows = r.token_of_row.to_host(), row_of = r.row_of.to_host();
      for (std::int64_t a = 0; a < T * K; ++a) CHECK(rows[row_of[a]] == a / K);
    }

    // the whole model with upstream's coefficients: loss, per-layer losses, gradients
    cfg.lbl_coef = f.attr("lbl_coef");
    cfg.rzl_coef = f.attr("rzl_coef");
    auto b = golden_batch(f);
    levanter::forward_options o;
    o.aux = std::make_shared<levanter::lm_aux>();
    const levanter::lm_aux& aux = *o.aux;
    auto [loss, grads] = hax::value_and_grad(
        [&](const LMHeadModel& p) { return levanter::compute_next_token_loss(p, cfg, b.ex, 0.0, o); })(model);
    CHECK(loss.item() == doctest::Approx(f.floats("loss_with_aux")[0]).epsilon(1e-5));
    REQUIRE(aux.load_balancing.size() == 2);
    for (int l = 0; l < 2; ++l) {
      CHECK(aux.load_balancing[l] == doctest::Approx(0.01 * f.floats("moe_lbl")[l]).epsilon(1e-5));
      CHECK(aux.router_z[l] == doctest::Approx(0.001 * f.floats("moe_rzl")[l]).epsilon(1e-5));
      for (std::int64_t e = 0; e < E; ++e)
        CHECK(aux.expert_loads[l][e] == doctest::Approx(double(counts[l * E + e]) / double(T * K)));
    }
    // upstream Levanter (gen_levanter_llama_grads.py) computes the same function: routing, both losses, gradients
    REQUIRE(f.attr("levanter_mixtral_matches_torch") == 1.0);
    CHECK(loss.item() == doctest::Approx(f.floats("levanter_loss_with_aux")[0]).epsilon(1e-5));
    for (const auto& hf_g : by_hf_name(grads)) {
      const auto& hf = hf_g.first;  // not a structured binding: clang before 16 cannot capture one
      const auto& g = hf_g.second;
      CAPTURE(hf);
      const auto want = f.floats("grads_with_aux/" + hf);
      CHECK(max_abs_diff(g, want) <= 1e-4 * std::max(1e-3, max_abs(want)));
      const auto lev = f.floats("levanter_grads_with_aux/" + hf);
      CHECK(max_abs_diff(g, lev) <= 1e-4 * std::max(1e-3, max_abs(lev)));
    }
  }
}

TEST_CASE("mixtral: the gradient by finite differences, shared experts, counts, defaults and checks") {
  auto [cfg, model, vocab] = import_case("mixtral_top2");
  h5golden::file f(golden + "/mixtral_top2_golden.h5");
  cfg.lbl_coef = 0.01;
  cfg.rzl_coef = 0.001;
  // a step small enough that no token changes its experts (the loss is only piecewise smooth in the router)
  check_gradient_by_finite_differences(model, cfg, golden_batch(f).ex, 1e-3);

  // shared experts: an always-on SwiGLU of n_shared_experts x intermediate_dim beside the routed ones
  auto sc = tiny_of(levanter::MixtralConfig{});
  sc.n_routed_experts = 4;
  sc.n_shared_experts = 2;
  auto sm = LMHeadModel::init(sc, 32, hax::random::make_key(3));
  REQUIRE(sm.transformer.layers.stacked.shared_mlp);
  CHECK(sm.transformer.layers.stacked.shared_mlp->gate_proj.weight.shape_string() == "{layers=2, mlp=48, embed=16}");
  CHECK(hax::tree::parameter_count(sm) == sc.parameter_count(32));
  CHECK(hax::tree::parameter_count(model) == cfg.parameter_count(vocab));
  check_gradient_by_finite_differences(sm, sc, golden_batch(f).ex, 1e-3);
  CHECK_THROWS_WITH_AS(levanter::hf::hf_adapter<LMHeadModel>::to_hf_config(sc, 32),
                       doctest::Contains("n_shared_experts 2 has no Hugging Face form"), levanter::hf::error);

  // upstream MixtralConfig's defaults
  const levanter::MixtralConfig d;
  CHECK(d.num_experts_per_tok == 2);
  CHECK(d.n_routed_experts == 8);
  CHECK(d.n_shared_experts == 0);
  CHECK(*d.lbl_coef == 0.01);
  CHECK(*d.rzl_coef == 0.001);
  CHECK(!d.sliding_window);
  CHECK(d.seq_len == 8192);
  CHECK(d.intermediate_dim == 14336);
  CHECK(d.num_kv_heads == 8);

  auto bad = tiny_of(levanter::MixtralConfig{});
  bad.num_experts_per_tok = 9;
  auto r = validate_cfg(bad);
  REQUIRE(!r.errors.empty());
  CHECK(r.errors[0].find("model.num_experts_per_tok") != std::string::npos);
  bad = tiny_of(levanter::MixtralConfig{});
  bad.n_routed_experts = 0;
  CHECK(!validate_cfg(bad).errors.empty());
  CHECK_THROWS_WITH_AS(levanter::layers::route(hax::zeros<float>(3 * levanter::Token, 4 * levanter::Experts), 5,
                                               std::nullopt, std::nullopt),
                       doctest::Contains("num_experts_per_tok 5 must be between 1 and the 4 experts"),
                       std::invalid_argument);
}

TEST_CASE("layers::attention: the backends compute the same function, names decode, dropout is keyed") {
  namespace layers = levanter::layers;
  using levanter::Batch, levanter::Pos, levanter::KeyPos, levanter::HeadSize;
  using levanter::llama::KVHeads, levanter::llama::QHeadsPerGroup;
  CHECK(layers::attention_backend_of(std::nullopt) == layers::attention_backend::blocked);
  CHECK(layers::attention_backend_of("default") == layers::attention_backend::blocked);
  CHECK(layers::attention_backend_of("jax_flash") == layers::attention_backend::blocked);
  CHECK(layers::attention_backend_of("vanilla") == layers::attention_backend::vanilla);
  CHECK_THROWS_WITH_AS(layers::attention_backend_of("splash"), doctest::Contains("'splash'"), std::invalid_argument);

  const std::int64_t B = 2, P = 9, KV = 2, G = 2, D = 8;
  namespace r = hax::random;
  auto q = r::normal(r::make_key(1), B * Batch, P * Pos, KV * KVHeads, G * QHeadsPerGroup, D * HeadSize);
  auto k = r::normal(r::make_key(2), B * Batch, P * KeyPos, KV * KVHeads, D * HeadSize);
  auto v = r::normal(r::make_key(3), B * Batch, P * KeyPos, KV * KVHeads, D * HeadSize);
  // two documents in row 0 (a new segment from position 4), one in row 1
  std::vector<std::int32_t> seg(static_cast<std::size_t>(B * P), 0);
  for (std::int64_t p = 4; p < P; ++p) seg[static_cast<std::size_t>(p)] = 1;
  const auto segments = hax::from_host<std::int32_t>(seg, B * Batch, P * Pos);
  hax::no_grad_guard ng;
  for (std::int64_t window : {0, 3}) {
    CAPTURE(window);
    layers::attention_spec blocked{.scale = 0.3, .sliding_window = window, .block_size = 4};
    auto vanilla = blocked;
    vanilla.backend = layers::attention_backend::vanilla;
    const auto a = layers::attention(q, k, v, segments, blocked).to_host();
    const auto b = layers::attention(q, k, v, segments, vanilla).to_host();
    CHECK(max_abs_diff(a, b) <= 1e-5);
    // soft-capping in the blocked kernels computes the plain form's function, and changes the result
    auto capped = blocked;
    capped.logits_soft_cap = 0.5;
    auto capped_vanilla = vanilla;
    capped_vanilla.logits_soft_cap = 0.5;
    const auto c = layers::attention(q, k, v, segments, capped).to_host();
    CHECK(max_abs_diff(c, layers::attention(q, k, v, segments, capped_vanilla).to_host()) <= 1e-5);
    CHECK(max_abs_diff(a, c) > 1e-3);
  }
  // dropout: the same key gives the same result, another key another one
  layers::attention_spec drop{.dropout = 0.5, .dropout_key = r::make_key(7)};
  const auto d1 = layers::attention(q, k, v, segments, drop).to_host();
  CHECK(d1 == layers::attention(q, k, v, segments, drop).to_host());
  drop.dropout_key = r::make_key(8);
  CHECK(max_abs_diff(d1, layers::attention(q, k, v, segments, drop).to_host()) > 1e-3);
}

namespace {
using levanter::llama::KVHeads, levanter::llama::QHeadsPerGroup;
/// The inputs of an attention call with sinks, differentiated together.
struct sink_inputs {
  BOOST_HANA_DEFINE_STRUCT(
      sink_inputs,
      (hax::named_array<float, hax::axes<levanter::Batch, levanter::Pos, KVHeads, QHeadsPerGroup, levanter::HeadSize>>,
       q),
      (hax::named_array<float, hax::axes<levanter::Batch, levanter::KeyPos, KVHeads, levanter::HeadSize>>, k),
      (hax::named_array<float, hax::axes<levanter::Batch, levanter::KeyPos, KVHeads, levanter::HeadSize>>, v),
      (hax::named_array<float, hax::axes<KVHeads, QHeadsPerGroup>>, sinks));
};
}  // namespace

TEST_CASE("layers::attention with learned sinks equals upstream Levanter's attn_sink, values and gradients") {
  namespace layers = levanter::layers;
  using levanter::Batch, levanter::Pos, levanter::KeyPos, levanter::HeadSize;
  // tests/oracle/gen_attention_sink_golden.py: upstream's dot_product_attention(..., attn_sink=) on its VANILLA
  // backend; the cases' settings as the generator's CASES
  h5golden::file f(std::string(HALIAX_GOLDEN_DIR) + "/attention_sink_golden.h5");
  const std::int64_t B = 2, P = 6, KV = 2, G = 2, D = 4;
  struct golden_case {
    const char* name;
    layers::attention_spec spec;
  };
  const golden_case gcases[] = {{"causal", {}}, {"window_softcap", {.scale = 0.4, .logits_soft_cap = 1.5, .sliding_window = 3}}};
  const auto segments = hax::zeros<std::int32_t>(B * Batch, P * Pos);
  for (const auto& gc : gcases) {
    const char* name = gc.name;  // not a structured binding: clang before 16 cannot capture one
    const auto& spec = gc.spec;
    CAPTURE(name);
    const std::string g = std::string(name) + "/";
    const auto q = hax::from_host(f.floats(g + "q"), B * Batch, P * Pos, KV * KVHeads, G * QHeadsPerGroup, D * HeadSize);
    const auto k = hax::from_host(f.floats(g + "k"), B * Batch, P * KeyPos, KV * KVHeads, D * HeadSize);
    const auto v = hax::from_host(f.floats(g + "v"), B * Batch, P * KeyPos, KV * KVHeads, D * HeadSize);
    const auto sinks = hax::from_host(f.floats(g + "sinks"), KV * KVHeads, G * QHeadsPerGroup);
    const auto w = hax::from_host(f.floats(g + "w"), B * Batch, P * Pos, KV * KVHeads, G * QHeadsPerGroup, D * HeadSize);
    for (auto backend : {layers::attention_backend::blocked, layers::attention_backend::vanilla}) {
      auto s = spec;
      s.backend = backend;
      {
        hax::no_grad_guard ng;
        CHECK(max_abs_diff(layers::attention(q, k, v, segments, s, sinks).to_host(), f.floats(g + "out")) <= 1e-5);
        // without sinks the result differs (the sinks matter in both cases)
        CHECK(max_abs_diff(layers::attention(q, k, v, segments, s).to_host(), f.floats(g + "out")) > 1e-2);
      }
      const auto grads = hax::grad([&](const sink_inputs& in) {
        return hax::sum(layers::attention(in.q, in.k, in.v, segments, s, in.sinks) * w);
      })(sink_inputs{q, k, v, sinks});
      CHECK(max_abs_diff(grads.q.to_host(), f.floats(g + "grad_q")) <= 1e-5);
      CHECK(max_abs_diff(grads.k.to_host(), f.floats(g + "grad_k")) <= 1e-5);
      CHECK(max_abs_diff(grads.v.to_host(), f.floats(g + "grad_v")) <= 1e-5);
      CHECK(max_abs_diff(grads.sinks.to_host(), f.floats(g + "grad_sinks")) <= 1e-5);
    }
  }
}

TEST_CASE("gemma3: a multimodal checkpoint's language model imports (text_config, both tensor layouts, defaults)") {
  // tests/oracle/gen_hf_gemma3_multimodal_golden.py: Gemma3ForConditionalGeneration with a tiny vision tower, saved
  // by transformers 5.23 (language_model.model.*, as the released checkpoints), and the logits of text-only input
  h5golden::file f(golden + "/gemma3_multimodal_golden.h5");
  auto b = golden_batch(f);
  const auto want = f.floats("logits");
  auto check_dir = [&](const std::string& dir) {
    auto d = levanter::hf::open_dir(dir, "test");
    CHECK(d.model_type == "gemma3_text");
    CHECK(d.wrapper == "gemma3");
    CHECK(d.vocab_size == 64);
    const auto cfg = levanter::hf::config_from_hf<LMHeadModel>(levanter::Gemma3Config{}, d);
    CHECK(cfg.family == &levanter::llama_family::gemma3);
    CHECK(cfg.num_layers == 7);
    CHECK(cfg.sliding_window_pattern == 6);
    CHECK(cfg.rope_local_base_freq == 10000.0);
    CHECK(cfg.layer_norm_epsilon == 1e-6);
    CHECK(cfg.tie_word_embeddings);
    auto model = LMHeadModel::init(cfg, d.vocab_size, hax::random::make_key(0));
    levanter::hf::load(d, model, cfg);
    hax::no_grad_guard ng;
    const auto ours = levanter::lm_logits(model, cfg, b.tokens, b.ex.segment_ids).to_host();
    CHECK(max_abs_diff(ours, want) <= 1e-5 * std::max(1.0, max_abs(want)));
  };
  check_dir(golden + "/gemma3_multimodal");

  // transformers 4.52-4.57's layout (model.language_model.*, model.vision_tower.*) with the text_config transformers
  // 4.50 wrote (only what differs from Gemma3TextConfig's defaults)
  const fs::path dir = fs::temp_directory_path() / ("levanter_test_gemma3_mm_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(golden + "/gemma3_multimodal_config_transformers4.json", dir / "config.json");
  const levanter::safetensors::hf_dir src(golden + "/gemma3_multimodal");
  std::vector<levanter::safetensors::tensor_to_write> renamed;
  for (const auto& n : src.names()) {
    std::string to = n;
    if (to.starts_with("language_model.model.")) to = "model.language_model." + to.substr(21);
    else if (to.starts_with("vision_tower.") || to.starts_with("multi_modal_projector.")) to = "model." + to;
    const auto values = src.read_f32(n);
    renamed.push_back({to, levanter::safetensors::dtype::F32, src.shape(n),
                       levanter::safetensors::encode_floats(values, levanter::safetensors::dtype::F32)});
  }
  levanter::safetensors::write_file((dir / "model.safetensors").string(), renamed);
  check_dir(dir.string());

  // a tensor that is neither the language model nor the image side is refused, naming it
  renamed.push_back({"model.audio_tower.weight", levanter::safetensors::dtype::F32, {2},
                     levanter::safetensors::encode_floats(std::vector<float>{1, 2}, levanter::safetensors::dtype::F32)});
  levanter::safetensors::write_file((dir / "model.safetensors").string(), renamed);
  {
    auto d = levanter::hf::open_dir(dir.string(), "test");
    const auto cfg = levanter::hf::config_from_hf<LMHeadModel>(levanter::Gemma3Config{}, d);
    auto model = LMHeadModel::init(cfg, d.vocab_size, hax::random::make_key(0));
    CHECK_THROWS_WITH_AS(levanter::hf::load(d, model, cfg), doctest::Contains("model.audio_tower.weight"),
                         levanter::hf::error);
  }
  // a text_config that is not an object, or holds another model, is refused, naming the file
  auto write_cfg = [&](const std::string& text_config) {
    std::ofstream(dir / "config.json") << R"({"model_type": "gemma3", "text_config": )" << text_config << "}";
  };
  write_cfg("[1, 2]");
  CHECK_THROWS_WITH_AS(levanter::hf::open_dir(dir.string(), "test"), doctest::Contains("text_config is [1,2]"),
                       levanter::hf::error);
  write_cfg(R"({"model_type": "llama"})");
  CHECK_THROWS_WITH_AS(levanter::hf::open_dir(dir.string(), "test"), doctest::Contains("text_config.model_type"),
                       levanter::hf::error);
  fs::remove_all(dir);
}
