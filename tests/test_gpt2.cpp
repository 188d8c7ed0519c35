// GPT-2 against upstream Levanter (tests/golden/gpt2_golden.h5 from tests/oracle/gen_gpt2_golden.py: levanter's
// Gpt2LMHeadModel on JAX CPU): the same init from PRNGKey(0), logits, loss with packed-document segments,
// z-loss and every gradient; plus parameter names and counts, FLOPs, segment isolation, checkpointing and the
// blockwise cross-entropy.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include <levanter/models/gpt2.hpp>

#include "h5_golden.hpp"
#include "host_io.hpp"

namespace {

using levanter::Gpt2Config;
using levanter::gpt2::LMHeadModel;
namespace hax = haliax;

const std::string golden_path = std::string(HALIAX_GOLDEN_DIR) + "/gpt2_golden.h5";

Gpt2Config golden_config(const h5golden::file& f) {
  Gpt2Config c;
  c.seq_len = int(f.attr("seq_len"));
  c.hidden_dim = int(f.attr("hidden_dim"));
  c.num_layers = int(f.attr("num_layers"));
  c.num_heads = int(f.attr("num_heads"));
  c.mlp_scale = int(f.attr("mlp_scale"));
  c.layer_norm_epsilon = f.attr("layer_norm_epsilon");
  c.gradient_checkpointing = false;
  return c;
}

std::string h5_name(const std::string& dotted) {
  std::string s = dotted;
  std::replace(s.begin(), s.end(), '.', '/');
  return s;
}

/// Copies every parameter of `group` (params/, adam/final_params/) into `m`; checks shapes.
void load(LMHeadModel& m, const h5golden::file& f, const std::string& group) {
  hax::tree::for_each_leaf(m, [&](const std::string& name, auto& leaf) {
    std::vector<std::int64_t> dims;
    auto v = f.floats(group + h5_name(name), &dims);
    REQUIRE(std::vector<std::int64_t>(leaf.sizes().begin(), leaf.sizes().end()) == dims);
    host_io::write_elements(leaf, v);
  });
}

double max_rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  double scale = 0, err = 0;
  for (auto w : want) scale = std::max(scale, double(std::fabs(w)));
  for (std::size_t i = 0; i < got.size(); ++i) err = std::max(err, double(std::fabs(got[i] - want[i])));
  return err / std::max(scale, 1e-30);
}

levanter::lm_example golden_example(const h5golden::file& f) {
  std::vector<std::int64_t> dims;
  auto t = f.ints("batch/tokens", &dims);
  auto tokens = hax::from_host<std::int32_t>(t, dims[0] * levanter::Batch, dims[1] * levanter::Pos);
  return levanter::lm_example::causal(tokens, std::int64_t(f.attr("eos_id")));
}

}  // namespace

TEST_CASE("gpt2: init from PRNGKey(0) equals upstream's for every Linear and Embedding weight") {
  h5golden::file f(golden_path);
  const auto cfg = golden_config(f);
  auto m = LMHeadModel::init(cfg, std::int64_t(f.attr("vocab_size")), hax::random::make_key(0));
  int compared = 0;
  hax::tree::for_each_leaf(m, [&](const std::string& name, const auto& leaf) {
    // The generator perturbed LayerNorm weights and all biases (zero/one at init) to make the test sensitive.
    if (name.find("ln_") != std::string::npos || name.ends_with("bias")) return;
    auto want = f.floats("params/" + h5_name(name));
    CHECK_MESSAGE(max_rel_err(leaf.to_host(), want) < 1e-6, name);
    ++compared;
  });
  CHECK(compared == 6);
}

TEST_CASE("gpt2: parameter paths and counts follow upstream") {
  Gpt2Config c;
  c.seq_len = 16;
  c.hidden_dim = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  auto m = LMHeadModel::init(c, 101, hax::random::make_key(1));
  const auto names = hax::tree::leaf_names(m);
  CHECK(std::find(names.begin(), names.end(), "transformer.blocks.stacked.attn.c_attn.weight") != names.end());
  CHECK(std::find(names.begin(), names.end(), "embeddings.token_embeddings.weight") != names.end());
  CHECK(std::find(names.begin(), names.end(), "transformer.ln_f.bias") != names.end());
  CHECK(hax::tree::parameter_count(m) == c.parameter_count(101));
  // GPT-2 small: 124,439,808 parameters with the 50257-token vocabulary (the HF figure).
  Gpt2Config small;
  CHECK(small.parameter_count(50257) == 124439808);
  // upstream lm_flops_per_token(768, 3072, 12, 12, 12, 1024, 50257, glu=False)
  CHECK(small.flops_per_token(50257) == doctest::Approx(1.0 * 12 * (2 * 2 * 768 * 3072 + 2 * 768 * 3 * 768 + 2 * 768 * 768 +
                                                                  (2.0 * 1024 * 1024 * 768 + 3.0 * 1024 * 1024 * 12 +
                                                                   2.0 * 1024 * 1024 * 768) / 1024) +
                                                        2.0 * 768 * 50257));
}

TEST_CASE("gpt2: logits, loss, z-loss and every gradient match upstream Levanter") {
  h5golden::file f(golden_path);
  const auto cfg = golden_config(f);
  auto m = LMHeadModel::init(cfg, std::int64_t(f.attr("vocab_size")), hax::random::make_key(0));
  load(m, f, "params/");
  auto ex = golden_example(f);
  CHECK(ex.segment_ids.to_host() == f.ints("batch/segment_ids"));
  {
    auto mask = ex.loss_mask.to_host();
    auto want = f.ints("batch/loss_mask");
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(bool(mask[i]) == bool(want[i]));
  }

  auto logits = m.logits(cfg, ex.tokens, ex.segment_ids);
  CHECK(max_rel_err(logits.to_host(), f.floats("logits")) < 1e-5);

  auto [loss, grads] = hax::value_and_grad([&](const LMHeadModel& p) {
    return levanter::gpt2::next_token_loss(p, cfg, ex);
  })(m);
  const double want_loss = f.floats("loss")[0];
  CHECK(loss.item() == doctest::Approx(want_loss).epsilon(1e-5));
  hax::tree::for_each_leaf(grads, [&](const std::string& name, const auto& g) {
    const double e = max_rel_err(g.to_host(), f.floats("grads/" + h5_name(name)));
    CHECK_MESSAGE(e < 1e-4, name << " max error relative to the largest gradient: " << e);
  });

  // Without segment ids (one document per row) the loss differs, so the golden exercises the masking.
  const double no_seg = f.floats("loss_no_segment_ids")[0];
  CHECK(std::fabs(no_seg - want_loss) > 1e-4);

  const double z = f.floats("loss_zloss")[0];
  auto zl = levanter::gpt2::next_token_loss(m, cfg, ex, 1e-4);
  CHECK(zl.item() == doctest::Approx(z).epsilon(1e-5));

  // The fused blockwise cross-entropy gives the same loss and gradients.
  auto cfg_b = cfg;
  cfg_b.cross_entropy_block_size = 32;
  auto [lb, gb] = hax::value_and_grad([&](const LMHeadModel& p) {
    return levanter::gpt2::next_token_loss(p, cfg_b, ex);
  })(m);
  CHECK(lb.item() == doctest::Approx(want_loss).epsilon(1e-5));
  hax::tree::zip_leaves(gb, grads, [&](const std::string& name, const auto& a, const auto& b) {
    CHECK_MESSAGE(max_rel_err(a.to_host(), b.to_host()) < 1e-4, name);
  });

  // The plain ("vanilla") attention path gives the same loss as the blocked one.
  auto cfg_v = cfg;
  cfg_v.attn_backend = "vanilla";
  CHECK(levanter::gpt2::next_token_loss(m, cfg_v, ex).item() == doctest::Approx(want_loss).epsilon(1e-5));
}

TEST_CASE("gpt2: a document's logits do not depend on the document packed before it") {
  Gpt2Config c;
  c.seq_len = 12;
  c.hidden_dim = 16;
  c.num_layers = 2;
  c.num_heads = 2;
  auto m = LMHeadModel::init(c, 20, hax::random::make_key(3));
  const std::int32_t eos = 19;
  std::vector<std::int32_t> a = {1, 2, 3, eos, 5, 6, 7, 8, 9, 10, 11, 12};
  std::vector<std::int32_t> b = {4, 4, 9, eos, 5, 6, 7, 8, 9, 10, 11, 12};  // first document changed
  auto run = [&](const std::vector<std::int32_t>& t) {
    auto ex = levanter::lm_example::causal(hax::from_host<std::int32_t>(t, 1 * levanter::Batch, 12 * levanter::Pos), eos);
    return m.logits(c, ex.tokens, ex.segment_ids).to_host();
  };
  auto la = run(a), lb = run(b);
  const std::size_t V = 20;
  for (std::size_t i = 4 * V; i < la.size(); ++i) REQUIRE(la[i] == doctest::Approx(lb[i]).epsilon(1e-6));
  bool first_differs = false;
  for (std::size_t i = 0; i < 3 * V; ++i) first_differs |= std::fabs(la[i] - lb[i]) > 1e-4;
  CHECK(first_differs);
}

TEST_CASE("gpt2: gradient checkpointing changes neither loss nor gradients") {
  Gpt2Config c;
  c.seq_len = 16;
  c.hidden_dim = 32;
  c.num_layers = 3;
  c.num_heads = 4;
  auto m = LMHeadModel::init(c, 50, hax::random::make_key(5));
  std::vector<std::int32_t> t(2 * 16);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = std::int32_t((i * 7 + 3) % 50);
  auto ex = levanter::lm_example::causal(hax::from_host<std::int32_t>(t, 2 * levanter::Batch, 16 * levanter::Pos), 49);
  auto run = [&](hax::nn::checkpoint_policy p) {
    levanter::forward_options o;
    o.checkpointing = p;
    return hax::value_and_grad([&](const LMHeadModel& mm) { return levanter::gpt2::next_token_loss(mm, c, ex, 0.0, o); })(m);
  };
  auto [l0, g0] = run(hax::nn::checkpoint_policy::none);
  auto [l1, g1] = run(hax::nn::checkpoint_policy::per_layer);
  CHECK(l0.item() == l1.item());
  hax::tree::zip_leaves(g0, g1, [](const std::string& name, const auto& a, const auto& b) {
    CHECK_MESSAGE(a.to_host() == b.to_host(), name);
  });
}

TEST_CASE("gpt2: impossible configurations are refused with the setting named") {
  Gpt2Config c;
  c.hidden_dim = 30;
  c.num_heads = 4;
  CHECK_THROWS_WITH_AS(LMHeadModel::init(c, 10, hax::random::make_key(0)),
                       doctest::Contains("hidden_dim 30 is not divisible by num_heads 4"), std::invalid_argument);
}

#include <levanter/optim/adamw.hpp>

TEST_CASE("gpt2: five AdamW steps from upstream's weights give upstream's losses and parameters") {
  h5golden::file f(golden_path);
  const auto cfg = golden_config(f);
  auto m = LMHeadModel::init(cfg, std::int64_t(f.attr("vocab_size")), hax::random::make_key(0));
  load(m, f, "params/");
  auto ex = golden_example(f);
  // The generator's AdamConfig (root attribute adam_config).
  levanter::AdamConfig ac;
  ac.learning_rate = 1e-3;
  ac.weight_decay = 0.1;
  ac.beta1 = 0.9;
  ac.beta2 = 0.95;
  ac.epsilon = 1e-8;
  ac.max_grad_norm = 1.0;
  ac.warmup = 0.2;
  ac.min_lr_ratio = 0.1;
  levanter::optim::adamw opt(ac, 5);
  auto state = opt.init(m);
  const auto want_losses = f.floats("adam/losses");
  const auto want_lrs = f.floats("adam/learning_rates");
  for (int step = 0; step < 5; ++step) {
    auto [loss, g] = hax::value_and_grad([&](const LMHeadModel& p) { return levanter::gpt2::next_token_loss(p, cfg, ex); })(m);
    CHECK_MESSAGE(std::fabs(loss.item() - want_losses[step]) < 1e-4, "step " << step);
    auto stats = opt.update(m, g, state, loss.item());
    CHECK(stats.learning_rate == doctest::Approx(want_lrs[step]).epsilon(1e-6));
  }
  hax::tree::for_each_leaf(m, [&](const std::string& name, const auto& leaf) {
    const double e = max_rel_err(leaf.to_host(), f.floats("adam/final_params/" + h5_name(name)));
    CHECK_MESSAGE(e < 1e-4, name << ": " << e);
  });
}
