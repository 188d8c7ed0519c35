// tracker/tracker.hpp: the json_logger, tensorboard and composite trackers.
#include <algorithm>
#include <levanter/tracker/tensorboard.hpp>
#include <levanter/tracker/tracker.hpp>
#include <stdexcept>

namespace levanter {

// ---- tracker --------------------------------------------------------------------------------------------------

void tracker::log_histogram(const std::string& tag, std::span<const float> values, std::int64_t step) {
  log(json{{tag, histogram_summary(values)}}, step);
}

json tracker::histogram_summary(std::span<const float> values) {
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

// ---- json_logger ----------------------------------------------------------------------------------------------

json_logger_tracker::json_logger_tracker(const std::string& path, std::string logger_name)
    : out_(path, std::ios::app), path_(path), logger_(std::move(logger_name)) {
  if (!out_) throw std::runtime_error("json_logger: cannot open '" + path + "' for writing");
}

void json_logger_tracker::log_hyperparameters(const json& hparams) {
  write({{"tracker", name}, {"event", "hparams"}, {"hparams", hparams}});
}

void json_logger_tracker::log(const json& metrics, std::int64_t step) {
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

void json_logger_tracker::log_histogram(const std::string& tag, std::span<const float> values, std::int64_t step) {
  if (!pending_.empty() && pending_step_ != step) {
    write({{"tracker", name}, {"event", "log"}, {"step", pending_step_}, {"metrics", pending_}});
    pending_ = json::object();
  }
  pending_step_ = step;
  pending_[tag] = histogram_summary(values);
}

void json_logger_tracker::log_summary(const json& metrics) {
  write({{"tracker", name}, {"event", "summary"}, {"metrics", metrics}});
  flatten(metrics, "", summary_);
}

void json_logger_tracker::log_artifact(const std::string& path, const std::string& nm, const std::string& type) {
  write({{"tracker", name}, {"event", "artifact"}, {"path", path}, {"name", nm}, {"artifact_type", type}});
}

void json_logger_tracker::finish() {
  if (!pending_.empty()) {
    write({{"tracker", name}, {"event", "log"}, {"step", pending_step_}, {"metrics", pending_}});
    pending_ = json::object();
  }
  json all = summary_;
  for (auto it = last_.begin(); it != last_.end(); ++it) all[it.key()] = it.value();
  write({{"tracker", name}, {"event", "finish"}, {"summary", all}});
}

void json_logger_tracker::write(const json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) throw std::runtime_error("json_logger: writing '" + path_ + "' failed (disk full?)");
}

void json_logger_tracker::flatten(const json& m, const std::string& prefix, json& into) {
  for (auto it = m.begin(); it != m.end(); ++it) {
    const std::string k = prefix.empty() ? it.key() : prefix + "/" + it.key();
    if (it.value().is_object())
      flatten(it.value(), k, into);
    else
      into[k] = it.value();
  }
}

// ---- tensorboard ----------------------------------------------------------------------------------------------

tensorboard_tracker::tensorboard_tracker(const std::string& dir, const std::string& filename_suffix,
                                         bool write_to_disk) {
  if (write_to_disk) writer_ = std::make_unique<tensorboard::event_writer>(dir, filename_suffix);
}

tensorboard_tracker::~tensorboard_tracker() = default;

void tensorboard_tracker::log_hyperparameters(const json& hparams) {
  if (writer_) writer_->add_text("hparams", "```\n" + hparams.dump(2) + "\n```", 0);
}

void tensorboard_tracker::log(const json& metrics, std::int64_t step) {
  last_step_ = step;
  write(metrics, "", step);
}

void tensorboard_tracker::log_summary(const json& metrics) { write(metrics, "", last_step_); }

void tensorboard_tracker::log_histogram(const std::string& tag, std::span<const float> values, std::int64_t step) {
  last_step_ = step;
  if (writer_) writer_->add_histogram(tag, values, step);
}

void tensorboard_tracker::finish() {
  if (writer_) writer_->close();
}

void tensorboard_tracker::write(const json& m, const std::string& prefix, std::int64_t step) {
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

// ---- composite ------------------------------------------------------------------------------------------------

void composite_tracker::log_hyperparameters(const json& h) {
  for (auto& t : ts_) t->log_hyperparameters(h);
}
void composite_tracker::log(const json& m, std::int64_t s) {
  for (auto& t : ts_) t->log(m, s);
}
void composite_tracker::log_summary(const json& m) {
  for (auto& t : ts_) t->log_summary(m);
}
void composite_tracker::log_artifact(const std::string& p, const std::string& n, const std::string& ty) {
  for (auto& t : ts_) t->log_artifact(p, n, ty);
}
void composite_tracker::finish() {
  for (auto& t : ts_) t->finish();
}
void composite_tracker::log_histogram(const std::string& tag, std::span<const float> v, std::int64_t s) {
  for (auto& t : ts_) t->log_histogram(tag, v, s);
}

}  // namespace levanter
