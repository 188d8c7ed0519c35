// levanter/optim/config.hpp: `optimizer:` and `optimizer.lr_schedule:`, upstream's OptimizerConfig/AdamConfig and
// LrSchedule choice classes with their keys and defaults.
#pragma once

#include <tuple>

#include <levanter/config/section.hpp>
#include <levanter/config/types.hpp>

namespace levanter::config {
struct validator;
}  // namespace levanter::config

namespace levanter {

struct CosineLrSchedule {
  static constexpr std::string_view type_name = "cosine";
  double exponent = 1.0;
};
struct ConstantLrSchedule {
  static constexpr std::string_view type_name = "constant";
};
struct LinearLrSchedule {
  static constexpr std::string_view type_name = "linear";
};
struct InvSqrtLrSchedule {
  static constexpr std::string_view type_name = "inv_sqrt";
  double timescale = 10000;
};
struct InvLrSchedule {
  static constexpr std::string_view type_name = "inv";
};
struct PowerLrSchedule {
  static constexpr std::string_view type_name = "power";
  std::optional<int64_t> batch_size;  // required upstream (no default)
  std::optional<int64_t> seq_length;  // required upstream (no default)
  double a = 4.6;
  double b = -0.51;
};

/// `lr_schedule: cosine` or `lr_schedule: {type: cosine, exponent: 2}`.
using LrScheduleChoice = config::Choice<CosineLrSchedule, ConstantLrSchedule, LinearLrSchedule, InvSqrtLrSchedule,
                                        InvLrSchedule, PowerLrSchedule>;

/// Upstream SkipStepConfig: skip an update whose loss or gradient norm is above mean + sigma_factor * std of the
/// last rolling_interval_length steps.
struct SkipStepConfig {
  int64_t rolling_interval_length = 128;
  double sigma_factor = 6.0;
};

/// Upstream ClipUpdateNormConfig: clip the update norm to mean + sigma_factor * std of recent update norms.
struct ClipUpdateNormConfig {
  int64_t rolling_interval_length = 128;
  double sigma_factor = 3.0;
};

/// What every `optimizer.type` shares (upstream OptimizerConfig): the learning-rate schedule and the weight decay
/// with its mask.
struct OptimizerConfig {
  double learning_rate = 6e-4;
  double weight_decay = 0.1;
  double min_lr_ratio = 0.1;
  double warmup = 0.01;
  std::optional<double> decay;
  double rewarmup = 0.0;
  std::optional<double> cooldown;
  std::optional<config::NumberOrList> cycle_length;
  std::optional<config::NumberOrList> cycles;
  LrScheduleChoice lr_schedule;
  std::optional<std::vector<int64_t>> haps;
  std::optional<config::StringOrList> weight_decay_modules;
  std::optional<bool> default_weight_decay_mask;
  /// Upstream has it on AdamConfig only; here every optimizer skips alike (the update and the optimizer's own count
  /// left alone, the schedule advanced).
  std::variant<bool, int64_t, SkipStepConfig> skip_bad_steps = false;
  /// Upstream has these two on AdamConfig only; here every optimizer clips its update alike (after the weight decay,
  /// before the learning rate, as upstream's AdamW chain).
  std::optional<double> update_rms_clipping;
  std::optional<ClipUpdateNormConfig> clip_update_norm;
};

/// `optimizer: {type: adam}` (AdamW): OptimizerConfig's fields plus AdamConfig's own.
struct AdamConfig : OptimizerConfig {
  static constexpr std::string_view type_name = "adam";

  // AdamConfig
  double beta1 = 0.9;
  double beta2 = 0.95;
  double epsilon = 1e-8;
  std::optional<double> max_grad_norm = 1.0;
  bool nesterov = false;
  bool adamc_weight_decay = false;
};

/// `optimizer: {type: lion}` (upstream LionConfig): optax's scale_by_lion. `epsilon` is upstream's key; Lion does
/// not use it.
struct LionConfig : OptimizerConfig {
  static constexpr std::string_view type_name = "lion";
  double beta1 = 0.9;
  double beta2 = 0.95;
  double epsilon = 1e-8;
  std::optional<double> max_grad_norm = 1.0;
};

/// `optimizer: {type: adopt}` (upstream AdoptConfig, ADOPT: the second moment of the previous step normalises the
/// gradient before the momentum).
struct AdoptConfig : OptimizerConfig {
  static constexpr std::string_view type_name = "adopt";
  double beta1 = 0.9;
  double beta2 = 0.95;
  double epsilon = 1e-6;
  std::optional<double> max_grad_norm = 1.0;
};

/// `optimizer: {type: rmsprop}` (upstream RMSPropMomentumConfig): RMSProp with a bias-corrected momentum.
struct RMSPropMomentumConfig : OptimizerConfig {
  static constexpr std::string_view type_name = "rmsprop";
  double beta1 = 0.9;
  double beta2 = 0.99;
  double eps = 1e-30;
  std::optional<double> max_grad_norm = 1.0;
};

/// `optimizer: {type: cautious}` (upstream CautiousConfig): Adam whose update is kept only where it agrees in sign
/// with the gradient, rescaled by the agreeing fraction of each parameter. `gamma` is upstream's key; unused.
struct CautiousConfig : OptimizerConfig {
  static constexpr std::string_view type_name = "cautious";
  double beta1 = 0.95;
  double beta2 = 0.95;
  double gamma = 0.025;
  double epsilon = 1e-8;
  std::optional<double> max_grad_norm = 1.0;
  bool adamc_weight_decay = false;
};

/// `optimizer: {type: mars}` (upstream MarsConfig): Adam on a variance-reduced gradient
/// g + gamma * beta1 / (1 - beta1) * (g - previous g), clipped by its own global norm.
struct MarsConfig : OptimizerConfig {
  static constexpr std::string_view type_name = "mars";
  double beta1 = 0.95;
  double beta2 = 0.99;
  double gamma = 0.025;
  double epsilon = 1e-8;
  std::optional<double> max_grad_norm = 1.0;
};

/// `optimizer: {type: muon}` (upstream MuonConfig): momentum orthogonalised by Newton-Schulz steps for every Linear
/// weight (except under a path naming lm_head or Embedding), Adam with its own schedule (peak adam_lr) and clipping
/// for the rest. `lr` is upstream's key; unused (learning_rate is the Muon group's peak).
struct MuonConfig : OptimizerConfig {
  static constexpr std::string_view type_name = "muon";
  MuonConfig() { weight_decay = 0.0; }
  double lr = 0.02;
  double adam_lr = 6e-4;
  double momentum = 0.95;
  bool nesterov = true;
  int64_t backend_steps = 5;
  std::optional<double> adam_weight_decay;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double epsilon = 1e-8;
  double muon_epsilon = 1e-8;
  std::optional<double> max_grad_norm = 1.0;
  bool use_kimi_scaling = false;
};

/// `optimizer: {type: scion}` (upstream ScionConfig): Newton-Schulz on the momentum of the Linear weights, signum
/// (at learning_rate * scion_to_signum_lr) for the rest. `lr` is upstream's key; unused.
struct ScionConfig : OptimizerConfig {
  static constexpr std::string_view type_name = "scion";
  ScionConfig() { weight_decay = 0.0; }
  double lr = 0.02;
  double scion_to_signum_lr = 0.25;
  double momentum = 0.95;
  int64_t backend_steps = 10;
  double beta1 = 0.9;
  double scion_epsilon = 1e-8;
  std::optional<double> max_grad_norm = 1.0;
};

/// `optimizer: {type: mini}` (upstream MiniConfig, Adam-mini): Adam whose second moment is shared along axes of
/// each weight (by its role: embedding, query, key, value, output, lm_head, other Linear weights), plain Adam for
/// the rest. `lr` and `nesterov` are upstream's keys; unused.
struct MiniConfig : OptimizerConfig {
  static constexpr std::string_view type_name = "mini";
  MiniConfig() { weight_decay = 0.0; }
  double lr = 0.02;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double epsilon = 1e-8;
  std::optional<double> max_grad_norm = 1.0;
  bool nesterov = false;
};

/// `optimizer: {type: soap}` (upstream SoapConfig): Adam in the eigenbasis of Shampoo's per-dimension
/// preconditioners, refreshed every precondition_frequency steps. `schedule_list` is upstream's key; unused.
/// `mu_dtype`/`precond_dtype`: float32 only.
struct SoapConfig : OptimizerConfig {
  static constexpr std::string_view type_name = "soap";
  SoapConfig() { weight_decay = 0.0; }
  double beta1 = 0.95;
  double beta2 = 0.95;
  double shampoo_beta = 0.95;  ///< below 0: beta2
  double epsilon = 1e-8;
  std::optional<double> max_grad_norm = 1.0;
  std::optional<std::vector<std::string>> schedule_list;
  int64_t precondition_frequency = 10;
  int64_t max_precond_dim = 10000;
  bool merge_small_dims = true;
  bool one_diag = false;
  int64_t target_merged_dim_size = 2048;
  std::optional<std::string> mu_dtype;
  std::optional<std::string> precond_dtype;
  bool partition_grads_into_blocks = true;
  int64_t block_size = 256;
};

/// `optimizer: {type: kron}` (upstream KronConfig, PSGD Kron): momentum preconditioned by Kronecker factors fitted to
/// random probes. Precisions and lax_map settings are upstream's keys with no effect on the host.
struct KronConfig : OptimizerConfig {
  static constexpr std::string_view type_name = "kron";
  double beta1 = 0.9;
  std::optional<double> max_grad_norm = 1.0;
  bool normalize_grads = false;
  double preconditioner_update_probability = 0.05;
  int64_t update_prob_flat_start = 500;
  int64_t max_size_triangular = 25000;
  int64_t min_ndim_triangular = 2;
  std::optional<std::string> memory_save_mode;
  double preconditioner_lr = 0.1;
  double preconditioner_init_scale = 1.0;
  std::optional<std::string> mu_dtype;
  std::optional<std::string> precond_dtype;
  std::string precond_update_precision = "tensorfloat32";
  std::optional<std::string> precond_grads_precision;
  bool lax_map_scanned_layers = false;
  int64_t lax_map_batch_size = 8;
  bool merge_small_dims = true;
  int64_t target_merged_dim_size = 8192;
  bool partition_grads_into_blocks = true;
  int64_t block_size = 256;
};

/// `optimizer: {type: sophia-h}` (upstream SophiaHConfig): momentum divided by an exponential average of a
/// Hutchinson estimate of the Hessian's diagonal (v ⊙ H v, every update_interval steps), clipped element by element.
/// H v is a central difference of gradients here (levanter/optim/hessian.hpp). No clip_by_global_norm: upstream's
/// chain has none.
struct SophiaHConfig : OptimizerConfig {
  static constexpr std::string_view type_name = "sophia-h";
  double beta1 = 0.96;
  double beta2 = 0.99;
  double epsilon = 1e-12;
  std::optional<double> clip_threshold = 1.0;
  int64_t rng_seed = 0;
  double gamma = 0.01;
  int64_t update_interval = 10;
};

/// `optimizer:`; the upstream optimizers not listed here are refused by name.
using OptimizerChoice =
    config::Choice<AdamConfig, LionConfig, AdoptConfig, RMSPropMomentumConfig, CautiousConfig, MarsConfig, MuonConfig,
                   ScionConfig, MiniConfig, SoapConfig, KronConfig, SophiaHConfig>;

/// Adds every problem of the `optimizer:` section to `v` (keys under `optimizer.`).
void validate(config::validator& v, const AdamConfig& o);
void validate(config::validator& v, const LionConfig& o);
void validate(config::validator& v, const AdoptConfig& o);
void validate(config::validator& v, const RMSPropMomentumConfig& o);
void validate(config::validator& v, const CautiousConfig& o);
void validate(config::validator& v, const MarsConfig& o);
void validate(config::validator& v, const MuonConfig& o);
void validate(config::validator& v, const ScionConfig& o);
void validate(config::validator& v, const MiniConfig& o);
void validate(config::validator& v, const SoapConfig& o);
void validate(config::validator& v, const KronConfig& o);
void validate(config::validator& v, const SophiaHConfig& o);

}  // namespace levanter

template <>
struct levanter::config::schema<levanter::CosineLrSchedule> {
  using T = levanter::CosineLrSchedule;
  static constexpr auto fields = std::make_tuple(
      field("exponent", &T::exponent, "power applied to the cosine decay factor"));
};
template <>
struct levanter::config::schema<levanter::ConstantLrSchedule> {
  static constexpr auto fields = std::make_tuple();
};
template <>
struct levanter::config::schema<levanter::LinearLrSchedule> {
  static constexpr auto fields = std::make_tuple();
};
template <>
struct levanter::config::schema<levanter::InvSqrtLrSchedule> {
  using T = levanter::InvSqrtLrSchedule;
  static constexpr auto fields = std::make_tuple(
      field("timescale", &T::timescale, ""));
};
template <>
struct levanter::config::schema<levanter::InvLrSchedule> {
  static constexpr auto fields = std::make_tuple();
};
template <>
struct levanter::config::schema<levanter::PowerLrSchedule> {
  using T = levanter::PowerLrSchedule;
  static constexpr auto fields = std::make_tuple(
      field("batch_size", &T::batch_size, ""),
      field("seq_length", &T::seq_length, ""),
      field("a", &T::a, ""),
      field("b", &T::b, ""));
};
template <>
struct levanter::config::schema<levanter::SkipStepConfig> {
  using T = levanter::SkipStepConfig;
  static constexpr auto fields = std::make_tuple(
      field("rolling_interval_length", &T::rolling_interval_length, "steps of history for the loss and gradient-norm statistics"),
      field("sigma_factor", &T::sigma_factor, "skip when above mean + sigma_factor * std"));
};
template <>
struct levanter::config::schema<levanter::ClipUpdateNormConfig> {
  using T = levanter::ClipUpdateNormConfig;
  static constexpr auto fields = std::make_tuple(
      field("rolling_interval_length", &T::rolling_interval_length, "steps of update-norm history"),
      field("sigma_factor", &T::sigma_factor, "clip to mean + sigma_factor * std"));
};
namespace levanter::config {
/// A field declared in a base class of `T` (OptimizerConfig's, in each optimizer's schema).
template <class T, class B, class M>
constexpr field_info<T, M> base_field(std::string_view name, M B::*member, std::string_view doc) {
  return {name, member, doc};
}
/// OptimizerConfig's keys, first in every optimizer's schema.
template <class T>
constexpr auto optimizer_fields() {
  return std::make_tuple(
      base_field<T>("learning_rate", &T::learning_rate, "peak learning rate"),
      base_field<T>("weight_decay", &T::weight_decay, "decoupled weight decay (multiplied by the learning rate)"),
      base_field<T>("min_lr_ratio", &T::min_lr_ratio, "final learning rate as a fraction of the peak"),
      base_field<T>("warmup", &T::warmup, "linear warmup: a fraction of the steps (< 1) or a number of steps"),
      base_field<T>("decay", &T::decay, "decay length: fraction or steps (unset: the rest of each cycle)"),
      base_field<T>("rewarmup", &T::rewarmup, "warmup at the start of each later cycle: fraction of the cycle or steps"),
      base_field<T>("cooldown", &T::cooldown, "deprecated upstream: a final linear cooldown to min_lr (fraction or steps)"),
      base_field<T>("cycle_length", &T::cycle_length, "length of each cycle: fraction or steps, or a list of cycle lengths"),
      base_field<T>("cycles", &T::cycles, "number of cycles, or a list of cycle end steps"),
      base_field<T>("lr_schedule", &T::lr_schedule, "decay shape: constant, cosine, linear, inv_sqrt, inv, power"),
      base_field<T>("haps", &T::haps, "deprecated upstream: list of cycle boundaries (use cycles)"),
      base_field<T>("weight_decay_modules", &T::weight_decay_modules, "regex (string) or substrings (list) of parameter paths to decay"),
      base_field<T>("default_weight_decay_mask", &T::default_weight_decay_mask, "spare norms, embeddings and biases from decay (unset: when no modules given)"),
      base_field<T>("skip_bad_steps", &T::skip_bad_steps, "skip updates with outlier loss or gradient norm (bool, history length, or config)"),
      base_field<T>("update_rms_clipping", &T::update_rms_clipping, "clip each parameter's update (per Stacked layer) to this RMS"),
      base_field<T>("clip_update_norm", &T::clip_update_norm, "clip the update norm from its rolling statistics"));
}
}  // namespace levanter::config

template <>
struct levanter::config::schema<levanter::AdamConfig> {
  using T = levanter::AdamConfig;
  static constexpr auto fields = std::tuple_cat(optimizer_fields<T>(), std::make_tuple(
      field("beta1", &T::beta1, "Adam first-moment decay"),
      field("beta2", &T::beta2, "Adam second-moment decay"),
      field("epsilon", &T::epsilon, "Adam denominator epsilon"),
      field("max_grad_norm", &T::max_grad_norm, "clip gradients to this global norm (unset or 0: no clipping)"),
      field("nesterov", &T::nesterov, "Nesterov momentum in the first moment"),
      field("adamc_weight_decay", &T::adamc_weight_decay, "AdamC: scale weight decay with lr / peak lr")));
};

template <>
struct levanter::config::schema<levanter::LionConfig> {
  using T = levanter::LionConfig;
  static constexpr auto fields = std::tuple_cat(optimizer_fields<T>(), std::make_tuple(
      field("beta1", &T::beta1, "interpolation of gradient and momentum whose sign is the update"),
      field("beta2", &T::beta2, "momentum decay"),
      field("epsilon", &T::epsilon, "unused by Lion (upstream key)"),
      field("max_grad_norm", &T::max_grad_norm, "clip gradients to this global norm (unset or 0: no clipping)")));
};
template <>
struct levanter::config::schema<levanter::AdoptConfig> {
  using T = levanter::AdoptConfig;
  static constexpr auto fields = std::tuple_cat(optimizer_fields<T>(), std::make_tuple(
      field("beta1", &T::beta1, "first-moment decay"),
      field("beta2", &T::beta2, "second-moment decay"),
      field("epsilon", &T::epsilon, "denominator epsilon"),
      field("max_grad_norm", &T::max_grad_norm, "clip gradients to this global norm (unset or 0: no clipping)")));
};
template <>
struct levanter::config::schema<levanter::RMSPropMomentumConfig> {
  using T = levanter::RMSPropMomentumConfig;
  static constexpr auto fields = std::tuple_cat(optimizer_fields<T>(), std::make_tuple(
      field("beta1", &T::beta1, "momentum decay"),
      field("beta2", &T::beta2, "mean-square decay"),
      field("eps", &T::eps, "denominator epsilon"),
      field("max_grad_norm", &T::max_grad_norm, "clip gradients to this global norm (unset: no clipping)")));
};
template <>
struct levanter::config::schema<levanter::CautiousConfig> {
  using T = levanter::CautiousConfig;
  static constexpr auto fields = std::tuple_cat(optimizer_fields<T>(), std::make_tuple(
      field("beta1", &T::beta1, "first-moment decay"),
      field("beta2", &T::beta2, "second-moment decay"),
      field("gamma", &T::gamma, "unused by Cautious (upstream key)"),
      field("epsilon", &T::epsilon, "denominator epsilon (also added to the agreeing fraction)"),
      field("max_grad_norm", &T::max_grad_norm, "clip gradients to this global norm (unset or 0: no clipping)"),
      field("adamc_weight_decay", &T::adamc_weight_decay, "AdamC: scale weight decay with lr / peak lr")));
};
template <>
struct levanter::config::schema<levanter::MarsConfig> {
  using T = levanter::MarsConfig;
  static constexpr auto fields = std::tuple_cat(optimizer_fields<T>(), std::make_tuple(
      field("beta1", &T::beta1, "first-moment decay"),
      field("beta2", &T::beta2, "second-moment decay"),
      field("gamma", &T::gamma, "weight of the gradient's change in the variance-reduced gradient"),
      field("epsilon", &T::epsilon, "denominator epsilon"),
      field("max_grad_norm", &T::max_grad_norm, "clip the variance-reduced gradient to this global norm (unset or 0: no clipping)")));
};

template <>
struct levanter::config::schema<levanter::MuonConfig> {
  using T = levanter::MuonConfig;
  static constexpr auto fields = std::tuple_cat(optimizer_fields<T>(), std::make_tuple(
      field("lr", &T::lr, "unused by Muon (upstream key; learning_rate is the Muon group's peak)"),
      field("adam_lr", &T::adam_lr, "peak learning rate of the Adam group (same schedule shape)"),
      field("momentum", &T::momentum, "momentum of the Muon group"),
      field("nesterov", &T::nesterov, "Nesterov momentum in the Muon group"),
      field("backend_steps", &T::backend_steps, "Newton-Schulz iterations"),
      field("adam_weight_decay", &T::adam_weight_decay, "weight decay of the Adam group (unset: weight_decay)"),
      field("beta1", &T::beta1, "Adam group's first-moment decay"),
      field("beta2", &T::beta2, "Adam group's second-moment decay"),
      field("epsilon", &T::epsilon, "Adam group's denominator epsilon"),
      field("muon_epsilon", &T::muon_epsilon, "added to the Frobenius norm before Newton-Schulz"),
      field("max_grad_norm", &T::max_grad_norm, "clip the Adam group's gradients to this norm (unset or 0: no clipping)"),
      field("use_kimi_scaling", &T::use_kimi_scaling, "scale by 0.2 sqrt(max(rows, cols)) instead of sqrt(max(1, fan_out / fan_in))")));
};
template <>
struct levanter::config::schema<levanter::ScionConfig> {
  using T = levanter::ScionConfig;
  static constexpr auto fields = std::tuple_cat(optimizer_fields<T>(), std::make_tuple(
      field("lr", &T::lr, "unused by Scion (upstream key)"),
      field("scion_to_signum_lr", &T::scion_to_signum_lr, "the signum group's lr as a fraction of learning_rate"),
      field("momentum", &T::momentum, "momentum of the Scion group"),
      field("backend_steps", &T::backend_steps, "Newton-Schulz iterations"),
      field("beta1", &T::beta1, "signum group's momentum decay"),
      field("scion_epsilon", &T::scion_epsilon, "added to the Frobenius norm before Newton-Schulz"),
      field("max_grad_norm", &T::max_grad_norm, "clip the signum group's gradients to this norm (unset or 0: no clipping)")));
};
template <>
struct levanter::config::schema<levanter::MiniConfig> {
  using T = levanter::MiniConfig;
  static constexpr auto fields = std::tuple_cat(optimizer_fields<T>(), std::make_tuple(
      field("lr", &T::lr, "unused by Adam-mini (upstream key)"),
      field("beta1", &T::beta1, "first-moment decay"),
      field("beta2", &T::beta2, "second-moment decay"),
      field("epsilon", &T::epsilon, "denominator epsilon"),
      field("max_grad_norm", &T::max_grad_norm, "clip the Adam group's gradients to this norm (unset or 0: no clipping)"),
      field("nesterov", &T::nesterov, "unused by Adam-mini (upstream key)")));
};

template <>
struct levanter::config::schema<levanter::SoapConfig> {
  using T = levanter::SoapConfig;
  static constexpr auto fields = std::tuple_cat(optimizer_fields<T>(), std::make_tuple(
      field("beta1", &T::beta1, "first-moment decay"),
      field("beta2", &T::beta2, "second-moment decay (in the eigenbasis)"),
      field("shampoo_beta", &T::shampoo_beta, "decay of the preconditioners' statistics (below 0: beta2)"),
      field("epsilon", &T::epsilon, "denominator epsilon (also added to the statistics before the first eigh)"),
      field("max_grad_norm", &T::max_grad_norm, "clip gradients to this global norm (unset or 0: no clipping)"),
      field("schedule_list", &T::schedule_list, "unused by SOAP (upstream key)"),
      field("precondition_frequency", &T::precondition_frequency, "steps between refreshes of the eigenbases"),
      field("max_precond_dim", &T::max_precond_dim, "dimensions at least this long get no preconditioner"),
      field("merge_small_dims", &T::merge_small_dims, "merge contiguous dimensions towards target_merged_dim_size"),
      field("one_diag", &T::one_diag, "a preconditioner for the first eligible dimension only"),
      field("target_merged_dim_size", &T::target_merged_dim_size, "the size merge_small_dims aims at"),
      field("mu_dtype", &T::mu_dtype, "float32 only"),
      field("precond_dtype", &T::precond_dtype, "float32 only"),
      field("partition_grads_into_blocks", &T::partition_grads_into_blocks, "cut dimensions into blocks of block_size (padded)"),
      field("block_size", &T::block_size, "block length of partition_grads_into_blocks")));
};
template <>
struct levanter::config::schema<levanter::KronConfig> {
  using T = levanter::KronConfig;
  static constexpr auto fields = std::tuple_cat(optimizer_fields<T>(), std::make_tuple(
      field("beta1", &T::beta1, "momentum decay"),
      field("max_grad_norm", &T::max_grad_norm, "clip gradients to this global norm (unset or 0: none; off with normalize_grads)"),
      field("normalize_grads", &T::normalize_grads, "scale each leaf's gradient to unit norm"),
      field("preconditioner_update_probability", &T::preconditioner_update_probability, "final probability of a preconditioner update"),
      field("update_prob_flat_start", &T::update_prob_flat_start, "steps with update probability 1 before it anneals"),
      field("max_size_triangular", &T::max_size_triangular, "longer dimensions get a diagonal preconditioner"),
      field("min_ndim_triangular", &T::min_ndim_triangular, "leaves of fewer dimensions get diagonal preconditioners"),
      field("memory_save_mode", &T::memory_save_mode, "unset, one_diag or all_diag"),
      field("preconditioner_lr", &T::preconditioner_lr, "step size of the preconditioner fit"),
      field("preconditioner_init_scale", &T::preconditioner_init_scale, "initial scale of the preconditioners"),
      field("mu_dtype", &T::mu_dtype, "float32 only"),
      field("precond_dtype", &T::precond_dtype, "float32 only"),
      field("precond_update_precision", &T::precond_update_precision, "matmul precision upstream (no effect here: float32)"),
      field("precond_grads_precision", &T::precond_grads_precision, "matmul precision upstream (no effect here: float32)"),
      field("lax_map_scanned_layers", &T::lax_map_scanned_layers, "upstream's JAX mapping of layers (no effect here)"),
      field("lax_map_batch_size", &T::lax_map_batch_size, "upstream's JAX mapping batch (no effect here)"),
      field("merge_small_dims", &T::merge_small_dims, "merge contiguous dimensions towards target_merged_dim_size"),
      field("target_merged_dim_size", &T::target_merged_dim_size, "the size merge_small_dims aims at"),
      field("partition_grads_into_blocks", &T::partition_grads_into_blocks, "cut dimensions into blocks of block_size (padded)"),
      field("block_size", &T::block_size, "block length of partition_grads_into_blocks")));
};

template <>
struct levanter::config::schema<levanter::SophiaHConfig> {
  using T = levanter::SophiaHConfig;
  static constexpr auto fields = std::tuple_cat(optimizer_fields<T>(), std::make_tuple(
      field("beta1", &T::beta1, "momentum decay"),
      field("beta2", &T::beta2, "decay of the Hessian-diagonal average"),
      field("epsilon", &T::epsilon, "floor of gamma * h in the denominator"),
      field("clip_threshold", &T::clip_threshold, "clip each element of the update to +-this (unset: no clipping)"),
      field("rng_seed", &T::rng_seed, "seed of the Hutchinson probes"),
      field("gamma", &T::gamma, "scale of the Hessian estimate in the denominator"),
      field("update_interval", &T::update_interval, "re-estimate the Hessian diagonal every this many updates")));
};

// The YAML machinery of this section is compiled once, in src/optim/config.cpp.
LEVANTER_CONFIG_SECTION_EXTERN(levanter::AdamConfig)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::LionConfig)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::AdoptConfig)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::RMSPropMomentumConfig)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::CautiousConfig)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::MarsConfig)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::MuonConfig)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::ScionConfig)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::MiniConfig)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::SoapConfig)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::KronConfig)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::SophiaHConfig)
