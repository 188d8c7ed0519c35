// The element loops of the optimizers written as rules (levanter/optim/rule.hpp), compiled once for the baseline
// instruction set (SSE2; without FMA no multiply-add is contracted, and -fno-math-errno lets sqrt vectorise): every
// program that links levanter_core computes the same bits. Each loop does, per element, the float operations of
// upstream's optax chain in optax's order.
#include <levanter/optim/rule.hpp>
#include <levanter/optim/rules.hpp>

#include <haliax/detail/portable.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace levanter::optim {

namespace detail {
void check_rule_placement(std::string_view type) {
  if (!haliax::detail::host_memory || haliax::detail::device_guard::requested())
    throw std::invalid_argument("optimizer.type '" + std::string(type) +
                                "': this optimizer's update runs on the host, and this build keeps the parameters in "
                                "device memory; use type: adam, which has device kernels");
}
}  // namespace detail

}  // namespace levanter::optim

namespace levanter::optim {
namespace {

// optax.clip_by_global_norm, applied element by element: (g / norm) * max_norm when it triggers.
// Clip and Decay are template parameters (each loop is compiled four times and picked per chunk), so that the element
// loops have no branches and vectorise.
template <bool Clip>
inline float clipped(const rule_step& st, float g) {
  if constexpr (Clip) return g / st.clip_den * st.clip_num;
  return g;
}

// add_decayed_weights, then scale(-lr), then apply_updates: p + (u + wd * p) * -lr. Returns the step.
template <bool Decay>
inline float apply(const rule_step& st, const rule_chunk& c, int64_t i, float u) {
  if constexpr (Decay) u = u + st.wd * c.p[i];
  const float step = u * st.neg_lr;
  c.p[i] = c.p[i] + step;
  return step;
}

// Runs body(first, count, out) over blocks of 256 elements; the body writes one float per element to out (the
// parameter step, or what a norm sums), and the squares are added in double in element order afterwards, in a loop
// of their own, so that the body's element loop vectorises (no float operation is reordered by it).
template <class Body>
double blocks(int64_t n, Body&& body) {
  alignas(64) float out[256];
  double sq = 0;
  for (int64_t b = 0; b < n; b += 256) {
    const int64_t k = std::min<int64_t>(256, n - b);
    body(b, k, out);
    for (int64_t j = 0; j < k; ++j) sq += static_cast<double>(out[j]) * out[j];
  }
  return sq;
}

// 1 - b^t in float32, as optax's bias correction computes it (a Python float to an int32 power).
inline float bias(double b, int64_t t) { return 1.0f - std::pow(static_cast<float>(b), static_cast<float>(t)); }

inline float sign(float x) { return x > 0 ? 1.0f : x < 0 ? -1.0f : x; }  // jnp.sign (0 -> 0, NaN -> NaN)

// ---- Lion: u = sign((1 - b1) g + b1 m); m <- (1 - b2) g + b2 m.   k: b1, 1 - b1, b2, 1 - b2
template <bool Clip, bool Decay>
double lion_loop_v(const rule_step& st, const rule_chunk& c) {
  return blocks(c.n, [&](int64_t b, int64_t k, float* out) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = b + j;
      const float g = clipped<Clip>(st, c.g[i]);
      const float m = c.s[0][i];
      const float u = sign(st.k[1] * g + st.k[0] * m);
      c.s[0][i] = st.k[3] * g + st.k[2] * m;
      out[j] = apply<Decay>(st, c, i, u);
    }
  });
}

// ---- ADOPT: the gradient normalised by the previous second moment (zero on the first step) feeds the momentum.
// k: b1, 1 - b1, b2, 1 - b2, eps, 1 - b1^t, 1 - b2^(t-1), first step (1/0)
template <bool Clip, bool Decay>
double adopt_loop_v(const rule_step& st, const rule_chunk& c) {
  const bool first = st.k[7] != 0;
  return blocks(c.n, [&](int64_t b, int64_t k, float* out) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = b + j;
      const float g = clipped<Clip>(st, c.g[i]);
      const float v = c.s[1][i];
      const float normed = g / (std::sqrt(v / st.k[6]) + st.k[4]);  // 0/0 on the first step: not used then
      const float a = first ? 0.0f : normed;
      const float m = st.k[1] * a + st.k[0] * c.s[0][i];
      c.s[0][i] = m;
      c.s[1][i] = st.k[3] * (g * g) + st.k[2] * v;
      out[j] = apply<Decay>(st, c, i, m / st.k[5]);
    }
  });
}

// ---- RMSProp with momentum: s <- b2 s + (1 - b2) g^2; q = g / (sqrt(s / (1 - b2^t)) + eps);
// mom <- b1 mom + (1 - b1) q; u = mom / (1 - b1^t).   k: b1, 1 - b1, b2, 1 - b2, eps, 1 - b1^t, 1 - b2^t
template <bool Clip, bool Decay>
double rmsprop_loop_v(const rule_step& st, const rule_chunk& c) {
  return blocks(c.n, [&](int64_t b, int64_t k, float* out) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = b + j;
      const float g = clipped<Clip>(st, c.g[i]);
      const float ms = st.k[2] * c.s[0][i] + st.k[3] * (g * g);
      c.s[0][i] = ms;
      const float q = g / (std::sqrt(ms / st.k[6]) + st.k[4]);
      const float mom = st.k[0] * c.s[1][i] + st.k[1] * q;
      c.s[1][i] = mom;
      out[j] = apply<Decay>(st, c, i, mom / st.k[5]);
    }
  });
}

// ---- Adam's moments and direction (Cautious, MARS). k: b1, 1 - b1, b2, 1 - b2, eps, 1 - b1^t, 1 - b2^t
inline float adam_moments(const rule_step& st, float g, float* m, float* v) {
  const float mn = st.k[1] * g + st.k[0] * *m;
  const float vn = st.k[3] * (g * g) + st.k[2] * *v;
  *m = mn;
  *v = vn;
  return (mn / st.k[5]) / (std::sqrt(vn / st.k[6]) + st.k[4]);
}
inline float adam_direction(const rule_step& st, float m, float v) {
  return (m / st.k[5]) / (std::sqrt(v / st.k[6]) + st.k[4]);
}

// ---- Cautious: Adam's update kept where it agrees in sign with the gradient, over the leaf's agreeing fraction.
// The leaf pass updates the moments and counts the agreeing elements; the main pass recomputes the update.
template <bool Clip, bool Decay>
double cautious_count_v(const rule_step& st, const rule_chunk& c) {
  int64_t agree = 0;
  for (int64_t i = 0; i < c.n; ++i) {
    const float g = clipped<Clip>(st, c.g[i]);
    const float u = adam_moments(st, g, &c.s[0][i], &c.s[1][i]);
    agree += (g * u > 0) ? 1 : 0;
  }
  return static_cast<double>(agree);
}
template <bool Clip, bool Decay>
double cautious_loop_v(const rule_step& st, const rule_chunk& c) {
  const float den = c.leaf_mean + st.k[4];
  return blocks(c.n, [&](int64_t b, int64_t k, float* out) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = b + j;
      const float g = clipped<Clip>(st, c.g[i]);
      const float u = adam_direction(st, c.s[0][i], c.s[1][i]);
      const float mask = (g * u > 0) ? 1.0f : 0.0f;
      out[j] = apply<Decay>(st, c, i, u * mask / den);
    }
  });
}

// ---- MARS: c = g + gamma b1 / (1 - b1) (g - previous g), scaled by min(1, max / (|c| + 1e-6)) over every
// parameter, then Adam on c; the raw gradient is kept for the next step. k[7]: gamma b1 / (1 - b1), k[8]: scale
inline float mars_c(const rule_step& st, float g, float og) { return g + st.k[7] * (g - og); }
double mars_norm(const rule_step& st, const rule_chunk& c) {
  return blocks(c.n, [&](int64_t b, int64_t k, float* out) {
    for (int64_t j = 0; j < k; ++j) out[j] = mars_c(st, c.g[b + j], c.s[2][b + j]);
  });
}
template <bool Clip, bool Decay>
double mars_loop_v(const rule_step& st, const rule_chunk& c) {
  return blocks(c.n, [&](int64_t b, int64_t k, float* out) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = b + j;
      const float g = c.g[i];
      const float x = mars_c(st, g, c.s[2][i]) * st.k[8];
      const float u = adam_moments(st, x, &c.s[0][i], &c.s[1][i]);
      c.s[2][i] = g;
      out[j] = apply<Decay>(st, c, i, u);
    }
  });
}

// The four compiled variants of a loop, picked by the step's clipping and the leaf's decay.
#define LEVANTER_RULE_LOOP(name)                                                   \
  double name(const rule_step& st, const rule_chunk& c) {                          \
    if (st.clip) return c.decay ? name##_v<true, true>(st, c) : name##_v<true, false>(st, c);  \
    return c.decay ? name##_v<false, true>(st, c) : name##_v<false, false>(st, c); \
  }
LEVANTER_RULE_LOOP(lion_loop)
LEVANTER_RULE_LOOP(adopt_loop)
LEVANTER_RULE_LOOP(rmsprop_loop)
LEVANTER_RULE_LOOP(cautious_count)
LEVANTER_RULE_LOOP(cautious_loop)
LEVANTER_RULE_LOOP(mars_loop)
#undef LEVANTER_RULE_LOOP

// The Adam constants of step t into k[0..6].
void adam_constants(rule_step& st, double b1, double b2, double eps) {
  st.k[0] = static_cast<float>(b1);
  st.k[1] = static_cast<float>(1.0 - b1);
  st.k[2] = static_cast<float>(b2);
  st.k[3] = static_cast<float>(1.0 - b2);
  st.k[4] = static_cast<float>(eps);
  st.k[5] = bias(b1, st.t);
  st.k[6] = bias(b2, st.t);
}

}  // namespace

rule_def lion_rule(const LionConfig& c) {
  rule_def r;
  r.type = LionConfig::type_name;
  r.buffers = {"mu"};
  r.loop = lion_loop;
  r.max_grad_norm = c.max_grad_norm;
  r.constants = [b1 = c.beta1, b2 = c.beta2](rule_step& st) {
    st.k[0] = static_cast<float>(b1);
    st.k[1] = static_cast<float>(1.0 - b1);
    st.k[2] = static_cast<float>(b2);
    st.k[3] = static_cast<float>(1.0 - b2);
  };
  return r;
}

rule_def adopt_rule(const AdoptConfig& c) {
  rule_def r;
  r.type = AdoptConfig::type_name;
  r.buffers = {"mu", "nu"};
  r.loop = adopt_loop;
  r.max_grad_norm = c.max_grad_norm;
  r.constants = [b1 = c.beta1, b2 = c.beta2, eps = c.epsilon](rule_step& st) {
    adam_constants(st, b1, b2, eps);
    st.k[6] = bias(b2, st.t - 1);  // the second moment as it was before this step
    st.k[7] = st.t == 1 ? 1.0f : 0.0f;
  };
  return r;
}

rule_def rmsprop_rule(const RMSPropMomentumConfig& c) {
  rule_def r;
  r.type = RMSPropMomentumConfig::type_name;
  r.buffers = {"mean_square", "momentum"};
  r.loop = rmsprop_loop;
  r.max_grad_norm = c.max_grad_norm;
  r.clip_at_zero = true;
  r.constants = [b1 = c.beta1, b2 = c.beta2, eps = c.eps](rule_step& st) { adam_constants(st, b1, b2, eps); };
  return r;
}

rule_def cautious_rule(const CautiousConfig& c) {
  rule_def r;
  r.type = CautiousConfig::type_name;
  r.buffers = {"mu", "nu"};
  r.leaf_loop = cautious_count;
  r.loop = cautious_loop;
  r.max_grad_norm = c.max_grad_norm;
  r.constants = [b1 = c.beta1, b2 = c.beta2, eps = c.epsilon, adamc = c.adamc_weight_decay, peak = c.learning_rate,
                 wd = c.weight_decay](rule_step& st) {
    adam_constants(st, b1, b2, eps);
    if (adamc) st.wd = static_cast<float>(wd * (static_cast<double>(st.lr) / peak));
  };
  return r;
}

rule_def mars_rule(const MarsConfig& c) {
  rule_def r;
  r.type = MarsConfig::type_name;
  r.buffers = {"mu", "nu", "mog"};
  r.loop = mars_loop;
  r.norm_loop = mars_norm;
  const double max_norm = c.max_grad_norm.value_or(0.0);
  r.constants = [b1 = c.beta1, b2 = c.beta2, eps = c.epsilon, gamma = c.gamma, max_norm](rule_step& st) {
    adam_constants(st, b1, b2, eps);
    st.k[7] = static_cast<float>(gamma * b1 / (1 - b1));
    st.k[8] = 1.0f;
    if (max_norm != 0.0)
      st.k[8] = std::min(1.0f, static_cast<float>(max_norm) / (static_cast<float>(st.rule_norm) + 1e-6f));
  };
  return r;
}

}  // namespace levanter::optim
