// The Llama family (levanter/models/llama*.hpp) against the goldens of tests/oracle/gen_hf_llama_golden.py and
// gen_levanter_llama_grads.py (tests/golden/hf_llama/): tiny random Llama, Mistral, Qwen2 and Qwen3 models written
// by `transformers`, their logits and next-token-loss gradients on fixed tokens (torch), and the same gradients
// from upstream Levanter (JAX) where upstream computes the same function. Cases cover MHA, GQA, MQA, every RoPE
// type, sliding windows, q/k/v biases, QK norm, an explicit head_dim, tied and untied heads. Also: RoPE tables,
// RoPE's finite-difference gradient, upstream's init from PRNGKey(0), Hugging Face export → import bitwise, and
// config checks.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <haliax/haliax.hpp>
#include <levanter/checkpoint/h5.hpp>
#include <levanter/config/validate.hpp>
#include <levanter/models/llama_hf.hpp>
#include <levanter/models/registry.hpp>

#include "gradcheck.hpp"
#include "h5_golden.hpp"

namespace fs = std::filesystem;
namespace hax = haliax;
namespace nn = haliax::nn;
using levanter::LlamaConfig;
using levanter::llama::LMHeadModel;

namespace {

const std::string golden = std::string(HALIAX_GOLDEN_DIR) + "/hf_llama";

const char* const cases[] = {
    "llama_mha", "llama_gqa_tied_linear", "llama_mqa_llama3", "llama_yarn_headdim", "mistral_sw", "qwen2_sw", "qwen3"};

/// The config of our type for an HF model_type.
LlamaConfig base_for(const std::string& model_type) {
  if (model_type == "mistral") return levanter::MistralConfig{};
  if (model_type == "qwen2") return levanter::QwenConfig{};
  if (model_type == "qwen3") return levanter::Qwen3Config{};
  return LlamaConfig{};
}

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
    levanter::hf::detail::host_copy(name, host.data(), host.size(), A::hf_name(name), leaf.sizes()[0], out);
  });
  return out;
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
    auto [cfg, model, vocab] = import_case(name);
    h5golden::file f(golden + "/" + std::string(name) + "_golden.h5");
    auto b = golden_batch(f);
    auto [loss, grads] = hax::value_and_grad(
        [&](const LMHeadModel& p) { return levanter::compute_next_token_loss(p, cfg, b.ex); })(model);
    CHECK(std::fabs(loss.item() - f.floats("loss")[0]) <= 1e-5 * std::max(1.0f, std::fabs(f.floats("loss")[0])));
    const auto ours = by_hf_name(grads);
    const bool lev = f.has("levanter_grads") && f.attr("levanter_matches_torch") == 1.0;
    int compared = 0;
    for (const auto& [hf, g] : ours) {
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
    for (const auto& [k, v] : a) {
      CAPTURE(k);
      CHECK(v == b.at(k));
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
  LlamaConfig tiny;
  tiny.seq_len = 16;
  tiny.hidden_dim = 16;
  tiny.intermediate_dim = 24;
  tiny.num_layers = 2;
  tiny.num_heads = 4;
  tiny.num_kv_heads = 2;
  for (auto fam : {levanter::llama_family::llama, levanter::llama_family::qwen2, levanter::llama_family::qwen3}) {
    tiny.family = fam;
    auto mm = LMHeadModel::init(tiny, 50, hax::random::make_key(2));
    CHECK(hax::tree::parameter_count(mm) == tiny.parameter_count(50));
  }
}
