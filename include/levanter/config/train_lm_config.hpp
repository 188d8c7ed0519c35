// levanter/config/train_lm_config.hpp: the sections of `train_lm`'s config with upstream's keys and defaults
// (TrainLmConfig, TrainerConfig, CheckpointerConfig, trackers, the data section). Keys we parse but do not
// implement yet are kept as `config::Opaque` or optional values and refused by validation with a message.
#pragma once

#include <cctype>
#include <cstdlib>

#include <tuple>
#include <map>

#include <levanter/config/types.hpp>
#include <levanter/models/gpt2_config.hpp>
#include <levanter/optim/config.hpp>

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

// ---- checkpointer --------------------------------------------------------------------------------------------
struct KeepPolicy {
  int64_t every = 10000;
  std::optional<int64_t> until;
};
struct CheckpointerConfig {
  std::string base_path = "checkpoints/";
  config::Duration save_interval = config::Duration::minutes(15);
  std::vector<KeepPolicy> keep{KeepPolicy{}};
  bool append_run_id_to_base_path = true;
  bool delete_old_temp_checkpoints = true;
};

/// `trainer.watch` (upstream WatchConfig): norms (and optionally histograms) of grads / params / updates /
/// opt_state every `interval` steps, logged as `<target>/norm/<param path>` and `<target>/norm/total`.
struct WatchConfig {
  config::StringOrList watch_targets = [] {
    config::StringOrList l;
    l.items = {"grads", "params"};
    l.is_list = true;
    return l;
  }();
  bool include_norms = true;
  bool include_per_parameter_norms = true;
  bool include_histograms = false;
  bool split_scan_layers = true;
  int64_t interval = 10;
  bool enabled() const { return !watch_targets.items.empty() && interval > 0 && (include_norms || include_histograms); }
};

// ---- trainer -------------------------------------------------------------------------------------------------
struct TrainerConfig {
  int64_t seed = 0;
  config::MpPolicy mp;
  config::Opaque quantization;
  config::Opaque model_averaging;
  std::optional<std::string> id;
  std::string log_dir = "logs/";
  config::OneOrMany<TrackerChoice> tracker;
  config::Opaque wandb;
  WatchConfig watch;
  bool profiler = false;
  int64_t profiler_start_step = 5;
  int64_t profiler_num_steps = 100;
  bool profiler_perfetto_link = false;
  bool log_jaxprs = true;
  bool log_xla_hlo = true;
  bool crash_on_nan = true;
  bool crash_on_inf = true;
  std::string batch_axis = "batch";
  config::StringOrList fsdp_axis{"embed"};
  std::optional<std::vector<std::string>> tensor_parallel_axes;
  std::map<std::string, config::StringOrList> axis_resources;
  std::map<std::string, config::StringOrList> parameter_axis_resources;
  int64_t replica_ici_axis_size = 1;
  int64_t model_axis_size = 1;
  int64_t replica_dcn_axis_size = 1;
  config::IntSchedule train_batch_size{512};
  int64_t per_device_parallelism = -1;
  int64_t per_device_eval_parallelism = -1;
  bool allow_nondivisible_batch_size = false;
  int64_t num_train_steps = 400000;
  int64_t steps_per_eval = 1000;
  std::optional<int64_t> max_eval_batches;
  CheckpointerConfig checkpointer;
  std::optional<bool> load_checkpoint;
  std::optional<std::string> load_checkpoint_path;
  std::optional<std::string> initialize_from;
  bool allow_partial_checkpoint = false;
  config::Opaque jax_config;
  std::optional<std::string> jax_compilation_cache_dir;
  config::Opaque distributed;
  config::Opaque ray;
  std::optional<bool> require_accelerator;
  bool shutdown_at_exit = false;
};

// ---- data ----------------------------------------------------------------------------------------------------
/// `data.cache_options` (upstream CacheOptions); none of these changes a cache's bytes.
struct CacheOptionsConfig {
  int64_t num_shard_groups = 128;               ///< accepted for upstream configs; the builder here is one process
  std::string target_size_per_flush = "512MB";  ///< a commit also ends at this much raw input
  int64_t batch_size = 1024;                    ///< documents per commit (upstream: 128 per tokenizer call)
  int64_t num_threads = 0;                      ///< tokenizing threads (0: one per core)
  /// target_size_per_flush in bytes ("512MB", "1GiB", "65536"); -1 when it does not parse.
  int64_t target_size_bytes() const {
    std::size_t i = 0;
    while (i < target_size_per_flush.size() && (std::isdigit(static_cast<unsigned char>(target_size_per_flush[i])) ||
                                                 target_size_per_flush[i] == '.'))
      ++i;
    if (i == 0) return -1;
    const double v = std::atof(target_size_per_flush.substr(0, i).c_str());
    std::string unit = target_size_per_flush.substr(i);
    while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
    for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    const std::pair<const char*, double> units[] = {{"", 1},       {"B", 1},           {"KB", 1e3},     {"MB", 1e6},
                                                     {"GB", 1e9},   {"K", 1e3},         {"M", 1e6},      {"G", 1e9},
                                                     {"KIB", 1024}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}};
    for (const auto& [u, m] : units)
      if (unit == u) return static_cast<int64_t>(v * m);
    return -1;
  }
};

struct LmDataConfig {
  std::string tokenizer = "gpt2";
  std::optional<int64_t> vocab_size;
  std::string cache_dir = "cache/";
  CacheOptionsConfig cache_options;
  std::string bad_documents = "stop";
  bool enforce_eos = true;
  std::optional<std::string> chat_template;
  int64_t ignore_token_id = -100;
  std::variant<bool, int64_t> shuffle = false;
  std::optional<std::string> permutation_type;
  std::vector<std::string> train_urls;
  std::vector<std::string> validation_urls;
  std::optional<std::string> id;
  std::optional<std::string> name;
  bool stream = true;
  std::optional<std::vector<std::string>> tags;
  config::Opaque format;
  std::optional<std::string> text_key;
  // mixture keys (LMMixtureDatasetConfig)
  config::Opaque configs;
  config::Opaque train_weights;
  std::optional<std::string> stop_strategy;
  std::optional<int64_t> mixture_block_size;
  config::Opaque target_budget;
  config::Opaque experiment_budget;
  std::optional<int64_t> max_train_batches;
  std::optional<int64_t> num_validation_sequences;
  std::optional<int64_t> shuffle_buffer_size;
};

/// `model:`; only GPT-2 is implemented, other upstream models are refused by name.
using ModelChoice = config::Choice<Gpt2Config>;

/// `viz:` (ours; upstream has the separate viz_lm program): a token-probability heatmap of validation windows,
/// rewritten every `every` steps (and at the end) while training runs.
struct TrainVizConfig {
  int64_t every = 0;                     ///< 0: off
  int64_t num_docs = 8;                  ///< validation windows shown
  std::optional<std::string> path;       ///< default: <run dir>/logprobs.html
  std::optional<int64_t> data_seed = 0;  ///< which windows: a permutation of them with this seed (null: the first)
};

// ---- train_lm ------------------------------------------------------------------------------------------------
struct TrainLmConfig {
  LmDataConfig data;
  TrainerConfig trainer;
  ModelChoice model;
  OptimizerChoice optimizer;
  std::variant<bool, std::string> initialize_from_hf = false;
  bool use_hf_model_config = false;
  double z_loss_weight = 0.0;
  std::optional<std::string> hf_save_path;
  config::Opaque hf_upload;
  int64_t hf_save_steps = 10000;
  std::optional<std::string> hf_save_dtype;
  std::optional<int64_t> data_seed;
  std::optional<std::string> initialize_from_checkpoint_path;
  int64_t epoch = 0;
  config::Opaque eval_harness;
  int64_t eval_harness_steps = 10000;
  bool log_entropy = false;
  TrainVizConfig viz;
};

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
struct levanter::config::schema<levanter::KeepPolicy> {
  using T = levanter::KeepPolicy;
  static constexpr auto fields = std::make_tuple(
      field("every", &T::every, "keep a permanent checkpoint every this many steps"),
      field("until", &T::until, "up to this step (only the last policy may omit it)"));
};
template <>
struct levanter::config::schema<levanter::CheckpointerConfig> {
  using T = levanter::CheckpointerConfig;
  static constexpr auto fields = std::make_tuple(
      field("base_path", &T::base_path, "directory under which checkpoints are written"),
      field("save_interval", &T::save_interval, "time between temporary checkpoints (e.g. 15m)"),
      field("keep", &T::keep, "permanent checkpoint policies: list of {every, until}"),
      field("append_run_id_to_base_path", &T::append_run_id_to_base_path, "write under <base_path>/<run id>"),
      field("delete_old_temp_checkpoints", &T::delete_old_temp_checkpoints, "delete the previous temporary checkpoint once a new one commits"));
};
template <>
struct levanter::config::schema<levanter::WatchConfig> {
  using T = levanter::WatchConfig;
  static constexpr auto fields = std::make_tuple(
      field("watch_targets", &T::watch_targets, "any of grads, params, updates, opt_state"),
      field("include_norms", &T::include_norms, "log norms"),
      field("include_per_parameter_norms", &T::include_per_parameter_norms, "log a norm per parameter (else only the total)"),
      field("include_histograms", &T::include_histograms, "log histograms (TensorBoard)"),
      field("split_scan_layers", &T::split_scan_layers, "one entry per layer of stacked blocks"),
      field("interval", &T::interval, "every this many steps (0: off)"));
};

template <>
struct levanter::config::schema<levanter::TrainerConfig> {
  using T = levanter::TrainerConfig;
  static constexpr auto fields = std::make_tuple(
      field("seed", &T::seed, "seed of the PRNG key split into data, model and training keys"),
      field("mp", &T::mp, "mixed precision: f32, bfloat16, or p=f32,c=bfloat16[,o=f32]"),
      field("quantization", &T::quantization, "quantized training (not supported)"),
      field("model_averaging", &T::model_averaging, "EMA of the weights (not supported yet)"),
      field("id", &T::id, "run id (default: $RUN_ID, else 8 random [a-z0-9])"),
      field("log_dir", &T::log_dir, "directory of run directories"),
      field("tracker", &T::tracker, "metrics tracker(s): json_logger (default), noop"),
      field("wandb", &T::wandb, "deprecated upstream alias of tracker (refused)"),
      field("watch", &T::watch, "norms/histograms of grads, params, updates, opt_state every interval steps"),
      field("profiler", &T::profiler, "write a per-op time breakdown of some steps to the run dir"),
      field("profiler_start_step", &T::profiler_start_step, "first profiled step"),
      field("profiler_num_steps", &T::profiler_num_steps, "number of profiled steps"),
      field("profiler_perfetto_link", &T::profiler_perfetto_link, "perfetto link (JAX only)"),
      field("log_jaxprs", &T::log_jaxprs, "JAX only; ignored"),
      field("log_xla_hlo", &T::log_xla_hlo, "JAX only; ignored"),
      field("crash_on_nan", &T::crash_on_nan, "stop when the loss becomes NaN"),
      field("crash_on_inf", &T::crash_on_inf, "stop when the loss becomes infinite"),
      field("batch_axis", &T::batch_axis, "name of the batch axis"),
      field("fsdp_axis", &T::fsdp_axis, "axis (or axes) along which parameters are sharded"),
      field("tensor_parallel_axes", &T::tensor_parallel_axes, "axes sharded over the model mesh axis"),
      field("axis_resources", &T::axis_resources, "logical axis -> mesh axis for compute"),
      field("parameter_axis_resources", &T::parameter_axis_resources, "logical axis -> mesh axis for parameters"),
      field("replica_ici_axis_size", &T::replica_ici_axis_size, "replica mesh axis size"),
      field("model_axis_size", &T::model_axis_size, "tensor-parallel mesh axis size"),
      field("replica_dcn_axis_size", &T::replica_dcn_axis_size, "replicas across slices"),
      field("train_batch_size", &T::train_batch_size, "sequences per step (int or [{start, value}] schedule)"),
      field("per_device_parallelism", &T::per_device_parallelism, "sequences per micro-batch (-1: whole batch); smaller accumulates gradients"),
      field("per_device_eval_parallelism", &T::per_device_eval_parallelism, "sequences per eval micro-batch (-1: same as training)"),
      field("allow_nondivisible_batch_size", &T::allow_nondivisible_batch_size, "allow a batch not divisible by the device count"),
      field("num_train_steps", &T::num_train_steps, "number of optimizer steps"),
      field("steps_per_eval", &T::steps_per_eval, "evaluate on the validation set every this many steps"),
      field("max_eval_batches", &T::max_eval_batches, "cap on validation batches per evaluation (unset: all)"),
      field("checkpointer", &T::checkpointer, "checkpoint policy"),
      field("load_checkpoint", &T::load_checkpoint, "unset: resume if a checkpoint exists; true: must; false: never"),
      field("load_checkpoint_path", &T::load_checkpoint_path, "checkpoint directory (or its parent) to resume from"),
      field("initialize_from", &T::initialize_from, "start from another run's checkpoint"),
      field("allow_partial_checkpoint", &T::allow_partial_checkpoint, "allow missing leaves when loading"),
      field("jax_config", &T::jax_config, "JAX options; ignored"),
      field("jax_compilation_cache_dir", &T::jax_compilation_cache_dir, "JAX only; ignored"),
      field("distributed", &T::distributed, "multi-process settings (use mpirun)"),
      field("ray", &T::ray, "Ray settings (not used)"),
      field("require_accelerator", &T::require_accelerator, "fail unless an accelerator is present"),
      field("shutdown_at_exit", &T::shutdown_at_exit, "shut the machine down at exit (refused)"));
};
template <>
struct levanter::config::schema<levanter::CacheOptionsConfig> {
  using T = levanter::CacheOptionsConfig;
  static constexpr auto fields = std::make_tuple(
      field("num_shard_groups", &T::num_shard_groups, "accepted (upstream's Ray shard groups; one builder here)"),
      field("target_size_per_flush", &T::target_size_per_flush, "raw input per commit at most, e.g. 512MB"),
      field("batch_size", &T::batch_size, "documents per commit"),
      field("num_threads", &T::num_threads, "tokenizing threads (0: one per core)"));
};

template <>
struct levanter::config::schema<levanter::LmDataConfig> {
  using T = levanter::LmDataConfig;
  static constexpr auto fields = std::make_tuple(
      field("tokenizer", &T::tokenizer, "tokenizer: 'byte' (built in), 'passthrough', or a tokenizer.json path"),
      field("vocab_size", &T::vocab_size, "vocabulary size (passthrough tokenizer)"),
      field("cache_dir", &T::cache_dir, "directory of the tokenized cache"),
      field("cache_options", &T::cache_options, "cache build options (threads, documents per commit)"),
      field("bad_documents", &T::bad_documents, "a malformed line or invalid UTF-8: stop (default) or skip (and count)"),
      field("enforce_eos", &T::enforce_eos, "append EOS to each document"),
      field("chat_template", &T::chat_template, "chat template (chat data)"),
      field("ignore_token_id", &T::ignore_token_id, "label id excluded from the loss"),
      field("shuffle", &T::shuffle, "false, true (full permutation) or an era length"),
      field("permutation_type", &T::permutation_type, "linear or feistel"),
      field("train_urls", &T::train_urls, "training files: local paths, globs, {a..b} ranges"),
      field("validation_urls", &T::validation_urls, "validation files"),
      field("id", &T::id, "Hugging Face dataset id (not supported: no network)"),
      field("name", &T::name, "Hugging Face dataset config name"),
      field("stream", &T::stream, "stream the HF dataset"),
      field("tags", &T::tags, "tags for per-tag eval losses"),
      field("format", &T::format, "document format (text, chat, supervised)"),
      field("text_key", &T::text_key, "JSON field holding the text"),
      field("configs", &T::configs, "mixture: {name: {train_urls, validation_urls, cache_dir, tags}}, in order"),
      field("train_weights", &T::train_weights, "mixture weights: {name: w} or [[step, {name: w}], ...]"),
      field("stop_strategy", &T::stop_strategy, "mixture stop strategy (restart)"),
      field("mixture_block_size", &T::mixture_block_size, "mixture block size (default 2048)"),
      field("target_budget", &T::target_budget, "mixture simulated epoching"),
      field("experiment_budget", &T::experiment_budget, "mixture simulated epoching"),
      field("max_train_batches", &T::max_train_batches, "mixture cap on training batches"),
      field("num_validation_sequences", &T::num_validation_sequences, "mixture validation sequences"),
      field("shuffle_buffer_size", &T::shuffle_buffer_size, "shuffle buffer size"));
};
template <>
struct levanter::config::schema<levanter::TrainVizConfig> {
  using T = levanter::TrainVizConfig;
  static constexpr auto fields = std::make_tuple(
      field("every", &T::every, "refresh every this many steps (0: off)"),
      field("num_docs", &T::num_docs, "validation windows shown"),
      field("path", &T::path, "HTML file (default: <run dir>/logprobs.html)"),
      field("data_seed", &T::data_seed, "seed of the window choice (null: the first windows)"));
};

template <>
struct levanter::config::schema<levanter::TrainLmConfig> {
  using T = levanter::TrainLmConfig;
  static constexpr auto fields = std::make_tuple(
      field("data", &T::data, "training and validation data"),
      field("trainer", &T::trainer, "training loop settings"),
      field("model", &T::model, "model architecture (type: gpt2)"),
      field("optimizer", &T::optimizer, "optimizer and learning-rate schedule (type: adam)"),
      field("initialize_from_hf", &T::initialize_from_hf, "start from a local Hugging Face GPT-2 directory (config.json + safetensors)"),
      field("use_hf_model_config", &T::use_hf_model_config, "take the model config from the HF checkpoint"),
      field("z_loss_weight", &T::z_loss_weight, "weight of the logsumexp^2 auxiliary loss"),
      field("hf_save_path", &T::hf_save_path, "export Hugging Face checkpoints to <hf_save_path>/<run id>/step-N every hf_save_steps"),
      field("hf_upload", &T::hf_upload, "upload HF checkpoints (not supported)"),
      field("hf_save_steps", &T::hf_save_steps, "steps between HF exports"),
      field("hf_save_dtype", &T::hf_save_dtype, "dtype of HF exports"),
      field("data_seed", &T::data_seed, "seed of the data order (default: from trainer.seed)"),
      field("initialize_from_checkpoint_path", &T::initialize_from_checkpoint_path, "start from the model of this checkpoint (fresh optimizer, step 0)"),
      field("epoch", &T::epoch, "number of epochs over the data (0: unbounded)"),
      field("eval_harness", &T::eval_harness, "lm-eval-harness (not supported)"),
      field("eval_harness_steps", &T::eval_harness_steps, "steps between harness evaluations"),
      field("log_entropy", &T::log_entropy, "log entropy histograms (not supported)"),
      field("viz", &T::viz, "token-probability heatmap of validation windows, refreshed while training"));
};

template <>
struct levanter::config::unsupported_choices<levanter::ModelChoice> {
  static constexpr unsupported_choice names[] = {
      {"llama", "use type: gpt2"},   {"mistral", "use type: gpt2"}, {"mixtral", "use type: gpt2"},
      {"qwen", "use type: gpt2"},    {"qwen3", "use type: gpt2"},   {"olmo2", "use type: gpt2"},
      {"gemma", "use type: gpt2"},   {"gemma2", "use type: gpt2"},  {"gemma3", "use type: gpt2"},
      {"whisper", "use type: gpt2"}, {"gpt2_hyena", "use type: gpt2"}, {"backpack", "use type: gpt2"},
      {"mpt", "use type: gpt2"},
  };
};
template <>
struct levanter::config::unsupported_choices<levanter::TrackerChoice> {
  static constexpr unsupported_choice names[] = {
      {"trackio", "use type: json_logger"},
  };
};
