// levanter/tracker/tracker.hpp: metric trackers as upstream's (`trainer.tracker`): `json_logger` writes one JSON object
// per event (`hparams`, `log`, `summary`, `artifact`, `finish`) with upstream's record layout, to
// `<run dir>/metrics.jsonl` (upstream sends the same lines to a Python logger); `noop` drops everything. A list
// of trackers fans out to each. `tensorboard` writes TensorBoard event files (levanter/tracker/tensorboard.hpp) to
// `<logdir>/<run id>/`, as upstream's TensorboardTracker does through tensorboardX.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

namespace levanter {

namespace tensorboard {
class event_writer;
}  // namespace tensorboard

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
  virtual void log_histogram(const std::string& tag, std::span<const float> values, std::int64_t step);
  static json histogram_summary(std::span<const float> values);
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
  explicit json_logger_tracker(const std::string& path, std::string logger_name = "levanter.json_logger");
  void log_hyperparameters(const json& hparams) override;
  void log(const json& metrics, std::int64_t step) override;
  /// Histograms go into the next `log` record of the same step, as `{min, max, num, sum, sum_squares}`.
  void log_histogram(const std::string& tag, std::span<const float> values, std::int64_t step) override;
  void log_summary(const json& metrics) override;
  void log_artifact(const std::string& path, const std::string& nm, const std::string& type) override;
  void finish() override;
  const std::string& path() const { return path_; }
  static constexpr const char* name = "json_logger";

 private:
  void write(const json& record);
  static void flatten(const json& m, const std::string& prefix, json& into);
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
  explicit tensorboard_tracker(const std::string& dir, const std::string& filename_suffix = "",
                               bool write_to_disk = true);
  ~tensorboard_tracker() override;
  void log_hyperparameters(const json& hparams) override;
  void log(const json& metrics, std::int64_t step) override;
  void log_summary(const json& metrics) override;
  void log_histogram(const std::string& tag, std::span<const float> values, std::int64_t step) override;
  void log_artifact(const std::string&, const std::string&, const std::string&) override {}
  void finish() override;
  const tensorboard::event_writer* writer() const { return writer_.get(); }
  static constexpr const char* name = "tensorboard";

 private:
  void write(const json& m, const std::string& prefix, std::int64_t step);
  std::unique_ptr<tensorboard::event_writer> writer_;
  std::int64_t last_step_ = 0;
};

/// Several trackers as one (upstream CompositeTracker).
class composite_tracker final : public tracker {
 public:
  explicit composite_tracker(std::vector<std::unique_ptr<tracker>> ts) : ts_(std::move(ts)) {}
  void log_hyperparameters(const json& h) override;
  void log(const json& m, std::int64_t s) override;
  void log_summary(const json& m) override;
  void log_artifact(const std::string& p, const std::string& n, const std::string& ty) override;
  void finish() override;
  void log_histogram(const std::string& tag, std::span<const float> v, std::int64_t s) override;

 private:
  std::vector<std::unique_ptr<tracker>> ts_;
};

}  // namespace levanter
