// eval_lm through its library entry point (levanter/main/eval_lm.hpp): a tiny GPT-2 trained by train_lm evaluates
// to the loss train_lm's last evaluation reported (per tag too), the JSON report and the tracker records, the
// analyses (entropy, top-2 gap, parameter norms), a Hugging Face directory against a loss computed here from the
// logits, and the errors a user can make. The program itself is run by tests/eval_program.sh.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <levanter/main/eval_lm.hpp>
#include <levanter/main/hf_convert.hpp>
#include <levanter/main/train_lm.hpp>

#include "train_helpers.hpp"

namespace fs = std::filesystem;
namespace hax = haliax;
using G = levanter::gpt2::LMHeadModel;

namespace {

const std::string golden = std::string(HALIAX_GOLDEN_DIR);

fs::path temp_dir(const std::string& name) { return train_helpers::temp_dir("levanter_test_eval_lm", name); }
void write_corpus(const fs::path& path, int docs, int seed) { train_helpers::write_corpus(path, docs, seed, 777u); }

/// Trains the tiny model of tests/test_train_lm.cpp for a few steps; returns train_lm's final eval loss.
double train_tiny(const fs::path& dir) {
  const std::string yaml = "data:\n  train_urls: [\"" + (dir / "train.jsonl").string() + "\"]\n" +
                           "  validation_urls: [\"" + (dir / "valid.jsonl").string() + "\"]\n" +
                           "  tags: [words]\n  tokenizer: byte\n  cache_dir: \"" + (dir / "cache").string() + "\"\n"
                           "model: {type: gpt2, seq_len: 32, hidden_dim: 32, num_heads: 2, num_layers: 2}\n"
                           "trainer:\n  num_train_steps: 4\n  train_batch_size: 4\n  steps_per_eval: 1000\n"
                           "  max_eval_batches: 2\n  id: train\n  log_dir: \"" + (dir / "logs").string() + "\"\n" +
                           "  checkpointer: {base_path: \"" + (dir / "checkpoints").string() + "\"}\n" +
                           "optimizer: {learning_rate: 3e-3, warmup: 0.25}\n";
  const char* argv[] = {"train_lm"};
  auto parsed = levanter::config::parse_command_line<levanter::TrainLmConfig>(1, argv, yaml, "<test>");
  std::ostringstream sink;
  const auto res = levanter::run_train_lm<G>(parsed.config, *parsed.config.model.get_if<levanter::Gpt2Config>(),
                                             parsed.resolved_yaml, sink);
  REQUIRE(res.eval_loss.has_value());
  return *res.eval_loss;
}

/// eval_lm with `yaml` as its config file and `args` as overrides, as the program reads them.
levanter::eval_lm_result eval(const std::string& yaml, std::vector<std::string> args = {},
                              std::string* printed = nullptr) {
  std::vector<const char*> argv{"eval_lm"};
  for (const auto& a : args) argv.push_back(a.c_str());
  auto parsed = levanter::config::parse_command_line<levanter::EvalLmConfig>(static_cast<int>(argv.size()),
                                                                             argv.data(), yaml, "<test>");
  std::ostringstream out;
  auto r = levanter::run_eval_lm(parsed.config, parsed.sources, parsed.resolved_yaml, out);
  if (printed) *printed = out.str();
  return r;
}

std::string trainer_yaml(const fs::path& dir, const std::string& id) {
  return "trainer: {id: " + id + ", log_dir: \"" + (dir / "logs").string() + "\"}\n";
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE(in);
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("eval_lm: a train_lm checkpoint evaluates to train_lm's last eval loss, with tags, tracker and report") {
  auto dir = temp_dir("ckpt");
  write_corpus(dir / "train.jsonl", 60, 1);
  write_corpus(dir / "valid.jsonl", 20, 2);
  const double trained = train_tiny(dir);

  // Model, data (tags included) and the evaluation batches come from the checkpoint's config.yaml.
  std::string printed;
  const auto r = eval("checkpoint_path: \"" + (dir / "checkpoints" / "train").string() + "\"\n" +
                          trainer_yaml(dir, "eval"),
                      {}, &printed);
  REQUIRE(r.loss.has_value());
  CHECK(*r.loss == trained);  // the same model, windows and batches: bitwise the same
  CHECK(printed.find("Loss: ") != std::string::npos);
  CHECK(r.metrics.contains("eval/loss"));
  CHECK(r.metrics.contains("eval/bpb"));
  CHECK(r.metrics.contains("eval/words/loss"));
  CHECK(r.metrics.contains("eval/words/bpb"));
  CHECK(r.metrics["eval/words/loss"].get<double>() == trained);  // the only set carries the tag
  CHECK(r.metrics["eval/bpb"].get<double>() > 0);

  // The report.
  CHECK(r.output_path == (dir / "logs" / "eval" / "eval_results.json").string());
  const auto report = read_json(r.output_path);
  CHECK(report["program"] == "eval_lm");
  CHECK(report["loss"].get<double>() == trained);
  CHECK(report["model"]["step"] == 4);
  CHECK(report["model"]["type"] == "gpt2");
  CHECK(report["batch_size"] == 4);
  CHECK(report["max_eval_batches"] == 2);
  CHECK(report["metrics"]["eval/words/loss"].get<double>() == trained);
  // The tracker (json_logger): the eval dict at step 0.
  bool logged = false;
  std::ifstream metrics(dir / "logs" / "eval" / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["event"] == "log" && j["metrics"].contains("eval/loss")) {
      CHECK(j["step"] == 0);
      CHECK(j["metrics"]["eval/loss"].get<double>() == trained);
      logged = true;
    }
  }
  CHECK(logged);
  CHECK(fs::exists(dir / "logs" / "eval" / "config.yaml"));

  // Given keys override the checkpoint's: fewer batches, another output file; the analyses.
  const auto out_path = dir / "out" / "results.json";
  fs::create_directories(out_path.parent_path());
  const auto r2 = eval("checkpoint_path: \"" + (dir / "checkpoints" / "train" / "step-4").string() + "\"\n" +
                           trainer_yaml(dir, "eval2") + "output_path: \"" + out_path.string() + "\"\n",
                       {"--trainer.max_eval_batches", "1", "--log_entropy", "true", "--log_top2_gap", "true",
                        "--log_param_stats", "true"});
  REQUIRE(r2.loss.has_value());
  CHECK(*r2.loss != trained);
  CHECK(std::isfinite(*r2.loss));
  CHECK(r2.output_path == out_path.string());
  const auto report2 = read_json(out_path);
  CHECK(report2["max_eval_batches"] == 1);
  CHECK(report2["sets"][0]["windows_evaluated"] == 4);
  CHECK(report2["sets"][0]["tags"] == nlohmann::json::array({"words"}));
  const auto& m = report2["metrics"];
  // One batch of 4 windows of 32 tokens: every position of each window.
  REQUIRE(m.contains("analysis//entropy"));
  CHECK(m["analysis//entropy"]["num"] == 4 * 32);
  CHECK(m["analysis//entropy"]["min"].get<double>() >= 0);
  CHECK(m["analysis//entropy"]["max"].get<double>() <= std::log(257.0) + 1e-4);
  CHECK(m["analysis//entropy_mean"].get<double>() > 0);
  REQUIRE(m.contains("analysis//top2_gap"));
  CHECK(m["analysis//top2_gap"]["min"].get<double>() >= 0);
  CHECK(m["analysis//top2_gap"]["num"] == 4 * 32);
  CHECK(m["params/norm/total"].get<double>() > 0);
  CHECK(m.contains("params/norm/transformer.blocks.0.attn.c_attn.weight"));
  CHECK(m.contains("params/hist/transformer.blocks.1.attn.c_attn.weight"));

  // eval_on_train: the training set (in file order), under no tag of its own.
  const auto r3 = eval("checkpoint_path: \"" + (dir / "checkpoints" / "train").string() + "\"\n" +
                           trainer_yaml(dir, "eval3") + "eval_on_train: true\n");
  REQUIRE(r3.loss.has_value());
  CHECK(*r3.loss != trained);
  CHECK(std::isfinite(*r3.loss));
  CHECK(!r3.metrics.contains("eval/words/loss"));
  fs::remove_all(dir);
}

TEST_CASE("eval_lm: a Hugging Face directory evaluates to the loss of its logits") {
  auto dir = temp_dir("hf");
  // Documents of token ids for the passthrough tokenizer (no EOS): the stream is these ids, in order.
  std::vector<std::int32_t> stream;
  {
    std::ofstream out(dir / "ids.jsonl");
    for (int d = 0; d < 5; ++d) {
      out << "{\"text\": \"";
      for (int i = 0; i < 40; ++i) {
        const int id = (7 * d + 3 * i) % 100;
        out << id << " ";
        stream.push_back(id);
      }
      out << "\"}\n";
    }
  }
  const std::string yaml = "hf_checkpoint: \"" + golden + "/hf_gpt2_tiny\"\n" + trainer_yaml(dir, "hf") +
                           "data: {tokenizer: passthrough, vocab_size: 101, validation_urls: [\"" +
                           (dir / "ids.jsonl").string() + "\"], cache_dir: \"" + (dir / "cache").string() + "\"}\n";
  std::string printed;
  const auto r = eval(yaml, {"--trainer.train_batch_size", "3"}, &printed);
  REQUIRE(r.loss.has_value());

  // The same loss from the model's logits: windows of 16 tokens (config.json's n_positions), each position
  // predicting the next.
  auto d = levanter::hf::open_dir(golden + "/hf_gpt2_tiny", "test");
  const auto c = levanter::hf::config_from_hf<G>(levanter::Gpt2Config{}, d);
  auto model = G::init(c, d.vocab_size, hax::random::make_key(0));
  levanter::hf::load(d, model, c);
  REQUIRE(c.seq_len == 16);
  const std::int64_t L = 16, V = d.vocab_size, n = static_cast<std::int64_t>(stream.size()) / L;
  double nll = 0;
  std::int64_t count = 0;
  {
    hax::no_grad_guard ng;
    const std::vector<std::int32_t> host(stream.begin(), stream.begin() + n * L);
    const auto tokens = hax::from_host<std::int32_t>(host, n * levanter::Batch, L * levanter::Pos);
    const auto segments = hax::zeros<std::int32_t>(n * levanter::Batch, L * levanter::Pos);
    const auto logits = levanter::lm_logits(model, c, tokens, segments).to_host();
    for (std::int64_t w = 0; w < n; ++w)
      for (std::int64_t p = 0; p + 1 < L; ++p) {
        const float* l = logits.data() + (w * L + p) * V;
        double mx = l[0], z = 0;
        for (std::int64_t v = 0; v < V; ++v) mx = std::max(mx, double(l[v]));
        for (std::int64_t v = 0; v < V; ++v) z += std::exp(double(l[v]) - mx);
        nll += mx + std::log(z) - double(l[host[static_cast<std::size_t>(w * L + p + 1)]]);
        ++count;
      }
  }
  CHECK(*r.loss == doctest::Approx(nll / double(count)).epsilon(1e-5));
  const auto report = read_json(r.output_path);
  CHECK(report["model"]["kind"] == "hf_checkpoint");
  CHECK(report["model"]["step"].is_null());
  CHECK(report["model"]["seq_len"] == 16);
  CHECK(report["sets"][0]["windows"] == n);
  CHECK(report["sets"][0]["windows_evaluated"] == n);
  CHECK(printed.find("Loss: ") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("eval_lm: the errors a user can make name the key or the path") {
  auto dir = temp_dir("errors");
  using levanter::config::config_error;
  const std::string hf_dir = golden + "/hf_gpt2_tiny";
  const std::string trainer = trainer_yaml(dir, "err");
  write_corpus(dir / "valid.jsonl", 4, 3);
  const std::string data = "data: {tokenizer: passthrough, vocab_size: 101, validation_urls: [\"" +
                           (dir / "ids.jsonl").string() + "\"], cache_dir: \"" + (dir / "cache").string() + "\"}\n";
  {
    std::ofstream out(dir / "ids.jsonl");
    for (int d = 0; d < 3; ++d) out << "{\"text\": \"1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18\"}\n";
  }
  // Which model: neither, both.
  CHECK_THROWS_WITH_AS(eval(trainer + data), doctest::Contains("no model given: set checkpoint_path"), config_error);
  CHECK_THROWS_WITH_AS(eval(trainer + data + "checkpoint_path: a\nhf_checkpoint: b\n"),
                       doctest::Contains("checkpoint_path and hf_checkpoint are both set"), config_error);
  // Missing directories.
  CHECK_THROWS_WITH_AS(eval(trainer + data + "checkpoint_path: \"" + (dir / "nowhere").string() + "\"\n"),
                       doctest::Contains("checkpoint_path: no complete checkpoint under"), levanter::checkpoint::error);
  const std::string not_local = "hf_checkpoint: '" + (dir / "nowhere").string() + "' is not a local directory";
  CHECK_THROWS_WITH_AS(eval(trainer + data + "hf_checkpoint: \"" + (dir / "nowhere").string() + "\"\n"),
                       doctest::Contains(not_local.c_str()), levanter::hf::error);
  // The wrong model type: a directory of another architecture; a model section that is not the checkpoint's.
  fs::copy(hf_dir, dir / "bert");
  {
    auto j = nlohmann::json::parse(std::ifstream(dir / "bert" / "config.json"));
    j["model_type"] = "bert";
    std::ofstream(dir / "bert" / "config.json") << j.dump();
  }
  CHECK_THROWS_WITH_AS(eval(trainer + data + "hf_checkpoint: \"" + (dir / "bert").string() + "\"\n"),
                       doctest::Contains("model_type 'bert', which no built-in model reads"), levanter::hf::error);
  CHECK_THROWS_WITH_AS(eval(trainer + data + "hf_checkpoint: \"" + hf_dir + "\"\nmodel: {type: llama}\n"),
                       doctest::Contains("llama"), config_error);
  {
    levanter::ImportHfConfig ic;
    ic.hf_checkpoint = hf_dir;
    ic.output_path = (dir / "imported").string();
    std::ostringstream sink;
    levanter::run_import_hf_to_lm(ic, sink);
  }
  const std::string imported = "checkpoint_path: \"" + (dir / "imported").string() + "\"\n";
  CHECK(eval(trainer + data + imported).loss.has_value());  // the imported checkpoint itself is fine
  CHECK_THROWS_WITH_AS(eval(trainer + data + imported, {"--model.hidden_dim", "64", "--model.num_heads", "4"}),
                       doctest::Contains("does not describe the checkpoint's model"), levanter::checkpoint::error);
  // No validation data, too little of it, a tokenizer larger than the model's vocabulary.
  CHECK_THROWS_WITH_AS(eval(trainer + imported, {"--data.tokenizer", "passthrough", "--data.vocab_size", "101"}),
                       doctest::Contains("data.validation_urls is empty"), config_error);
  {
    std::ofstream(dir / "short.jsonl") << "{\"text\": \"1 2 3\"}\n";
    CHECK_THROWS_WITH_AS(eval(trainer + data + imported,
                              {"--data.validation_urls", "[\"" + (dir / "short.jsonl").string() + "\"]",
                               "--data.cache_dir", (dir / "cache_short").string()}),
                         doctest::Contains("fewer tokens than one window of seq_len 16"), levanter::data::data_error);
  }
  CHECK_THROWS_WITH_AS(eval(trainer + imported,
                            {"--data.tokenizer", "byte", "--data.validation_urls",
                             "[\"" + (dir / "valid.jsonl").string() + "\"]", "--data.cache_dir",
                             (dir / "cache_byte").string()}),
                       doctest::Contains("more than the model's vocabulary of 101"), config_error);
  CHECK_THROWS_WITH_AS(eval(trainer + "hf_checkpoint: \"" + hf_dir + "\"\n"),
                       doctest::Contains("data.tokenizer: not given"), config_error);

  // Through the program: exit codes as programs.hpp says.
  auto run_main = [](std::vector<std::string> args) {
    std::vector<char*> argv{const_cast<char*>("eval_lm")};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    return levanter::eval_lm_main(static_cast<int>(argv.size()) - 1, argv.data());
  };
  CHECK(run_main({"--trainer.log_dir", (dir / "logs").string()}) == 2);
  CHECK(run_main({"--checkpoint_path", (dir / "nowhere").string(), "--trainer.log_dir", (dir / "logs").string()}) ==
        5);
  fs::remove_all(dir);
}

TEST_CASE("eval_lm: a large batch evaluated in parts gives the loss of the whole batch") {
  levanter::Gpt2Config c;
  c.seq_len = 8;
  c.hidden_dim = 16;
  c.num_layers = 1;
  c.num_heads = 2;
  const auto model = G::init(c, 50, hax::random::make_key(5));
  std::vector<std::int32_t> host;
  for (int i = 0; i < 7 * 8; ++i) host.push_back((i * 13 + 5) % 50);  // EOS (49) and the ignored id (7) among them
  hax::no_grad_guard ng;
  const auto ex = levanter::lm_example::causal(hax::from_host<std::int32_t>(host, 7 * levanter::Batch, 8 * levanter::Pos),
                                               49, 7);
  std::function<double(const levanter::lm_example&)> loss = [&](const levanter::lm_example& e) {
    return levanter::compute_next_token_loss(model, c, e).item();
  };
  const double whole = loss(ex);
  for (std::int64_t rows : {1, 2, 3, 7, 100})
    CHECK(levanter::detail::chunked_loss(loss, rows)(ex) == doctest::Approx(whole).epsilon(1e-6));
}

TEST_CASE("eval_lm: a supervised run's checkpoint evaluates its packed responses as train_lm did") {
  // The data section comes from the checkpoint with its format: eval_lm reads supervised records as packed rows
  // with the loss on the responses (data::open_split), not as text.
  auto dir = temp_dir("supervised");
  for (const char* name : {"train.jsonl", "valid.jsonl"}) {
    std::ofstream out(dir / name);
    for (int i = 0; i < (name[0] == 't' ? 60 : 16); ++i)
      out << "{\"prompt\": \"what follows " << i << "?\", \"response\": \" " << i + 1 << "\"}\n";
  }
  const std::string yaml = "data:\n  train_urls: [\"" + (dir / "train.jsonl").string() + "\"]\n" +
                           "  validation_urls: [\"" + (dir / "valid.jsonl").string() + "\"]\n" +
                           "  format: {type: supervised}\n  tokenizer: byte\n  cache_dir: \"" +
                           (dir / "cache").string() + "\"\n"
                           "model: {type: gpt2, seq_len: 32, hidden_dim: 32, num_heads: 2, num_layers: 2}\n"
                           "trainer:\n  num_train_steps: 4\n  train_batch_size: 4\n  steps_per_eval: 1000\n"
                           "  max_eval_batches: 2\n  id: train\n  log_dir: \"" + (dir / "logs").string() + "\"\n" +
                           "  checkpointer: {base_path: \"" + (dir / "checkpoints").string() + "\"}\n" +
                           "optimizer: {learning_rate: 3e-3, warmup: 0.25}\n";
  const char* argv[] = {"train_lm"};
  auto parsed = levanter::config::parse_command_line<levanter::TrainLmConfig>(1, argv, yaml, "<test>");
  std::ostringstream sink;
  const auto res = levanter::run_train_lm<G>(parsed.config, *parsed.config.model.get_if<levanter::Gpt2Config>(),
                                             parsed.resolved_yaml, sink);
  REQUIRE(res.eval_loss.has_value());
  const auto r = eval("checkpoint_path: \"" + (dir / "checkpoints" / "train").string() + "\"\n" +
                      trainer_yaml(dir, "eval"));
  REQUIRE(r.loss.has_value());
  CHECK(*r.loss == *res.eval_loss);
  fs::remove_all(dir);
}
