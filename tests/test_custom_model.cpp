// A second language model, defined only here, trains through the same Trainer and train_lm wiring as GPT-2: the
// model interface (levanter/models/lm.hpp) proven by another user. The model is deliberately small: token
// embeddings, one pre-norm MLP block with a residual, and an untied LM head ({embed, vocab}, the other head layout
// from GPT-2's tied {vocab, embed} table). It satisfies levanter::LmModel; nothing in levanter knows it.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <levanter/levanter.hpp>
#include "host_io.hpp"

namespace fs = std::filesystem;
namespace hax = haliax;
namespace nn = haliax::nn;
using levanter::Embed;
using levanter::Mlp;
using levanter::Vocab;

namespace tiny {

/// `model:` section of the tiny model (never registered in levanter's ModelChoice: the test passes it directly).
struct TinyConfig {
  static constexpr std::string_view type_name = "tiny_mlp_lm";
  int seq_len = 16;
  int hidden_dim = 16;
  int mlp_dim = 32;
  double flops_per_token(std::int64_t vocab) const {
    return 2.0 * 2 * hidden_dim * mlp_dim + 2.0 * hidden_dim * double(vocab);
  }
  std::int64_t parameter_count(std::int64_t vocab) const {
    const std::int64_t E = hidden_dim, M = mlp_dim;
    return vocab * E + 2 * E + (E * M + M) + (M * E + E) + E * vocab;
  }
};

struct TinyLm {
  using config_type = TinyConfig;
  BOOST_HANA_DEFINE_STRUCT(TinyLm, (nn::Embedding<Vocab, Embed>, wte), (nn::LayerNorm<Embed>, ln),
                           (nn::Mlp<Embed, Mlp>, mlp), (nn::Linear<hax::axes<Embed>, hax::axes<Vocab>>, head));

  static TinyLm init(const TinyConfig& c, std::int64_t vocab, hax::random::key key) {
    auto k = hax::random::split(key, 3);
    TinyLm m;
    m.wte = nn::Embedding<Vocab, Embed>::init(k[0], vocab * Vocab, c.hidden_dim * Embed, 0.02);
    m.ln = nn::LayerNorm<Embed>::init(c.hidden_dim * Embed);
    m.mlp = nn::Mlp<Embed, Mlp>::init(k[1], c.hidden_dim * Embed, c.mlp_dim * Mlp, nn::activation::gelu_new);
    m.head = nn::Linear<hax::axes<Embed>, hax::axes<Vocab>>::init(k[2], c.hidden_dim * Embed, vocab * Vocab, false);
    return m;
  }
  levanter::lm_hidden activations(const TinyConfig&, const levanter::token_batch& tokens, const levanter::token_batch&,
                                  const levanter::forward_options& = {}) const {
    levanter::lm_hidden x = wte.embed(tokens);
    return x + mlp(ln(x));
  }
  const hax::named_array<float, hax::axes<Embed, Vocab>>& get_lm_head() const { return head.weight; }
  std::int64_t vocab_size() const { return wte.weight.size(Vocab); }
};

}  // namespace tiny

template <>
struct levanter::model_of<tiny::TinyConfig> {
  using type = tiny::TinyLm;
};

static_assert(levanter::LmModel<tiny::TinyLm>);
static_assert(levanter::LmModel<levanter::gpt2::LMHeadModel>);
static_assert(!levanter::hf::HfConvertible<tiny::TinyLm>);

namespace {

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("levanter_test_custom_model_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_corpus(const fs::path& path, int docs, unsigned seed) {
  std::ofstream out(path);
  const char* words[] = {"red", "green", "blue", "the", "fox", "jumps", "over", "lazy", "dog", "and", "cat"};
  for (int d = 0; d < docs; ++d) {
    std::string text;
    for (int w = 0; w < 24; ++w) {
      seed = seed * 1103515245u + 12345u;
      text += words[(seed >> 16) % 11];
      text += " ";
    }
    out << "{\"text\": \"" << text << "\"}\n";
  }
}

levanter::TrainLmConfig config_for(const fs::path& dir, const std::string& id) {
  const std::string yaml = "data:\n  train_urls: [\"" + (dir / "train.jsonl").string() + "\"]\n" +
                           "  validation_urls: [\"" + (dir / "valid.jsonl").string() + "\"]\n" +
                           "  tokenizer: byte\n  cache_dir: \"" + (dir / "cache").string() + "\"\n" +
                           "trainer:\n  num_train_steps: 10\n  train_batch_size: 4\n  steps_per_eval: 4\n" +
                           "  id: " + id + "\n  log_dir: \"" + (dir / "logs").string() + "\"\n" +
                           "  checkpointer: {base_path: \"" + (dir / "checkpoints").string() +
                           "\", keep: [{every: 3}]}\n" + "optimizer: {learning_rate: 1e-2, warmup: 0.1}\n";
  const char* argv[] = {"test"};
  return levanter::config::parse_command_line<levanter::TrainLmConfig>(1, argv, yaml, "<test>").config;
}

using M = tiny::TinyLm;

levanter::train_result train(const levanter::TrainLmConfig& cfg, const std::vector<levanter::hook<M>>& hooks = {}) {
  std::ostringstream out;
  return levanter::run_train_lm<M>(cfg, tiny::TinyConfig{}, levanter::config::to_yaml_string(cfg), out, hooks);
}

std::map<std::int64_t, std::string> losses(const fs::path& metrics) {
  std::map<std::int64_t, std::string> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == "log" && j["metrics"].contains("train/loss"))
      out[j["step"].get<std::int64_t>()] = j["metrics"]["train/loss"].dump();
  }
  return out;
}

struct stop_here : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

TEST_CASE("custom model: a model defined outside levanter trains, evaluates, logs, checkpoints and resumes") {
  auto dir = temp_dir("train");
  write_corpus(dir / "train.jsonl", 80, 1);
  write_corpus(dir / "valid.jsonl", 10, 2);

  auto cfg = config_for(dir, "whole");
  const auto whole = train(cfg);
  CHECK(whole.steps == 10);
  CHECK(whole.first_loss == doctest::Approx(std::log(257.0)).epsilon(0.05));
  CHECK(whole.final_loss < whole.first_loss - 1.0);
  REQUIRE(whole.eval_loss.has_value());
  CHECK(whole.parameters == tiny::TinyConfig{}.parameter_count(257));
  const fs::path rd = dir / "logs" / "whole";
  for (const char* f : {"config.yaml", "metrics.jsonl", "summary.json", "run_metadata.json", "train_lm.log"})
    CHECK_MESSAGE(fs::exists(rd / f), f);
  // The checkpoint holds this model's parameters by their reflected names.
  const fs::path last = dir / "checkpoints" / "whole" / "step-10";
  REQUIRE(fs::exists(last / "metadata.json"));
  levanter::checkpoint::reader r((last / "model.h5").string());
  CHECK(r.has("head.weight"));
  CHECK(r.axes("head.weight") == std::vector<std::string>{"embed", "vocab"});
  CHECK(r.has("mlp.c_fc.weight"));
  CHECK(levanter::checkpoint_vocab_size(levanter::find_checkpoint(last.string(), "test", [](const std::string&) {})) ==
        257);

  // Interrupted after 5 updates and resumed from step-3: bitwise the losses of the uninterrupted run.
  auto split = config_for(dir, "split");
  CHECK_THROWS_AS(train(split, {levanter::hook<M>{1,
                                                   [](const levanter::step_info<M>& s) {
                                                     if (s.next_step == 5) throw stop_here("killed");
                                                   },
                                                   false}}),
                  stop_here);
  const auto resumed = train(split);
  CHECK(resumed.start_step == 3);
  CHECK(losses(rd / "metrics.jsonl") == losses(dir / "logs" / "split" / "metrics.jsonl"));
  CHECK(resumed.final_loss == whole.final_loss);

  // What this model lacks is refused by name, not ignored: it has no Hugging Face adapter.
  auto hf = config_for(dir, "hf");
  hf.hf_save_path = (dir / "hf").string();
  CHECK_THROWS_WITH_AS(train(hf), doctest::Contains("'tiny_mlp_lm' has no Hugging Face adapter"),
                       levanter::config::config_error);
  fs::remove_all(dir);
}

TEST_CASE("custom model: its gradients match finite differences through the generic next-token loss") {
  // The generic loss over an {embed, vocab} head (the layout GPT-2 does not use) differentiated by haliax: check a
  // few parameters of each leaf against central differences.
  tiny::TinyConfig c;
  c.hidden_dim = 4;
  c.mlp_dim = 6;
  auto model = M::init(c, 11, hax::random::make_key(3));
  std::vector<std::int32_t> ids = {1, 4, 2, 9, 0, 3, 3, 10, 5, 7, 6, 8};
  auto tokens = hax::from_host<std::int32_t>(ids, 2 * levanter::Batch, 6 * levanter::Pos);
  const auto ex = levanter::lm_example::causal(tokens, -1);
  auto [loss, grads] = hax::value_and_grad([&](const M& m) { return levanter::compute_next_token_loss(m, c, ex); })(model);
  auto loss_of = [&](const M& m) {
    hax::no_grad_guard ng;
    return double(levanter::compute_next_token_loss(m, c, ex).item());
  };
  std::map<std::string, std::vector<float>> g;
  hax::tree::for_each_leaf(grads, [&](const std::string& name, const auto& leaf) { g[name] = leaf.to_host(); });
  int checked = 0;
  hax::tree::for_each_leaf(model, [&](const std::string& name, auto& leaf) {
    auto host = leaf.to_host();
    for (std::size_t i = 0; i < host.size(); i += std::max<std::size_t>(1, host.size() / 3)) {
      const float h = 2e-4f;  // LayerNorm of tiny embeddings is steep: a larger step leaves the linear regime
      const float orig = host[i];
      auto with = [&](float v) {
        host[i] = v;
        M m = model;
        hax::tree::for_each_leaf(m, [&](const std::string& n2, auto& l2) {
          if (n2 != name) return;
          auto fresh = std::remove_cvref_t<decltype(l2)>::allocate(l2.sizes(), "fd");
          host_io::write_elements(fresh, host);
          l2 = fresh;
        });
        return loss_of(m);
      };
      const double fd = (with(orig + h) - with(orig - h)) / (2.0 * h);
      host[i] = orig;
      // float32 losses: the difference quotient carries about 1e-3 of rounding noise at this step.
      CHECK_MESSAGE(std::abs(g[name][i] - fd) <= 2e-3 + 3e-2 * std::abs(fd),
                    name << "[" << i << "]: autodiff " << g[name][i] << ", finite differences " << fd);
      ++checked;
    }
  });
  CHECK(checked >= 8);
  CHECK(std::isfinite(loss.item()));
}
