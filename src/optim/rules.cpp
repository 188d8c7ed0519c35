// The element loops of the optimizers written as rules (levanter/optim/rule.hpp), compiled for the baseline
// instruction set (SSE2) and again for AVX2, picked at run time; neither uses FMA, so no multiply-add is contracted
// (and -fno-math-errno lets sqrt vectorise): every program that links levanter_core computes the same bits on any
// x86-64. Each loop does, per element, the float operations of
// upstream's optax chain in optax's order.
#include <levanter/optim/rule.hpp>
#include <levanter/optim/rules.hpp>
#include <levanter/optim/adamw_kernel.hpp>

#include <haliax/detail/gemm.hpp>
#include <haliax/detail/portable.hpp>
#include <haliax/detail/threefry.hpp>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace levanter::optim {

namespace {
// Whether the element loops run their AVX2 build: as AdamW's loop (the CPU has AVX2 and LEVANTER_ISA is not
// "baseline").
bool rule_isa_avx2 = std::strcmp(detail::adamw::kernel_isa(), "avx2") == 0;
}  // namespace

namespace detail {
bool set_rule_loops_avx2(bool on) {
  const bool was = rule_isa_avx2;
  rule_isa_avx2 = on && detail::adamw::isa_available(detail::adamw::isa::avx2);
  return was;
}
bool rule_loops_avx2() { return rule_isa_avx2; }

double finish_recorded(const rule_step& st, const rule_chunk& c) {
  double sq = 0;
  const float wd = st.wd;
  for (int64_t k = 0; k < c.n; ++k) {
    float u = -c.x[k];
    if (c.decay) u = u + wd * c.p[k];
    c.x[k] = u;
    sq += static_cast<double>(u) * u;
  }
  return sq;
}
double apply_recorded(const rule_step& st, const rule_chunk& c) {
  double sq = 0;
  const float div = st.k[0], mul = st.k[1], neg_lr = st.neg_lr;
  for (int64_t k = 0; k < c.n; ++k) {
    const float step = ((c.x[k] / div) * mul) * neg_lr;
    c.p[k] = c.p[k] + step;
    sq += static_cast<double>(step) * step;
  }
  return sq;
}

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


// add_decayed_weights, then scale(-lr), then apply_updates: p + (u + wd * p) * -lr. Returns the step.
template <bool Decay>
inline float apply_step(float wd, float neg_lr, float& p, float u) {
  if constexpr (Decay) u = u + wd * p;
  const float step = u * neg_lr;
  p = p + step;
  return step;
}

// A block of one chunk: at most 256 elements of the parameters, the gradient, the state buffers and the scratch,
// and `out`, where the body writes one float per element (the parameter's step, or what a norm sums). The arrays
// never overlap: declaring them restrict (and the step's constants copied out of rule_step, which the stores could
// otherwise alias) lets the element loops vectorise without run-time overlap checks.
struct block {
  int64_t k;
  float* __restrict p;
  const float* __restrict g;
  float* __restrict s0;
  float* __restrict s1;
  float* __restrict s2;
  float* __restrict x;
  const float* __restrict a;  // rule_chunk::aux
  float* __restrict out;
};

// Runs body(block) over the chunk's blocks of 256 elements; the squares of `out` are added in double in element
// order afterwards, in a loop of their own, so that the body's element loop vectorises (no float operation is
// reordered by it).
template <class Body>
double blocks(const rule_chunk& c, Body&& body) {
  alignas(64) float out[256];
  double sq = 0;
  auto at = [](auto* q, int64_t b) { return q ? q + b : nullptr; };
  for (int64_t b = 0; b < c.n; b += 256) {
    const int64_t k = std::min<int64_t>(256, c.n - b);
    body(block{k, c.p + b, c.g + b, at(c.s[0], b), at(c.s[1], b), at(c.s[2], b), at(c.x, b), at(c.aux, b), out});
    for (int64_t j = 0; j < k; ++j) sq += static_cast<double>(out[j]) * out[j];
  }
  return sq;
}

// 1 - b^t in float32, as optax's bias correction computes it (a Python float to an int32 power).
inline float bias(double b, int64_t t) { return 1.0f - std::pow(static_cast<float>(b), static_cast<float>(t)); }

inline float sign(float x) { return x > 0 ? 1.0f : x < 0 ? -1.0f : x; }  // jnp.sign (0 -> 0, NaN -> NaN)

// The step's constants as locals.
struct consts {
  float k[12];
  float wd, neg_lr, clip_num, clip_den;
  explicit consts(const rule_step& st) : wd(st.wd), neg_lr(st.neg_lr), clip_num(st.clip_num), clip_den(st.clip_den) {
    std::copy(std::begin(st.k), std::end(st.k), k);
  }
  // optax.clip_by_global_norm, applied element by element: (g / norm) * max_norm when it triggers. Clip and Decay
  // are template parameters (each loop is compiled four times and picked per chunk), so that the element loops have
  // no branches and vectorise.
  template <bool Clip>
  float clipped(float g) const {
    if constexpr (Clip) return g / clip_den * clip_num;
    return g;
  }
  template <bool Decay>
  float apply(float& p, float u) const {
    return apply_step<Decay>(wd, neg_lr, p, u);
  }
  // Adam's moments (m, v updated) and direction. k: b1, 1 - b1, b2, 1 - b2, eps, 1 - b1^t, 1 - b2^t
  float adam_moments(float g, float& m, float& v) const {
    const float mn = k[1] * g + k[0] * m;
    const float vn = k[3] * (g * g) + k[2] * v;
    m = mn;
    v = vn;
    return (mn / k[5]) / (std::sqrt(vn / k[6]) + k[4]);
  }
  float adam_direction(float m, float v) const { return (m / k[5]) / (std::sqrt(v / k[6]) + k[4]); }
};

// ---- Lion: u = sign((1 - b1) g + b1 m); m <- (1 - b2) g + b2 m.   k: b1, 1 - b1, b2, 1 - b2
template <bool Clip, bool Decay>
double lion_loop_v(const rule_step& st, const rule_chunk& c) {
  const consts q(st);
  return blocks(c, [&](const block& b) {
    for (int64_t j = 0; j < b.k; ++j) {
      const float g = q.clipped<Clip>(b.g[j]);
      const float m = b.s0[j];
      const float u = sign(q.k[1] * g + q.k[0] * m);
      b.s0[j] = q.k[3] * g + q.k[2] * m;
      b.out[j] = q.apply<Decay>(b.p[j], u);
    }
  });
}

// ---- ADOPT: the gradient normalised by the previous second moment (zero on the first step) feeds the momentum.
// k: b1, 1 - b1, b2, 1 - b2, eps, 1 - b1^t, 1 - b2^(t-1), first step (1/0). The first step is its own loop.
template <bool First, bool Clip, bool Decay>
void adopt_block(const consts& q, const block& b) {
  for (int64_t j = 0; j < b.k; ++j) {
    const float g = q.clipped<Clip>(b.g[j]);
    const float v = b.s1[j];
    float a = 0.0f;
    if constexpr (!First) a = g / (std::sqrt(v / q.k[6]) + q.k[4]);
    const float m = q.k[1] * a + q.k[0] * b.s0[j];
    b.s0[j] = m;
    b.s1[j] = q.k[3] * (g * g) + q.k[2] * v;
    b.out[j] = q.apply<Decay>(b.p[j], m / q.k[5]);
  }
}
template <bool Clip, bool Decay>
double adopt_loop_v(const rule_step& st, const rule_chunk& c) {
  const consts q(st);
  const bool first = st.k[7] != 0;
  return blocks(c, [&](const block& b) {
    if (first)
      adopt_block<true, Clip, Decay>(q, b);
    else
      adopt_block<false, Clip, Decay>(q, b);
  });
}

// ---- RMSProp with momentum: s <- b2 s + (1 - b2) g^2; q = g / (sqrt(s / (1 - b2^t)) + eps);
// mom <- b1 mom + (1 - b1) q; u = mom / (1 - b1^t).   k: b1, 1 - b1, b2, 1 - b2, eps, 1 - b1^t, 1 - b2^t
template <bool Clip, bool Decay>
double rmsprop_loop_v(const rule_step& st, const rule_chunk& c) {
  const consts q(st);
  return blocks(c, [&](const block& b) {
    for (int64_t j = 0; j < b.k; ++j) {
      const float g = q.clipped<Clip>(b.g[j]);
      const float ms = q.k[2] * b.s0[j] + q.k[3] * (g * g);
      b.s0[j] = ms;
      const float r = g / (std::sqrt(ms / q.k[6]) + q.k[4]);
      const float mom = q.k[0] * b.s1[j] + q.k[1] * r;
      b.s1[j] = mom;
      b.out[j] = q.apply<Decay>(b.p[j], mom / q.k[5]);
    }
  });
}

// ---- Cautious: Adam's update kept where it agrees in sign with the gradient, over the leaf's agreeing fraction.
// The leaf pass updates the moments and counts the agreeing elements; the main pass recomputes the update.
template <bool Clip, bool Decay>
double cautious_count_v(const rule_step& st, const rule_chunk& c) {
  const consts q(st);
  int64_t agree = 0;
  blocks(c, [&](const block& b) {
    int64_t n = 0;
    for (int64_t j = 0; j < b.k; ++j) {
      const float g = q.clipped<Clip>(b.g[j]);
      const float u = q.adam_moments(g, b.s0[j], b.s1[j]);
      n += (g * u > 0) ? 1 : 0;
      b.out[j] = 0.0f;
    }
    agree += n;
  });
  return static_cast<double>(agree);
}
template <bool Clip, bool Decay>
double cautious_loop_v(const rule_step& st, const rule_chunk& c) {
  const consts q(st);
  const float den = c.leaf_mean + st.k[4];
  return blocks(c, [&](const block& b) {
    for (int64_t j = 0; j < b.k; ++j) {
      const float g = q.clipped<Clip>(b.g[j]);
      const float u = q.adam_direction(b.s0[j], b.s1[j]);
      const float dropped = u * 0.0f;  // u * mask with mask 0 (a NaN stays NaN, a sign stays), u * 1 is u
      b.out[j] = q.apply<Decay>(b.p[j], (g * u > 0 ? u : dropped) / den);
    }
  });
}

// ---- MARS: c = g + gamma b1 / (1 - b1) (g - previous g), scaled by min(1, max / (|c| + 1e-6)) over every
// parameter, then Adam on c; the raw gradient is kept for the next step. k[7]: gamma b1 / (1 - b1), k[8]: scale
double mars_norm(const rule_step& st, const rule_chunk& c) {
  const consts q(st);
  return blocks(c, [&](const block& b) {
    for (int64_t j = 0; j < b.k; ++j) b.out[j] = b.g[j] + q.k[7] * (b.g[j] - b.s2[j]);
  });
}
template <bool Clip, bool Decay>
double mars_loop_v(const rule_step& st, const rule_chunk& c) {
  const consts q(st);
  return blocks(c, [&](const block& b) {
    for (int64_t j = 0; j < b.k; ++j) {
      const float g = b.g[j];
      const float x = (g + q.k[7] * (g - b.s2[j])) * q.k[8];
      const float u = q.adam_moments(x, b.s0[j], b.s1[j]);
      b.s2[j] = g;
      b.out[j] = q.apply<Decay>(b.p[j], u);
    }
  });
}

// ---- Adam (the Adam groups of Muon and Adam-mini): optax's scale_by_adam. k: as adam_constants
template <bool Clip, bool Decay>
double adam_loop_v(const rule_step& st, const rule_chunk& c) {
  const consts q(st);
  return blocks(c, [&](const block& b) {
    for (int64_t j = 0; j < b.k; ++j) {
      const float g = q.clipped<Clip>(b.g[j]);
      b.out[j] = q.apply<Decay>(b.p[j], q.adam_moments(g, b.s0[j], b.s1[j]));
    }
  });
}

// ---- Muon's momentum (no dampening) into the scratch that Newton-Schulz orthogonalises: buf <- m buf + g,
// x = m buf + g with Nesterov, else buf.   k[0]: momentum
template <bool Nesterov>
double muon_prep(const rule_step& st, const rule_chunk& c) {
  const consts q(st);
  blocks(c, [&](const block& b) {
    for (int64_t j = 0; j < b.k; ++j) {
      const float buf = q.k[0] * b.s0[j] + b.g[j];
      b.s0[j] = buf;
      b.x[j] = Nesterov ? q.k[0] * buf + b.g[j] : buf;
      b.out[j] = 0.0f;
    }
  });
  return 0;
}

// ---- Scion's momentum: buf <- m buf + (1 - m) g, x = buf.   k[0]: momentum, k[1]: 1 - momentum
double scion_prep(const rule_step& st, const rule_chunk& c) {
  const consts q(st);
  blocks(c, [&](const block& b) {
    for (int64_t j = 0; j < b.k; ++j) {
      const float buf = q.k[0] * b.s0[j] + q.k[1] * b.g[j];
      b.s0[j] = buf;
      b.x[j] = buf;
      b.out[j] = 0.0f;
    }
  });
  return 0;
}

// ---- The orthogonalised scratch as the update (Muon's and Scion's matrices; never clipped).
template <bool Clip, bool Decay>
double matrix_loop_v(const rule_step& st, const rule_chunk& c) {
  const consts q(st);
  return blocks(c, [&](const block& b) {
    for (int64_t j = 0; j < b.k; ++j) b.out[j] = q.apply<Decay>(b.p[j], b.x[j]);
  });
}

// ---- Signum (Scion's other leaves): buf <- b1 buf + (1 - b1) g, u = sign(buf).   k[0]: b1, k[1]: 1 - b1
template <bool Clip, bool Decay>
double signum_loop_v(const rule_step& st, const rule_chunk& c) {
  const consts q(st);
  return blocks(c, [&](const block& b) {
    for (int64_t j = 0; j < b.k; ++j) {
      const float g = q.clipped<Clip>(b.g[j]);
      const float buf = q.k[0] * b.s0[j] + q.k[1] * g;
      b.s0[j] = buf;
      b.out[j] = q.apply<Decay>(b.p[j], sign(buf));
    }
  });
}

// ---- Adam-mini: the momentum as Adam's, g^2 into the scratch to be averaged over the group's axes, then the
// second moment from the average.   k: as adam_constants
double mini_prep(const rule_step& st, const rule_chunk& c) {
  const consts q(st);
  blocks(c, [&](const block& b) {
    for (int64_t j = 0; j < b.k; ++j) {
      b.s0[j] = q.k[1] * b.g[j] + q.k[0] * b.s0[j];
      b.x[j] = b.g[j] * b.g[j];
      b.out[j] = 0.0f;
    }
  });
  return 0;
}
template <bool Clip, bool Decay>
double mini_loop_v(const rule_step& st, const rule_chunk& c) {
  const consts q(st);
  return blocks(c, [&](const block& b) {
    for (int64_t j = 0; j < b.k; ++j) {
      const float v = q.k[3] * b.x[j] + q.k[2] * b.s1[j];
      b.s1[j] = v;
      b.out[j] = q.apply<Decay>(b.p[j], q.adam_direction(b.s0[j], v));
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

// ---- Sophia-H: mu <- (1 - b1) g + b1 mu; u = clip((mu / (1 - b1^t)) / max(gamma h, eps), +-c), with the Hessian
// average h as the last re-estimate left it; on a re-estimating step h <- (1 - b2) d + b2 h afterwards, d = v ⊙ H v
// (rule_chunk::aux). k: b1, 1 - b1, 1 - b1^t, gamma, eps, c (inf: no clipping), b2, 1 - b2, re-estimate (1/0)
template <bool Hess, bool Decay>
void sophia_block(const consts& q, const block& b) {
  for (int64_t j = 0; j < b.k; ++j) {
    const float g = b.g[j];
    const float m = q.k[1] * g + q.k[0] * b.s0[j];
    b.s0[j] = m;
    const float h = b.s1[j];
    const float u = std::min(std::max((m / q.k[2]) / std::max(q.k[3] * h, q.k[4]), -q.k[5]), q.k[5]);
    if constexpr (Hess) b.s1[j] = q.k[7] * b.a[j] + q.k[6] * h;
    b.out[j] = q.apply<Decay>(b.p[j], u);
  }
}
template <bool Clip, bool Decay>
double sophia_loop_v(const rule_step& st, const rule_chunk& c) {
  const consts q(st);
  const bool hess = st.k[8] != 0;
  return blocks(c, [&](const block& b) {
    if (hess)
      sophia_block<true, Decay>(q, b);
    else
      sophia_block<false, Decay>(q, b);
  });
}

// The four compiled variants of a loop, picked by the step's clipping and the leaf's decay, each twice: for the
// baseline and, on x86-64, for AVX2 without FMA (target "avx2" does not imply "fma", and nothing is contracted), so
// the arithmetic is the baseline's, eight lanes wide, and the results the same bits (tests/test_optim.cpp).
// `flatten` inlines the block loop and its body into the AVX2 function, so that they are compiled for it.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LEVANTER_RULE_LOOP_AVX2(name)                                                   \
  template <bool Clip, bool Decay>                                                      \
  [[gnu::target("avx2"), gnu::flatten]] double name##_avx2(const rule_step& st, const rule_chunk& c) { \
    return name##_v<Clip, Decay>(st, c);                                                \
  }
#define LEVANTER_RULE_PICK(name, Clip, Decay) \
  (rule_isa_avx2 ? name##_avx2<Clip, Decay>(st, c) : name##_v<Clip, Decay>(st, c))
#else
#define LEVANTER_RULE_LOOP_AVX2(name)
#define LEVANTER_RULE_PICK(name, Clip, Decay) name##_v<Clip, Decay>(st, c)
#endif
#define LEVANTER_RULE_LOOP(name)                                                         \
  LEVANTER_RULE_LOOP_AVX2(name)                                                          \
  double name(const rule_step& st, const rule_chunk& c) {                                \
    if (st.clip)                                                                         \
      return c.decay ? LEVANTER_RULE_PICK(name, true, true) : LEVANTER_RULE_PICK(name, true, false); \
    return c.decay ? LEVANTER_RULE_PICK(name, false, true) : LEVANTER_RULE_PICK(name, false, false); \
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
LEVANTER_RULE_LOOP(sophia_loop)
#undef LEVANTER_RULE_PICK
#undef LEVANTER_RULE_LOOP_AVX2
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

rule_def sophia_h_rule(const SophiaHConfig& c) {
  rule_group g;
  g.loop = sophia_loop;  // upstream's sophia chain has no clip_by_global_norm: max_grad_norm stays unset
  const std::int64_t every = c.update_interval;
  g.constants = [c, every](rule_step& st) {
    st.k[0] = static_cast<float>(c.beta1);
    st.k[1] = static_cast<float>(1.0 - c.beta1);
    st.k[2] = bias(c.beta1, st.t);
    st.k[3] = static_cast<float>(c.gamma);
    st.k[4] = static_cast<float>(c.epsilon);
    st.k[5] = c.clip_threshold ? static_cast<float>(*c.clip_threshold) : std::numeric_limits<float>::infinity();
    st.k[6] = static_cast<float>(c.beta2);
    st.k[7] = static_cast<float>(1.0 - c.beta2);
    st.k[8] = st.t % every == 0 ? 1.0f : 0.0f;
  };
  auto r = single(SophiaHConfig::type_name, {"mu", "h"}, std::move(g));
  // hess_key: PRNGKey(rng_seed); a re-estimating step (t a multiple of update_interval) probes with split(key)[0] and
  // keeps split(key)[1]
  namespace tf = haliax::detail::threefry;
  const auto key0 = tf::prng_key(static_cast<std::uint64_t>(c.rng_seed));
  r.words = {{"hess_key.0", key0.k0}, {"hess_key.1", key0.k1}, {"hessian_count", 0}};
  auto key_of = [](const std::vector<std::pair<std::string, std::int64_t>>& w) {
    return tf::key_data{static_cast<std::uint32_t>(w[0].second), static_cast<std::uint32_t>(w[1].second)};
  };
  r.probe = [every, key_of](std::int64_t t, const std::vector<std::pair<std::string, std::int64_t>>& w)
      -> std::optional<hvp_probe> {
    if (t % every != 0) return std::nullopt;
    const auto k = tf::split(key_of(w), 2)[0];
    return hvp_probe{k.k0, k.k1};
  };
  r.begin = [every, key_of](std::int64_t t, std::vector<std::pair<std::string, std::int64_t>>& w, std::uint64_t*) {
    if (t % every != 0) return;
    const auto next = tf::split(key_of(w), 2)[1];
    w[0].second = next.k0;
    w[1].second = next.k1;
    ++w[2].second;
  };
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
