// levanter/lora.hpp: which Linear modules LoRA adapts, the merged weight, its gradient (finite differences through
// a real Llama and GPT-2), and the PEFT files. tests/lora_program.sh runs the lora_lm program end to end.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <haliax/haliax.hpp>
#include <levanter/compat/safetensors.hpp>
#include <levanter/lora.hpp>
#include <levanter/models/gpt2_hf.hpp>
#include <levanter/models/llama_hf.hpp>
#include <nlohmann/json.hpp>

namespace hax = haliax;
using namespace levanter;

namespace {

const std::string golden = HALIAX_GOLDEN_DIR;

template <class M>
struct imported {
  M model;
  typename M::config_type cfg;
};

template <class M>
imported<M> import_dir(const std::string& name, const typename M::config_type& base) {
  auto d = hf::open_dir(golden + "/" + name, "test");
  imported<M> r;
  r.cfg = hf::config_from_hf<M>(base, d);
  r.model = M::init(r.cfg, d.vocab_size, hax::random::make_key(0));
  hf::load(d, r.model, r.cfg);
  return r;
}

LoraConfig lora_config(std::optional<std::variant<std::vector<std::string>, std::string>> targets, std::int64_t r = 4,
                       double alpha = 8.0) {
  LoraConfig c;
  c.target_modules = std::move(targets);
  c.r = r;
  c.alpha = alpha;
  return c;
}

std::vector<std::string> modules(const lora::spec& s) {
  std::vector<std::string> out;
  for (const auto& t : s.targets) out.push_back(t.module);
  return out;
}

// B drawn at random (init makes it zero), so that A has a gradient too.
lora::params with_random_b(const lora::spec& s, std::uint64_t seed) {
  auto p = lora::init(s, hax::random::make_key(seed));
  for (std::size_t t = 0; t < p.adapters.size(); ++t) {
    const auto sizes = p.adapters[t].lora_B.sizes();
    p.adapters[t].lora_B = hax::multiply(
        hax::random::normal(hax::random::make_key(seed + 100 + t), sizes[0] * lora::LoraLayers,
                            sizes[1] * lora::LoraOut, sizes[2] * lora::R),
        0.1f);
  }
  return p;
}

lm_example example(std::int64_t vocab, std::int64_t n) {
  std::vector<std::int32_t> ids;
  for (std::int64_t i = 0; i < 2 * n; ++i) ids.push_back(static_cast<std::int32_t>((7 * i + 3) % std::min<std::int64_t>(vocab, 60)));
  return lm_example::causal(hax::from_host<std::int32_t>(ids, 2 * Batch, n * Pos), -1);
}

// Central differences on a few elements of every adapter against haliax's gradient of `loss` at `p`.
template <class Loss>
void check_gradient_of(Loss loss, const lora::params& p, const lora::spec& s) {
  const auto [value, g] = hax::value_and_grad(loss)(p);
  CHECK(std::isfinite(value.item()));
  std::int64_t checked = 0, sizable = 0;  // sizable: gradients well above the tolerance (the check means something)
  for (std::size_t t = 0; t < p.adapters.size(); ++t) {
    for (int which = 0; which < 2; ++which) {
      auto host_grad = which == 0 ? g.adapters[t].lora_A.to_host() : g.adapters[t].lora_B.to_host();
      const std::int64_t count = static_cast<std::int64_t>(host_grad.size());
      for (std::int64_t k = 0; k < 3; ++k) {
        const std::int64_t at = (k * 7919 + static_cast<std::int64_t>(t) * 31) % count;
        auto perturbed = [&](float delta) {
          lora::params q = p;
          auto bump = [&](auto& arr) {
            arr = hax::copy(arr);  // q shares p's buffers
            hax::with_host_elements(arr, 0, arr.element_count(), hax::host_access::read_write,
                                    [&](float* x) { x[at] += delta; });
          };
          if (which == 0)
            bump(q.adapters[t].lora_A);
          else
            bump(q.adapters[t].lora_B);
          hax::no_grad_guard ng;
          return static_cast<double>(loss(q).item());
        };
        const double eps = 1e-2;
        const double fd = (perturbed(static_cast<float>(eps)) - perturbed(static_cast<float>(-eps))) / (2 * eps);
        const double ad = host_grad[static_cast<std::size_t>(at)];
        INFO(s.targets[t].module << (which == 0 ? ".lora_A" : ".lora_B") << "[" << at << "]: autodiff " << ad
                                 << ", finite differences " << fd);
        CHECK(std::abs(ad - fd) <= 2e-2 * std::abs(fd) + 2e-4);
        ++checked;
        if (std::abs(fd) > 1e-3) ++sizable;
      }
    }
  }
  CHECK(checked == static_cast<std::int64_t>(6 * p.adapters.size()));
  CHECK(sizable * 2 > checked);
}

template <class M>
void check_gradient(const imported<M>& m, const lora::spec& s, std::int64_t n) {
  const auto ex = example(m.model.vocab_size(), n);
  auto loss = [&](const lora::params& p) { return compute_next_token_loss(lora::merged(m.model, p, s), m.cfg, ex); };
  check_gradient_of(loss, with_random_b(s, 3), s);
}

// The training loss with dropout on the adapters' input, as lora_lm computes it.
template <class M>
auto dropout_loss(const imported<M>& m, const lora::spec& s, const lm_example& ex, double dropout,
                  hax::random::key key, hax::nn::checkpoint_policy policy,
                  std::shared_ptr<std::vector<std::int64_t>> applied = nullptr) {
  return [&m, &s, &ex, dropout, key, policy, applied](const lora::params& p) {
    const auto mm = lora::merged(m.model, p, s);
    forward_options fo;
    fo.inference = false;
    fo.key = key;
    fo.checkpointing = policy;
    hax::ambient_scope adapters(lora::dropout_side(lora::adapted_weights(mm, s), p, s, dropout, key, applied));
    return compute_next_token_loss(mm, m.cfg, ex, 0.0, fo);
  };
}

// With dropout: finite differences, the same loss and gradient with each layer recomputed in backward (gradient
// checkpointing, where the scope that set the adapters has ended), and the number of times each adapter ran.
template <class M>
void check_dropout_gradient(const imported<M>& m, const lora::spec& s, std::int64_t n, std::int64_t unapplied) {
  const auto ex = example(m.model.vocab_size(), n);
  const auto key = hax::random::make_key(21);
  const auto p = with_random_b(s, 3);
  auto plain = std::make_shared<std::vector<std::int64_t>>(), remat = std::make_shared<std::vector<std::int64_t>>();
  check_gradient_of(dropout_loss(m, s, ex, 0.3, key, hax::nn::checkpoint_policy::none, plain), p, s);
  plain->assign(s.targets.size(), 0);
  const auto [v1, g1] = hax::value_and_grad(dropout_loss(m, s, ex, 0.3, key, hax::nn::checkpoint_policy::none, plain))(p);
  const auto [v2, g2] =
      hax::value_and_grad(dropout_loss(m, s, ex, 0.3, key, hax::nn::checkpoint_policy::per_layer, remat))(p);
  CHECK(v1.item() == v2.item());
  double worst = 0;
  hax::tree::zip_leaves(g1, g2, [&](const std::string&, const auto& a, const auto& b) {
    const auto ha = a.to_host(), hb = b.to_host();
    for (std::size_t i = 0; i < ha.size(); ++i) worst = std::max(worst, double(std::abs(ha[i] - hb[i])));
  });
  CHECK(worst < 1e-6);
  std::int64_t zero = 0;
  for (std::size_t t = 0; t < s.targets.size(); ++t) {
    INFO(s.targets[t].module << ": applied " << (*plain)[t] << " times, " << (*remat)[t] << " with recomputation");
    if ((*plain)[t] == 0) {
      ++zero;
      CHECK((*remat)[t] == 0);
    } else {
      CHECK((*plain)[t] == s.targets[t].layers);  // once per layer
      CHECK((*remat)[t] == 2 * s.targets[t].layers);  // and again when recomputed
    }
  }
  CHECK(zero == unapplied);
  // dropout acts: not the loss without it, and another key draws other masks
  hax::no_grad_guard ng;
  const double none = compute_next_token_loss(lora::merged(m.model, p, s), m.cfg, ex).item();
  const double other =
      dropout_loss(m, s, ex, 0.3, hax::random::make_key(22), hax::nn::checkpoint_policy::none)(p).item();
  CHECK(v1.item() != none);
  CHECK(other != v1.item());
}

}  // namespace

TEST_CASE("lora: target_modules picks Linear modules as upstream - none is every one, a list matches path suffixes, a string is re.match") {
  const auto m = import_dir<llama::LMHeadModel>("hf_llama/llama_mha", LlamaConfig{});
  const auto all = lora::make_spec(m.model, lora_config(std::nullopt));
  CHECK(all.targets.size() == 8);  // q, k, v, o, gate, up, down (stacked) and the LM head
  CHECK(modules(all).back() == "lm_head");
  const auto qv = lora::make_spec(m.model, lora_config(std::vector<std::string>{"q_proj", "v_proj"}));
  CHECK(modules(qv) == std::vector<std::string>{"transformer.layers.stacked.self_attn.q_proj",
                                                "transformer.layers.stacked.self_attn.v_proj"});
  CHECK(qv.targets[0].layers == 2);
  CHECK(qv.targets[0].in == 32);
  CHECK(qv.targets[0].out == 32);
  CHECK(qv.targets[0].out_first);
  CHECK(qv.scale == doctest::Approx(2.0));
  CHECK(lora::make_spec(m.model, lora_config(std::string(".*self_attn"))).targets.size() == 4);
  CHECK(lora::make_spec(m.model, lora_config(std::string("transformer.*mlp"))).targets.size() == 3);
  // re.match anchors at the start: "self_attn" is not a prefix of any path
  CHECK_THROWS_WITH_AS(lora::make_spec(m.model, lora_config(std::string("self_attn"))),
                       doctest::Contains("lora.target_modules matches none"), config::config_error);
  CHECK_THROWS_AS(lora::make_spec(m.model, lora_config(std::vector<std::string>{"Wqkv"})), config::config_error);

  const auto g = import_dir<gpt2::LMHeadModel>("hf_gpt2_tiny", Gpt2Config{});
  const auto attn = lora::make_spec(g.model, lora_config(std::vector<std::string>{"c_attn"}));
  REQUIRE(attn.targets.size() == 1);
  CHECK_FALSE(attn.targets[0].out_first);  // Conv1D {in, out}
  CHECK(attn.targets[0].in == 32);
  CHECK(attn.targets[0].out == 96);  // qkv x heads x head_size
}

TEST_CASE("lora: B starts at zero (the model is unchanged) and the merged weight is W + alpha/r B.A") {
  const auto m = import_dir<llama::LMHeadModel>("hf_llama/llama_mha", LlamaConfig{});
  const auto s = lora::make_spec(m.model, lora_config(std::vector<std::string>{"q_proj", "down_proj"}, 4, 12.0));
  const auto fresh = lora::init(s, hax::random::make_key(1));
  CHECK(lora::parameter_count(s) == 2 * 4 * (32 + 32) + 2 * 4 * (40 + 32));
  {
    hax::no_grad_guard ng;
    const auto same = lora::merged(m.model, fresh, s);
    hax::tree::zip_leaves(m.model, same, [&](const std::string& name, const auto& a, const auto& b) {
      INFO(name);
      CHECK(a.to_host() == b.to_host());
    });
  }
  const auto p = with_random_b(s, 5);
  hax::no_grad_guard ng;
  const auto mm = lora::merged(m.model, p, s);
  const auto w = m.model.transformer.layers.stacked.self_attn.q_proj.weight.to_host();
  const auto w2 = mm.transformer.layers.stacked.self_attn.q_proj.weight.to_host();
  const auto a = p.adapters[0].lora_A.to_host(), b = p.adapters[0].lora_B.to_host();
  const std::int64_t L = 2, O = 32, I = 32, r = 4;
  double worst = 0;
  for (std::int64_t l = 0; l < L; ++l)
    for (std::int64_t o = 0; o < O; ++o)
      for (std::int64_t i = 0; i < I; ++i) {
        double d = 0;
        for (std::int64_t k = 0; k < r; ++k) d += double(b[(l * O + o) * r + k]) * double(a[(l * r + k) * I + i]);
        const std::size_t at = static_cast<std::size_t>((l * O + o) * I + i);
        worst = std::max(worst, std::abs(double(w2[at]) - (double(w[at]) + 3.0 * d)));
      }
  CHECK(worst < 1e-5);
}

TEST_CASE("lora: the loss's gradient reaches A and B (finite differences through a Llama and a GPT-2)") {
  const auto m = import_dir<llama::LMHeadModel>("hf_llama/llama_mha", LlamaConfig{});
  check_gradient(m, lora::make_spec(m.model, lora_config(std::vector<std::string>{"q_proj", "o_proj", "lm_head"})), 8);
  const auto g = import_dir<gpt2::LMHeadModel>("hf_gpt2_tiny", Gpt2Config{});
  check_gradient(g, lora::make_spec(g.model, lora_config(std::vector<std::string>{"c_attn", "mlp.c_proj"})), 8);
}

TEST_CASE("lora: PEFT files name torch modules, per layer, with lora_A {r, in} and lora_B {out, r}") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("lora_peft_" + std::to_string(::getpid()));
  const auto g = import_dir<gpt2::LMHeadModel>("hf_gpt2_tiny", Gpt2Config{});
  const auto cfg = lora_config(std::vector<std::string>{"c_attn"});
  const auto s = lora::make_spec(g.model, cfg);
  lora::save_peft<gpt2::LMHeadModel>(with_random_b(s, 9), s, cfg, "base", dir.string());
  std::ifstream f(dir / "adapter_model.safetensors", std::ios::binary);
  const std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto h = safetensors::parse(bytes, "adapter_model.safetensors");
  std::vector<std::string> names;
  for (const auto& t : h.tensors) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"base_model.model.transformer.h.0.attn.c_attn.lora_A.weight",
                                          "base_model.model.transformer.h.0.attn.c_attn.lora_B.weight",
                                          "base_model.model.transformer.h.1.attn.c_attn.lora_A.weight",
                                          "base_model.model.transformer.h.1.attn.c_attn.lora_B.weight"});
  for (const auto& t : h.tensors)
    CHECK(t.shape == (t.name.find("lora_A") != std::string::npos ? std::vector<std::int64_t>{4, 32}
                                                                  : std::vector<std::int64_t>{96, 4}));
  const auto j = nlohmann::json::parse(std::ifstream(dir / "adapter_config.json"));
  CHECK(j["peft_type"] == "LORA");
  CHECK(j["r"] == 4);
  CHECK(j["lora_alpha"] == 8.0);
  CHECK(j["fan_in_fan_out"] == true);
  CHECK(j["target_modules"] == nlohmann::json::array({"attn.c_attn"}));
  fs::remove_all(dir);
}

TEST_CASE("lora: with dropout, an adapted Linear adds alpha/r B.A.dropout(x) to W.x, as upstream's LoraLinear") {
  const auto m = import_dir<llama::LMHeadModel>("hf_llama/llama_mha", LlamaConfig{});
  const auto s = lora::make_spec(m.model, lora_config(std::vector<std::string>{"q_proj", "down_proj", "lm_head"}, 4, 12.0));
  const auto p = with_random_b(s, 7);
  hax::no_grad_guard ng;
  const auto mm = lora::merged(m.model, p, s);
  const auto key = hax::random::make_key(11);
  auto applied = std::make_shared<std::vector<std::int64_t>>();
  const auto side = lora::dropout_side(lora::adapted_weights(mm, s), p, s, 0.25, key, applied);
  const auto x = hax::random::normal(hax::random::make_key(12), 2 * Batch, 3 * Pos, 32 * Embed);
  const auto layers = mm.transformer.layers.unstack();
  const auto base_layers = m.model.transformer.layers.unstack();
  const auto merged_only = layers[1].self_attn.q_proj(x).to_host();
  const auto k_alone = layers[1].self_attn.k_proj(x).to_host();
  std::vector<float> y, k_with;
  {
    hax::ambient_scope scope(side);
    y = layers[1].self_attn.q_proj(x).to_host();
    k_with = layers[1].self_attn.k_proj(x).to_host();
  }
  CHECK(k_with == k_alone);  // k_proj is not adapted
  CHECK(*applied == std::vector<std::int64_t>{1, 0, 0});
  CHECK_THROWS_AS(lora::dropout_side(lora::adapted_weights(mm, s), p, s, 0.0, key), std::invalid_argument);
  // upstream: W x + scale B A dropout(x), the mask drawn from dropout_key(key, target 0, layer 1) over {rows, in}
  const auto dropped = hax::nn::Dropout{0.25}(hax::detail::layout::reinterpret<hax::axes<hax::nn::SideRows, lora::LoraIn>>(
                                                   x, {6, 32}),
                                               lora::dropout_key(key, 0, 1))
                           .to_host();
  const auto w = base_layers[1].self_attn.q_proj.weight.to_host();  // {out, in}
  const auto a = p.adapters[0].lora_A.to_host(), b = p.adapters[0].lora_B.to_host();
  const auto xh = x.to_host();
  REQUIRE(y.size() == 6 * 32);
  double worst = 0, moved = 0;
  std::int64_t zeros = 0;
  for (float d : dropped) zeros += d == 0.0f;
  for (std::int64_t row = 0; row < 6; ++row)
    for (std::int64_t o = 0; o < 32; ++o) {
      double wx = 0, bad = 0;
      for (std::int64_t i = 0; i < 32; ++i) wx += double(w[o * 32 + i]) * xh[row * 32 + i];
      for (std::int64_t k = 0; k < 4; ++k) {
        double ad = 0;
        for (std::int64_t i = 0; i < 32; ++i) ad += double(a[(1 * 4 + k) * 32 + i]) * dropped[row * 32 + i];
        bad += double(b[(1 * 32 + o) * 4 + k]) * ad;
      }
      const std::size_t at = static_cast<std::size_t>(row * 32 + o);
      worst = std::max(worst, std::abs(double(y[at]) - (wx + 3.0 * bad)));
      moved = std::max(moved, std::abs(double(y[at]) - merged_only[at]));
    }
  CHECK(worst < 1e-4);
  CHECK(moved > 1e-2);  // the dropout changed the output
  CHECK(zeros > 192 / 8);
  CHECK(zeros < 192 / 2);
}

TEST_CASE("lora: with dropout the gradient reaches A and B, with or without recomputing layers (Llama, GPT-2)") {
  const auto m = import_dir<llama::LMHeadModel>("hf_llama/llama_mha", LlamaConfig{});
  // the LM head is read as a matrix by the loss, not applied as a Linear: it keeps the merged form
  check_dropout_gradient(m, lora::make_spec(m.model, lora_config(std::vector<std::string>{"q_proj", "o_proj", "down_proj", "lm_head"})), 8, 1);
  const auto g = import_dir<gpt2::LMHeadModel>("hf_gpt2_tiny", Gpt2Config{});
  check_dropout_gradient(g, lora::make_spec(g.model, lora_config(std::vector<std::string>{"c_attn", "mlp.c_proj"})), 8, 0);
}
