// optim/config.hpp: checks of the `optimizer:` section.
#include <levanter/optim/config.hpp>

#include <levanter/config/validate.hpp>

namespace levanter {

using config::fmt_num;

namespace {

namespace bounds = config::bounds;
using config::check_int;
using config::check_real;

/// warmup, decay, rewarmup, cooldown: a fraction of the run (or cycle) when < 1, else a number of steps.
void check_frac_or_steps(config::validator& v, const std::string& key, double x) {
  check_real(v, key, x, 0, double(bounds::max_steps), false, false,
             "a fraction of the steps (below 1) or a number of steps");
}

/// cycle_length / cycles: a number, or a list of cycle end steps (increasing).
void check_cycles(config::validator& v, const std::string& key, const config::NumberOrList& c, bool is_length) {
  if (c.number) {
    if (is_length)
      check_real(v, key, *c.number, 0, double(bounds::max_steps), true, false, "steps per cycle");
    else
      check_real(v, key, *c.number, 1, double(bounds::max_steps), false, false, "the number of cycles");
    return;
  }
  for (std::size_t i = 0; i < c.list.size(); ++i) {
    const std::string k = config::detail::join_index(key, i);
    if (check_int(v, k, c.list[i], 1, bounds::max_steps, "cycle boundaries are step numbers") && i > 0 &&
        c.list[i] <= c.list[i - 1])
      v.error(k, "cycle boundaries must increase (" + std::to_string(c.list[i]) + " after " +
                     std::to_string(c.list[i - 1]) + ")");
  }
}

void check_rolling(config::validator& v, const std::string& key, int64_t length, double sigma) {
  check_int(v, key + ".rolling_interval_length", length, 1, 1 << 20, "steps of history");
  check_real(v, key + ".sigma_factor", sigma, 0, 1000, true, false);
}

void check_max_grad_norm(config::validator& v, const std::optional<double>& m) {
  if (m) check_real(v, "optimizer.max_grad_norm", *m, 0, 1e9, false, false, "or null for no clipping");
}

void check_beta(config::validator& v, const char* key, double b) { check_real(v, key, b, 0, 1, false, true); }

void check_eps(config::validator& v, const char* key, double e) { check_real(v, key, e, 0, 1, true, false); }

void validate_base(config::validator& v, const OptimizerConfig& o) {
  check_real(v, "optimizer.learning_rate", o.learning_rate, 0, 100);
  if (const auto* s = std::get_if<SkipStepConfig>(&o.skip_bad_steps))
    check_rolling(v, "optimizer.skip_bad_steps", s->rolling_interval_length, s->sigma_factor);
  if (auto* n = std::get_if<int64_t>(&o.skip_bad_steps))
    check_int(v, "optimizer.skip_bad_steps", *n, 1, 1 << 20, "a history length in steps (or use true/false)");
  check_real(v, "optimizer.weight_decay", o.weight_decay, 0, 100);
  check_frac_or_steps(v, "optimizer.warmup", o.warmup);
  if (o.decay) check_frac_or_steps(v, "optimizer.decay", *o.decay);
  check_frac_or_steps(v, "optimizer.rewarmup", o.rewarmup);
  check_real(v, "optimizer.min_lr_ratio", o.min_lr_ratio, 0, 1);
  if (o.cycle_length) check_cycles(v, "optimizer.cycle_length", *o.cycle_length, true);
  if (o.cycles) check_cycles(v, "optimizer.cycles", *o.cycles, false);
  if (const auto* c = o.lr_schedule.get_if<CosineLrSchedule>())
    check_real(v, "optimizer.lr_schedule.exponent", c->exponent, 0, 100, true, false);
  if (const auto* p = o.lr_schedule.get_if<PowerLrSchedule>()) {
    if (p->batch_size) check_int(v, "optimizer.lr_schedule.batch_size", *p->batch_size, 1, bounds::max_batch);
    if (p->seq_length) check_int(v, "optimizer.lr_schedule.seq_length", *p->seq_length, 1, bounds::max_seq_len);
    check_real(v, "optimizer.lr_schedule.a", p->a, 0, 1e6, true, false);
    check_real(v, "optimizer.lr_schedule.b", p->b, -100, 0, false, true);
  }
  if (o.cooldown)
    v.refuse("optimizer.cooldown", "cooldown is deprecated upstream and not supported",
             "use decay (the length of the final decay) with the normal schedule");
  if (o.haps)
    v.refuse("optimizer.haps", "haps is deprecated upstream and not supported",
             "use cycles: [end steps of each cycle]");
  int cyc = (o.cycle_length ? 1 : 0) + (o.cycles ? 1 : 0) + (o.haps ? 1 : 0);
  if (cyc > 1)
    v.error(o.cycle_length ? "optimizer.cycle_length" : "optimizer.cycles",
            "use at most one of cycle_length, cycles and haps");
  if (auto* p = o.lr_schedule.get_if<PowerLrSchedule>()) {
    if (!p->batch_size || !p->seq_length)
      v.error("optimizer.lr_schedule", "the power schedule needs batch_size and seq_length; set "
                                       "lr_schedule: {type: power, batch_size: B, seq_length: L}");
  }
  if (auto* s = o.lr_schedule.get_if<InvSqrtLrSchedule>())
    check_real(v, "optimizer.lr_schedule.timescale", s->timescale, 0, double(bounds::max_steps), true, false);
  if (o.clip_update_norm) check_rolling(v, "optimizer.clip_update_norm", o.clip_update_norm->rolling_interval_length,
                                        o.clip_update_norm->sigma_factor);
  if (o.update_rms_clipping && o.clip_update_norm)
    v.error("optimizer.update_rms_clipping", "update_rms_clipping cannot be combined with clip_update_norm "
                                             "(upstream rejects it); keep one of them");
  if (o.update_rms_clipping)
    check_real(v, "optimizer.update_rms_clipping", *o.update_rms_clipping, 0, 1e9, true, false);
}

}  // namespace

void validate(config::validator& v, const AdamConfig& o) {
  validate_base(v, o);
  check_real(v, "optimizer.beta1", o.beta1, 0, 1, false, true);
  check_real(v, "optimizer.beta2", o.beta2, 0, 1, false, true);
  check_real(v, "optimizer.epsilon", o.epsilon, 0, 1, true, false);
  if (o.max_grad_norm)
    check_real(v, "optimizer.max_grad_norm", *o.max_grad_norm, 0, 1e9, false, false,
               "or null for no clipping");
}

void validate(config::validator& v, const LionConfig& o) {
  validate_base(v, o);
  check_beta(v, "optimizer.beta1", o.beta1);
  check_beta(v, "optimizer.beta2", o.beta2);
  check_max_grad_norm(v, o.max_grad_norm);
}

void validate(config::validator& v, const AdoptConfig& o) {
  validate_base(v, o);
  check_beta(v, "optimizer.beta1", o.beta1);
  check_beta(v, "optimizer.beta2", o.beta2);
  check_eps(v, "optimizer.epsilon", o.epsilon);
  check_max_grad_norm(v, o.max_grad_norm);
}

void validate(config::validator& v, const RMSPropMomentumConfig& o) {
  validate_base(v, o);
  check_beta(v, "optimizer.beta1", o.beta1);
  check_beta(v, "optimizer.beta2", o.beta2);
  check_eps(v, "optimizer.eps", o.eps);
  check_max_grad_norm(v, o.max_grad_norm);
}

void validate(config::validator& v, const CautiousConfig& o) {
  validate_base(v, o);
  check_beta(v, "optimizer.beta1", o.beta1);
  check_beta(v, "optimizer.beta2", o.beta2);
  check_eps(v, "optimizer.epsilon", o.epsilon);
  check_max_grad_norm(v, o.max_grad_norm);
}

void validate(config::validator& v, const MarsConfig& o) {
  validate_base(v, o);
  check_beta(v, "optimizer.beta1", o.beta1);
  check_beta(v, "optimizer.beta2", o.beta2);
  check_real(v, "optimizer.gamma", o.gamma, 0, 100);
  check_eps(v, "optimizer.epsilon", o.epsilon);
  check_max_grad_norm(v, o.max_grad_norm);
}

void validate(config::validator& v, const MuonConfig& o) {
  validate_base(v, o);
  check_real(v, "optimizer.adam_lr", o.adam_lr, 0, 10, true);
  check_beta(v, "optimizer.momentum", o.momentum);
  check_int(v, "optimizer.backend_steps", o.backend_steps, 0, 100, "Newton-Schulz iterations, e.g. 5");
  if (o.adam_weight_decay) check_real(v, "optimizer.adam_weight_decay", *o.adam_weight_decay, 0, 10);
  check_beta(v, "optimizer.beta1", o.beta1);
  check_beta(v, "optimizer.beta2", o.beta2);
  check_eps(v, "optimizer.epsilon", o.epsilon);
  check_eps(v, "optimizer.muon_epsilon", o.muon_epsilon);
  check_max_grad_norm(v, o.max_grad_norm);
}

void validate(config::validator& v, const ScionConfig& o) {
  validate_base(v, o);
  check_real(v, "optimizer.scion_to_signum_lr", o.scion_to_signum_lr, 0, 100);
  check_beta(v, "optimizer.momentum", o.momentum);
  check_int(v, "optimizer.backend_steps", o.backend_steps, 0, 100, "Newton-Schulz iterations, e.g. 10");
  check_beta(v, "optimizer.beta1", o.beta1);
  check_eps(v, "optimizer.scion_epsilon", o.scion_epsilon);
  check_max_grad_norm(v, o.max_grad_norm);
}

void validate(config::validator& v, const MiniConfig& o) {
  validate_base(v, o);
  check_beta(v, "optimizer.beta1", o.beta1);
  check_beta(v, "optimizer.beta2", o.beta2);
  check_eps(v, "optimizer.epsilon", o.epsilon);
  check_max_grad_norm(v, o.max_grad_norm);
}

namespace {
void check_f32(config::validator& v, const std::string& key, const std::optional<std::string>& dtype) {
  if (dtype && *dtype != "float32" && *dtype != "f32" && *dtype != "fp32")
    v.error(key, "'" + *dtype + "' is not supported: this optimizer keeps its state in float32; remove the key");
}
void check_block(config::validator& v, bool merge, int64_t target, bool partition, int64_t block_size) {
  if (merge) check_int(v, "optimizer.target_merged_dim_size", target, 1, int64_t{1} << 40, "e.g. 2048");
  if (partition) check_int(v, "optimizer.block_size", block_size, 1, 1 << 16, "e.g. 256");
}
}  // namespace

void validate(config::validator& v, const SoapConfig& o) {
  validate_base(v, o);
  check_beta(v, "optimizer.beta1", o.beta1);
  check_beta(v, "optimizer.beta2", o.beta2);
  if (o.shampoo_beta >= 0) check_beta(v, "optimizer.shampoo_beta", o.shampoo_beta);
  check_eps(v, "optimizer.epsilon", o.epsilon);
  check_max_grad_norm(v, o.max_grad_norm);
  check_int(v, "optimizer.precondition_frequency", o.precondition_frequency, 1, int64_t{1} << 40, "e.g. 10");
  check_int(v, "optimizer.max_precond_dim", o.max_precond_dim, 1, int64_t{1} << 40, "e.g. 10000");
  check_f32(v, "optimizer.mu_dtype", o.mu_dtype);
  check_f32(v, "optimizer.precond_dtype", o.precond_dtype);
  check_block(v, o.merge_small_dims, o.target_merged_dim_size, o.partition_grads_into_blocks, o.block_size);
}

void validate(config::validator& v, const KronConfig& o) {
  validate_base(v, o);
  check_beta(v, "optimizer.beta1", o.beta1);
  check_max_grad_norm(v, o.max_grad_norm);
  check_real(v, "optimizer.preconditioner_update_probability", o.preconditioner_update_probability, 0, 1, true);
  check_int(v, "optimizer.update_prob_flat_start", o.update_prob_flat_start, 0, int64_t{1} << 40, "e.g. 500");
  check_int(v, "optimizer.max_size_triangular", o.max_size_triangular, 0, int64_t{1} << 40, "e.g. 25000");
  check_int(v, "optimizer.min_ndim_triangular", o.min_ndim_triangular, 0, 64, "e.g. 2");
  if (o.memory_save_mode && *o.memory_save_mode != "one_diag" && *o.memory_save_mode != "all_diag")
    v.error("optimizer.memory_save_mode",
            "'" + *o.memory_save_mode + "' is not a mode: use one_diag or all_diag, or leave it unset");
  check_real(v, "optimizer.preconditioner_lr", o.preconditioner_lr, 0, 10, true);
  check_real(v, "optimizer.preconditioner_init_scale", o.preconditioner_init_scale, 0, 1e6, true);
  check_f32(v, "optimizer.mu_dtype", o.mu_dtype);
  check_f32(v, "optimizer.precond_dtype", o.precond_dtype);
  check_block(v, o.merge_small_dims, o.target_merged_dim_size, o.partition_grads_into_blocks, o.block_size);
}

void validate(config::validator& v, const SophiaHConfig& o) {
  validate_base(v, o);
  check_beta(v, "optimizer.beta1", o.beta1);
  check_beta(v, "optimizer.beta2", o.beta2);
  check_eps(v, "optimizer.epsilon", o.epsilon);
  if (o.clip_threshold) check_real(v, "optimizer.clip_threshold", *o.clip_threshold, 0, 1e30, true);
  check_real(v, "optimizer.gamma", o.gamma, 0, 1e30, true);
  check_int(v, "optimizer.update_interval", o.update_interval, 1, int64_t{1} << 40, "e.g. 10");
  check_int(v, "optimizer.rng_seed", o.rng_seed, 0, (int64_t{1} << 32) - 1, "e.g. 0");
}

}  // namespace levanter

LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::AdamConfig)
LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::LionConfig)
LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::AdoptConfig)
LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::RMSPropMomentumConfig)
LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::CautiousConfig)
LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::MarsConfig)
LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::MuonConfig)
LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::ScionConfig)
LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::MiniConfig)
LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::SoapConfig)
LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::KronConfig)
LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::SophiaHConfig)
