// train_lm end to end through its library entry point (levanter/main/train_lm.hpp): a tiny GPT-2 on a few
// documents written by the test — run directory contents, falling loss, micro-batching equal to one big batch,
// bitwise reproducibility (also across thread counts), and the user errors of the data path.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <levanter/main/sft.hpp>
#include <levanter/main/train_lm.hpp>

#include "train_helpers.hpp"

namespace fs = std::filesystem;
using train_helpers::file_bytes;
using train_helpers::loss_log;
using train_helpers::write_corpus;

namespace {

fs::path temp_dir(const std::string& name) { return train_helpers::temp_dir("levanter_test_train_lm", name); }

levanter::TrainLmConfig tiny_config(const fs::path& dir, const std::string& extra = "") {
  const std::string yaml = "data:\n  train_urls: [\"" + (dir / "train.jsonl").string() + "\"]\n" +
                           "  validation_urls: [\"" + (dir / "valid.jsonl").string() + "\"]\n" +
                           "  tokenizer: byte\n  cache_dir: \"" + (dir / "cache").string() + "\"\n"
                           "model: {type: gpt2, seq_len: 32, hidden_dim: 32, num_heads: 2, num_layers: 2}\n"
                           "trainer:\n  num_train_steps: 12\n  train_batch_size: 4\n  steps_per_eval: 6\n"
                           "  max_eval_batches: 2\n  id: test\n  log_dir: \"" + (dir / "logs").string() + "\"\n" +
                           "  checkpointer: {base_path: \"" + (dir / "checkpoints").string() + "\"}\n" +
                           "optimizer: {learning_rate: 3e-3, warmup: 2}\n" + extra;
  const char* argv[] = {"train_lm"};
  auto parsed = levanter::config::parse_command_line<levanter::TrainLmConfig>(1, argv, yaml, "<test>");
  const auto v = levanter::validate_train_lm(parsed.config, parsed.sources);
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

using G = levanter::gpt2::LMHeadModel;
using hook = levanter::hook<G>;
using step_info = levanter::step_info<G>;

levanter::train_result run(const levanter::TrainLmConfig& cfg, const std::vector<hook>& hooks = {}) {
  std::ostringstream sink;
  return levanter::run_train_lm<G>(cfg, *cfg.model.get_if<levanter::Gpt2Config>(), levanter::config::to_yaml_string(cfg),
                                   sink, hooks);
}

/// A hook that stops the run (as a crash would) once `steps` updates are applied.
hook stop_after(std::int64_t steps);

}  // namespace

TEST_CASE("train_lm: a tiny run trains and leaves config, metrics and summary in the run directory") {
  auto dir = temp_dir("e2e");
  write_corpus(dir / "train.jsonl", 200, 1);
  write_corpus(dir / "valid.jsonl", 20, 2);
  auto cfg = tiny_config(dir);
  // Hooks as upstream: info.step is the index of the step just taken; `every` fires on its multiples, and at_end
  // once more after the last step.
  std::vector<std::int64_t> every5, at_end, every5_forced;
  auto res = run(cfg, {hook{5, [&](const step_info& s) { every5.push_back(s.step); }, false},
                       hook{0, [&](const step_info& s) { at_end.push_back(s.next_step); }, true},
                       hook{5, [&](const step_info& s) { every5_forced.push_back(s.step); }, true}});
  CHECK(every5 == std::vector<std::int64_t>{0, 5, 10});
  CHECK(at_end == std::vector<std::int64_t>{12});
  CHECK(every5_forced == std::vector<std::int64_t>{0, 5, 10, 11});
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
      // MFU divides by the GEMM rate measured on this model's own products: above 1 the peak was mis-measured.
      const double mfu = j["metrics"]["throughput/mfu"].get<double>(), hfu = j["metrics"]["throughput/hfu"].get<double>();
      CHECK(mfu > 0);
      CHECK(mfu <= 1.0);
      // GPT-2's default gradient checkpointing recomputes every layer's forward: the hardware did more than the model.
      CHECK(hfu > mfu);
    }
  }
  REQUIRE(!events.empty());
  CHECK(events.front() == "hparams");
  CHECK(events.back() == "finish");
  CHECK(evals == 3);  // after steps 0 and 6 (upstream's schedule), and at the end (step 11)
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
  int n = 0;
  auto config = [&] {  // a fresh cache per case: a cache remembers the files it was built from
    auto cfg = tiny_config(dir);
    cfg.data.cache_dir = (dir / ("cache" + std::to_string(n++))).string();
    return cfg;
  };
  {
    auto cfg = config();  // train.jsonl does not exist
    CHECK_THROWS_WITH_AS(run(cfg), doctest::Contains("train.jsonl"), levanter::data::data_error);
  }
  {
    std::ofstream(dir / "train.jsonl") << "{\"text\": \"fine\"}\n{\"text\": broken\n";
    auto cfg = config();
    CHECK_THROWS_WITH_AS(run(cfg), doctest::Contains("train.jsonl:2"), levanter::data::data_error);
  }
  {
    std::ofstream(dir / "train.jsonl") << "{\"body\": \"no text field\"}\n";
    auto cfg = config();
    CHECK_THROWS_WITH_AS(run(cfg), doctest::Contains("'text'"), levanter::data::data_error);
  }
  {
    std::ofstream(dir / "train.jsonl") << "\n";
    auto cfg = config();
    CHECK_THROWS_WITH_AS(run(cfg), doctest::Contains("no documents"), levanter::data::data_error);
  }
  {
    std::ofstream(dir / "train.jsonl") << "{\"text\": \"short\"}\n";
    auto cfg = config();
    CHECK_THROWS_WITH_AS(run(cfg), doctest::Contains("fewer than one window"), levanter::data::data_error);
  }
  {
    // skip-and-count: the bad line is left out and training goes on.
    std::ofstream out(dir / "train.jsonl");
    for (int i = 0; i < 40; ++i) out << "{\"text\": \"the cat sat on the mat and ran away from the dog\"}\n";
    out << "{\"text\": broken\n";
    out.close();
    auto cfg = config();
    cfg.data.bad_documents = "skip";
    cfg.trainer.num_train_steps = 4;
    CHECK_NOTHROW(run(cfg));
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

struct stop_here : std::runtime_error {
  using std::runtime_error::runtime_error;
};

hook stop_after(std::int64_t steps) {
  return hook{1, [steps](const step_info& s) {
                if (s.next_step == steps) throw stop_here("killed");
              },
              false};
}

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
  CHECK_THROWS_AS(run(cfg, {stop_after(7)}), stop_here);
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
  auto res = levanter::run_train_lm<G>(cfg, *cfg.model.get_if<levanter::Gpt2Config>(),
                                       levanter::config::to_yaml_string(cfg), out);
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
  // As upstream's save_hf_checkpoint_callback: after step index 3 (not 0), and at the end (index 5).
  CHECK(fs::exists(dir / "hf" / "exp" / "step-3" / "model.safetensors"));
  CHECK(fs::exists(dir / "hf" / "exp" / "step-5" / "config.json"));
  CHECK_FALSE(fs::exists(dir / "hf" / "exp" / "step-0"));
  auto next = tiny_config(dir);
  next.trainer.id = "imp";
  next.trainer.num_train_steps = 3;
  next.initialize_from_hf = (dir / "hf" / "exp" / "step-5").string();
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
  cfg.trainer.watch.include_histograms = true;  // watched at step 0: norms as scalars, histograms as histograms
  run(cfg);
  CHECK(fs::exists(dir / "logs" / "tb" / "metrics.jsonl"));
  std::vector<fs::path> events;
  for (const auto& e : fs::directory_iterator(dir / "tblogs" / "tb"))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) events.push_back(e.path());
  REQUIRE(events.size() == 1);
  std::ifstream in(events[0], std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  for (const char* tag : {"brain.Event:2", "train/loss", "optim/learning_rate", "eval/loss", "hparams", "final_loss",
                          "grad/norm/total", "params/hist/transformer.ln_f.weight", "throughput/loading_time"})
    CHECK_MESSAGE(bytes.find(tag) != std::string::npos, tag);
  fs::remove_all(dir);
}

TEST_CASE("train_lm: watch norms and histograms, loading and hook times, run metadata, and the profiler") {
  auto dir = temp_dir("observe");
  write_corpus(dir / "train.jsonl", 100, 16);
  write_corpus(dir / "valid.jsonl", 10, 17);
  auto cfg = tiny_config(dir);
  cfg.trainer.watch.watch_targets.items = {"grads", "params", "updates", "opt_state"};
  cfg.trainer.watch.include_histograms = true;
  cfg.trainer.watch.interval = 5;
  cfg.trainer.profiler = true;
  cfg.trainer.profiler_start_step = 2;
  cfg.trainer.profiler_num_steps = 3;
  cfg.trainer.num_train_steps = 11;
  cfg.trainer.id = "observe";
  run(cfg);
  const auto run_dir = dir / "logs" / "observe";
  std::map<std::int64_t, nlohmann::json> by_step;
  {
    std::ifstream in(run_dir / "metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      if (j["event"] == "log" && j["metrics"].contains("train/loss")) by_step[j["step"].get<std::int64_t>()] = j["metrics"];
      if (j["event"] == "hparams") {
        // The run metadata rides along with the config in the hyperparameters.
        CHECK(j["hparams"]["run_metadata"].contains("openblas_core"));
        CHECK(j["hparams"]["run_metadata"]["libraries"].contains("kokkos"));
        CHECK(j["hparams"].contains("trainer"));
      }
    }
  }
  REQUIRE(by_step.size() == 11);
  for (const auto& sm : by_step) {
    const auto step = sm.first;  // not a structured binding: clang before 16 cannot capture one
    const auto& m = sm.second;
    CHECK(m.contains("throughput/loading_time"));
    CHECK(m.contains("throughput/hook_time"));
    CHECK(m["throughput/loading_time"].get<double>() >= 0);
    // Watched every 5 steps (0, 5, 10), not in between.
    CHECK_MESSAGE(m.contains("grad/norm/total") == (step % 5 == 0), step);
  }
  const auto& w = by_step.at(5);
  // Upstream's names: per parameter, stacked blocks split per layer with '.' paths.
  for (const char* k : {"grad/norm/total", "params/norm/total", "updates/norm/total", "opt_state/mu/norm/total",
                        "opt_state/nu/norm/total", "grad/norm/transformer.blocks.0.attn.c_attn.weight",
                        "grad/norm/transformer.blocks.1.mlp.c_fc.weight", "params/norm/embeddings.token_embeddings.weight",
                        "grad/hist/transformer.blocks.1.attn.c_proj.weight", "params/hist/transformer.ln_f.weight"})
    CHECK_MESSAGE(w.contains(k), k);
  // The total gradient norm is the optimizer's (pre-clipping) gradient norm.
  CHECK(w["grad/norm/total"].get<double>() == doctest::Approx(w["optim/grad_norm"].get<double>()).epsilon(1e-4));
  // The per-layer norms add up (in squares) to the stacked parameter's.
  double sq = 0, total_sq = 0;
  for (auto it = w.begin(); it != w.end(); ++it)
    if (it.key().rfind("grad/norm/", 0) == 0 && it.key() != "grad/norm/total") sq += std::pow(it.value().get<double>(), 2);
  total_sq = std::pow(w["grad/norm/total"].get<double>(), 2);
  CHECK(sq == doctest::Approx(total_sq).epsilon(1e-6));
  // Histograms land in json_logger as summaries.
  const auto& h = w["params/hist/transformer.ln_f.weight"];
  CHECK(h["num"].get<std::int64_t>() == 32);
  CHECK(h["min"].get<double>() <= h["max"].get<double>());
  // The updates are the parameter change of that step: non-zero, and far smaller than the parameters.
  CHECK(w["updates/norm/total"].get<double>() > 0);
  CHECK(w["updates/norm/total"].get<double>() < 0.5 * w["params/norm/total"].get<double>());

  // run_metadata.json
  std::ifstream md_in(run_dir / "run_metadata.json");
  REQUIRE(md_in);
  const auto md = nlohmann::json::parse(md_in);
  for (const char* k : {"git_sha", "git_dirty", "build_type", "compiler", "libraries", "openblas_core", "openblas_threads",
                        "threads", "ranks", "host", "start_time"})
    CHECK_MESSAGE(md.contains(k), k);
  CHECK(md["ranks"].get<int>() == 1);

  // The profiler: steps 2..4, a table and its JSON, with GEMMs (their axes and GFLOP/s), kernels and phases.
  REQUIRE(fs::exists(run_dir / "profile.txt"));
  std::ifstream pj_in(run_dir / "profile.json");
  const auto pj = nlohmann::json::parse(pj_in);
  CHECK(pj["first_step"].get<int>() == 2);
  CHECK(pj["steps"].get<int>() == 3);
  bool fwd_dot = false, bwd_dot = false, kernel = false, optimizer = false;
  double self_sum = 0;
  for (const auto& op : pj["ops"]) {
    self_sum += op["self_seconds"].get<double>();
    CHECK(op["calls"].get<std::int64_t>() > 0);
    if (op["op"] == "dot" && op["phase"] == "forward") {
      fwd_dot = true;
      CHECK(op["axes"].get<std::string>().find("embed") != std::string::npos);
      CHECK(op["gflops_per_second"].get<double>() > 0);
    }
    if (op["op"] == "dot" && op["phase"] == "backward") bwd_dot = true;
    if (op["op"].get<std::string>().rfind("haliax::", 0) == 0) kernel = true;
    if (op["op"] == "optimizer update") optimizer = true;
  }
  CHECK(fwd_dot);
  CHECK(bwd_dot);
  CHECK(kernel);
  CHECK(optimizer);
  CHECK(self_sum <= pj["wall_seconds"].get<double>() * 1.01);
  CHECK(self_sum > 0.5 * pj["wall_seconds"].get<double>());
  // Profiling is off again after the profiled steps: nothing listens to Kokkos any more.
  CHECK_FALSE(Kokkos::Tools::profileLibraryLoaded());
  fs::remove_all(dir);
}

namespace {
levanter::config::Opaque opaque(const std::string& yaml) {
  levanter::config::Opaque o;
  o.set = true;
  o.yaml = yaml;
  o.where = "<test>";
  return o;
}

/// tiny_config's run on a mixture of two datasets (train files only) at equal weights, blocks of 8.
levanter::TrainLmConfig two_dataset_mixture(const fs::path& dir, const std::string& a, const fs::path& a_train,
                                            const std::string& b, const fs::path& b_train) {
  auto cfg = tiny_config(dir);
  cfg.data.train_urls.clear();
  cfg.data.validation_urls.clear();
  cfg.data.configs = opaque("{" + a + ": {train_urls: [\"" + a_train.string() + "\"]}, " + b + ": {train_urls: [\"" +
                            b_train.string() + "\"]}}");
  cfg.data.train_weights = opaque("{" + a + ": 0.5, " + b + ": 0.5}");
  cfg.data.mixture_block_size = 8;
  return cfg;
}
}  // namespace

TEST_CASE("train_lm: a mixture of two datasets with staged weights, per-tag eval losses and bits per byte, resumed") {
  auto dir = temp_dir("mixture");
  write_corpus(dir / "a_train.jsonl", 60, 20);
  write_corpus(dir / "a_valid.jsonl", 10, 21);
  {
    std::ofstream out(dir / "b_train.jsonl");
    for (int i = 0; i < 60; ++i) out << "{\"text\": \"" << std::string(40 + i % 7, char('a' + i % 26)) << " " << i << "\"}\n";
  }
  std::filesystem::copy_file(dir / "b_train.jsonl", dir / "b_valid.jsonl");
  auto cfg = tiny_config(dir);
  cfg.data.train_urls.clear();
  cfg.data.validation_urls.clear();
  cfg.data.configs = opaque("{alpha: {train_urls: [\"" + (dir / "a_train.jsonl").string() + "\"], validation_urls: [\"" +
                            (dir / "a_valid.jsonl").string() + "\"], tags: [words]}, beta: {train_urls: [\"" +
                            (dir / "b_train.jsonl").string() + "\"], validation_urls: [\"" + (dir / "b_valid.jsonl").string() +
                            "\"]}}");
  cfg.data.train_weights = opaque("[[0, {alpha: 0.75, beta: 0.25}], [4, {alpha: 0.25, beta: 0.75}]]");
  cfg.data.mixture_block_size = 8;
  cfg.data.shuffle = true;
  cfg.trainer.checkpointer.keep = {levanter::KeepPolicy{4, std::nullopt}};
  cfg.trainer.id = "mix";
  auto whole = run(cfg);
  CHECK(whole.final_loss < whole.first_loss);
  // Each dataset has its own cache under cache_dir/<name>/.
  for (const char* c : {"alpha/train", "alpha/validation", "beta/train", "beta/validation"})
    CHECK_MESSAGE(fs::exists(dir / "cache" / c / "shard_ledger.json"), c);
  // Per-tag eval metrics.
  nlohmann::json last_eval;
  {
    std::ifstream in(dir / "logs" / "mix" / "metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      if (j["event"] == "log" && j["metrics"].contains("eval/loss")) last_eval = j["metrics"];
    }
  }
  for (const char* k : {"eval/loss", "eval/bpb", "eval/alpha/loss", "eval/beta/loss", "eval/words/loss", "eval/alpha/bpb",
                        "eval/macro_loss"})
    CHECK_MESSAGE(last_eval.contains(k), k);
  CHECK(last_eval["eval/words/loss"].get<double>() == last_eval["eval/alpha/loss"].get<double>());
  const double a = last_eval["eval/alpha/loss"], b = last_eval["eval/beta/loss"];
  CHECK(last_eval["eval/macro_loss"].get<double>() == doctest::Approx((a + a + b) / 3));
  CHECK(std::min(a, b) <= last_eval["eval/loss"].get<double>());
  CHECK(last_eval["eval/loss"].get<double>() <= std::max(a, b));
  // Bytes: one per byte token (EOS counts none), so bits per byte = loss / ln 2 * targets / bytes > loss / ln 2.
  CHECK(last_eval["eval/bpb"].get<double>() > last_eval["eval/loss"].get<double>() / std::log(2.0));

  // Stopped after step 6 and resumed: the same batches, the same losses.
  cfg.trainer.id = "mix-split";
  CHECK_THROWS_AS(run(cfg, {stop_after(6)}), stop_here);
  auto resumed = run(cfg);
  CHECK(resumed.start_step == 4);
  CHECK(loss_log(dir / "logs" / "mix" / "metrics.jsonl") == loss_log(dir / "logs" / "mix-split" / "metrics.jsonl"));

  // Bad weights name the key.
  cfg.trainer.id = "mix-bad";
  cfg.data.train_weights = opaque("{alpha: 1, gamma: 1}");
  CHECK_THROWS_WITH_AS(run(cfg), doctest::Contains("gamma"), levanter::data::data_error);
  fs::remove_all(dir);
}

TEST_CASE("train_lm: epoch N and a mixture's stop_strategy end the run where the data ends") {
  auto dir = temp_dir("epochs");
  write_corpus(dir / "train.jsonl", 12, 30);
  write_corpus(dir / "valid.jsonl", 5, 31);
  const auto windows_of = [](const levanter::TrainLmConfig& c, std::int64_t epochs) {
    levanter::data::lm_data::options o;
    o.seq_len = 32;
    o.batch_size = 4;
    o.data_key = haliax::random::make_key(0);
    o.epochs = epochs;
    levanter::data::lm_data d(c.data, o);
    return std::make_pair(d.single_size(), d.train_length());
  };

  // epoch: 2 over a single dataset: 2N examples, so floor(2N / 4) steps of 4, whatever num_train_steps says.
  auto cfg = tiny_config(dir, "epoch: 2\n");
  cfg.trainer.num_train_steps = 1000;
  cfg.data.shuffle = true;
  cfg.trainer.id = "two-epochs";
  const auto [n, length] = windows_of(cfg, 2);
  REQUIRE(n > 10);
  CHECK(length == 2 * n);
  CHECK_FALSE(windows_of(cfg, 0).second.has_value());  // epoch: 0, no end
  auto res = run(cfg);
  CHECK(res.steps == 2 * n / 4);
  REQUIRE(res.last_checkpoint.has_value());
  CHECK(fs::path(*res.last_checkpoint).filename() == "step-" + std::to_string(2 * n / 4));
  CHECK(loss_log(dir / "logs" / "two-epochs" / "metrics.jsonl").size() == static_cast<std::size_t>(2 * n / 4));
  const std::string log = file_bytes(dir / "logs" / "two-epochs" / "train_lm.log");
  CHECK(log.find("the training data ends after " + std::to_string(2 * n) + " examples: training stops after step " +
                 std::to_string(2 * n / 4) + " of trainer.num_train_steps 1000") != std::string::npos);
  if ((2 * n) % 4 != 0) CHECK(log.find("do not fill a batch and are left out") != std::string::npos);
  // Run again: the checkpoint is where the data ends, so there is nothing left to train.
  auto again = run(cfg);
  CHECK(again.start_step == res.steps);
  CHECK(again.steps == res.steps);
  CHECK(file_bytes(dir / "logs" / "two-epochs" / "train_lm.log").find("(where the training data ends); nothing to "
                                                                        "train") != std::string::npos);
  // A shorter run than the data is unchanged: num_train_steps still ends it.
  cfg.trainer.id = "short";
  cfg.trainer.num_train_steps = 3;
  CHECK(run(cfg).steps == 3);

  // A mixture with first_exhausted / all_exhausted ends where upstream's MixtureDataset's length says.
  write_corpus(dir / "b_train.jsonl", 40, 32);
  auto mix = two_dataset_mixture(dir, "small", dir / "train.jsonl", "big", dir / "b_train.jsonl");
  mix.trainer.num_train_steps = 1000;
  mix.trainer.steps_per_eval = 1000;
  std::int64_t first_len = 0;
  for (const char* stop : {"first_exhausted", "all_exhausted"}) {
    CAPTURE(stop);
    mix.data.stop_strategy = stop;
    mix.trainer.id = std::string("mix-") + stop;
    levanter::data::lm_data::options o;
    o.seq_len = 32;
    o.batch_size = 4;
    o.data_key = haliax::random::split(haliax::random::make_key(static_cast<std::uint64_t>(mix.trainer.seed)), 4)[0];
    const auto len = levanter::data::lm_data(mix.data, o).train_length();
    REQUIRE(len.has_value());
    // Equal weights: 'small' (n windows) runs out near example 2n, 'big' near 2 x its windows.
    if (std::string(stop) == "first_exhausted") {
      CHECK(*len >= 2 * n - 8);
      CHECK(*len <= 2 * n + 8);
      first_len = *len;
    } else {
      CHECK(*len > first_len);
    }
    CHECK(run(mix).steps == *len / 4);
  }
  // epoch with a mixture is refused, as upstream.
  mix.epoch = 2;
  const auto v = levanter::validate_train_lm(mix, {});
  std::string errors;
  for (const auto& e : v.errors) errors += e + "\n";
  CHECK(errors.find("epochs are not supported for mixture datasets") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("data: max_train_batches, simulated epoching and num_validation_sequences shape a mixture, as upstream") {
  auto dir = temp_dir("caps");
  write_corpus(dir / "a.jsonl", 12, 40);  // words: every window holds letters
  {
    std::ofstream out(dir / "b.jsonl");  // digits only
    unsigned s = 7;
    for (int d = 0; d < 12; ++d) {
      std::string text;
      for (int w = 0; w < 25; ++w) {
        s = s * 1103515245u + 12345u;
        text += std::to_string((s >> 8) % 100000) + " ";
      }
      out << "{\"text\": \"" << text << "\"}\n";
    }
  }
  auto cfg = two_dataset_mixture(dir, "a", dir / "a.jsonl", "b", dir / "b.jsonl");
  cfg.data.shuffle = true;
  levanter::data::lm_data::options o;
  o.seq_len = 32;
  o.batch_size = 4;
  o.data_key = haliax::random::make_key(3);
  // The distinct windows each dataset contributes to the first 2000 examples (restart wraps, so all of them).
  const auto distinct = [&](const levanter::TrainLmConfig& c) {
    levanter::data::lm_data data(c.data, o);
    const auto rows = data.examples(0, 2000);
    std::set<std::vector<std::int32_t>> a, b;
    for (std::size_t r = 0; r < 2000; ++r) {
      std::vector<std::int32_t> row(rows.begin() + static_cast<std::ptrdiff_t>(r * 32),
                                    rows.begin() + static_cast<std::ptrdiff_t>((r + 1) * 32));
      const bool letters = std::any_of(row.begin(), row.end(), [](std::int32_t t) { return t >= 'a' && t <= 'z'; });
      (letters ? a : b).insert(row);
    }
    return std::make_tuple(a.size(), b.size(), data.train_windows(0)->final_size(), data.train_windows(1)->final_size());
  };
  const auto [a_all, b_all, na, nb] = distinct(cfg);
  REQUIRE(na > 20);
  REQUIRE(nb > 20);
  CHECK(a_all == static_cast<std::size_t>(na));
  CHECK(b_all == static_cast<std::size_t>(nb));

  // max_train_batches {a: 2}: 'a' gives only the first 2 x 4 examples of its shuffled order; 'b' all of its own.
  auto capped = cfg;
  capped.data.max_train_batches = opaque("{a: 2}");
  const auto [a_cap, b_cap, na2, nb2] = distinct(capped);
  CHECK(a_cap == 8);
  CHECK(b_cap == static_cast<std::size_t>(nb));
  // ... and with first_exhausted the mixture ends when those 8 are drawn (about 16 examples at equal weights).
  capped.data.stop_strategy = "first_exhausted";
  const auto len = levanter::data::lm_data(capped.data, o).train_length();
  REQUIRE(len.has_value());
  CHECK(*len >= 8);
  CHECK(*len <= 24);

  // Simulated epoching keeps int(length x experiment / target) of every dataset.
  auto simulated = cfg;
  simulated.data.target_budget = opaque("1000");
  simulated.data.experiment_budget = opaque("500");
  const auto [a_sim, b_sim, na3, nb3] = distinct(simulated);
  CHECK(a_sim == static_cast<std::size_t>(na / 2));
  CHECK(b_sim == static_cast<std::size_t>(nb / 2));

  // num_validation_sequences {a: 5}: the last 5 windows of a's fixed split order (a Feistel permutation keyed
  // PRNGKey(0)) are its validation set, and training never sees them.
  const auto rows_of = [](const levanter::data::cache_windows& w) {
    std::set<std::vector<std::int32_t>> out;
    for (std::int64_t i = 0; i < w.final_size(); ++i) {
      std::vector<std::int32_t> row(32);
      w.window(i, row.data());
      out.insert(row);
    }
    return out;
  };
  for (const bool shuffled_split : {true, false}) {
    CAPTURE(shuffled_split);
    auto held = cfg;
    held.data.num_validation_sequences = opaque("{a: 5}");
    held.data.shuffle_before_trainval_split = shuffled_split;
    levanter::data::lm_data data(held.data, o);
    REQUIRE(data.validation_sets().size() == 1);
    const auto& v = data.validation_sets().front();
    CHECK(v.name == "a");
    CHECK(v.tags == std::vector<std::string>{"a"});
    REQUIRE(v.windows->final_size() == 5);
    const auto held_rows = rows_of(*v.windows);
    CHECK(held_rows.size() == 5);
    if (!shuffled_split)  // in order: the dataset's last 5 windows
      for (std::int64_t j = 0; j < 5; ++j) {
        std::vector<std::int32_t> a(32), b(32);
        v.windows->window(j, a.data());
        data.train_windows(0)->window(na - 5 + j, b.data());
        CHECK(a == b);
      }
    const auto rows = data.examples(0, 2000);
    std::set<std::vector<std::int32_t>> trained;
    for (std::size_t r = 0; r < 2000; ++r)
      trained.insert(std::vector<std::int32_t>(rows.begin() + static_cast<std::ptrdiff_t>(r * 32),
                                               rows.begin() + static_cast<std::ptrdiff_t>((r + 1) * 32)));
    for (const auto& h : held_rows) CHECK_FALSE(trained.count(h));
    CHECK(trained.size() == static_cast<std::size_t>(na - 5 + nb));  // every other window is trained on
  }
  {  // train_lm evaluates on the held-out windows under the dataset's tag
    auto held_run = cfg;
    held_run.data.num_validation_sequences = opaque("{a: 5}");
    held_run.trainer.id = "held";
    held_run.trainer.num_train_steps = 4;
    const auto r = run(held_run);
    REQUIRE(r.eval_loss.has_value());
    CHECK(file_bytes(dir / "logs" / "held" / "metrics.jsonl").find("\"eval/a/loss\"") != std::string::npos);
  }
  auto no_room = cfg;
  no_room.data.num_validation_sequences = opaque("{a: 10000}");
  CHECK_THROWS_WITH_AS(levanter::data::lm_data(no_room.data, o), doctest::Contains("leave none of the dataset's"),
                       levanter::data::data_error);

  // Errors name the key.
  auto too_many = cfg;
  too_many.data.max_train_batches = opaque("{a: 1000}");
  CHECK_THROWS_WITH_AS(levanter::data::lm_data(too_many.data, o), doctest::Contains("data.max_train_batches.a: 1000 batches"),
                       levanter::data::data_error);
  const auto errors_of = [](const levanter::TrainLmConfig& c) {
    std::string all;
    for (const auto& e : levanter::validate_train_lm(c, {}).errors) all += e + "\n";
    return all;
  };
  auto unknown = cfg;
  unknown.data.max_train_batches = opaque("{c: 1}");
  CHECK(errors_of(unknown).find("data.max_train_batches.c (<test>): no dataset 'c' in data.configs") != std::string::npos);
  auto backwards = cfg;
  backwards.data.target_budget = opaque("100");
  backwards.data.experiment_budget = opaque("500");
  CHECK(errors_of(backwards).find("experiment budget should be smaller than target budget") != std::string::npos);
  auto both = simulated;
  both.data.max_train_batches = opaque("{a: 1}");
  CHECK(errors_of(both).find("data.max_train_batches (<test>): cannot be combined with simulated epoching") != std::string::npos);
  auto unknown_split = cfg;
  unknown_split.data.num_validation_sequences = opaque("{web: 3}");
  CHECK(errors_of(unknown_split).find("data.num_validation_sequences.web (<test>): no dataset 'web'") !=
        std::string::npos);
  auto single = tiny_config(dir);
  single.data.max_train_batches = opaque("{a: 1}");
  CHECK(errors_of(single).find("data.max_train_batches (<test>): caps the datasets of a mixture") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("train_lm: a Hugging Face tokenizer.json, its cache reused, and a cache of another tokenizer refused") {
  auto dir = temp_dir("hftok");
  write_corpus(dir / "train.jsonl", 100, 22);
  write_corpus(dir / "valid.jsonl", 10, 23);
  const std::string tok_path = std::string(LEVANTER_SOURCE_DIR) + "/tests/golden/tokenizers/gpt2_style/tokenizer.json";
  auto cfg = tiny_config(dir);
  cfg.data.tokenizer = tok_path;
  cfg.trainer.id = "hftok";
  auto r = run(cfg);
  CHECK(r.final_loss < r.first_loss);
  const auto tok = levanter::data::tokenizer::from_file(tok_path);
  // The cache holds the tokenizer's ids, EOS after each document, and names the tokenizer in its ledger.
  std::ifstream ledger_in(dir / "cache" / "train" / "shard_ledger.json");
  const auto ledger = nlohmann::json::parse(ledger_in);
  CHECK(ledger["is_finished"].get<bool>());
  CHECK(ledger.dump().find(tok.content_hash()) != std::string::npos);
  // A second run reuses the cache as it is.
  cfg.trainer.id = "hftok2";
  auto r2 = run(cfg);
  CHECK(r2.first_loss == r.first_loss);
  // The byte tokenizer on the same cache_dir: refused, naming both settings.
  cfg.data.tokenizer = "byte";
  cfg.trainer.id = "hftok3";
  CHECK_THROWS_WITH_AS(run(cfg), doctest::Contains("vocab_size"), levanter::data::data_error);
  fs::remove_all(dir);
}

TEST_CASE("train_lm: the upstream oracle's YAML gives upstream Levanter's per-step and eval losses") {
  // tests/golden/upstream_train_lm: a tiny GPT-2 on local jsonl with a byte-level BPE tokenizer.json, run by the real
  // upstream Levanter (tests/oracle/gen_upstream_train_lm_golden.py). Same token stream (BOS/EOS added as text),
  // same step numbering and evaluation schedule (after step indices 0, 20, 40 and at the end), the last partial
  // eval batch counted: every loss within 2e-6 of upstream's (XLA's own run-to-run jitter is 1.4e-6).
  const fs::path src = LEVANTER_SOURCE_DIR;
  const fs::path golden = src / "tests" / "golden" / "upstream_train_lm";
  auto dir = temp_dir("upstream");
  const auto cwd = fs::current_path();
  fs::current_path(src);  // the config's paths are relative to the repository root
  const std::string args[] = {"train_lm", "tests/golden/upstream_train_lm/config.yaml", "--data.cache_dir", (dir / "cache").string(), "--trainer.log_dir",
                              (dir / "logs").string(), "--trainer.checkpointer.base_path", (dir / "ckpt").string(),
                              "--trainer.id", "upstream"};
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  auto parsed = levanter::config::parse_command_line<levanter::TrainLmConfig>(static_cast<int>(argv.size()),
                                                                              argv.data());
  REQUIRE(levanter::validate_train_lm(parsed.config, parsed.sources).errors.empty());
  std::ostringstream sink;
  levanter::run_train_lm<G>(parsed.config, *parsed.config.model.get_if<levanter::Gpt2Config>(),
                            parsed.resolved_yaml, sink);
  fs::current_path(cwd);

  const auto up = nlohmann::json::parse(std::ifstream(golden / "upstream_losses.json"));
  std::map<std::int64_t, double> train, evals;
  std::ifstream in(dir / "logs" / "upstream" / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] != "log") continue;
    if (j["metrics"].contains("train/loss")) train[j["step"].get<std::int64_t>()] = j["metrics"]["train/loss"];
    if (j["metrics"].contains("eval/loss")) evals[j["step"].get<std::int64_t>()] = j["metrics"]["eval/loss"];
  }
  REQUIRE(train.size() == up["train_loss"].size());
  double worst = 0;
  for (const auto& item : up["train_loss"].items()) {
    const std::string step = item.key();  // not a structured binding: clang before 16 cannot capture one
    const auto& want = item.value();
    const double got = train.at(std::stoll(step));
    worst = std::max(worst, std::abs(got - want.get<double>()));
    CHECK_MESSAGE(std::abs(got - want.get<double>()) <= 2e-6, "train/loss at step " << step << ": ours " << got
                                                                                    << ", upstream " << want);
  }
  MESSAGE("largest train/loss difference from upstream: " << worst);
  REQUIRE(evals.size() == up["eval"].size());
  for (const auto& e : up["eval"]) {
    const auto step = e["step"].get<std::int64_t>();
    REQUIRE_MESSAGE(evals.count(step), "no eval/loss logged at step " << step);
    CHECK_MESSAGE(std::abs(evals[step] - e["eval/loss"].get<double>()) <= 2e-6,
                  "eval/loss at step " << step << ": ours " << evals[step] << ", upstream " << e["eval/loss"]);
  }
  fs::remove_all(dir);
}

namespace {

/// Supervised records: an upper-case prompt and a lower-case response, so a byte token tells which part it is in.
/// Every fourth record has an empty response (its row is all prompt: never trained on); `variant` changes the
/// letters of those prompts only (same lengths).
void write_supervised(const fs::path& p, int n, int seed, bool variant) {
  std::ofstream out(p);
  for (int i = 0; i < n; ++i) {
    std::string prompt, response;
    const int lp = 5 + (i * 7 + seed) % 9, lr = i % 4 == 3 ? 0 : 3 + (i * 5 + seed) % 7;
    for (int j = 0; j < lp; ++j)
      prompt += static_cast<char>('A' + (i * 3 + j * 5 + seed + (variant && i % 4 == 3 ? 11 : 0)) % 26);
    for (int j = 0; j < lr; ++j) response += static_cast<char>('a' + (i * 7 + j * 3 + seed) % 26);
    out << "{\"prompt\": \"" << prompt << "\", \"response\": \"" << response << "\"}\n";
  }
}

/// The loss mask at work, end to end: `base` (run already, its log under dir/logs/<base id>) trains on the files
/// `write(dir, variant)` writes (train.jsonl, valid.jsonl). With `variant` (tokens never trained on and never attended
/// to by a trained position are changed, lengths kept) every loss is bitwise the same; with base's train.jsonl
/// changed by `edit_trained` (one trained letter) they differ.
void check_masked_changes(const fs::path& dir, const levanter::TrainLmConfig& base,
                          const std::function<void(const fs::path&, bool)>& write,
                          const std::function<void(std::string&)>& edit_trained);

/// Checks that each position of the `n` packed examples of 32 tokens in `b` is trained exactly when the next token
/// is a lower-case letter of the same row (the trained part of these test data); returns the trained positions.
std::int64_t trained_on_lower_case(const levanter::data::example_batch& b, std::int64_t n) {
  std::int64_t trained = 0;
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t p = 0; p + 1 < 32; ++p) {
      const auto i = static_cast<std::size_t>(r * 32 + p);
      const bool next_trained = b.segments[i + 1] == b.segments[i] && b.segments[i] >= 0 && b.tokens[i + 1] >= 'a' &&
                                b.tokens[i + 1] <= 'z';
      CHECK(static_cast<bool>(b.keep[i]) == next_trained);
      trained += b.keep[i];
    }
  return trained;
}

/// Runs `cfg` as `id` for its 6 steps: the loss falls, and train_lm.log says `said` (how the data was packed).
void trains_and_says(levanter::TrainLmConfig& cfg, const fs::path& dir, const std::string& id, const std::string& said) {
  cfg.trainer.id = id;
  CHECK(run(cfg).steps == 6);
  const auto losses = logged_losses(dir / "logs" / id / "metrics.jsonl");
  REQUIRE(losses.size() == 6);
  CHECK(losses.back() < losses.front());
  CHECK(file_bytes(dir / "logs" / id / "train_lm.log").find(said) != std::string::npos);
}

}  // namespace

TEST_CASE("train_lm: supervised data is packed and trains on the responses only") {
  auto dir = temp_dir("supervised");
  write_supervised(dir / "train.jsonl", 80, 1, false);
  write_supervised(dir / "valid.jsonl", 12, 2, false);
  auto cfg = tiny_config(dir);
  cfg.data.format = opaque("{type: supervised, separate_with: \" \"}");
  cfg.trainer.num_train_steps = 6;

  // The batches: rows packed whole (segment ids are row indices, -1 for padding), the trained positions exactly
  // those whose next token is a response letter of the same row.
  levanter::data::lm_data::options o;
  o.seq_len = 32;
  o.batch_size = 4;
  o.data_key = haliax::random::make_key(0);
  {
    levanter::data::lm_data data(cfg.data, o);
    REQUIRE(data.train_windows(0)->packed());
    const auto n = data.single_size();
    CHECK(n > 10);
    CHECK(n < 80);  // several records per example
    CHECK(trained_on_lower_case(data.batch(0, n, 256, -100), n) > 100);
  }

  // Training: the loss falls; the log names the packing.
  trains_and_says(cfg, dir, "sft", "records packed into");

  // Records never trained on (empty responses) can change without changing any loss, bitwise: masked tokens
  // contribute nothing, and packed rows do not attend to each other. A change to one response letter does change them.
  check_masked_changes(
      dir, cfg,
      [](const fs::path& d, bool variant) {
        write_supervised(d / "train.jsonl", 80, 1, variant);
        write_supervised(d / "valid.jsonl", 12, 2, variant);
      },
      [](std::string& text) {
        const auto at = text.find("\"response\": \"") + 13;
        text[at] = text[at] == 'q' ? 'r' : 'q';
      });

  // Resuming a supervised run is bitwise the same as running it whole.
  cfg.trainer.id = "sft-split";
  cfg.trainer.checkpointer.keep = {levanter::KeepPolicy{2, std::nullopt}};
  CHECK_THROWS_AS(run(cfg, {stop_after(3)}), stop_here);
  auto resumed = run(cfg);
  CHECK(resumed.start_step == 2);
  CHECK(loss_log(dir / "logs" / "sft-split" / "metrics.jsonl") == loss_log(dir / "logs" / "sft" / "metrics.jsonl"));

  // Single-turn chat (upstream SingleTurnChatProcessor): the first user and the first assistant message, wherever
  // they are, make the same rows as the supervised records (without a separator), so the same examples.
  {
    std::ifstream in(dir / "train.jsonl");
    std::ofstream out(dir / "chat.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      const auto r = nlohmann::json::parse(line);
      nlohmann::json messages = nlohmann::json::array(
          {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", r["prompt"]}},
           {{"role", "assistant"}, {"content", r["response"]}}, {{"role", "user"}, {"content", "And then?"}},
           {{"role", "assistant"}, {"content", "Nothing."}}});
      out << nlohmann::json{{"conversation", messages}}.dump() << "\n";
    }
  }
  auto chat = cfg;
  chat.data.train_urls = {(dir / "chat.jsonl").string()};
  chat.data.validation_urls = {};
  chat.data.cache_dir = (dir / "chat-cache").string();
  chat.data.format = opaque("{type: chat, single_turn: true, messages_field: conversation}");
  auto plain = cfg;
  plain.data.validation_urls = {};
  plain.data.cache_dir = (dir / "plain-cache").string();
  plain.data.format = opaque("{type: supervised}");
  {
    const levanter::data::lm_data a(chat.data, o), b(plain.data, o);
    REQUIRE(a.single_size() == b.single_size());
    const auto x = a.batch(0, a.single_size(), 256, -100), y = b.batch(0, b.single_size(), 256, -100);
    CHECK(x.tokens == y.tokens);
    CHECK(x.keep == y.keep);
    CHECK(x.segments == y.segments);
  }
  {
    std::ofstream(dir / "chat.jsonl") << R"({"conversation": [{"role": "user", "content": "hi"}]})" << "\n";
    fs::remove_all(dir / "chat-cache");
    CHECK_THROWS_WITH_AS(levanter::data::lm_data(chat.data, o),
                         doctest::Contains("chat.jsonl:1: no message with role 'assistant' in 'conversation'"),
                         levanter::data::data_error);
  }

  // The text cache of the same files is not mistaken for the supervised one.
  cfg.data.format = {};
  cfg.trainer.id = "as-text";
  CHECK_THROWS_WITH_AS(run(cfg), doctest::Contains("format: cached"), levanter::data::data_error);
  fs::remove_all(dir);
}

namespace {

// An sft config (upstream SFTConfig keys) over `dir`, parsed and planned as the sft program does.
levanter::sft_plan sft_plan_of(const fs::path& dir, const std::string& extra) {
  const std::string yaml =
      "tokenizer: byte\nmax_seq_len: 32\nmodel: {type: gpt2}\n"
      "trainer:\n  num_train_steps: 8\n  train_batch_size: 4\n  id: sft\n  log_dir: \"" + (dir / "logs").string() +
      "\"\n  checkpointer: {base_path: \"" + (dir / "checkpoints").string() + "\", keep: [{every: 2}]}\n" +
      "optimizer: {learning_rate: 3e-3, warmup: 0.25}\n" + extra;
  const char* argv[] = {"sft"};
  auto parsed = levanter::config::parse_command_line<levanter::SftConfig>(1, argv, yaml, "<test>");
  return levanter::plan_sft(parsed.config, parsed.sources);
}

levanter::train_result run_sft(const levanter::sft_plan& p, const std::vector<hook>& hooks = {}) {
  std::ostringstream sink;
  return levanter::run_train_lm<G>(p.train, *p.train.model.get_if<levanter::Gpt2Config>(),
                                   levanter::config::to_yaml_string(p.train), sink, hooks);
}

// A tiny GPT-2 trained 4 steps on `dir`'s corpus and exported as Hugging Face does: the model sft fine-tunes.
fs::path hf_base(const fs::path& dir) {
  write_corpus(dir / "train.jsonl", 100, 12);
  write_corpus(dir / "valid.jsonl", 10, 13);
  auto base = tiny_config(dir);
  base.trainer.num_train_steps = 4;
  base.trainer.id = "base";
  base.hf_save_path = (dir / "hf").string();
  base.hf_save_steps = 4;
  run(base);
  const auto hf_dir = dir / "hf" / "base" / "step-3";
  REQUIRE(fs::exists(hf_dir / "config.json"));
  return hf_dir;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

}  // namespace

TEST_CASE("sft: upstream's SFTConfig fine-tunes a Hugging Face model on single-turn chats, resumes bitwise") {
  auto dir = temp_dir("sft");
  const auto hf_dir = hf_base(dir);

  // Chats whose prompt and response are supervised records' (roles as sft names them); record 5's prompt is longer
  // than a sequence, so sft leaves it out.
  write_supervised(dir / "records.jsonl", 60, 1, false);
  auto write_chats = [&](const fs::path& out_path, char long_prompt_letter) {
    std::ifstream in(dir / "records.jsonl");
    std::ofstream out(out_path);
    std::string line;
    for (int i = 0; std::getline(in, line); ++i) {
      const auto r = nlohmann::json::parse(line);
      const std::string prompt = i == 5 ? std::string(40, long_prompt_letter) : r["prompt"].get<std::string>();
      nlohmann::json messages = nlohmann::json::array({{{"role", "system"}, {"content", "Be brief."}},
                                                       {{"role", "human"}, {"content", prompt}},
                                                       {{"role", "gpt"}, {"content", r["response"]}}});
      out << nlohmann::json{{"messages", messages}}.dump() << "\n";
    }
  };
  write_chats(dir / "chats.jsonl", 'Q');
  const std::string data = "dataset_type: chat_jsonl\nchat_train_urls: [\"" + (dir / "chats.jsonl").string() +
                           "\"]\nsupervised_data: {cache_dir: \"" + (dir / "sft-cache").string() + "\"}\n" +
                           "input_role: human\noutput_role: gpt\ninitialize_from_hf: \"" + hf_dir.string() + "\"\n";
  const auto plan = sft_plan_of(dir, data + "epoch: 2\n");
  REQUIRE_MESSAGE(plan.checked.errors.empty(), joined(plan.checked.errors));
  CHECK(plan.train.use_hf_model_config);
  CHECK(plan.train.hf_seq_len == 32);

  // The examples: rows packed 4 at most, in a permutation of the rows, twice over; the loss on responses and EOS.
  {
    levanter::data::lm_data::options o;
    o.seq_len = 32;
    o.batch_size = 4;
    o.data_key = haliax::random::make_key(0);
    o.epochs = 1;
    const levanter::data::lm_data d(plan.train.data, o);
    const auto n = d.single_size();
    CHECK(n >= 2 * 59 / 4);  // 59 rows kept, twice, at most 4 to an example
    const auto b = d.batch(0, n, 256, -100);
    std::set<std::int32_t> segments_of_first;
    std::int64_t eos_trained = 0;
    for (std::int64_t r = 0; r < n; ++r) {
      std::set<std::int32_t> segs;
      for (std::int64_t p = 0; p < 32; ++p) {
        const auto i = static_cast<std::size_t>(r * 32 + p);
        if (b.segments[i] >= 0) segs.insert(b.segments[i]);
        if (b.keep[i] && b.tokens[i + 1] == 256) ++eos_trained;
      }
      CHECK(segs.size() <= 4);
    }
    CHECK(eos_trained == 2 * 59);  // every kept row ends with the EOS sft appends, which is trained
  }

  auto res = run_sft(plan);
  CHECK(res.steps == 8);
  const auto losses = logged_losses(dir / "logs" / "sft" / "metrics.jsonl");
  REQUIRE(losses.size() == 8);
  CHECK(losses.back() < losses.front());
  CHECK(file_bytes(dir / "logs" / "sft" / "train_lm.log").find("2 epochs, packed into") != std::string::npos);

  // The left-out row can change without changing anything; a response letter cannot.
  auto other = dir / "other";
  fs::create_directories(other);
  write_chats(other / "chats.jsonl", 'Z');
  auto other_data = [&](const std::string& file) {
    return "dataset_type: chat_jsonl\nchat_train_urls: [\"" + (other / file).string() +
           "\"]\nsupervised_data: {cache_dir: \"" + (other / ("cache-" + file)).string() + "\"}\n" +
           "input_role: human\noutput_role: gpt\ninitialize_from_hf: \"" + hf_dir.string() + "\"\nepoch: 2\n";
  };
  run_sft(sft_plan_of(other, other_data("chats.jsonl")));
  CHECK(loss_log(other / "logs" / "sft" / "metrics.jsonl") == loss_log(dir / "logs" / "sft" / "metrics.jsonl"));
  {
    std::string text = file_bytes(other / "chats.jsonl");
    int flipped = 0;  // the last letter of every non-empty response (JSON keys are sorted: content, then role)
    for (auto at = text.find("\",\"role\":\"gpt\""); at != std::string::npos; at = text.find("\",\"role\":\"gpt\"", at + 1))
      if (text[at - 1] >= 'a' && text[at - 1] <= 'z') {
        text[at - 1] = text[at - 1] == 'q' ? 'r' : 'q';
        ++flipped;
      }
    REQUIRE(flipped > 20);
    std::ofstream(other / "changed.jsonl") << text;
  }
  auto changed = sft_plan_of(other, other_data("changed.jsonl"));
  changed.train.trainer.id = "changed";
  run_sft(changed);
  CHECK(loss_log(other / "logs" / "changed" / "metrics.jsonl") != loss_log(dir / "logs" / "sft" / "metrics.jsonl"));

  // Interrupted and resumed, bitwise the same as whole.
  auto split = plan;
  split.train.trainer.id = "sft-split";
  CHECK_THROWS_AS(run_sft(split, {stop_after(5)}), stop_here);
  const auto resumed = run_sft(split);
  CHECK(resumed.start_step == 4);
  CHECK(loss_log(dir / "logs" / "sft-split" / "metrics.jsonl") == loss_log(dir / "logs" / "sft" / "metrics.jsonl"));

  // reinit_tokens re-draws rows before the first step (so the run differs); a token the tokenizer lacks is named.
  auto reinit = sft_plan_of(dir, data + "epoch: 2\nreinit_tokens: [q, z]\nreinit_lm_head: false\n");
  REQUIRE_MESSAGE(reinit.checked.errors.empty(), joined(reinit.checked.errors));
  REQUIRE(reinit.train.reinit_tokens);
  CHECK(reinit.train.reinit_tokens->tokens == std::vector<std::string>{"q", "z"});
  CHECK_FALSE(reinit.train.reinit_tokens->lm_head);
  reinit.train.trainer.id = "reinit";
  reinit.train.trainer.num_train_steps = 2;
  run_sft(reinit);
  const auto first_two = logged_losses(dir / "logs" / "reinit" / "metrics.jsonl");
  REQUIRE(first_two.size() == 2);
  CHECK(first_two.front() != losses.front());
  auto missing = sft_plan_of(dir, data + "reinit_tokens: [\"<|eot_id|>\"]\n");
  missing.train.trainer.id = "reinit-missing";
  CHECK_THROWS_WITH_AS(run_sft(missing), doctest::Contains("reinit_tokens: '<|eot_id|>' is not a token"),
                       levanter::config::config_error);

  // epoch 0 reads the rows once and the run ends with them; supervised records (dataset_type huggingface, local
  // files) train the same way.
  auto once = sft_plan_of(dir, "dataset_type: huggingface\nsupervised_data: {cache_dir: \"" +
                                   (dir / "sup-cache").string() + "\", train_urls: [\"" +
                                   (dir / "records.jsonl").string() + "\"]}\ninitialize_from_hf: \"" +
                                   hf_dir.string() + "\"\n");
  REQUIRE_MESSAGE(once.checked.errors.empty(), joined(once.checked.errors));
  once.train.trainer.id = "once";
  once.train.trainer.num_train_steps = 100;
  const auto ended = run_sft(once);
  CHECK(ended.steps < 16);  // 45 rows with a response, up to 4 to an example, 4 examples a step
  CHECK(ended.steps >= 2);
  fs::remove_all(dir);
}

TEST_CASE("sft: config errors name sft's keys and what to do") {
  auto dir = temp_dir("sft_errors");
  auto errors_of = [&](const std::string& yaml) { return joined(sft_plan_of(dir, yaml).checked.errors); };
  const auto none = errors_of("chat_train_urls: [a.jsonl]\nsupervised_data: {cache_dir: c}\n");
  CHECK(none.find("initialize_from_hf: sft fine-tunes a trained model") != std::string::npos);
  const auto missing = errors_of("trainer: {initialize_from: x}\n");
  CHECK(missing.find("supervised_data") != std::string::npos);
  CHECK(missing.find("chat_train_urls: required with dataset_type chat_jsonl") != std::string::npos);
  const auto hub = errors_of("dataset_type: huggingface\nsupervised_data: {id: tatsu-lab/alpaca, cache_dir: c}\n"
                             "initialize_from_hf: true\nmodel_name_or_path: meta-llama/Llama-3.1-8B\n");
  CHECK(hub.find("supervised_data.id") != std::string::npos);
  CHECK(hub.find("Hugging Face datasets are not supported") != std::string::npos);
  CHECK(hub.find("model_name_or_path") != std::string::npos);
  CHECK(hub.find("not a local directory") != std::string::npos);
  const auto both = errors_of("chat_train_urls: [a.jsonl]\nsupervised_data: {cache_dir: c}\n"
                              "initialize_from_hf: some/dir\ntrainer: {initialize_from: x}\n");
  CHECK(both.find("trainer.initialize_from") != std::string::npos);
  const auto odd = errors_of("dataset_type: parquet\nsupervised_data: {cache_dir: c}\nreinit_tokens: 3\n"
                             "trainer: {initialize_from: x}\nhf_save_path: out\n");
  CHECK(odd.find("unknown dataset type 'parquet'") != std::string::npos);
  CHECK_MESSAGE(odd.find("expected true, false or a list of tokens") != std::string::npos, odd);
  CHECK(odd.find("hf_save_steps: must be positive with hf_save_path") != std::string::npos);
  const auto remote = errors_of("chat_train_urls: [\"gs://bucket/x.jsonl\"]\nsupervised_data: {cache_dir: c}\n"
                                "trainer: {initialize_from: x}\n");
  CHECK(remote.find("chat_train_urls") != std::string::npos);
  CHECK(remote.find("remote") != std::string::npos);
  // A mixture-style map of sources: the first is used, with a note.
  const auto map = sft_plan_of(dir, "dataset_type: huggingface\ntrainer: {initialize_from: x}\nsupervised_data:\n"
                                    "  first: {cache_dir: c1, train_urls: [a.jsonl]}\n"
                                    "  second: {cache_dir: c2, train_urls: [b.jsonl]}\n");
  CHECK(map.checked.errors.empty());
  CHECK(map.train.data.cache_dir == "c1");
  CHECK(joined(map.checked.notes).find("sft uses the first ('first')") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("sft_mixture: upstream's SFTMixtureConfig mixes two chat datasets' rows, packs them, resumes bitwise") {
  auto dir = temp_dir("sft_mixture");
  const auto hf_dir = hf_base(dir);
  for (int part = 0; part < 2; ++part) {
    write_supervised(dir / ("records" + std::to_string(part) + ".jsonl"), 30 + 20 * part, 3 + part, false);
    std::ifstream in(dir / ("records" + std::to_string(part) + ".jsonl"));
    std::ofstream out(dir / ("chats" + std::to_string(part) + ".jsonl"));
    std::string line;
    while (std::getline(in, line)) {
      const auto r = nlohmann::json::parse(line);
      out << nlohmann::json{{"messages", nlohmann::json::array({{{"role", "user"}, {"content", r["prompt"]}},
                                                                {{"role", "assistant"}, {"content", r["response"]}}})}}
                 .dump()
          << "\n";
    }
  }
  auto yaml = [&](const std::string& id, const std::string& extra) {
    return "tokenizer: byte\nmax_seq_len: 32\nmodel: {type: gpt2}\ninitialize_from_hf: \"" + hf_dir.string() +
           "\"\nsupervised_data:\n  tulu: {cache_dir: \"" + (dir / "c0").string() + "\", train_urls: [\"" +
           (dir / "chats0.jsonl").string() + "\"]}\n  math: {cache_dir: \"" + (dir / "c1").string() +
           "\", train_urls: [\"" + (dir / "chats1.jsonl").string() + "\"]}\n" +
           "mixture_weights: {tulu: 3, math: 1}\nmixture_block_size: 8\n"
           "trainer:\n  num_train_steps: 6\n  train_batch_size: 4\n  id: " + id + "\n  log_dir: \"" +
           (dir / "logs").string() + "\"\n  checkpointer: {base_path: \"" + (dir / "checkpoints").string() +
           "\", keep: [{every: 2}]}\noptimizer: {learning_rate: 3e-3, warmup: 0.25}\n" + extra;
  };
  auto plan_of = [&](const std::string& y) {
    const char* argv[] = {"sft_mixture"};
    auto parsed = levanter::config::parse_command_line<levanter::SftMixtureConfig>(1, argv, y, "<test>");
    return levanter::plan_sft_mixture(parsed.config, parsed.sources);
  };
  const auto plan = plan_of(yaml("mix", ""));
  REQUIRE_MESSAGE(plan.checked.errors.empty(), joined(plan.checked.errors));
  CHECK(plan.train.data.sft->examples == 24);
  const auto res = run_sft(plan);
  CHECK(res.steps == 6);
  const auto losses = logged_losses(dir / "logs" / "mix" / "metrics.jsonl");
  REQUIRE(losses.size() == 6);
  CHECK(losses.back() < losses.front());
  CHECK(file_bytes(dir / "logs" / "mix" / "train_lm.log").find("sft mixture of 2 datasets: 24 examples") !=
        std::string::npos);

  // Other weights give other batches; an interrupted run resumes bitwise.
  auto other = plan_of(yaml("mix-other", "").replace(yaml("mix-other", "").find("{tulu: 3, math: 1}"), 18,
                                                      "{tulu: 1, math: 3}"));
  REQUIRE(other.checked.errors.empty());
  run_sft(other);
  CHECK(loss_log(dir / "logs" / "mix-other" / "metrics.jsonl") != loss_log(dir / "logs" / "mix" / "metrics.jsonl"));
  auto split = plan_of(yaml("mix-split", ""));
  CHECK_THROWS_AS(run_sft(split, {stop_after(3)}), stop_here);
  CHECK(run_sft(split).start_step == 2);
  CHECK(loss_log(dir / "logs" / "mix-split" / "metrics.jsonl") == loss_log(dir / "logs" / "mix" / "metrics.jsonl"));

  // Errors in sft_mixture's keys.
  const auto bad = joined(plan_of(yaml("bad", "stop_strategy: first_exhausted\n")).checked.errors);
  CHECK(bad.find("stop_strategy") != std::string::npos);
  CHECK(bad.find("use restart") != std::string::npos);
  auto unknown = yaml("bad", "");
  unknown.replace(unknown.find("{tulu: 3, math: 1}"), 18, "{tulu: 3, code: 1}");
  CHECK(joined(plan_of(unknown).checked.errors).find("mixture_weights") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("sft: reinit_tokens re-draws exactly the listed rows, around each feature's mean and spread") {
  levanter::Gpt2Config mc;
  mc.seq_len = 16;
  mc.hidden_dim = 32;
  mc.num_heads = 2;
  mc.num_layers = 1;
  // (models share their buffers when copied: each is made afresh from the same key)
  auto fresh = [&] { return G::init(mc, 64, haliax::random::make_key(1)); };
  const auto model = fresh();
  auto a = fresh(), b = fresh();
  const std::vector<std::int32_t> ids{3, 40};
  levanter::detail::reinit_token_rows(a, ids, haliax::random::make_key(7), true, true);
  levanter::detail::reinit_token_rows(b, ids, haliax::random::make_key(7), true, true);
  const auto before = model.embeddings.token_embeddings.weight.to_host(),
             after = a.embeddings.token_embeddings.weight.to_host();
  CHECK(after == b.embeddings.token_embeddings.weight.to_host());  // a function of the key
  const std::size_t E = 32;
  for (std::size_t e = 0; e < E; ++e) {
    double mean = 0, var = 0;
    for (std::size_t v = 0; v < 64; ++v) mean += before[v * E + e];
    mean /= 64;
    for (std::size_t v = 0; v < 64; ++v) var += (before[v * E + e] - mean) * (before[v * E + e] - mean);
    const double sd = std::sqrt(var / 64);
    for (std::size_t v = 0; v < 64; ++v) {
      const bool listed = v == 3 || v == 40;
      if (!listed) CHECK(after[v * E + e] == before[v * E + e]);
      if (listed) {
        CHECK(after[v * E + e] != before[v * E + e]);
        CHECK(std::abs(after[v * E + e] - mean) <= 3 * sd + 1e-6);
      }
    }
  }
  auto c = fresh();  // another key, other rows
  levanter::detail::reinit_token_rows(c, ids, haliax::random::make_key(8), true, true);
  CHECK(c.embeddings.token_embeddings.weight.to_host() != after);
  auto d = fresh();  // neither part: nothing changes
  levanter::detail::reinit_token_rows(d, ids, haliax::random::make_key(7), false, false);
  CHECK(d.embeddings.token_embeddings.weight.to_host() == before);
}

TEST_CASE("train_lm: format text with pack: true trains on whole documents, never across them") {
  auto dir = temp_dir("text_pack");
  write_corpus(dir / "train.jsonl", 100, 12);
  write_corpus(dir / "valid.jsonl", 10, 13);
  auto cfg = tiny_config(dir, "");
  cfg.data.format = opaque("{type: text, pack: true}");
  cfg.trainer.num_train_steps = 6;
  levanter::data::lm_data::options o;
  o.seq_len = 32;
  o.batch_size = 4;
  o.data_key = haliax::random::make_key(0);
  {
    const levanter::data::lm_data d(cfg.data, o);
    REQUIRE(d.train_windows(0)->packed());
    const auto n = d.single_size();
    const auto b = d.batch(0, n, 256, -100);
    std::int64_t eos_trained = 0, boundaries = 0;
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t p = 0; p + 1 < 32; ++p) {
        const auto i = static_cast<std::size_t>(r * 32 + p);
        if (b.segments[i] >= 0 && b.segments[i + 1] != b.segments[i]) ++boundaries;
        CHECK(static_cast<bool>(b.keep[i]) == (b.segments[i] >= 0 && b.segments[i + 1] == b.segments[i]));
        if (b.keep[i] && b.tokens[i] == 256) ++eos_trained;  // an EOS never predicts the next document
      }
    CHECK(boundaries > 0);
    CHECK(eos_trained == 0);
  }
  cfg.trainer.id = "packed";
  const auto res = run(cfg);
  CHECK(res.steps == 6);
  const auto losses = logged_losses(dir / "logs" / "packed" / "metrics.jsonl");
  REQUIRE(losses.size() == 6);
  CHECK(losses.back() < losses.front());
  CHECK(file_bytes(dir / "logs" / "packed" / "train_lm.log").find("documents packed into") != std::string::npos);
  fs::remove_all(dir);
}

namespace {

/// Multi-turn chats: upper-case user turns, lower-case assistant turns, and a last user turn after the last answer
/// (never trained on, and no trained position attends to it); `variant` changes that turn's letters only.
void write_chats(const fs::path& p, int n, int seed, bool variant) {
  std::ofstream out(p);
  auto word = [](int len, int s, char base) {
    std::string w;
    for (int j = 0; j < len; ++j) w += static_cast<char>(base + (s + j * 5) % 26);
    return w;
  };
  for (int i = 0; i < n; ++i) {
    nlohmann::json messages = nlohmann::json::array();
    if (i % 3 == 0) messages.push_back({{"role", "system"}, {"content", word(4, i + seed, 'A')}});
    const int turns = 1 + (i + seed) % 3;
    for (int t = 0; t < turns; ++t) {
      messages.push_back({{"role", "user"}, {"content", word(3 + (i + t) % 5, i * 7 + t + seed, 'A')}});
      messages.push_back({{"role", "assistant"}, {"content", word(2 + (i * 3 + t) % 6, i * 5 + t + seed, 'a')}});
    }
    messages.push_back({{"role", "user"}, {"content", word(4, i + seed + (variant ? 9 : 0), 'A')}});
    out << nlohmann::json{{"messages", messages}}.dump() << "\n";
  }
}

}  // namespace

TEST_CASE("train_lm: multi-turn chat is rendered with its template, packed, and trains on the assistant only") {
  auto dir = temp_dir("chat");
  write_chats(dir / "train.jsonl", 60, 1, false);
  write_chats(dir / "valid.jsonl", 10, 2, false);
  auto cfg = tiny_config(dir);
  // Assistant text (lower case) is the generation; user and system text are upper case, in brackets.
  cfg.data.format = opaque(
      "{type: chat, chat_template: \"{% for m in messages %}{% if m['role'] == 'assistant' %}<{% generation %}"
      "{{ m['content'] }}{% endgeneration %}>{% else %}[{{ m['content'] }}]{% endif %}{% endfor %}\"}");
  cfg.trainer.num_train_steps = 6;
  levanter::data::lm_data::options o;
  o.seq_len = 32;
  o.batch_size = 4;
  o.data_key = haliax::random::make_key(0);
  {
    levanter::data::lm_data data(cfg.data, o);
    REQUIRE(data.train_windows(0)->packed());
    const auto n = data.single_size();
    CHECK(n > 10);
    const auto b = data.batch(0, n, 256, -100);
    CHECK(trained_on_lower_case(b, n) > 100);  // the assistant's letters, and only those
    std::int64_t user_after_answer = 0;
    for (std::size_t i = 0; i + 1 < b.tokens.size(); ++i) user_after_answer += b.tokens[i] == '>' && b.tokens[i + 1] == '[';
    CHECK(user_after_answer > 0);
  }
  trains_and_says(cfg, dir, "chat", "conversations packed into");

  // The last user turns, never trained on and after every trained position, change: every loss is bitwise the same.
  // One assistant letter changes them.
  check_masked_changes(
      dir, cfg,
      [](const fs::path& d, bool variant) {
        write_chats(d / "train.jsonl", 60, 1, variant);
        write_chats(d / "valid.jsonl", 10, 2, variant);
      },
      [](std::string& text) {
        const auto at = text.find("\",\"role\":\"assistant\"") - 1;  // the first answer's last letter
        REQUIRE(text[at] >= 'a');
        text[at] = text[at] == 'q' ? 'r' : 'q';
      });

  // A template without a generation block is refused before training, naming the dataset's format.
  auto bad = tiny_config(dir);
  bad.data.format = opaque("{type: chat, chat_template: \"{% for m in messages %}{{ m['content'] }}{% endfor %}\"}");
  bad.data.cache_dir = (dir / "cache-bad").string();
  bad.trainer.id = "chat-bad";
  CHECK_THROWS_WITH(run(bad), doctest::Contains("data.format: chat data: the chat template has no {% generation %}"));
  fs::remove_all(dir);
}

namespace {

void check_masked_changes(const fs::path& dir, const levanter::TrainLmConfig& base,
                          const std::function<void(const fs::path&, bool)>& write,
                          const std::function<void(std::string&)>& edit_trained) {
  const std::string id = base.trainer.id.value();
  const auto base_log = loss_log(dir / "logs" / id / "metrics.jsonl");
  REQUIRE(!base_log.empty());
  const auto other = dir / "other";
  fs::create_directories(other);
  write(other, true);
  REQUIRE(file_bytes(other / "train.jsonl") != file_bytes(dir / "train.jsonl"));
  auto changed = tiny_config(other);
  changed.data.format = base.data.format;
  changed.trainer.num_train_steps = base.trainer.num_train_steps;
  changed.trainer.id = id + "-masked-change";
  run(changed);
  CHECK(loss_log(other / "logs" / (id + "-masked-change") / "metrics.jsonl") == base_log);
  std::string text = file_bytes(dir / "train.jsonl");
  edit_trained(text);
  std::ofstream(other / "train.jsonl") << text;
  fs::remove_all(other / "cache");
  changed.trainer.id = id + "-trained-change";
  run(changed);
  CHECK(loss_log(other / "logs" / (id + "-trained-change") / "metrics.jsonl") != base_log);
}

}  // namespace

TEST_CASE("train_lm: upstream's Tulu chat config resolves with local chats and reads them with the tokenizer's template") {
  // train_lm_llama3_tulu_sft.yaml: a mixture of one `format: {type: chat}` dataset. Here its data, tokenizer, model
  // and output paths are local (the tokenizer's tokenizer_config.json carries a Llama 3 chat template).
  auto dir = temp_dir("tulu_chat");
  fs::create_directories(dir);
  write_chats(dir / "chats.jsonl", 20, 3, false);
  const std::string tok = std::string(HALIAX_GOLDEN_DIR) + "/chat_data";
  // The Hub dataset's `id` line goes (as a user converting it to .jsonl would remove it); the rest is upstream's.
  std::string yaml = file_bytes(fs::path(LEVANTER_SOURCE_DIR) / "tests" / "upstream-config" /
                                "train_lm_llama3_tulu_sft.yaml");
  const auto id_at = yaml.find("      id: allenai/tulu-3-sft-mixture\n");
  REQUIRE(id_at != std::string::npos);
  yaml.erase(id_at, yaml.find('\n', id_at) + 1 - id_at);
  std::ofstream(dir / "tulu.yaml") << yaml;
  std::vector<std::string> args = {
      "train_lm", "--config_path", (dir / "tulu.yaml").string(),
      "--data.tokenizer", tok, "--data.cache_dir", (dir / "cache").string(), "--data.configs.tulu.train_urls",
      "[\"" + (dir / "chats.jsonl").string() + "\"]",
      "--initialize_from_hf", std::string(HALIAX_GOLDEN_DIR) + "/hf_llama/llama_mqa_llama3", "--hf_save_path",
      (dir / "hf").string(), "--trainer.tracker", "{type: json_logger}", "--trainer.wandb", "null",
      "--trainer.checkpointer.base_path", (dir / "ckpt").string()};
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  auto parsed = levanter::config::parse_command_line<levanter::TrainLmConfig>(static_cast<int>(argv.size()), argv.data());
  const auto v = levanter::validate_train_lm(parsed.config, parsed.sources);
  REQUIRE_MESSAGE(v.errors.empty(), (v.errors.empty() ? "" : v.errors.front()));
  levanter::data::lm_data::options o;
  o.seq_len = 64;
  o.batch_size = 4;
  o.data_key = haliax::random::make_key(0);
  const levanter::data::lm_data data(parsed.config.data, o);
  REQUIRE(data.is_mixture());
  const auto b = data.batch(0, 4, 1199, -100);
  const auto header = *data.tok().token_to_id("<|start_header_id|>");
  CHECK(std::count(b.tokens.begin(), b.tokens.end(), header) > 4);
  CHECK(std::count(b.keep.begin(), b.keep.end(), 1) > 20);
  fs::remove_all(dir);
}

TEST_CASE("sft: upstream's SFT configs resolve once data, tokenizer and model are local, or name their blocker") {
  // What a user does to try them here: local chats, a local tokenizer and Hugging Face model, local output paths and
  // a local tracker (the rest of each config is upstream's). Configs with mixture_weights go through sft_mixture,
  // with their dataset names kept.
  auto dir = temp_dir("sft_upstream");
  fs::create_directories(dir);
  std::ofstream(dir / "chats.jsonl") << R"({"messages": [{"role": "user", "content": "hi"}, )"
                                     << R"({"role": "assistant", "content": "hello"}]})" << "\n";
  const fs::path root = fs::path(LEVANTER_SOURCE_DIR) / "tests" / "upstream-config";
  const std::string model = std::string(HALIAX_GOLDEN_DIR) + "/hf_llama/llama_mqa_llama3";
  const std::string chats = "[\"" + (dir / "chats.jsonl").string() + "\"]";
  int resolved = 0, seen = 0;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (name.find("sft") == std::string::npos || name.rfind("train_lm", 0) == 0) continue;
    ++seen;
    const YAML::Node y = YAML::LoadFile(e.path().string());
    const bool mixture = static_cast<bool>(y["mixture_weights"]);
    std::vector<std::string> args = {"sft",
                                     "--config_path",
                                     e.path().string(),
                                     "--tokenizer",
                                     "byte",
                                     "--model_name_or_path",
                                     model,
                                     "--trainer.tracker",
                                     "{type: json_logger}",
                                     "--trainer.wandb",
                                     "null",
                                     "--trainer.checkpointer.base_path",
                                     (dir / "ckpt").string()};
    if (y["hf_save_path"]) args.insert(args.end(), {"--hf_save_path", (dir / "hf").string()});
    if (mixture) {
      std::string map = "{";
      for (const auto& kv : y["supervised_data"])
        map += kv.first.as<std::string>() + ": {cache_dir: \"" + (dir / "c").string() + "\", train_urls: " + chats +
               "}, ";
      args.insert(args.end(), {"--supervised_data", map + "}"});
    } else {
      args.insert(args.end(), {"--chat_train_urls", chats, "--supervised_data", "{cache_dir: \"" + (dir / "c").string() + "\"}"});
    }
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    levanter::config::validation_result checked;
    if (mixture) {
      auto p = levanter::config::parse_command_line<levanter::SftMixtureConfig>(static_cast<int>(argv.size()),
                                                                               argv.data());
      checked = levanter::plan_sft_mixture(p.config, p.sources).checked;
    } else {
      auto p = levanter::config::parse_command_line<levanter::SftConfig>(static_cast<int>(argv.size()), argv.data());
      checked = levanter::plan_sft(p.config, p.sources).checked;
    }
    CAPTURE(name);
    if (checked.errors.empty()) {
      ++resolved;
    } else {
      MESSAGE(name << ": " << checked.errors.front());
      // Two upstream configs name no model to start from (upstream raises for them too): the error names the key.
      CHECK(checked.errors.front().rfind("initialize_from_hf", 0) == 0);
    }
  }
  CHECK(seen == 9);
  CHECK(resolved == 7);
  fs::remove_all(dir);
}
