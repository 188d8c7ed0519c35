// The element loops of the optimizers written as rules (levanter/optim/rule.hpp), compiled once for the baseline
// instruction set (SSE2; without FMA no multiply-add is contracted, and -fno-math-errno lets sqrt vectorise): every
// program that links levanter_core computes the same bits. Each loop does, per element, the float operations of
// upstream's optax chain in optax's order.
#include <levanter/optim/rule.hpp>
#include <levanter/optim/rules.hpp>

#include <haliax/detail/gemm.hpp>
#include <haliax/detail/portable.hpp>

#include <algorithm>
#include <functional>
#include <numeric>
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

// ---- Adam (the Adam groups of Muon and Adam-mini): optax's scale_by_adam. k: as adam_constants
template <bool Clip, bool Decay>
double adam_loop_v(const rule_step& st, const rule_chunk& c) {
  return blocks(c.n, [&](int64_t b, int64_t k, float* out) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = b + j;
      const float g = clipped<Clip>(st, c.g[i]);
      out[j] = apply<Decay>(st, c, i, adam_moments(st, g, &c.s[0][i], &c.s[1][i]));
    }
  });
}

// ---- Muon's momentum (no dampening) into the scratch that Newton-Schulz orthogonalises: buf <- m buf + g,
// x = m buf + g with Nesterov, else buf.   k[0]: momentum
template <bool Nesterov>
double muon_prep(const rule_step& st, const rule_chunk& c) {
  for (int64_t i = 0; i < c.n; ++i) {
    const float buf = st.k[0] * c.s[0][i] + c.g[i];
    c.s[0][i] = buf;
    c.x[i] = Nesterov ? st.k[0] * buf + c.g[i] : buf;
  }
  return 0;
}

// ---- Scion's momentum: buf <- m buf + (1 - m) g, x = buf.   k[0]: momentum, k[1]: 1 - momentum
double scion_prep(const rule_step& st, const rule_chunk& c) {
  for (int64_t i = 0; i < c.n; ++i) {
    const float buf = st.k[0] * c.s[0][i] + st.k[1] * c.g[i];
    c.s[0][i] = buf;
    c.x[i] = buf;
  }
  return 0;
}

// ---- The orthogonalised scratch as the update (Muon's and Scion's matrices; never clipped).
template <bool Clip, bool Decay>
double matrix_loop_v(const rule_step& st, const rule_chunk& c) {
  return blocks(c.n, [&](int64_t b, int64_t k, float* out) {
    for (int64_t j = 0; j < k; ++j) out[j] = apply<Decay>(st, c, b + j, c.x[b + j]);
  });
}

// ---- Signum (Scion's other leaves): buf <- b1 buf + (1 - b1) g, u = sign(buf).   k[0]: b1, k[1]: 1 - b1
template <bool Clip, bool Decay>
double signum_loop_v(const rule_step& st, const rule_chunk& c) {
  return blocks(c.n, [&](int64_t b, int64_t k, float* out) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = b + j;
      const float g = clipped<Clip>(st, c.g[i]);
      const float buf = st.k[0] * c.s[0][i] + st.k[1] * g;
      c.s[0][i] = buf;
      out[j] = apply<Decay>(st, c, i, sign(buf));
    }
  });
}

// ---- Adam-mini: the momentum as Adam's, g^2 into the scratch to be averaged over the group's axes, then the
// second moment from the average.   k: as adam_constants
double mini_prep(const rule_step& st, const rule_chunk& c) {
  for (int64_t i = 0; i < c.n; ++i) {
    c.s[0][i] = st.k[1] * c.g[i] + st.k[0] * c.s[0][i];
    c.x[i] = c.g[i] * c.g[i];
  }
  return 0;
}
template <bool Clip, bool Decay>
double mini_loop_v(const rule_step& st, const rule_chunk& c) {
  return blocks(c.n, [&](int64_t b, int64_t k, float* out) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = b + j;
      const float v = st.k[3] * c.x[i] + st.k[2] * c.s[1][i];
      c.s[1][i] = v;
      out[j] = apply<Decay>(st, c, i, adam_direction(st, c.s[0][i], v));
    }
  });
}

// x (shaped `sizes`) replaced by its mean over `axes` (positions; those past the array's rank are skipped), taken
// one axis at a time from the last, as jnp.mean(..., keepdims=True) repeatedly, then broadcast back.
void mean_over_axes(float* x, const std::vector<int64_t>& sizes, std::vector<int> axes) {
  std::sort(axes.rbegin(), axes.rend());
  std::vector<int64_t> shape = sizes;
  std::vector<float> cur(x, x + std::accumulate(sizes.begin(), sizes.end(), int64_t{1}, std::multiplies<>()));
  bool any = false;
  for (int a : axes) {
    if (a >= static_cast<int>(shape.size())) continue;
    any = true;
    int64_t outer = 1, inner = 1;
    for (int k = 0; k < a; ++k) outer *= shape[static_cast<std::size_t>(k)];
    for (std::size_t k = static_cast<std::size_t>(a) + 1; k < shape.size(); ++k) inner *= shape[k];
    const int64_t len = shape[static_cast<std::size_t>(a)];
    std::vector<float> next(static_cast<std::size_t>(outer * inner));
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t in = 0; in < inner; ++in) {
        double sum = 0;
        for (int64_t l = 0; l < len; ++l) sum += cur[static_cast<std::size_t>((o * len + l) * inner + in)];
        next[static_cast<std::size_t>(o * inner + in)] = static_cast<float>(sum) / static_cast<float>(len);
      }
    cur.swap(next);
    shape[static_cast<std::size_t>(a)] = 1;
  }
  if (!any) return;
  // broadcast: walk every element's index, dropping the reduced axes
  const std::size_t rank = sizes.size();
  std::vector<int64_t> idx(rank, 0);
  const int64_t n = std::accumulate(sizes.begin(), sizes.end(), int64_t{1}, std::multiplies<>());
  for (int64_t e = 0; e < n; ++e) {
    int64_t r = 0;
    for (std::size_t k = 0; k < rank; ++k) r = r * shape[k] + (shape[k] == 1 ? 0 : idx[k]);
    x[e] = cur[static_cast<std::size_t>(r)];
    for (std::size_t k = rank; k-- > 0;) {
      if (++idx[k] < sizes[k]) break;
      idx[k] = 0;
    }
  }
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
LEVANTER_RULE_LOOP(adam_loop)
LEVANTER_RULE_LOOP(matrix_loop)
LEVANTER_RULE_LOOP(signum_loop)
LEVANTER_RULE_LOOP(mini_loop)
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

// A rule of one group.
rule_def single(std::string_view type, std::vector<std::string> buffers, rule_group g) {
  rule_def r;
  r.type = type;
  r.buffers = std::move(buffers);
  r.groups.push_back(std::move(g));
  return r;
}

// ---- The matrix optimizers: a group of Linear weights orthogonalised (Muon, Scion) or with second moments shared
// along axes (Adam-mini), and a group for everything else. Upstream labels a leaf by its path and module.

bool mentions(const std::string& path, const char* s) { return path.find(s) != std::string::npos; }

// Muon's and Scion's labels: every Linear weight except those under a path naming "Embedding" or "lm_head".
std::size_t matrix_label(const leaf_desc& d) {
  if (mentions(d.path, "Embedding") || mentions(d.path, "lm_head")) return 1;
  return d.linear_weight ? 0 : 1;
}

// The Adam group (Muon's "adamw", Adam-mini's "adamw"): clip_by_global_norm -> scale_by_adam -> decay -> -lr.
rule_group adam_group(std::string name, double b1, double b2, double eps, std::optional<double> max_grad_norm) {
  rule_group g;
  g.name = std::move(name);
  g.loop = adam_loop;
  g.max_grad_norm = max_grad_norm;
  g.constants = [b1, b2, eps](rule_step& st) { adam_constants(st, b1, b2, eps); };
  return g;
}

}  // namespace

rule_def lion_rule(const LionConfig& c) {
  rule_group g;
  g.loop = lion_loop;
  g.max_grad_norm = c.max_grad_norm;
  g.constants = [b1 = c.beta1, b2 = c.beta2](rule_step& st) {
    st.k[0] = static_cast<float>(b1);
    st.k[1] = static_cast<float>(1.0 - b1);
    st.k[2] = static_cast<float>(b2);
    st.k[3] = static_cast<float>(1.0 - b2);
  };
  return single(LionConfig::type_name, {"mu"}, std::move(g));
}

rule_def adopt_rule(const AdoptConfig& c) {
  rule_group g;
  g.loop = adopt_loop;
  g.max_grad_norm = c.max_grad_norm;
  g.constants = [b1 = c.beta1, b2 = c.beta2, eps = c.epsilon](rule_step& st) {
    adam_constants(st, b1, b2, eps);
    st.k[6] = bias(b2, st.t - 1);  // the second moment as it was before this step
    st.k[7] = st.t == 1 ? 1.0f : 0.0f;
  };
  return single(AdoptConfig::type_name, {"mu", "nu"}, std::move(g));
}

rule_def rmsprop_rule(const RMSPropMomentumConfig& c) {
  rule_group g;
  g.loop = rmsprop_loop;
  g.max_grad_norm = c.max_grad_norm;
  g.clip_at_zero = true;
  g.constants = [b1 = c.beta1, b2 = c.beta2, eps = c.eps](rule_step& st) { adam_constants(st, b1, b2, eps); };
  return single(RMSPropMomentumConfig::type_name, {"mean_square", "momentum"}, std::move(g));
}

rule_def cautious_rule(const CautiousConfig& c) {
  rule_group g;
  g.leaf_loop = cautious_count;
  g.loop = cautious_loop;
  g.max_grad_norm = c.max_grad_norm;
  g.constants = [b1 = c.beta1, b2 = c.beta2, eps = c.epsilon, adamc = c.adamc_weight_decay, peak = c.learning_rate,
                 wd = c.weight_decay](rule_step& st) {
    adam_constants(st, b1, b2, eps);
    if (adamc) st.wd = static_cast<float>(wd * (static_cast<double>(st.lr) / peak));
  };
  return single(CautiousConfig::type_name, {"mu", "nu"}, std::move(g));
}

rule_def mars_rule(const MarsConfig& c) {
  rule_group g;
  g.loop = mars_loop;
  g.norm_loop = mars_norm;
  const double max_norm = c.max_grad_norm.value_or(0.0);
  g.constants = [b1 = c.beta1, b2 = c.beta2, eps = c.epsilon, gamma = c.gamma, max_norm](rule_step& st) {
    adam_constants(st, b1, b2, eps);
    st.k[7] = static_cast<float>(gamma * b1 / (1 - b1));
    st.k[8] = 1.0f;
    if (max_norm != 0.0)
      st.k[8] = std::min(1.0f, static_cast<float>(max_norm) / (static_cast<float>(st.rule_norm) + 1e-6f));
  };
  return single(MarsConfig::type_name, {"mu", "nu", "mog"}, std::move(g));
}


void newton_schulz(float* x, int64_t layers, int64_t rows, int64_t cols, int steps, float eps, float scale) {
  // upstream zeropower_via_newtonschulz5: X / (|X|_F + eps), transposed to have no more rows than columns, then
  // `steps` times A = X X^T, B = b A + c A A, X = a X + B X; scaled.
  constexpr float a = 3.4445f, b = -4.7750f, c = 2.0315f;
  const bool tr = rows > cols;
  const int64_t m = tr ? cols : rows, n = tr ? rows : cols;
  std::vector<float> X(static_cast<std::size_t>(layers * m * n)), Y(X.size());
  std::vector<float> A(static_cast<std::size_t>(layers * m * m)), AA(A.size());
  for (int64_t l = 0; l < layers; ++l) {
    const float* src = x + l * m * n;
    double sq = 0;
    for (int64_t i = 0; i < m * n; ++i) sq += static_cast<double>(src[i]) * src[i];
    const float den = static_cast<float>(std::sqrt(sq)) + eps;
    float* dst = X.data() + l * m * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) dst[i * n + j] = (tr ? src[j * cols + i] : src[i * n + j]) / den;
  }
  for (int s = 0; s < steps; ++s) {
    haliax::detail::gemm_batched<float>(false, true, layers, m, m, n, X.data(), X.data(), A.data());
    haliax::detail::gemm_batched<float>(false, false, layers, m, m, m, A.data(), A.data(), AA.data());
    for (std::size_t i = 0; i < A.size(); ++i) A[i] = b * A[i] + c * AA[i];
    haliax::detail::gemm_batched<float>(false, false, layers, m, n, m, A.data(), X.data(), Y.data());
    for (std::size_t i = 0; i < X.size(); ++i) X[i] = a * X[i] + Y[i];
  }
  for (int64_t l = 0; l < layers; ++l) {
    const float* src = X.data() + l * m * n;
    float* dst = x + l * m * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) (tr ? dst[j * cols + i] : dst[i * n + j]) = src[i * n + j] * scale;
  }
}

rule_def muon_rule(const MuonConfig& c) {
  rule_def r;
  r.type = MuonConfig::type_name;
  r.buffers = {"mu", "nu"};  // a matrix's momentum in mu (nu unused there)
  rule_group m;
  m.name = "muon";
  m.prep = c.nesterov ? muon_prep<true> : muon_prep<false>;
  m.loop = matrix_loop;
  m.constants = [mom = c.momentum](rule_step& st) { st.k[0] = static_cast<float>(mom); };
  m.leaf = [steps = c.backend_steps, eps = c.muon_epsilon, kimi = c.use_kimi_scaling](const rule_step&,
                                                                                      const leaf_desc& d, float* x) {
    // upstream scales by sqrt(max(1, rows / cols)) of the weight laid out outputs first (and asserts that layout
    // without Kimi's scaling); here the fan-out over the fan-in, whatever the layout.
    const double scale = kimi ? 0.2 * std::sqrt(static_cast<double>(std::max(d.rows, d.cols)))
                              : std::sqrt(std::max(1.0, static_cast<double>(d.fan_out) / static_cast<double>(d.fan_in)));
    newton_schulz(x, d.layers, d.rows, d.cols, static_cast<int>(steps), static_cast<float>(eps),
                  static_cast<float>(scale));
  };
  r.groups.push_back(std::move(m));
  auto adam = adam_group("adamw", c.beta1, c.beta2, c.epsilon, c.max_grad_norm);
  adam.peak_lr = c.adam_lr;
  adam.weight_decay = c.adam_weight_decay.value_or(c.weight_decay);
  r.groups.push_back(std::move(adam));
  r.label = matrix_label;
  return r;
}

rule_def scion_rule(const ScionConfig& c) {
  rule_def r;
  r.type = ScionConfig::type_name;
  r.buffers = {"momentum_buffer"};
  rule_group s;
  s.name = "scion";
  s.prep = scion_prep;
  s.loop = matrix_loop;
  s.constants = [mom = c.momentum](rule_step& st) {
    st.k[0] = static_cast<float>(mom);
    st.k[1] = static_cast<float>(1.0 - mom);
  };
  s.leaf = [steps = c.backend_steps, eps = c.scion_epsilon](const rule_step&, const leaf_desc& d, float* x) {
    // upstream: sqrt(max(1, rows / cols)) of the weight as laid out (inputs first unless out_first)
    const double scale = std::sqrt(std::max(1.0, static_cast<double>(d.rows) / static_cast<double>(d.cols)));
    newton_schulz(x, d.layers, d.rows, d.cols, static_cast<int>(steps), static_cast<float>(eps),
                  static_cast<float>(scale));
  };
  r.groups.push_back(std::move(s));
  rule_group sg;
  sg.name = "signum";
  sg.loop = signum_loop;
  sg.max_grad_norm = c.max_grad_norm;
  sg.lr_factor = c.scion_to_signum_lr;
  sg.constants = [b1 = c.beta1](rule_step& st) {
    st.k[0] = static_cast<float>(b1);
    st.k[1] = static_cast<float>(1.0 - b1);
  };
  r.groups.push_back(std::move(sg));
  r.label = matrix_label;
  return r;
}

rule_def mini_rule(const MiniConfig& c) {
  // upstream adam_mini.py's create_mask: the first of these path substrings decides; else a Linear's weight is
  // "linear" and everything else (biases included) "adamw". The second moment is averaged over these positional
  // axes of the stored array (Stacked layer axis included) where the array has them.
  struct mean_group {
    const char* name;
    std::vector<int> axes;
  };
  static const std::vector<mean_group> groups = {{"embedding", {1}}, {"query", {2, 3, 4}}, {"key", {2, 3}},
                                                 {"value", {3}},     {"output", {2, 3}},   {"lm_head", {1}},
                                                 {"linear", {2}}};
  rule_def r;
  r.type = MiniConfig::type_name;
  r.buffers = {"mu", "nu"};  // momentum and second moment, in every group
  for (const auto& mg : groups) {
    rule_group g;
    g.name = mg.name;
    g.prep = mini_prep;
    g.loop = mini_loop;
    g.constants = [b1 = c.beta1, b2 = c.beta2, eps = c.epsilon](rule_step& st) { adam_constants(st, b1, b2, eps); };
    g.leaf = [axes = mg.axes](const rule_step&, const leaf_desc& d, float* x) { mean_over_axes(x, d.sizes, axes); };
    r.groups.push_back(std::move(g));
  }
  auto adam = adam_group("adamw", c.beta1, c.beta2, c.epsilon, c.max_grad_norm);
  r.groups.push_back(std::move(adam));
  r.label = [](const leaf_desc& d) -> std::size_t {
    const char* subs[] = {"embedding", "q_proj", "k_proj", "v_proj", "o_proj", "lm_head"};
    for (std::size_t i = 0; i < 6; ++i)
      if (mentions(d.path, subs[i])) return i;
    return d.linear_weight ? 6 : 7;
  };
  return r;
}

}  // namespace levanter::optim
