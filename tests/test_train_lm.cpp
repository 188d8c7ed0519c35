// train_lm end to end through its library entry point (levanter/main/train_lm.hpp): a tiny GPT-2 on a few
// documents written by the test — run directory contents, falling loss, micro-batching equal to one big batch,
// bitwise reproducibility (also across thread counts), and the user errors of the data path.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
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
                           "  checkpointer: {base_path: \"" + (dir / "checkpoints").string() + "\"}\n" +
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

namespace {

/// The last logged train/loss of every step, as the exact text json_logger wrote (a resumed run logs the steps
/// after its checkpoint again; the later record wins).
std::map<std::int64_t, std::string> loss_log(const fs::path& metrics) {
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

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct stop_here : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

TEST_CASE("train_lm: a run interrupted and resumed equals an uninterrupted one, bitwise") {
  auto dir = temp_dir("resume");
  write_corpus(dir / "train.jsonl", 100, 8);
  write_corpus(dir / "valid.jsonl", 10, 9);
  auto cfg = tiny_config(dir);
  cfg.data.shuffle = true;
  cfg.trainer.checkpointer.keep = {levanter::KeepPolicy{4, std::nullopt}};
  cfg.trainer.id = "whole";
  auto whole = run(cfg);
  CHECK(whole.start_step == 0);
  REQUIRE(whole.last_checkpoint.has_value());
  CHECK(fs::path(*whole.last_checkpoint).filename() == "step-12");

  // The same run stopped after step 7 (a hook throws, as a crash would stop it), then started again.
  cfg.trainer.id = "split";
  CHECK_THROWS_AS(run(cfg, {levanter::hook{7, [](const levanter::step_info&) { throw stop_here("killed"); }}}), stop_here);
  const fs::path ck = dir / "checkpoints" / "split";
  CHECK(fs::exists(ck / "step-4" / "metadata.json"));
  CHECK_FALSE(fs::exists(ck / "step-8"));
  auto resumed = run(cfg);
  CHECK(resumed.start_step == 4);
  REQUIRE(resumed.resumed_from.has_value());
  CHECK(fs::path(*resumed.resumed_from).filename() == "step-4");
  CHECK(resumed.final_loss == whole.final_loss);

  const auto a = loss_log(dir / "logs" / "whole" / "metrics.jsonl");
  const auto b = loss_log(dir / "logs" / "split" / "metrics.jsonl");
  REQUIRE(a.size() == 12);
  CHECK(a == b);
  // Final parameters and optimizer state: the same bytes.
  for (const char* f : {"model.h5", "opt_state.h5", "training_state.h5"})
    CHECK_MESSAGE(file_bytes(dir / "checkpoints" / "whole" / "step-12" / f) == file_bytes(ck / "step-12" / f), f);

  // Running it again finds step 12 and has nothing left to do.
  auto again = run(cfg);
  CHECK(again.start_step == 12);
  fs::remove_all(dir);
}

TEST_CASE("train_lm: resume skips a torn checkpoint, refuses to restart over unreadable ones, and initialize_from") {
  auto dir = temp_dir("torn");
  write_corpus(dir / "train.jsonl", 100, 10);
  write_corpus(dir / "valid.jsonl", 10, 11);
  auto cfg = tiny_config(dir);
  cfg.trainer.num_train_steps = 8;
  cfg.trainer.checkpointer.keep = {levanter::KeepPolicy{4, std::nullopt}};
  cfg.trainer.id = "r";
  run(cfg);
  const fs::path ck = dir / "checkpoints" / "r";
  REQUIRE(fs::exists(ck / "step-8" / "opt_state.h5"));
  fs::resize_file(ck / "step-8" / "opt_state.h5", 1000);
  cfg.trainer.num_train_steps = 10;
  std::ostringstream out;
  auto res = levanter::run_train_lm(cfg, levanter::config::to_yaml_string(cfg), out);
  CHECK(res.start_step == 4);
  CHECK(out.str().find("step-8") != std::string::npos);
  CHECK(out.str().find("torn") != std::string::npos);

  // Every checkpoint unreadable: an error, not a silent restart at step 0.
  for (const auto& e : fs::directory_iterator(ck))
    if (fs::exists(e.path() / "model.h5")) fs::resize_file(e.path() / "model.h5", 10);
  CHECK_THROWS_WITH_AS(run(cfg), doctest::Contains("none could be loaded"), levanter::checkpoint::error);

  // load_checkpoint: true with nothing there is an error; false ignores what is there.
  auto must = cfg;
  must.trainer.id = "nothing";
  must.trainer.load_checkpoint = true;
  CHECK_THROWS_WITH_AS(run(must), doctest::Contains("trainer.load_checkpoint is true but there is no checkpoint"),
                       levanter::checkpoint::error);
  auto fresh = cfg;
  fresh.trainer.load_checkpoint = false;
  fresh.trainer.num_train_steps = 3;
  CHECK(run(fresh).start_step == 0);

  // initialize_from: another run's checkpoint, its step included; saves go to this run's own directory.
  auto src = cfg;
  src.trainer.id = "src";
  src.trainer.num_train_steps = 4;
  const auto src_res = run(src);
  auto child = cfg;
  child.trainer.id = "child";
  child.trainer.num_train_steps = 6;
  child.trainer.initialize_from = (dir / "checkpoints" / "src").string();
  auto r = run(child);
  CHECK(r.start_step == 4);
  CHECK(fs::exists(dir / "checkpoints" / "child" / "step-6" / "metadata.json"));
  // initialize_from_checkpoint_path: the model only, at step 0.
  auto init_model = cfg;
  init_model.trainer.id = "from_model";
  init_model.trainer.num_train_steps = 3;
  init_model.initialize_from_checkpoint_path = (dir / "checkpoints" / "src" / "step-4").string();
  auto rm = run(init_model);
  CHECK(rm.start_step == 0);
  // It starts from trained weights, not from about ln(vocab).
  CHECK(rm.first_loss < src_res.first_loss - 0.5 * (src_res.first_loss - src_res.final_loss));
  fs::remove_all(dir);
}

TEST_CASE("train_lm: initialize_from_hf and hf_save_path") {
  auto dir = temp_dir("hf");
  write_corpus(dir / "train.jsonl", 100, 12);
  write_corpus(dir / "valid.jsonl", 10, 13);
  // Export during training, then start a new run from that export with the model config taken from it.
  auto cfg = tiny_config(dir);
  cfg.trainer.num_train_steps = 6;
  cfg.trainer.id = "exp";
  cfg.hf_save_path = (dir / "hf").string();
  cfg.hf_save_steps = 3;
  auto first = run(cfg);
  CHECK(fs::exists(dir / "hf" / "exp" / "step-3" / "model.safetensors"));
  CHECK(fs::exists(dir / "hf" / "exp" / "step-6" / "config.json"));
  auto next = tiny_config(dir);
  next.trainer.id = "imp";
  next.trainer.num_train_steps = 3;
  next.initialize_from_hf = (dir / "hf" / "exp" / "step-6").string();
  next.use_hf_model_config = true;
  next.model.get_if<levanter::Gpt2Config>()->hidden_dim = 64;  // replaced by the checkpoint's 32
  auto second = run(next);
  CHECK(second.start_step == 0);
  CHECK(second.parameters == first.parameters);
  CHECK(second.first_loss < first.first_loss - 0.5 * (first.first_loss - first.final_loss));
  // Without use_hf_model_config, an architecture mismatch is an error naming both values.
  next.use_hf_model_config = false;
  CHECK_THROWS_WITH_AS(run(next), doctest::Contains("n_embd 32 but the model config says 64"), levanter::hf::error);
  fs::remove_all(dir);
}

TEST_CASE("train_lm: a tracker list with tensorboard writes event files next to the json log") {
  auto dir = temp_dir("tb");
  write_corpus(dir / "train.jsonl", 100, 14);
  write_corpus(dir / "valid.jsonl", 10, 15);
  auto cfg = tiny_config(dir, "");
  cfg.trainer.num_train_steps = 3;
  cfg.trainer.id = "tb";
  levanter::TensorboardConfig tb;
  tb.logdir = (dir / "tblogs").string();
  levanter::TrackerChoice json_choice, tb_choice;
  json_choice.value = levanter::JsonLoggerConfig{};
  tb_choice.value = tb;
  cfg.trainer.tracker.items = {json_choice, tb_choice};
  cfg.trainer.tracker.is_list = true;
  run(cfg);
  CHECK(fs::exists(dir / "logs" / "tb" / "metrics.jsonl"));
  std::vector<fs::path> events;
  for (const auto& e : fs::directory_iterator(dir / "tblogs" / "tb"))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) events.push_back(e.path());
  REQUIRE(events.size() == 1);
  std::ifstream in(events[0], std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  for (const char* tag : {"brain.Event:2", "train/loss", "optim/learning_rate", "eval/loss", "hparams", "final_loss"})
    CHECK_MESSAGE(bytes.find(tag) != std::string::npos, tag);
  fs::remove_all(dir);
}
