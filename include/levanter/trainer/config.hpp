// levanter/trainer/config.hpp: the `trainer:` section (upstream TrainerConfig and WatchConfig), beside the
// Trainer (trainer/trainer.hpp). It composes the checkpointer's and the trackers' sections.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>

#include <haliax/precision.hpp>
#include <vector>

#include <levanter/checkpoint/config.hpp>
#include <levanter/config/section.hpp>
#include <levanter/config/types.hpp>
#include <levanter/tracker/config.hpp>

namespace levanter::config {
struct validator;
}  // namespace levanter::config

namespace levanter {

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
// ---- trainer.model_averaging (upstream optim/model_averaging.py) -------------------------------------------------
/// `{type: ema, beta: 0.999}`: average <- (1 - beta) * model + beta * average after every update.
struct EmaModelAveragingConfig {
  static constexpr std::string_view type_name = "ema";
  double beta = 0.999;
};
/// `{type: ema_decay_sqrt}`: weight w = 1 - beta before switch_step, then 1 - sqrt((step - switch_step) /
/// decay_steps) (clipped to [0, 1]); average <- a * model + (1 - a) * average with a = w / (sum of the weights so far).
struct EmaDecaySqrtConfig {
  static constexpr std::string_view type_name = "ema_decay_sqrt";
  double beta = 0.999;
  int64_t switch_step = 100000;
  int64_t decay_steps = 100000;
};
using ModelAveragingChoice = config::Choice<EmaModelAveragingConfig, EmaDecaySqrtConfig>;

// ---- trainer -------------------------------------------------------------------------------------------------
struct TrainerConfig {
  int64_t seed = 0;
  config::MpPolicy mp;
  config::Opaque quantization;
  std::optional<ModelAveragingChoice> model_averaging;
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
  bool shard_parameters = true;
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

/// Adds every problem of the `trainer:` section to `v` (keys under `trainer.`), its checkpointer and trackers
/// included.
void validate(config::validator& v, const TrainerConfig& t);

/// The bfloat16 instructions this CPU has ("AVX512_BF16", "AMX-BF16", both, or "" for none), for the note a
/// bfloat16 `trainer.mp` policy gets.
std::string cpu_bf16_instructions();

/// The precision trainer.mp's compute dtype runs matrix products in: bf16 when it is bfloat16 and this build and CPU
/// run bfloat16 GEMMs (haliax::bf16_matmul_available), else f32 (the trainer's note says which).
haliax::matmul_precision matmul_precision_of(const TrainerConfig& t);

}  // namespace levanter

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
struct levanter::config::schema<levanter::EmaModelAveragingConfig> {
  using T = levanter::EmaModelAveragingConfig;
  static constexpr auto fields = std::make_tuple(field("beta", &T::beta, "weight of the average kept at each update"));
};
template <>
struct levanter::config::schema<levanter::EmaDecaySqrtConfig> {
  using T = levanter::EmaDecaySqrtConfig;
  static constexpr auto fields = std::make_tuple(
      field("beta", &T::beta, "1 - beta weighs each update before switch_step"),
      field("switch_step", &T::switch_step, "step from which the weights decay as 1 - sqrt(progress)"),
      field("decay_steps", &T::decay_steps, "steps over which the weights decay to zero"));
};
template <>
struct levanter::config::schema<levanter::TrainerConfig> {
  using T = levanter::TrainerConfig;
  static constexpr auto fields = std::make_tuple(
      field("seed", &T::seed, "seed of the PRNG key split into data, model and training keys"),
      field("mp", &T::mp, "mixed precision: f32, bfloat16, or p=f32,c=bfloat16[,o=f32]"),
      field("quantization", &T::quantization, "quantized training (not supported)"),
      field("model_averaging", &T::model_averaging, "an average of the weights (ema, ema_decay_sqrt) that evaluation and exports use"),
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
      field("shard_parameters", &T::shard_parameters, "(this project) with fsdp_axis on several ranks: false keeps the parameters whole and shards only the optimizer state (ZeRO-1)"),
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

// The YAML machinery of this section is compiled once, in src/trainer/config.cpp.
LEVANTER_CONFIG_SECTION_EXTERN(levanter::TrainerConfig)
