// levanter/optim/schedule.hpp: the learning-rate schedule of `optimizer:` (upstream
// `OptimizerConfig.lr_scheduler`, src/levanter/optim/config.py), evaluated in double precision.
//
//   levanter::AdamConfig cfg;                       // warmup 1%, cosine to 10% of the peak
//   auto lr = levanter::optim::make_lr_schedule(cfg, 10000);
//   double at_500 = lr(500);
//
// Shape, per cycle [start, end) (one cycle unless `cycles`, `cycle_length` or `haps` says otherwise):
//   linear warmup from the previous cycle's final value (0 for the first) to the peak over `warmup` (first
//   cycle) or `rewarmup` (later cycles) steps -> constant peak ("stable") -> decay of `decay` steps (default: the
//   rest of the cycle) with the `lr_schedule` shape. The pieces are joined as optax.join_schedules does: piece k
//   starts at boundary k-1 and sees the step counted from that boundary.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "config.hpp"

namespace levanter::optim {

/// A learning-rate schedule: `lr(step)` for step = number of optimizer updates applied so far (optax's count).
class lr_schedule {
 public:
  using piece = std::function<double(double)>;

  lr_schedule() = default;
  /// Pieces joined at `boundaries` (optax.join_schedules): `boundaries.size() >= pieces.size() - 1`; extra
  /// boundaries are ignored, as `zip` ignores them upstream.
  lr_schedule(std::vector<piece> pieces, std::vector<int64_t> boundaries)
      : pieces_(std::move(pieces)), boundaries_(std::move(boundaries)) {
    if (pieces_.empty()) throw std::invalid_argument("levanter::optim::lr_schedule: no schedule pieces");
    if (boundaries_.size() + 1 < pieces_.size())
      throw std::invalid_argument("levanter::optim::lr_schedule: fewer boundaries than joins");
  }

  /// The learning rate at `step`.
  double operator()(int64_t step) const {
    // join_schedules: out = s0(step); for each (b, s): out = step < b ? out : s(step - b).
    std::size_t k = 0;
    for (std::size_t i = 1; i < pieces_.size(); ++i)
      if (!(step < boundaries_[i - 1])) k = i;
    const double local = k == 0 ? static_cast<double>(step) : static_cast<double>(step - boundaries_[k - 1]);
    return pieces_[k](local);
  }

  /// Every piece's start step (0, then the join boundaries used).
  std::vector<int64_t> starts() const {
    std::vector<int64_t> s{0};
    for (std::size_t i = 1; i < pieces_.size(); ++i) s.push_back(boundaries_[i - 1]);
    return s;
  }

 private:
  std::vector<piece> pieces_;
  std::vector<int64_t> boundaries_;
};

namespace detail::schedule {

[[noreturn]] inline void fail(const std::string& key, const std::string& msg) {
  throw std::invalid_argument("optimizer." + key + ": " + msg);
}

/// Upstream `_convert_frac_or_steps`: a value <= 1 is a fraction of `n` (truncated), a whole number > 1 is steps.
inline int64_t frac_or_steps(double v, int64_t n, const std::string& key) {
  if (v < 0.0 || (v > 1.0 && std::fmod(v, 1.0) != 0.0))
    fail(key, "invalid fraction " + std::to_string(v) + "; must be between 0 and 1, or a whole number of steps");
  if (v <= 1.0) return static_cast<int64_t>(v * static_cast<double>(n));
  return static_cast<int64_t>(v);
}

// optax schedules, as closures over doubles.
inline lr_schedule::piece constant(double v) {
  return [v](double) { return v; };
}
inline lr_schedule::piece linear(double init, double end, int64_t steps) {  // optax.linear_schedule
  if (steps <= 0) return constant(init);
  const double t = static_cast<double>(steps);
  return [=](double c) {
    c = std::clamp(c, 0.0, t);
    return (init - end) * (1.0 - c / t) + end;
  };
}
inline lr_schedule::piece cosine(double init, int64_t steps, double alpha, double exponent) {
  if (!(steps > 0))
    fail("lr_schedule", "cosine decay needs a positive number of decay steps (got " + std::to_string(steps) +
                            "); give the cycle some steps after warmup, or set decay");
  const double t = static_cast<double>(steps);
  return [=](double c) {
    c = std::min(c, t);
    const double cd = 0.5 * (1.0 + std::cos(std::numbers::pi * c / t));
    return init * ((1.0 - alpha) * std::pow(cd, exponent) + alpha);
  };
}
inline lr_schedule::piece inv_sqrt(double lr, double min_lr, int64_t warmup, double timescale) {
  return [=](double c) {
    const double d = std::min(1.0, 1.0 / std::sqrt(std::max(c + static_cast<double>(warmup), 1.0) / timescale));
    return std::max(lr * d, min_lr);
  };
}
inline lr_schedule::piece inv(double lr, double min_lr, int64_t steps) {
  return [=](double c) {
    const double d = std::min(1.0, 1.0 / ((lr / min_lr - 1.0) * std::max(c, 1.0) / static_cast<double>(steps) + 1.0));
    return std::max(lr * d, min_lr);
  };
}
inline lr_schedule::piece power(double lr, const PowerLrSchedule& p) {
  if (!p.batch_size || !p.seq_length)
    fail("lr_schedule", "type power needs batch_size and seq_length (tokens trained = step * batch_size * seq_length)");
  if (p.a <= 0 || p.b >= 0) fail("lr_schedule", "power schedule expects a > 0 and b < 0");
  const double bs = static_cast<double>(*p.batch_size), sl = static_cast<double>(*p.seq_length);
  return [=](double c) { return std::min(lr, bs * p.a * std::pow(c * bs * sl, p.b)); };
}

inline int64_t whole(double v, const std::string& key) {
  if (std::fmod(v, 1.0) != 0.0) fail(key, "must be a whole number (got " + std::to_string(v) + ")");
  return static_cast<int64_t>(v);
}

/// Upstream `_get_cycle_minima`: 0, the cycle boundaries, and the last step.
inline std::vector<int64_t> cycle_minima(const OptimizerConfig& c, int64_t total) {
  std::vector<int64_t> pts;
  if (c.cycle_length) {
    if (c.cycles) fail("cycle_length", "can't use both cycle_length and cycles");
    if (c.haps) fail("cycle_length", "can't use both cycle_length and haps");
    if (!c.cycle_length->is_list()) {
      const int64_t len = frac_or_steps(*c.cycle_length->number, total, "cycle_length");
      if (len <= 0) fail("cycle_length", "resolves to 0 steps");
      for (int64_t i = 1; i < total / len; ++i) pts.push_back(i * len);
    } else {
      int64_t acc = 0;
      for (auto l : c.cycle_length->list) pts.push_back(acc += l);
      if (!pts.empty() && pts.back() > total)
        fail("cycle_length", "cycle lengths exceed the total number of steps: " + std::to_string(pts.back()) +
                                 " > " + std::to_string(total));
    }
  } else if (c.haps) {
    pts = *c.haps;
  } else if (c.cycles && !c.cycles->is_list()) {
    const int64_t n = whole(*c.cycles->number, "cycles");
    for (int64_t i = 0; i < n - 1; ++i)
      pts.push_back(static_cast<int64_t>(static_cast<double>(total) / static_cast<double>(n) * static_cast<double>(i + 1)));
  } else if (c.cycles) {
    pts = c.cycles->list;
  }
  pts.insert(pts.begin(), 0);
  if (pts.back() != total) pts.push_back(total);
  return pts;
}

/// The decay shape of one cycle (upstream `LrSchedule.build(LrScheduleContext)`).
inline lr_schedule::piece decay_shape(const OptimizerConfig& c, double lr, double min_lr, int64_t warmup_steps,
                                      int64_t decay_steps) {
  return std::visit(
      [&](const auto& s) -> lr_schedule::piece {
        using S = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<S, ConstantLrSchedule>) return constant(lr);
        else if constexpr (std::is_same_v<S, CosineLrSchedule>) return cosine(lr, decay_steps, c.min_lr_ratio, s.exponent);
        else if constexpr (std::is_same_v<S, LinearLrSchedule>) return linear(lr, min_lr, decay_steps);
        else if constexpr (std::is_same_v<S, InvSqrtLrSchedule>) return inv_sqrt(lr, min_lr, warmup_steps, s.timescale);
        else if constexpr (std::is_same_v<S, InvLrSchedule>) return inv(lr, min_lr, decay_steps);
        else return power(lr, s);
      },
      c.lr_schedule.value);
}

}  // namespace detail::schedule

/// The schedule upstream's `OptimizerConfig.lr_scheduler(num_train_steps)` builds from `cfg`: warmup, stable,
/// decay per cycle (`cycles` / `cycle_length` / `haps`), `rewarmup`, `min_lr_ratio`, the `lr_schedule` shape
/// and the deprecated `cooldown` tail. Throws std::invalid_argument (naming the key) where upstream raises.
///
///   auto lr = make_lr_schedule(cfg, 1000);   // lr(0) == 0 with warmup; lr(999) near min_lr_ratio * peak
inline lr_schedule make_lr_schedule(const OptimizerConfig& cfg, int64_t num_train_steps) {
  namespace d = detail::schedule;
  if (num_train_steps <= 0) d::fail("lr_schedule", "num_train_steps must be positive");
  const int64_t cooldown_steps = cfg.cooldown ? d::frac_or_steps(*cfg.cooldown, num_train_steps, "cooldown") : 0;
  const int64_t total_main = num_train_steps - cooldown_steps;
  const auto pts = d::cycle_minima(cfg, total_main);

  const double lr = cfg.learning_rate;
  const double min_lr = lr * cfg.min_lr_ratio;
  std::vector<lr_schedule::piece> pieces;
  std::vector<int64_t> bounds;
  double previous_end = 0.0;
  lr_schedule::piece last;
  int64_t last_decay_steps = 0;

  for (std::size_t cyc = 0; cyc + 1 < pts.size(); ++cyc) {
    const int64_t start = pts[cyc], end = pts[cyc + 1];
    const int64_t cycle_steps = end - start;
    const int64_t warmup_steps = cyc == 0 ? d::frac_or_steps(cfg.warmup, cycle_steps, "warmup")
                                          : d::frac_or_steps(cfg.rewarmup, cycle_steps, "rewarmup");
    if (warmup_steps != 0) {
      pieces.push_back(d::linear(previous_end, lr, warmup_steps));
      bounds.push_back(start + warmup_steps);
    }
    const int64_t decay_steps =
        cfg.decay ? d::frac_or_steps(*cfg.decay, cycle_steps, "decay") : cycle_steps - warmup_steps;
    const int64_t stable_steps = cycle_steps - warmup_steps - decay_steps;
    if (stable_steps != 0) {
      pieces.push_back(d::constant(lr));
      bounds.push_back(start + warmup_steps + stable_steps);
    }
    last = d::decay_shape(cfg, lr, min_lr, warmup_steps, decay_steps);
    last_decay_steps = decay_steps;
    previous_end = last(static_cast<double>(decay_steps));
    pieces.push_back(last);
    bounds.push_back(end);
  }
  if (cooldown_steps != 0)
    pieces.push_back(d::linear(last(static_cast<double>(last_decay_steps)), min_lr, cooldown_steps));
  return lr_schedule(std::move(pieces), std::move(bounds));
}

}  // namespace levanter::optim
