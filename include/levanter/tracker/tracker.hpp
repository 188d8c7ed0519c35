// levanter/tracker/tracker.hpp: metric trackers as upstream's (`trainer.tracker`): `json_logger` writes one JSON object
// per event (`hparams`, `log`, `summary`, `artifact`, `finish`) with upstream's record layout, to
// `<run dir>/metrics.jsonl` (upstream sends the same lines to a Python logger); `noop` drops everything. A list
// of trackers fans out to each. `tensorboard` writes TensorBoard event files (levanter/tracker/tensorboard.hpp) to
// `<logdir>/<run id>/`, as upstream's TensorboardTracker does through tensorboardX.
#pragma once

#include <algorithm>
#include <fstream>
#include <levanter/tracker/tensorboard.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <span>
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
  /// A histogram of `values` (upstream `levanter.tracker.Histogram`). TensorBoard stores the histogram itself;
  /// the default logs its summary `{min, max, num, sum, sum_squares}` under `tag` as an ordinary metric.
  virtual void log_histogram(const std::string& tag, std::span<const float> values, std::int64_t step) {
    log(json{{tag, histogram_summary(values)}}, step);
  }
  static json histogram_summary(std::span<const float> values) {
    double mn = values.empty() ? 0.0 : double(values[0]), mx = mn, sum = 0, sq = 0;
    for (float f : values) {
      const double d = f;
      mn = std::min(mn, d);
      mx = std::max(mx, d);
      sum += d;
      sq += d * d;
    }
    return json{{"min", mn}, {"max", mx}, {"num", values.size()}, {"sum", sum}, {"sum_squares", sq}};
  }
};

class noop_tracker final : public tracker {
 public:
  void log_hyperparameters(const json&) override {}
  void log(const json&, std::int64_t) override {}
  void log_summary(const json&) override {}
  void log_artifact(const std::string&, const std::string&, const std::string&) override {}
  void finish() override {}
  void log_histogram(const std::string&, std::span<const float>, std::int64_t) override {}
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
    if (!pending_.empty() && pending_step_ == step) {
      json all = pending_;
      for (auto it = metrics.begin(); it != metrics.end(); ++it) all[it.key()] = it.value();
      pending_ = json::object();
      write({{"tracker", name}, {"event", "log"}, {"step", step}, {"metrics", all}});
      flatten(all, "", last_);
      return;
    }
    write({{"tracker", name}, {"event", "log"}, {"step", step}, {"metrics", metrics}});
    flatten(metrics, "", last_);
  }
  /// Histograms go into the next `log` record of the same step, as `{min, max, num, sum, sum_squares}`.
  void log_histogram(const std::string& tag, std::span<const float> values, std::int64_t step) override {
    if (!pending_.empty() && pending_step_ != step) {
      write({{"tracker", name}, {"event", "log"}, {"step", pending_step_}, {"metrics", pending_}});
      pending_ = json::object();
    }
    pending_step_ = step;
    pending_[tag] = histogram_summary(values);
  }
  void log_summary(const json& metrics) override {
    write({{"tracker", name}, {"event", "summary"}, {"metrics", metrics}});
    flatten(metrics, "", summary_);
  }
  void log_artifact(const std::string& path, const std::string& nm, const std::string& type) override {
    write({{"tracker", name}, {"event", "artifact"}, {"path", path}, {"name", nm}, {"artifact_type", type}});
  }
  void finish() override {
    if (!pending_.empty()) {
      write({{"tracker", name}, {"event", "log"}, {"step", pending_step_}, {"metrics", pending_}});
      pending_ = json::object();
    }
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
  json last_ = json::object(), summary_ = json::object(), pending_ = json::object();
  std::int64_t pending_step_ = 0;
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
  void log_histogram(const std::string& tag, std::span<const float> values, std::int64_t step) override {
    last_step_ = step;
    if (writer_) writer_->add_histogram(tag, values, step);
  }
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
  void log_histogram(const std::string& tag, std::span<const float> v, std::int64_t s) override {
    for (auto& t : ts_) t->log_histogram(tag, v, s);
  }

 private:
  std::vector<std::unique_ptr<tracker>> ts_;
};

}  // namespace levanter
