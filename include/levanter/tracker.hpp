// levanter/tracker.hpp: metric trackers as upstream's (`trainer.tracker`): `json_logger` writes one JSON object
// per event (`hparams`, `log`, `summary`, `artifact`, `finish`) with upstream's record layout, to
// `<run dir>/metrics.jsonl` (upstream sends the same lines to a Python logger); `noop` drops everything. A list
// of trackers fans out to each. `tensorboard` writes TensorBoard event files (levanter/tensorboard.hpp) to
// `<logdir>/<run id>/`, as upstream's TensorboardTracker does through tensorboardX.
#pragma once

#include <fstream>
#include <levanter/tensorboard.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace levanter {

using json = nlohmann::ordered_json;

/// What a tracker receives. Metric names follow upstream (`train/loss`, `optim/learning_rate`, `throughput/mfu`).
class tracker {
 public:
  virtual ~tracker() = default;
  virtual void log_hyperparameters(const json& hparams) = 0;
  virtual void log(const json& metrics, std::int64_t step) = 0;
  virtual void log_summary(const json& metrics) = 0;
  virtual void log_artifact(const std::string& path, const std::string& name, const std::string& type) = 0;
  virtual void finish() = 0;
};

class noop_tracker final : public tracker {
 public:
  void log_hyperparameters(const json&) override {}
  void log(const json&, std::int64_t) override {}
  void log_summary(const json&) override {}
  void log_artifact(const std::string&, const std::string&, const std::string&) override {}
  void finish() override {}
};

/// Upstream JsonLoggerTracker's records, one per line, flushed after each so a crash loses nothing written.
class json_logger_tracker final : public tracker {
 public:
  explicit json_logger_tracker(const std::string& path, std::string logger_name = "levanter.json_logger")
      : out_(path, std::ios::app), path_(path), logger_(std::move(logger_name)) {
    if (!out_) throw std::runtime_error("json_logger: cannot open '" + path + "' for writing");
  }
  void log_hyperparameters(const json& hparams) override { write({{"tracker", name}, {"event", "hparams"}, {"hparams", hparams}}); }
  void log(const json& metrics, std::int64_t step) override {
    write({{"tracker", name}, {"event", "log"}, {"step", step}, {"metrics", metrics}});
    flatten(metrics, "", last_);
  }
  void log_summary(const json& metrics) override {
    write({{"tracker", name}, {"event", "summary"}, {"metrics", metrics}});
    flatten(metrics, "", summary_);
  }
  void log_artifact(const std::string& path, const std::string& nm, const std::string& type) override {
    write({{"tracker", name}, {"event", "artifact"}, {"path", path}, {"name", nm}, {"artifact_type", type}});
  }
  void finish() override {
    json all = summary_;
    for (auto it = last_.begin(); it != last_.end(); ++it) all[it.key()] = it.value();
    write({{"tracker", name}, {"event", "finish"}, {"summary", all}});
  }
  const std::string& path() const { return path_; }
  static constexpr const char* name = "json_logger";

 private:
  void write(const json& record) {
    out_ << record.dump() << '\n';
    out_.flush();
    if (!out_) throw std::runtime_error("json_logger: writing '" + path_ + "' failed (disk full?)");
  }
  static void flatten(const json& m, const std::string& prefix, json& into) {
    for (auto it = m.begin(); it != m.end(); ++it) {
      const std::string k = prefix.empty() ? it.key() : prefix + "/" + it.key();
      if (it.value().is_object())
        flatten(it.value(), k, into);
      else
        into[k] = it.value();
    }
  }
  std::ofstream out_;
  std::string path_;
  std::string logger_;
  json last_ = json::object(), summary_ = json::object();
};

/// Upstream TensorboardTracker: numbers become scalars, strings text, nested metrics are flattened with `/`.
/// Hyperparameters are written as a text entry `hparams` holding the resolved config as JSON (upstream uses the
/// hparams plugin, which needs a metric to attach to). Summary values are written at the last logged step.
class tensorboard_tracker final : public tracker {
 public:
  /// Writes under `dir` (upstream: `<logdir>/<run id>`); `write_to_disk: false` keeps nothing.
  explicit tensorboard_tracker(const std::string& dir, const std::string& filename_suffix = "", bool write_to_disk = true) {
    if (write_to_disk) writer_ = std::make_unique<tensorboard::event_writer>(dir, filename_suffix);
  }
  void log_hyperparameters(const json& hparams) override {
    if (writer_) writer_->add_text("hparams", "```\n" + hparams.dump(2) + "\n```", 0);
  }
  void log(const json& metrics, std::int64_t step) override {
    last_step_ = step;
    write(metrics, "", step);
  }
  void log_summary(const json& metrics) override { write(metrics, "", last_step_); }
  void log_artifact(const std::string&, const std::string&, const std::string&) override {}
  void finish() override {
    if (writer_) writer_->close();
  }
  const tensorboard::event_writer* writer() const { return writer_.get(); }
  static constexpr const char* name = "tensorboard";

 private:
  void write(const json& m, const std::string& prefix, std::int64_t step) {
    if (!writer_) return;
    for (auto it = m.begin(); it != m.end(); ++it) {
      const std::string k = prefix.empty() ? it.key() : prefix + "/" + it.key();
      const auto& v = it.value();
      if (v.is_object())
        write(v, k, step);
      else if (v.is_number() && !v.is_boolean())
        writer_->add_scalar(k, v.get<double>(), step);
      else if (v.is_boolean())
        writer_->add_scalar(k, v.get<bool>() ? 1.0 : 0.0, step);
      else if (v.is_string())
        writer_->add_text(k, v.get<std::string>(), step);
    }
  }
  std::unique_ptr<tensorboard::event_writer> writer_;
  std::int64_t last_step_ = 0;
};

/// Several trackers as one (upstream CompositeTracker).
class composite_tracker final : public tracker {
 public:
  explicit composite_tracker(std::vector<std::unique_ptr<tracker>> ts) : ts_(std::move(ts)) {}
  void log_hyperparameters(const json& h) override { for (auto& t : ts_) t->log_hyperparameters(h); }
  void log(const json& m, std::int64_t s) override { for (auto& t : ts_) t->log(m, s); }
  void log_summary(const json& m) override { for (auto& t : ts_) t->log_summary(m); }
  void log_artifact(const std::string& p, const std::string& n, const std::string& ty) override {
    for (auto& t : ts_) t->log_artifact(p, n, ty);
  }
  void finish() override { for (auto& t : ts_) t->finish(); }

 private:
  std::vector<std::unique_ptr<tracker>> ts_;
};

}  // namespace levanter
