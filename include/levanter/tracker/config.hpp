// levanter/tracker/config.hpp: `trainer.tracker` (upstream's tracker configs, one per `type:`), beside the trackers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <levanter/config/types.hpp>

namespace levanter {

// ---- trackers ------------------------------------------------------------------------------------------------
struct JsonLoggerConfig {
  static constexpr std::string_view type_name = "json_logger";
  std::string logger_name = "levanter.json_logger";
  std::string level = "INFO";
};
struct NoopTrackerConfig {
  static constexpr std::string_view type_name = "noop";
};
/// Parsed so upstream files load; refused by validation (no network, no wandb client).
struct WandbConfig {
  static constexpr std::string_view type_name = "wandb";
  std::optional<std::string> entity;
  std::optional<std::string> project = "levanter";
  std::optional<std::string> name;
  std::optional<std::vector<std::string>> tags;
  std::optional<std::string> id;
  std::optional<std::string> group;
  std::optional<std::string> mode;
  std::optional<std::string> resume = "allow";
  bool save_code = true;
  bool save_xla_dumps = false;
};
/// TensorBoard event files under `<logdir>/<run id>/` (purge_step, max_queue, flush_secs and comment are
/// accepted for upstream compatibility; events are flushed every 120 s, at 1 MiB, and at the end).
struct TensorboardConfig {
  static constexpr std::string_view type_name = "tensorboard";
  std::optional<std::string> logdir = "tblogs";
  std::optional<std::string> comment;
  std::optional<int64_t> purge_step;
  int64_t max_queue = 10;
  int64_t flush_secs = 120;
  std::optional<std::string> filename_suffix;
  bool write_to_disk = true;
};
/// Our default is json_logger (upstream's default, wandb, needs a network service).
using TrackerChoice = config::Choice<JsonLoggerConfig, NoopTrackerConfig, WandbConfig, TensorboardConfig>;

}  // namespace levanter

template <>
struct levanter::config::schema<levanter::JsonLoggerConfig> {
  using T = levanter::JsonLoggerConfig;
  static constexpr auto fields = std::make_tuple(
      field("logger_name", &T::logger_name, "name recorded with each JSON line"),
      field("level", &T::level, "log level name"));
};
template <>
struct levanter::config::schema<levanter::NoopTrackerConfig> {
  static constexpr auto fields = std::make_tuple();
};
template <>
struct levanter::config::schema<levanter::WandbConfig> {
  using T = levanter::WandbConfig;
  static constexpr auto fields = std::make_tuple(
      field("entity", &T::entity, ""),
      field("project", &T::project, ""),
      field("name", &T::name, ""),
      field("tags", &T::tags, ""),
      field("id", &T::id, ""),
      field("group", &T::group, ""),
      field("mode", &T::mode, ""),
      field("resume", &T::resume, ""),
      field("save_code", &T::save_code, ""),
      field("save_xla_dumps", &T::save_xla_dumps, ""));
};
template <>
struct levanter::config::schema<levanter::TensorboardConfig> {
  using T = levanter::TensorboardConfig;
  static constexpr auto fields = std::make_tuple(
      field("logdir", &T::logdir, "event-file directory"),
      field("comment", &T::comment, "suffix of the run directory"),
      field("purge_step", &T::purge_step, "purge events after this step"),
      field("max_queue", &T::max_queue, "events queued before a flush"),
      field("flush_secs", &T::flush_secs, "seconds between flushes"),
      field("filename_suffix", &T::filename_suffix, "event-file name suffix"),
      field("write_to_disk", &T::write_to_disk, "write event files"));
};
template <>
struct levanter::config::unsupported_choices<levanter::TrackerChoice> {
  static constexpr auto names = std::to_array<unsupported_choice>({
      {"trackio", "use type: json_logger"},
  });
};
