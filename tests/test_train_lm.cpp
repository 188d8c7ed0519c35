// train_lm end to end through its library entry point (levanter/main/train_lm.hpp): a tiny GPT-2 on a few
// documents written by the test — run directory contents, falling loss, micro-batching equal to one big batch,
// bitwise reproducibility (also across thread counts), and the user errors of the data path.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <levanter/main/train_lm.hpp>

namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("levanter_test_train_lm_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

/// A small corpus with some structure: repeated sentences about numbers.
void write_corpus(const fs::path& path, int docs, int seed) {
  std::ofstream out(path);
  const char* words[] = {"alpha", "beta", "gamma", "delta", "the", "cat", "sat", "on", "mat", "and", "ran"};
  unsigned s = 12345u + static_cast<unsigned>(seed);
  for (int d = 0; d < docs; ++d) {
    std::string text;
    for (int w = 0; w < 30; ++w) {
      s = s * 1103515245u + 12345u;
      text += words[(s >> 16) % 11];
      text += w % 7 == 6 ? ". " : " ";
    }
    out << "{\"text\": \"" << text << "\"}\n";
  }
}

levanter::TrainLmConfig tiny_config(const fs::path& dir, const std::string& extra = "") {
  const std::string yaml = "data:\n  train_urls: [\"" + (dir / "train.jsonl").string() + "\"]\n" +
                           "  validation_urls: [\"" + (dir / "valid.jsonl").string() + "\"]\n" +
                           "  tokenizer: byte\n"
                           "model: {type: gpt2, seq_len: 32, hidden_dim: 32, num_heads: 2, num_layers: 2}\n"
                           "trainer:\n  num_train_steps: 12\n  train_batch_size: 4\n  steps_per_eval: 6\n"
                           "  max_eval_batches: 2\n  id: test\n  log_dir: \"" + (dir / "logs").string() + "\"\n" +
                           "optimizer: {learning_rate: 3e-3, warmup: 2}\n" + extra;
  const char* argv[] = {"train_lm"};
  auto parsed = levanter::config::parse_command_line<levanter::TrainLmConfig>(1, argv, yaml, "<test>");
  const auto v = levanter::config::validate(parsed.config, parsed.sources);
  REQUIRE_MESSAGE(v.errors.empty(), (v.errors.empty() ? "" : v.errors.front()));
  return parsed.config;
}

std::vector<double> logged_losses(const fs::path& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == "log" && j["metrics"].contains("train/loss")) out.push_back(j["metrics"]["train/loss"].get<double>());
  }
  return out;
}

levanter::train_result run(const levanter::TrainLmConfig& cfg, const std::vector<levanter::hook>& hooks = {}) {
  std::ostringstream sink;
  return levanter::run_train_lm(cfg, levanter::config::to_yaml_string(cfg), sink, hooks);
}

}  // namespace

TEST_CASE("train_lm: a tiny run trains and leaves config, metrics and summary in the run directory") {
  auto dir = temp_dir("e2e");
  write_corpus(dir / "train.jsonl", 200, 1);
  write_corpus(dir / "valid.jsonl", 20, 2);
  auto cfg = tiny_config(dir);
  std::vector<std::int64_t> every5, at_end;
  auto res = run(cfg, {levanter::hook{5, [&](const levanter::step_info& s) { every5.push_back(s.step); }},
                       levanter::hook{0, [&](const levanter::step_info& s) { at_end.push_back(s.step); }, true}});
  CHECK(every5 == std::vector<std::int64_t>{5, 10});
  CHECK(at_end == std::vector<std::int64_t>{12});
  CHECK(res.steps == 12);
  CHECK(res.final_loss < res.first_loss - 0.5);
  CHECK(res.first_loss == doctest::Approx(std::log(257.0)).epsilon(0.05));
  REQUIRE(res.eval_loss.has_value());
  const fs::path rd = dir / "logs" / "test";
  CHECK(fs::exists(rd / "config.yaml"));
  CHECK(fs::exists(rd / "summary.json"));
  CHECK(fs::exists(rd / "train_lm.log"));
  // The resolved config reads back to the same settings.
  auto again = levanter::config::decode<levanter::TrainLmConfig>(YAML::LoadFile((rd / "config.yaml").string()));
  CHECK(again.trainer.num_train_steps == 12);
  // json_logger: hparams first, one log line per step with upstream's metric names, eval lines, summary, finish.
  std::ifstream in(rd / "metrics.jsonl");
  std::string line;
  std::vector<std::string> events;
  int evals = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    CHECK(j["tracker"] == "json_logger");
    events.push_back(j["event"]);
    if (j["event"] == "log" && j["metrics"].contains("eval/loss")) ++evals;
    if (j["event"] == "log" && j["metrics"].contains("train/loss")) {
      CHECK(j["metrics"].contains("optim/learning_rate"));
      CHECK(j["metrics"].contains("throughput/tokens_per_second"));
      CHECK(j["metrics"].contains("throughput/mfu"));
    }
  }
  REQUIRE(!events.empty());
  CHECK(events.front() == "hparams");
  CHECK(events.back() == "finish");
  CHECK(evals == 2);  // step 6 and the end
  auto summary = nlohmann::json::parse(std::ifstream(rd / "summary.json"));
  CHECK(summary["steps"] == 12);
  CHECK(summary["final_loss"].get<double>() == doctest::Approx(res.final_loss));
  fs::remove_all(dir);
}

TEST_CASE("train_lm: micro-batching gives the losses of one big batch") {
  auto dir = temp_dir("micro");
  write_corpus(dir / "train.jsonl", 100, 3);
  write_corpus(dir / "valid.jsonl", 10, 4);
  auto big = tiny_config(dir);
  big.trainer.num_train_steps = 5;
  big.trainer.id = "big";
  auto micro = big;
  micro.trainer.per_device_parallelism = 1;
  micro.trainer.id = "micro";
  run(big);
  run(micro);
  auto a = logged_losses(dir / "logs" / "big" / "metrics.jsonl");
  auto b = logged_losses(dir / "logs" / "micro" / "metrics.jsonl");
  REQUIRE(a.size() == 5);
  REQUIRE(b.size() == 5);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(b[i] == doctest::Approx(a[i]).epsilon(1e-5));
  fs::remove_all(dir);
}

TEST_CASE("train_lm: the same config gives bitwise the same losses, whatever the thread count") {
  auto dir = temp_dir("repro");
  write_corpus(dir / "train.jsonl", 100, 5);
  write_corpus(dir / "valid.jsonl", 10, 6);
  auto cfg = tiny_config(dir, "");
  cfg.trainer.num_train_steps = 6;
  cfg.data.shuffle = true;
  const int threads = haliax::num_threads();
  cfg.trainer.id = "a";
  run(cfg);
  haliax::set_num_threads(1);
  cfg.trainer.id = "b";
  run(cfg);
  haliax::set_num_threads(threads);
  auto a = logged_losses(dir / "logs" / "a" / "metrics.jsonl");
  auto b = logged_losses(dir / "logs" / "b" / "metrics.jsonl");
  REQUIRE(a.size() == 6);
  CHECK(a == b);
  // A different seed gives a different run.
  cfg.trainer.seed = 1;
  cfg.trainer.id = "c";
  run(cfg);
  CHECK(logged_losses(dir / "logs" / "c" / "metrics.jsonl") != a);
  fs::remove_all(dir);
}

TEST_CASE("train_lm: data errors name the file and what to do") {
  auto dir = temp_dir("errors");
  write_corpus(dir / "valid.jsonl", 10, 7);
  {
    auto cfg = tiny_config(dir);  // train.jsonl does not exist
    CHECK_THROWS_WITH_AS(run(cfg), doctest::Contains("train.jsonl' not found"), levanter::data::data_error);
  }
  {
    std::ofstream(dir / "train.jsonl") << "{\"text\": \"fine\"}\n{\"text\": broken\n";
    auto cfg = tiny_config(dir);
    CHECK_THROWS_WITH_AS(run(cfg), doctest::Contains("train.jsonl:2: malformed JSON line"), levanter::data::data_error);
  }
  {
    std::ofstream(dir / "train.jsonl") << "{\"body\": \"no text field\"}\n";
    auto cfg = tiny_config(dir);
    CHECK_THROWS_WITH_AS(run(cfg), doctest::Contains("no string field 'text'"), levanter::data::data_error);
  }
  {
    std::ofstream(dir / "train.jsonl") << "\n";
    auto cfg = tiny_config(dir);
    CHECK_THROWS_WITH_AS(run(cfg), doctest::Contains("no documents"), levanter::data::data_error);
  }
  {
    std::ofstream(dir / "train.jsonl") << "{\"text\": \"short\"}\n";
    auto cfg = tiny_config(dir);
    CHECK_THROWS_WITH_AS(run(cfg), doctest::Contains("fewer than one sequence"), levanter::data::data_error);
  }
  fs::remove_all(dir);
}

TEST_CASE("train_lm: NaN and infinite losses stop the run with the step and the metric") {
  CHECK_THROWS_WITH_AS(levanter::check_finite(std::nan(""), "train/loss", 7, true, true),
                       doctest::Contains("step 7: train/loss is NaN"), levanter::training_error);
  CHECK_THROWS_WITH_AS(levanter::check_finite(INFINITY, "train/loss", 3, true, true),
                       doctest::Contains("step 3: train/loss is infinite"), levanter::training_error);
  CHECK_NOTHROW(levanter::check_finite(std::nan(""), "train/loss", 7, false, true));
  CHECK_NOTHROW(levanter::check_finite(1.5, "train/loss", 7, true, true));
}

TEST_CASE("train_lm: batch-size schedules give upstream's data offsets") {
  levanter::config::IntSchedule s;
  s.steps = {{0, 4}, {10, 8}, {20, 16}};
  CHECK(levanter::data_offset_at(s, 0) == 0);
  CHECK(levanter::data_offset_at(s, 5) == 20);
  CHECK(levanter::data_offset_at(s, 10) == 40);
  CHECK(levanter::data_offset_at(s, 15) == 80);
  CHECK(levanter::data_offset_at(s, 25) == 40 + 80 + 80);
  CHECK(s.at(0) == 4);
  CHECK(s.at(19) == 8);
  CHECK(s.at(100) == 16);
}
