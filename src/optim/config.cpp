// optim/config.hpp: checks of the `optimizer:` section.
#include <levanter/optim/config.hpp>

#include <levanter/config/validate.hpp>

namespace levanter {

using config::fmt_num;

void validate(config::validator& v, const AdamConfig& o) {
  if (!(o.learning_rate >= 0)) v.error("optimizer.learning_rate", "must be >= 0 (got " + fmt_num(o.learning_rate) + ")");
  if (!(o.weight_decay >= 0)) v.error("optimizer.weight_decay", "must be >= 0 (got " + fmt_num(o.weight_decay) + ")");
  if (!(o.beta1 >= 0 && o.beta1 < 1)) v.error("optimizer.beta1", "must be in [0, 1) (got " + fmt_num(o.beta1) + ")");
  if (!(o.beta2 >= 0 && o.beta2 < 1)) v.error("optimizer.beta2", "must be in [0, 1) (got " + fmt_num(o.beta2) + ")");
  if (!(o.epsilon > 0)) v.error("optimizer.epsilon", "must be positive (got " + fmt_num(o.epsilon) + ")");
  if (!(o.warmup >= 0)) v.error("optimizer.warmup", "must be >= 0 (a fraction or a number of steps)");
  if (o.decay && !(*o.decay >= 0)) v.error("optimizer.decay", "must be >= 0 (a fraction or a number of steps)");
  if (!(o.rewarmup >= 0)) v.error("optimizer.rewarmup", "must be >= 0 (a fraction or a number of steps)");
  if (!(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1))
    v.error("optimizer.min_lr_ratio", "must be in [0, 1] (got " + fmt_num(o.min_lr_ratio) + ")");
  if (o.max_grad_norm && !(*o.max_grad_norm >= 0))
    v.error("optimizer.max_grad_norm", "must be >= 0 or unset (got " + fmt_num(*o.max_grad_norm) + ")");
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
    if (!(p->a > 0 && p->b < 0)) v.error("optimizer.lr_schedule", "the power schedule expects a > 0 and b < 0");
  }
  if (auto* s = o.lr_schedule.get_if<InvSqrtLrSchedule>(); s && !(s->timescale > 0))
    v.error("optimizer.lr_schedule.timescale", "must be positive");
  if (o.update_rms_clipping && o.clip_update_norm)
    v.error("optimizer.update_rms_clipping", "update_rms_clipping cannot be combined with clip_update_norm "
                                             "(upstream rejects it); keep one of them");
  if (o.update_rms_clipping && !(*o.update_rms_clipping > 0))
    v.error("optimizer.update_rms_clipping", "must be positive");
  if (auto* n = std::get_if<int64_t>(&o.skip_bad_steps); n && *n <= 0)
    v.error("optimizer.skip_bad_steps", "a history length must be positive (or use true/false)");
}

}  // namespace levanter

LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::AdamConfig)
