// haliax/nn/functions.hpp: neural-network functions on named arrays (upstream `haliax.nn`): softmax,
// log_softmax, logsumexp, standardize, one_hot, and the activations.
//
//   auto p = haliax::nn::softmax(logits, Vocab);      // {batch, pos, vocab} -> same axes, rows sum to 1
//   auto h = haliax::nn::gelu(x);                     // tanh approximation, as upstream's default
//
// Axis-wise ops (softmax, log_softmax, logsumexp, standardize) are fused kernels, numerically stable and
// without temporaries: one pass for the row statistic (max or mean), one for the second (sum of exp or
// variance), one that writes. When the axis is the innermost one each row is contiguous and the loops run in
// fixed-width lane groups that vectorise at -O2; otherwise a block of neighbouring inner positions walks the
// axis together, so every step reads whole cache lines. exp is a branch-free polynomial (about 2 ulp).
//
// On x86-64 hosts (gcc, clang) the row kernels are also compiled for AVX2 and AVX-512 and picked from the
// CPU at run time; float outputs larger than the caches are written with streaming stores by a pipeline
// that reads row r+1, computes row r and writes row r-1 in one loop. GPU builds use the portable kernels.
// Measured on the 2-core Xeon (Sapphire Rapids) dev VM, softmax over 4096 x 50257 float logits moves its
// bytes at about 55-65% of the bandwidth of a plain copy of the same array.
//
// Every float-valued function here records its gradient rule while a gradient is taken (haliax/autodiff.hpp).
// The softmax family's backwards are fused row kernels built like the forwards (lane groups, ISA dispatch,
// streaming stores for large float outputs); the activations' are one elementwise kernel g * f'(x), with
// JAX's sub-gradients at the kinks (relu'(0) = 0, ...). one_hot has no gradient (its input is integer).
#pragma once

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core.hpp"
#include "../detail/math.hpp"
#include "../detail/profile.hpp"
#include "../detail/row_team.hpp"
#include "../detail/thread_pool.hpp"
#include "../ops/elementwise.hpp"

namespace haliax::nn {

namespace detail {

namespace mp = haliax::detail::mp;

template <class Axes, class A>
inline constexpr bool has_axis_v = haliax::detail::contains_v<haliax::detail::to_list<Axes>, std::remove_cvref_t<A>>;

/// Axes with A removed.
template <class Axes, class A>
using without_t = haliax::detail::to_axes<mp::mp_remove<haliax::detail::to_list<Axes>, std::remove_cvref_t<A>>>;

/// Axes with A appended last.
template <class Axes, class A>
using with_last_t = haliax::detail::to_axes<mp::mp_push_back<haliax::detail::to_list<Axes>, std::remove_cvref_t<A>>>;

// ---------------------------------------------------------------------------------------------------------
// Scalar helpers usable in kernels. Everything a row kernel calls is force-inlined, so that each host ISA
// variant below (generic, AVX2, AVX-512) gets its own vectorised copy.

#define HALIAX_NN_INLINE KOKKOS_FORCEINLINE_FUNCTION

// Marks a fixed-width lane loop. gcc -O3 would otherwise unroll it completely before vectorising and then
// fail to re-vectorise the long exp body (measured 2-5x slower than -O2); kept as a loop, it becomes exactly
// the intended vector instructions at -O2 and -O3 alike.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define HALIAX_NN_LANES _Pragma("GCC unroll 1")
#else
#define HALIAX_NN_LANES
#endif

/// exp for float without libm: exp(x) = 2^n * e^r with n = round(x / ln 2), |r| <= ln2 / 2, and e^r from the
/// Cephes expf polynomial (max error about 1.4 ulp). It has no branches and no float selects: gcc without
/// -fno-trapping-math refuses to if-convert a select whose arms hold float arithmetic (and sinks the
/// arithmetic into a branch otherwise), so the clamps are done on integer bits and the special cases fall
/// out of the scaling. exp(x) for x < about -87.7 is flushed to 0 (so masked -inf / -1e9 entries cost no
/// denormal arithmetic); above ln(FLT_MAX) it gives +inf; NaN stays NaN.
HALIAX_NN_INLINE float exp_f32(float x) {
  std::uint32_t xb;
  std::memcpy(&xb, &x, sizeof xb);
  // |x| in (200, inf] becomes +-200 (sign kept): the rounding trick below needs |x / ln 2| < 2^22.
  constexpr std::uint32_t lim = 0x43480000u;  // 200.0f
  const std::uint32_t ab = xb & 0x7FFFFFFFu;
  const bool big = ab - (lim + 1u) < 0x7F800000u - lim;
  const std::uint32_t cb = big ? ((xb & 0x80000000u) | lim) : xb;
  float xc;
  std::memcpy(&xc, &cb, sizeof xc);
  constexpr float round_magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low bits
  const float tn = xc * 1.44269504088896341f + round_magic;
  const float n = tn - round_magic;
  float r = xc - n * 0.693359375f;  // ln 2 split in two so that n * ln2_hi is exact
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  std::uint32_t tb;
  std::memcpy(&tb, &tn, sizeof tb);
  std::int32_t ni = static_cast<std::int32_t>(tb - 0x4B400000u);
  // 2^n as s1 * s2: s1 = 2^min(n, 127) is exactly 0 for n <= -127 (underflow), s2 carries n above 127 so
  // the product overflows to inf.
  ni = ni < -127 ? -127 : ni;
  ni = ni > 254 ? 254 : ni;
  const std::int32_t n1 = ni < 127 ? ni : 127;
  const std::uint32_t b1 = static_cast<std::uint32_t>(n1 + 127) << 23;
  const std::uint32_t b2 = static_cast<std::uint32_t>(ni - n1 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, sizeof s1);
  std::memcpy(&s2, &b2, sizeof s2);
  return p * s1 * s2;
}

/// exp for x in [-inf, 0] (no NaN): the softmax family's inner loop, where x is an element minus its row's
/// finite max. Cheaper than exp_f32: one unsigned min clamps x below -200 (and -inf), and 2^n is built with
/// one max. The polynomial returns 2 e^r and the scale is 2^(n-1), so results below about 2^-125
/// (x < -86.99) are flushed to exactly 0 and no denormal is ever produced.
HALIAX_NN_INLINE float exp_nonpos_f32(float x) {
  std::uint32_t xb;
  std::memcpy(&xb, &x, sizeof xb);
  constexpr std::uint32_t minus_200 = 0xC3480000u;  // as unsigned, larger means more negative
  xb = xb < minus_200 ? xb : minus_200;
  float xc;
  std::memcpy(&xc, &xb, sizeof xc);
  constexpr float round_magic = 12582912.0f;
  const float tn = xc * 1.44269504088896341f + round_magic;
  const float n = tn - round_magic;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 3.9751383000e-4f;  // the Cephes coefficients times 2
  p = p * r + 2.7963999014e-3f;
  p = p * r + 1.6666903815e-2f;
  p = p * r + 8.3331591788e-2f;
  p = p * r + 3.3333330918e-1f;
  p = p * r + 1.0000000240e+0f;
  const float q = r * 2.0f + 2.0f;
  p = p * (r * r) + q;
  std::uint32_t tb;
  std::memcpy(&tb, &tn, sizeof tb);
  std::int32_t e = static_cast<std::int32_t>(tb - 0x4B3FFF82u);  // n + 126: the biased exponent of 2^(n-1)
  e = e > 0 ? e : 0;
  const std::uint32_t sb = static_cast<std::uint32_t>(e) << 23;
  float scale;
  std::memcpy(&scale, &sb, sizeof scale);
  return p * scale;
}

/// exp in the compute type: the vectorisable one for float, the library one for double.
template <class V>
HALIAX_NN_INLINE V fast_exp(V x) {
  if constexpr (std::is_same_v<V, float>) {
    return exp_f32(x);
  } else {
    return haliax::detail::math::exp(x);
  }
}

/// tanh in the compute type: for float (1 - e) / (1 + e) with e = exp(-2|u|) from the vectorisable exp,
/// sign restored (absolute error about 1e-7, which is what GELU needs; it vectorises where libm's tanhf does
/// not); the library tanh for double.
template <class V>
HALIAX_NN_INLINE V fast_tanh(V u) {
  if constexpr (std::is_same_v<V, float>) {
    const float a = u < 0.0f ? -u : u;
    const float e = exp_nonpos_f32(-2.0f * a);
    const float t = (1.0f - e) / (1.0f + e);
    return u < 0.0f ? -t : t;
  } else {
    return haliax::detail::math::tanh(u);
  }
}

/// exp_nonpos_f32 for float, the library exp for double.
template <class V>
HALIAX_NN_INLINE V fast_exp_nonpos(V x) {
  if constexpr (std::is_same_v<V, float>) {
    return exp_nonpos_f32(x);
  } else {
    return haliax::detail::math::exp(x);
  }
}

template <class V>
HALIAX_NN_INLINE V neg_inf() {
  return -std::numeric_limits<V>::infinity();
}

/// The shift used before exponentiating: the max, or 0 when the max is not finite (as upstream logsumexp),
/// so an all -inf row gives exp(-inf) = 0 rather than NaN from -inf - -inf.
template <class V>
HALIAX_NN_INLINE V safe_shift(V m) {
  return haliax::detail::math::isfinite(m) ? m : V(0);
}

template <class T>
HALIAX_NN_INLINE compute_t<T> ld(const T* p, std::int64_t i) {
  if constexpr (std::is_same_v<T, bf16>) {
    // Through the 16-bit member: gcc -O2 does not vectorise copies of the struct itself.
    const std::uint32_t u = static_cast<std::uint32_t>(p[i].bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  } else {
    return static_cast<compute_t<T>>(p[i]);
  }
}

template <class T, class V>
HALIAX_NN_INLINE void st(T* p, std::int64_t i, V v) {
  if constexpr (std::is_same_v<T, bf16>) {
    // bf16(float)'s rounding (nearest even, NaN kept quiet) with an integer select instead of its branch,
    // so that loops of bf16 stores vectorise.
    const float f = static_cast<float>(v);
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    const std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    const std::uint32_t quiet_nan = (u >> 16) | 0x40u;
    p[i].bits = static_cast<std::uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
  } else {
    p[i] = static_cast<T>(v);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Contiguous rows (the axis is innermost). `VB` is the vector width in bytes the code is tuned for (16 for
// the generic build, 32 for AVX2, 64 for AVX-512). Reductions run in independent lanes (a few vectors' worth)
// so the loops vectorise without reassociation flags; sums are accumulated per chunk and the chunk sums
// added, which keeps float sums of ~10^5 terms accurate to a few ulp.

template <class V, int VB>
inline constexpr int reduce_lanes = 4 * VB / static_cast<int>(sizeof(V));
template <class V, int VB>
inline constexpr int exp_lanes = VB / static_cast<int>(sizeof(V));
inline constexpr std::int64_t sum_chunk = 1024;

/// Asks for the cache lines of L elements at p to be brought towards L2 (host only; a no-op elsewhere).
/// The softmax family prefetches the next row during its compute-bound pass, so that the next row's
/// memory-bound first pass reads from cache.
template <int L, class T>
HALIAX_NN_INLINE void prefetch_group(const T* p) {
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
  for (int c = 0; c < L * static_cast<int>(sizeof(T)); c += 64)
    __builtin_prefetch(reinterpret_cast<const char*>(p) + c, 0, 2);
#endif
}

/// The rows to prefetch while a row is being computed: the next row's input and output (either may be null).
template <class T>
struct prefetch_rows {
  const T* x = nullptr;
  const T* y = nullptr;
  template <int L>
  HALIAX_NN_INLINE void fetch(std::int64_t j) const {
    if (x) prefetch_group<L>(x + j);
    if (y) prefetch_group<L>(y + j);
  }
};

/// The row's max, ignoring NaNs; `has_nan` tells whether there were any (counted alongside, which costs
/// little in this memory-bound pass).
template <int VB, class T>
HALIAX_NN_INLINE compute_t<T> row_max(const T* x, std::int64_t n, bool& has_nan) {
  using V = compute_t<T>;
  constexpr int L = reduce_lanes<V, VB>;
  V m[L];
  std::int32_t nans[L];
  for (int k = 0; k < L; ++k) {
    m[k] = neg_inf<V>();
    nans[k] = 0;
  }
  std::int64_t j = 0;
  for (; j + L <= n; j += L) {
    const T* p = x + j;
    for (int k = 0; k < L; ++k) {
      const V v = ld(p, k);
      m[k] = v > m[k] ? v : m[k];
      nans[k] += v != v;
    }
  }
  for (; j < n; ++j) {
    const V v = ld(x, j);
    m[0] = v > m[0] ? v : m[0];
    nans[0] += v != v;
  }
  V r = m[0];
  std::int32_t c = 0;
  for (int k = 0; k < L; ++k) {
    r = m[k] > r ? m[k] : r;
    c |= nans[k];
  }
  has_nan = c != 0;
  return r;
}

/// sum_j f(x_j) in chunks; f(v) maps a loaded compute value to the summand.
template <int L, class T, class F>
HALIAX_NN_INLINE compute_t<T> row_sum_of(const T* x, std::int64_t n, F f, prefetch_rows<T> next = {}) {
  using V = compute_t<T>;
  V total[L];
  for (int k = 0; k < L; ++k) total[k] = V(0);
  std::int64_t j = 0;
  while (j + L <= n) {
    const std::int64_t end = j + sum_chunk < n ? j + sum_chunk : n;
    V s[L];
    for (int k = 0; k < L; ++k) s[k] = V(0);
    for (; j + L <= end; j += L) {
      next.template fetch<L>(j);
      const T* p = x + j;
      HALIAX_NN_LANES
      for (int k = 0; k < L; ++k) s[k] += f(ld(p, k));
    }
    for (int k = 0; k < L; ++k) total[k] += s[k];
  }
  for (; j < n; ++j) total[0] += f(ld(x, j));
  V r = V(0);
  for (int k = 0; k < L; ++k) r += total[k];
  return r;
}

// Fixed-width groups. The pointers are restrict-qualified parameters of force-inlined functions, which tells
// the vectoriser that a group's stores cannot change its loads; the trip count L is a compile-time constant
// because gcc 12 at -O2 vectorises only loops whose trip count is a known multiple of the vector length.

/// q_k = f(p_k) for k < L.
template <int L, class T, class F>
HALIAX_NN_INLINE void map_group(const T* KOKKOS_RESTRICT p, T* KOKKOS_RESTRICT q, F f) {
  HALIAX_NN_LANES
  for (int k = 0; k < L; ++k) st(q, k, f(ld(p, k)));
}

/// q_k = f(p_k) and s_k += q_k for k < L.
template <int L, class T, class F>
HALIAX_NN_INLINE void map_sum_group(const T* KOKKOS_RESTRICT p, T* KOKKOS_RESTRICT q, compute_t<T>* KOKKOS_RESTRICT s,
                                    F f) {
  HALIAX_NN_LANES
  for (int k = 0; k < L; ++k) {
    const compute_t<T> e = f(ld(p, k));
    st(q, k, e);
    s[k] += e;
  }
}

/// q_k *= c for k < L (in place, one pointer).
template <int L, class T>
HALIAX_NN_INLINE void scale_group(T* q, compute_t<T> c) {
  HALIAX_NN_LANES
  for (int k = 0; k < L; ++k) q[k] *= c;
}

/// y_j = f(x_j) for a row (x and y distinct).
template <int L, class T, class F>
HALIAX_NN_INLINE void row_map(const T* x, T* y, std::int64_t n, F f) {
  std::int64_t j = 0;
  for (; j + L <= n; j += L) map_group<L>(x + j, y + j, f);
  for (; j < n; ++j) st(y, j, f(ld(x, j)));
}

/// y_j *= c for a row.
template <int L, class T>
HALIAX_NN_INLINE void row_scale(T* y, std::int64_t n, compute_t<T> c) {
  std::int64_t j = 0;
  for (; j + L <= n; j += L) scale_group<L>(y + j, c);
  for (; j < n; ++j) y[j] *= c;
}

/// sum_j f(x_j), also writing each f(x_j) to y (same element type as x).
template <int L, class T, class F>
HALIAX_NN_INLINE compute_t<T> row_map_sum(const T* x, T* y, std::int64_t n, F f, prefetch_rows<T> next = {}) {
  using V = compute_t<T>;
  V total[L];
  for (int k = 0; k < L; ++k) total[k] = V(0);
  std::int64_t j = 0;
  while (j + L <= n) {
    const std::int64_t end = j + sum_chunk < n ? j + sum_chunk : n;
    V s[L];
    for (int k = 0; k < L; ++k) s[k] = V(0);
    for (; j + L <= end; j += L) {
      next.template fetch<L>(j);
      map_sum_group<L>(x + j, y + j, s, f);
    }
    for (int k = 0; k < L; ++k) total[k] += s[k];
  }
  for (; j < n; ++j) {
    const V e = f(ld(x, j));
    st(y, j, e);
    total[0] += e;
  }
  V r = V(0);
  for (int k = 0; k < L; ++k) r += total[k];
  return r;
}

enum class axis_op { softmax, log_softmax, logsumexp, standardize };

// Summands for row_sum_of (structs rather than lambdas so that they are force-inlined into every ISA variant).
struct identity_fn {
  template <class V>
  HALIAX_NN_INLINE V operator()(V v) const {
    return v;
  }
};
template <class V>
struct sq_dev_fn {
  V mean;
  HALIAX_NN_INLINE V operator()(V v) const { return (v - mean) * (v - mean); }
};
template <class V, bool NonPos>
struct exp_shift_fn {  // exp(v - m); NonPos: v - m is known to be in [-inf, 0]
  V m;
  HALIAX_NN_INLINE V operator()(V v) const {
    if constexpr (NonPos) {
      return fast_exp_nonpos(v - m);
    } else {
      return fast_exp(v - m);
    }
  }
};
template <class V>
struct affine_fn {  // (v - shift) * scale - offset
  V shift, scale, offset = V(0);
  HALIAX_NN_INLINE V operator()(V v) const { return (v - shift) * scale - offset; }
};

/// The shift subtracted before exponentiating, given the row max: the max itself, except that logsumexp
/// (like upstream's) uses 0 for a non-finite max so an all -inf row gives -inf and a +inf gives +inf.
/// softmax and log_softmax of a row holding +inf are NaN, as upstream's.
template <axis_op Op, class V>
HALIAX_NN_INLINE V shift_for(V mx) {
  if constexpr (Op == axis_op::logsumexp) {
    return safe_shift(mx);
  } else {
    return mx == -neg_inf<V>() ? mx : safe_shift(mx);
  }
}
template <class V, bool NonPos>
struct exp_scale_fn {  // exp(v - m) * scale
  V m, scale;
  HALIAX_NN_INLINE V operator()(V v) const { return exp_shift_fn<V, NonPos>{m}(v)*scale; }
};

/// The second and third passes of softmax, log_softmax and logsumexp over one row, given the shift m.
template <axis_op Op, int VB, bool NonPos, class T>
HALIAX_NN_INLINE void row_exp_op(const T* x, T* y, T* out, std::int64_t n, compute_t<T> m, prefetch_rows<T> next) {
  using V = compute_t<T>;
  constexpr int L = exp_lanes<V, VB>;
  // Where y holds values exactly (float, double) softmax writes the exps in the sum pass and rescales in
  // place, so exp runs once per element; for bf16 they are recomputed to avoid rounding twice.
  constexpr bool store_exp = Op == axis_op::softmax && std::is_same_v<T, V>;
  V s;
  if constexpr (store_exp) {
    s = row_map_sum<L>(x, y, n, exp_shift_fn<V, NonPos>{m}, next);
  } else {
    s = row_sum_of<L>(x, n, exp_shift_fn<V, NonPos>{m}, next);
  }
  if constexpr (Op == axis_op::logsumexp) {
    st(out, 0, m + haliax::detail::math::log(s));
  } else if constexpr (Op == axis_op::log_softmax) {
    // (x - m) - log(s), in that order: x - (m + log s) loses everything when |m| >> log(s).
    row_map<L>(x, y, n, affine_fn<V>{m, V(1), haliax::detail::math::log(s)});
  } else if constexpr (store_exp) {
    row_scale<L>(y, n, V(1) / s);
  } else {
    row_map<L>(x, y, n, exp_scale_fn<V, NonPos>{m, V(1) / s});
  }
}

/// One contiguous row of n elements: x -> y (softmax, log_softmax, standardize) or x -> *out (logsumexp).
/// `param` is epsilon for standardize; `next` (may be null) is the row to prefetch while computing.
template <axis_op Op, int VB, class T>
HALIAX_NN_INLINE void row_op(const T* x, T* y, T* out, std::int64_t n, compute_t<T> param, prefetch_rows<T> next) {
  using V = compute_t<T>;
  if constexpr (Op == axis_op::standardize) {
    constexpr int L = reduce_lanes<V, VB>;
    const V mean = row_sum_of<L>(x, n, identity_fn{}) / static_cast<V>(n);
    const V var = row_sum_of<L>(x, n, sq_dev_fn<V>{mean}, next) / static_cast<V>(n);
    const V scale = V(1) / haliax::detail::math::sqrt(var + param);
    row_map<L>(x, y, n, affine_fn<V>{mean, scale});
  } else {
    bool has_nan = false;
    const V mx = row_max<VB>(x, n, has_nan);
    // Common case: every x - max lies in [-inf, 0], so the cheaper exp applies. A NaN or +inf in the row
    // takes the general exp, which propagates NaN as upstream does.
    if (!has_nan && mx != -neg_inf<V>()) {
      row_exp_op<Op, VB, true>(x, y, out, n, safe_shift(mx), next);
    } else {
      row_exp_op<Op, VB, false>(x, y, out, n, shift_for<Op>(mx), next);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Strided rows (the axis is not innermost): element (o, j, i) is at (o * n + j) * inner + i. A work item
// takes `b` <= B neighbouring inner positions and walks j for all of them at once, so each step reads whole
// cache lines and the block's column stays in cache between the passes.

/// Inner positions per work item: a few cache lines on the host; one per thread on a device, where
/// neighbouring threads already read neighbouring addresses.
inline constexpr int block_width = std::is_same_v<haliax::memory_space, Kokkos::HostSpace> ? 32 : 1;

/// q_t = exp(p_t - a_t), s_t += q_t for t < b (restrict parameters: see the fixed-width groups above).
template <class T>
HALIAX_NN_INLINE void block_exp_store(const T* KOKKOS_RESTRICT p, T* KOKKOS_RESTRICT q,
                                      const compute_t<T>* KOKKOS_RESTRICT a, compute_t<T>* KOKKOS_RESTRICT s, int b) {
  for (int t = 0; t < b; ++t) {
    const compute_t<T> e = fast_exp(ld(p, t) - a[t]);
    st(q, t, e);
    s[t] += e;
  }
}

/// The strided kernel body for one block: `x` and `y` point at position (o, 0, i0); `out` is the reduced
/// output at (o, i0) for logsumexp. `param` is epsilon for standardize.
template <axis_op Op, class T>
HALIAX_NN_INLINE void block_op(const T* x, T* y, T* out, std::int64_t n, std::int64_t inner, int b,
                               compute_t<T> param) {
  using V = compute_t<T>;
  constexpr int B = block_width;
  V a[B], s[B];
  if constexpr (Op == axis_op::standardize) {
    for (int t = 0; t < b; ++t) a[t] = V(0);
    for (std::int64_t j = 0; j < n; ++j) {
      const T* p = x + j * inner;
      for (int t = 0; t < b; ++t) a[t] += ld(p, t);
    }
    for (int t = 0; t < b; ++t) {
      a[t] = a[t] / static_cast<V>(n);
      s[t] = V(0);
    }
    for (std::int64_t j = 0; j < n; ++j) {
      const T* p = x + j * inner;
      for (int t = 0; t < b; ++t) {
        const V d = ld(p, t) - a[t];
        s[t] += d * d;
      }
    }
    for (int t = 0; t < b; ++t) s[t] = V(1) / haliax::detail::math::sqrt(s[t] / static_cast<V>(n) + param);
    for (std::int64_t j = 0; j < n; ++j) {
      const T* p = x + j * inner;
      T* q = y + j * inner;
      for (int t = 0; t < b; ++t) st(q, t, (ld(p, t) - a[t]) * s[t]);
    }
  } else {
    for (int t = 0; t < b; ++t) {
      a[t] = neg_inf<V>();
      s[t] = V(0);
    }
    for (std::int64_t j = 0; j < n; ++j) {
      const T* p = x + j * inner;
      for (int t = 0; t < b; ++t) {
        const V v = ld(p, t);
        a[t] = v > a[t] ? v : a[t];
      }
    }
    for (int t = 0; t < b; ++t) a[t] = shift_for<Op>(a[t]);
    constexpr bool store_exp = Op == axis_op::softmax && std::is_same_v<T, V>;
    for (std::int64_t j = 0; j < n; ++j) {
      const T* p = x + j * inner;
      if constexpr (store_exp) {
        block_exp_store(p, y + j * inner, a, s, b);
      } else {
        for (int t = 0; t < b; ++t) s[t] += fast_exp(ld(p, t) - a[t]);
      }
    }
    if constexpr (Op == axis_op::logsumexp) {
      for (int t = 0; t < b; ++t) st(out, t, a[t] + haliax::detail::math::log(s[t]));
    } else if constexpr (Op == axis_op::log_softmax) {
      for (int t = 0; t < b; ++t) s[t] = haliax::detail::math::log(s[t]);
      for (std::int64_t j = 0; j < n; ++j) {
        const T* p = x + j * inner;
        T* q = y + j * inner;
        for (int t = 0; t < b; ++t) st(q, t, (ld(p, t) - a[t]) - s[t]);
      }
    } else {
      for (int t = 0; t < b; ++t) s[t] = V(1) / s[t];
      for (std::int64_t j = 0; j < n; ++j) {
        const T* p = x + j * inner;
        T* q = y + j * inner;
        if constexpr (store_exp) {
          for (int t = 0; t < b; ++t) q[t] *= s[t];
        } else {
          for (int t = 0; t < b; ++t) st(q, t, fast_exp(ld(p, t) - a[t]) * s[t]);
        }
      }
    }
  }
}

/// A full block gets a compile-time trip count so its inner loops vectorise.
template <axis_op Op, class T>
HALIAX_NN_INLINE void block_op_any(const T* x, T* y, T* out, std::int64_t n, std::int64_t inner, int b,
                                   compute_t<T> param) {
  if (b == block_width) {
    block_op<Op>(x, y, out, n, inner, block_width, param);
  } else {
    block_op<Op>(x, y, out, n, inner, b, param);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Host ISA dispatch. Without -march flags the compiler targets SSE2 only; on x86-64 hosts with gcc or clang
// the same kernels are also compiled for AVX2 and AVX-512 and chosen once per call from the running CPU.
// Device builds (CUDA, HIP, SYCL) never see this.

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) &&       \
    !defined(KOKKOS_ENABLE_CUDA) && !defined(KOKKOS_ENABLE_HIP) && !defined(KOKKOS_ENABLE_SYCL) && \
    !defined(HALIAX_NO_ISA_DISPATCH)
#define HALIAX_NN_ISA_DISPATCH 1
#include <immintrin.h>
#endif

enum class host_isa { generic, avx2, avx512 };

/// Tests force a narrower variant with this (only downwards: a variant the CPU lacks is never chosen).
inline host_isa& host_isa_limit() {
  static host_isa limit = host_isa::avx512;
  return limit;
}

#ifdef HALIAX_NN_ISA_DISPATCH
inline host_isa detect_host_isa() {
  static const host_isa detected = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
      return host_isa::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return host_isa::avx2;
    return host_isa::generic;
  }();
  return static_cast<int>(detected) < static_cast<int>(host_isa_limit()) ? detected : host_isa_limit();
}

// Streaming output (host x86 only). For outputs much larger than the caches, the final values are written
// with non-temporal stores: they skip the read-for-ownership of y, so a softmax moves the bytes of a copy
// (read x, write y) instead of a third more. The rows are software-pipelined in one loop: while row r's
// exps are computed, row r+1 is read for its max and row r-1 is written out, one vector per group, so the
// memory traffic in both directions overlaps the arithmetic. Softmax keeps each row's exps in one of two
// per-thread scratch rows until its sum is known.

/// Outputs at least this large (bytes) are streamed.
inline constexpr std::int64_t stream_min_bytes = std::int64_t(8) << 20;
/// Rows up to this many elements use the scratch rows (larger rows take the cached path).
inline constexpr std::int64_t stream_max_row = std::int64_t(1) << 22;
/// Rows per work item on the streamed path (the pipeline runs within a work item).
inline constexpr std::int64_t stream_rows_per_item = 64;

inline float* host_scratch(std::int64_t n) {
  thread_local std::vector<float> buf;
  if (static_cast<std::int64_t>(buf.size()) < n) buf.resize(static_cast<std::size_t>(n));
  return buf.data();
}

/// A row to write out: y_j = (src_j - shift) * scale - offset for j < n (y null: nothing to write).
struct stream_cursor {
  float* y = nullptr;
  const float* src = nullptr;
  float shift = 0.0f, scale = 1.0f, offset = 0.0f;
};

// HALIAX_NN_FUSED_STREAM defines, for one ISA, the pipeline's inner loop:
//
//   float NAME<Store, AheadMax>(x, e, n, f, ahead, ahead_stat, ahead_nan, prev)
//
// returns sum_j f(x_j) over the row x (storing f(x_j) to e when Store); reduces `ahead` (the next row, or
// any readable row of n elements) to its max and NaN flag (AheadMax) or its sum; and writes `prev` out
// with streaming stores, one aligned vector per group (plain stores for the unaligned head and the tail).
// Each version is compiled for its own target, which the intrinsics need.
#define HALIAX_NN_FUSED_STREAM(NAME, TARGET, W, VEC, SET1, LOADU, SUB, MUL, STREAM)                              \
  template <bool Store, bool AheadMax, class F>                                                                  \
  TARGET inline float NAME(const float* x, float* e, std::int64_t n, F f, const float* ahead, float& ahead_stat, \
                           bool& ahead_nan, const stream_cursor& prev) {                                         \
    constexpr int L = W;                                                                                         \
    float total[L], a[L];                                                                                        \
    std::int32_t nans[L];                                                                                        \
    for (int k = 0; k < L; ++k) {                                                                                \
      total[k] = 0.0f;                                                                                           \
      a[k] = AheadMax ? neg_inf<float>() : 0.0f;                                                                 \
      nans[k] = 0;                                                                                               \
    }                                                                                                            \
    float* const py = prev.y;                                                                                    \
    const float* const ps = prev.src;                                                                            \
    std::int64_t done = 0; /* elements of prev written */                                                        \
    if (py)                                                                                                      \
      for (; done < n && (reinterpret_cast<std::uintptr_t>(py + done) & (4 * W - 1)) != 0; ++done)               \
        py[done] = (ps[done] - prev.shift) * prev.scale - prev.offset;                                           \
    const std::int64_t wlim = py ? n : 0;                                                                        \
    const VEC vs = SET1(prev.shift), vc = SET1(prev.scale), vo = SET1(prev.offset);                              \
    std::int64_t j = 0;                                                                                          \
    while (j + L <= n) {                                                                                         \
      const std::int64_t end = j + sum_chunk < n ? j + sum_chunk : n;                                            \
      float s[L];                                                                                                \
      for (int k = 0; k < L; ++k) s[k] = 0.0f;                                                                   \
      for (; j + L <= end; j += L) {                                                                             \
        if constexpr (Store) {                                                                                   \
          map_sum_group<L>(x + j, e + j, s, f);                                                                  \
        } else {                                                                                                 \
          const float* p = x + j;                                                                                \
          HALIAX_NN_LANES for (int k = 0; k < L; ++k) s[k] += f(p[k]);                                           \
        }                                                                                                        \
        const float* q = ahead + j;                                                                              \
        HALIAX_NN_LANES for (int k = 0; k < L; ++k) {                                                            \
          const float v = q[k];                                                                                  \
          if constexpr (AheadMax) {                                                                              \
            a[k] = v > a[k] ? v : a[k];                                                                          \
            nans[k] += v != v;                                                                                   \
          } else {                                                                                               \
            a[k] += v;                                                                                           \
          }                                                                                                      \
        }                                                                                                        \
        if (done + W <= wlim) {                                                                                  \
          STREAM(py + done, SUB(MUL(SUB(LOADU(ps + done), vs), vc), vo));                                        \
          done += W;                                                                                             \
        }                                                                                                        \
      }                                                                                                          \
      for (int k = 0; k < L; ++k) total[k] += s[k];                                                              \
    }                                                                                                            \
    for (; j < n; ++j) {                                                                                         \
      const float v = f(x[j]);                                                                                   \
      if constexpr (Store) e[j] = v;                                                                             \
      total[0] += v;                                                                                             \
      const float w = ahead[j];                                                                                  \
      if constexpr (AheadMax) {                                                                                  \
        a[0] = w > a[0] ? w : a[0];                                                                              \
        nans[0] += w != w;                                                                                       \
      } else {                                                                                                   \
        a[0] += w;                                                                                               \
      }                                                                                                          \
    }                                                                                                            \
    if (py) {                                                                                                    \
      for (; done + W <= n; done += W) STREAM(py + done, SUB(MUL(SUB(LOADU(ps + done), vs), vc), vo));           \
      for (; done < n; ++done) py[done] = (ps[done] - prev.shift) * prev.scale - prev.offset;                    \
      _mm_sfence();                                                                                              \
    }                                                                                                            \
    float r = 0.0f, st = a[0];                                                                                   \
    std::int32_t c = 0;                                                                                          \
    for (int k = 0; k < L; ++k) {                                                                                \
      r += total[k];                                                                                             \
      c |= nans[k];                                                                                              \
      if constexpr (AheadMax) {                                                                                  \
        st = a[k] > st ? a[k] : st;                                                                              \
      } else if (k > 0) {                                                                                        \
        st += a[k];                                                                                              \
      }                                                                                                          \
    }                                                                                                            \
    ahead_stat = st;                                                                                             \
    ahead_nan = c != 0;                                                                                          \
    return r;                                                                                                    \
  }
HALIAX_NN_FUSED_STREAM(fused_stream_avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"))), 16,
                       __m512, _mm512_set1_ps, _mm512_loadu_ps, _mm512_sub_ps, _mm512_mul_ps, _mm512_stream_ps)
HALIAX_NN_FUSED_STREAM(fused_stream_avx2, __attribute__((target("avx2,fma"))), 8, __m256, _mm256_set1_ps,
                       _mm256_loadu_ps, _mm256_sub_ps, _mm256_mul_ps, _mm256_stream_ps)
HALIAX_NN_FUSED_STREAM(fused_stream_sse, , 4, __m128, _mm_set1_ps, _mm_loadu_ps, _mm_sub_ps, _mm_mul_ps, _mm_stream_ps)
#undef HALIAX_NN_FUSED_STREAM

/// The fused pass for ISA width VB (see HALIAX_NN_FUSED_STREAM).
template <int VB, bool Store, bool AheadMax, class F>
HALIAX_NN_INLINE float fused_stream(const float* x, float* e, std::int64_t n, F f, const float* ahead,
                                    float& ahead_stat, bool& ahead_nan, const stream_cursor& prev) {
  if constexpr (VB == 64) {
    return fused_stream_avx512<Store, AheadMax>(x, e, n, f, ahead, ahead_stat, ahead_nan, prev);
  } else if constexpr (VB == 32) {
    return fused_stream_avx2<Store, AheadMax>(x, e, n, f, ahead, ahead_stat, ahead_nan, prev);
  } else {
    return fused_stream_sse<Store, AheadMax>(x, e, n, f, ahead, ahead_stat, ahead_nan, prev);
  }
}

// Writes a whole row out with streaming stores (the pipeline's last row, or the row before one that leaves
// the pipeline). One version per ISA.
#define HALIAX_NN_STREAM_ROW(NAME, TARGET, W, VEC, SET1, LOADU, SUB, MUL, STREAM)            \
  TARGET inline void NAME(const stream_cursor& c, std::int64_t n) {                          \
    if (!c.y) return;                                                                        \
    std::int64_t j = 0;                                                                      \
    for (; j < n && (reinterpret_cast<std::uintptr_t>(c.y + j) & (4 * W - 1)) != 0; ++j)     \
      c.y[j] = (c.src[j] - c.shift) * c.scale - c.offset;                                    \
    const VEC vs = SET1(c.shift), vc = SET1(c.scale), vo = SET1(c.offset);                   \
    for (; j + W <= n; j += W) STREAM(c.y + j, SUB(MUL(SUB(LOADU(c.src + j), vs), vc), vo)); \
    for (; j < n; ++j) c.y[j] = (c.src[j] - c.shift) * c.scale - c.offset;                   \
    _mm_sfence();                                                                            \
  }
HALIAX_NN_STREAM_ROW(stream_row_avx512, __attribute__((target("avx512f"))), 16, __m512, _mm512_set1_ps, _mm512_loadu_ps,
                     _mm512_sub_ps, _mm512_mul_ps, _mm512_stream_ps)
HALIAX_NN_STREAM_ROW(stream_row_avx2, __attribute__((target("avx"))), 8, __m256, _mm256_set1_ps, _mm256_loadu_ps,
                     _mm256_sub_ps, _mm256_mul_ps, _mm256_stream_ps)
HALIAX_NN_STREAM_ROW(stream_row_sse, , 4, __m128, _mm_set1_ps, _mm_loadu_ps, _mm_sub_ps, _mm_mul_ps, _mm_stream_ps)
#undef HALIAX_NN_STREAM_ROW

template <int VB>
HALIAX_NN_INLINE void stream_row(const stream_cursor& c, std::int64_t n) {
  if constexpr (VB == 64) {
    stream_row_avx512(c, n);
  } else if constexpr (VB == 32) {
    stream_row_avx2(c, n);
  } else {
    stream_row_sse(c, n);
  }
}

/// Rows [r0, r1) of a float softmax, log_softmax or standardize with streamed output, as a pipeline: while
/// row r's exps (or variance) are computed, row r+1 is read for its max (or mean) and row r-1 is written out.
template <axis_op Op, int VB>
HALIAX_NN_INLINE void stream_rows(const float* x, float* y, std::int64_t n, std::int64_t r0, std::int64_t r1,
                                  float param) {
  constexpr bool standardize = Op == axis_op::standardize;
  float* scratch = Op == axis_op::softmax ? host_scratch(2 * n) : nullptr;
  int cur = 0;
  stream_cursor prev;
  // The first statistic of row r0: its max (and NaN flag) or its mean.
  bool nan_r = false;
  float stat_r = standardize ? row_sum_of<reduce_lanes<float, VB>>(x + r0 * n, n, identity_fn{}) / static_cast<float>(n)
                             : row_max<VB>(x + r0 * n, n, nan_r);
  for (std::int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    const float* ahead = r + 1 < r1 ? xr + n : xr;
    float stat_next = 0.0f;
    bool nan_next = false;
    stream_cursor row;
    if constexpr (standardize) {
      const float mean = stat_r;
      const float var = fused_stream<VB, false, false>(xr, static_cast<float*>(nullptr), n, sq_dev_fn<float>{mean},
                                                       ahead, stat_next, nan_next, prev) /
                        static_cast<float>(n);
      stat_next /= static_cast<float>(n);
      row = {yr, xr, mean, 1.0f / haliax::detail::math::sqrt(var + param), 0.0f};
    } else {
      if (nan_r || stat_r == -neg_inf<float>()) {  // rare: the general exp, cached stores
        stream_row<VB>(prev, n);
        prev = {};
        row_exp_op<Op, VB, false>(xr, yr, static_cast<float*>(nullptr), n, shift_for<Op>(stat_r),
                                  prefetch_rows<float>{});
        stat_r = row_max<VB>(ahead, n, nan_r);
        continue;
      }
      const float m = safe_shift(stat_r);
      if constexpr (Op == axis_op::softmax) {
        float* e = scratch + cur * n;
        cur ^= 1;
        const float s =
            fused_stream<VB, true, true>(xr, e, n, exp_shift_fn<float, true>{m}, ahead, stat_next, nan_next, prev);
        row = {yr, e, 0.0f, 1.0f / s, 0.0f};
      } else {
        const float s = fused_stream<VB, false, true>(xr, static_cast<float*>(nullptr), n, exp_shift_fn<float, true>{m},
                                                      ahead, stat_next, nan_next, prev);
        row = {yr, xr, m, 1.0f, haliax::detail::math::log(s)};
      }
    }
    prev = row;
    stat_r = stat_next;
    nan_r = nan_next;
  }
  stream_row<VB>(prev, n);
}

template <axis_op Op, class T>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,bmi,bmi2,f16c"))) void row_op_avx512(
    const T* x, T* y, T* out, std::int64_t n, compute_t<T> param, prefetch_rows<T> next) {
  row_op<Op, 64>(x, y, out, n, param, next);
}
template <axis_op Op, class T>
__attribute__((target("avx2,fma,bmi,bmi2,f16c"))) void row_op_avx2(const T* x, T* y, T* out, std::int64_t n,
                                                                   compute_t<T> param, prefetch_rows<T> next) {
  row_op<Op, 32>(x, y, out, n, param, next);
}
template <axis_op Op>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,bmi,bmi2,f16c"))) void stream_rows_avx512(
    const float* x, float* y, std::int64_t n, std::int64_t r0, std::int64_t r1, float param) {
  stream_rows<Op, 64>(x, y, n, r0, r1, param);
}
template <axis_op Op>
__attribute__((target("avx2,fma,bmi,bmi2,f16c"))) void stream_rows_avx2(const float* x, float* y, std::int64_t n,
                                                                        std::int64_t r0, std::int64_t r1, float param) {
  stream_rows<Op, 32>(x, y, n, r0, r1, param);
}
template <axis_op Op>
void stream_rows_sse(const float* x, float* y, std::int64_t n, std::int64_t r0, std::int64_t r1, float param) {
  stream_rows<Op, 16>(x, y, n, r0, r1, param);
}
template <axis_op Op, class T>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,bmi,bmi2,f16c"))) void block_op_avx512(
    const T* x, T* y, T* out, std::int64_t n, std::int64_t inner, int b, compute_t<T> param) {
  block_op_any<Op>(x, y, out, n, inner, b, param);
}
template <axis_op Op, class T>
__attribute__((target("avx2,fma,bmi,bmi2,f16c"))) void block_op_avx2(const T* x, T* y, T* out, std::int64_t n,
                                                                     std::int64_t inner, int b, compute_t<T> param) {
  block_op_any<Op>(x, y, out, n, inner, b, param);
}
#else
inline host_isa detect_host_isa() { return host_isa::generic; }
#endif

// ---------------------------------------------------------------------------------------------------------
// The driver

struct axis_split {
  std::int64_t outer = 1, n = 1, inner = 1;
};

template <class Axes, class A, std::size_t N>
axis_split split_at(const std::array<std::int64_t, N>& sizes) {
  constexpr std::size_t k = haliax::detail::index_of_v<haliax::detail::to_list<Axes>, std::remove_cvref_t<A>>;
  axis_split s;
  s.n = sizes[k];
  for (std::size_t i = 0; i < k; ++i) s.outer *= sizes[i];
  for (std::size_t i = k + 1; i < N; ++i) s.inner *= sizes[i];
  return s;
}

/// The portable path's contiguous rows (inner == 1): one team member per row, its lanes splitting the row
/// (haliax/detail/row_team.hpp), the passes of `row_op` as lane reductions and lane loops. The exp is the
/// general one (NaN and +inf propagate as in `row_op`'s general case); an all -inf row takes lane_max's lowest
/// finite value as its max, which gives row_op's results (NaN for softmax and log_softmax, -inf for logsumexp).
template <axis_op Op, class T>
void row_team_op(const char* label, const T* x, T* y, T* out, std::int64_t outer, std::int64_t n,
                 compute_t<T> param) {
  using V = compute_t<T>;
  namespace hd = haliax::detail;
  Kokkos::parallel_for(label, hd::row_policy(outer), KOKKOS_LAMBDA(const hd::row_member& t) {
    HALIAX_CAPTURE(x, y, out, param, n);
    const std::int64_t o = hd::row_of(t);
    if (o >= outer) return;
    const T* xr = x + o * n;
    T* yr = Op == axis_op::logsumexp ? nullptr : y + o * n;
    if constexpr (Op == axis_op::standardize) {
      const V mean = hd::lane_sum<V>(t, n, [&](std::int64_t j) { return ld(xr, j); }) / static_cast<V>(n);
      const V var = hd::lane_sum<V>(t, n, [&](std::int64_t j) {
                      const V d = ld(xr, j) - mean;
                      return d * d;
                    }) / static_cast<V>(n);
      const V scale = V(1) / haliax::detail::math::sqrt(var + param);
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(t, n),
                           [&](std::int64_t j) { st(yr, j, (ld(xr, j) - mean) * scale); });
    } else {
      const V m = shift_for<Op>(hd::lane_max<V>(t, n, [&](std::int64_t j) { return ld(xr, j); }));
      // softmax into float or double writes the exps in the sum pass and rescales them, as row_op does
      constexpr bool store_exp = Op == axis_op::softmax && std::is_same_v<T, V>;
      const V s = hd::lane_sum<V>(t, n, [&](std::int64_t j) {
        const V e = fast_exp(ld(xr, j) - m);
        if constexpr (store_exp) yr[j] = e;
        return e;
      });
      if constexpr (Op == axis_op::logsumexp) {
        Kokkos::single(Kokkos::PerThread(t), [&] { st(out, o, m + haliax::detail::math::log(s)); });
      } else if constexpr (Op == axis_op::log_softmax) {
        const V ls = haliax::detail::math::log(s);
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(t, n),
                             [&](std::int64_t j) { st(yr, j, (ld(xr, j) - m) - ls); });
      } else if constexpr (store_exp) {
        const V r = V(1) / s;
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(t, n), [&](std::int64_t j) { yr[j] *= r; });
      } else {
        const V r = V(1) / s;
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(t, n),
                             [&](std::int64_t j) { st(yr, j, fast_exp(ld(xr, j) - m) * r); });
      }
    }
  });
}

/// Runs an axis-wise op over x (split into outer x n x inner). `y` has x's shape (null for logsumexp);
/// `out` has shape outer x inner (logsumexp only).
template <axis_op Op, class T>
void run_axis_op(const char* label, const T* x, T* y, T* out, axis_split sp, compute_t<T> param = {}) {
  const std::int64_t outer = sp.outer, n = sp.n, inner = sp.inner;
  if (outer == 0 || inner == 0) return;
  if (inner == 1 && !haliax::detail::use_host_kernels(haliax::kernels::family::softmax)) {
    row_team_op<Op>(label, x, y, out, outer, n, param);
    return;
  }
  [[maybe_unused]] const host_isa isa = detect_host_isa();
  constexpr bool host = std::is_same_v<haliax::memory_space, Kokkos::HostSpace>;
  if (inner == 1) {
#ifdef HALIAX_NN_ISA_DISPATCH
    if constexpr (std::is_same_v<T, float> && Op != axis_op::logsumexp) {
      if (n >= 1024 && n <= stream_max_row && outer * n * static_cast<std::int64_t>(sizeof(T)) >= stream_min_bytes) {
        const std::int64_t items = (outer + stream_rows_per_item - 1) / stream_rows_per_item;
        Kokkos::parallel_for(
            label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, items), KOKKOS_LAMBDA(std::int64_t w) {
              const std::int64_t r0 = w * stream_rows_per_item;
              const std::int64_t r1 = r0 + stream_rows_per_item < outer ? r0 + stream_rows_per_item : outer;
              if (isa == host_isa::avx512) {
                stream_rows_avx512<Op>(x, y, n, r0, r1, param);
              } else if (isa == host_isa::avx2) {
                stream_rows_avx2<Op>(x, y, n, r0, r1, param);
              } else {
                stream_rows_sse<Op>(x, y, n, r0, r1, param);
              }
            });
        return;
      }
    }
#endif
    Kokkos::parallel_for(
        label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, outer), KOKKOS_LAMBDA(std::int64_t o) {
          const T* xr = x + o * n;
          T* yr = Op == axis_op::logsumexp ? nullptr : y + o * n;
          T* orow = Op == axis_op::logsumexp ? out + o : nullptr;
          prefetch_rows<T> next;
          if (host && o + 1 < outer) next = {xr + n, yr ? yr + n : nullptr};
#ifdef HALIAX_NN_ISA_DISPATCH
          if (isa == host_isa::avx512) {
            row_op_avx512<Op>(xr, yr, orow, n, param, next);
            return;
          }
          if (isa == host_isa::avx2) {
            row_op_avx2<Op>(xr, yr, orow, n, param, next);
            return;
          }
#endif
          row_op<Op, 16>(xr, yr, orow, n, param, next);
        });
    return;
  }
  constexpr int B = block_width;
  const std::int64_t nb = (inner + B - 1) / B;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, outer * nb), KOKKOS_LAMBDA(std::int64_t w) {
        const std::int64_t o = w / nb;
        const std::int64_t i0 = (w - o * nb) * B;
        const int b = inner - i0 < B ? static_cast<int>(inner - i0) : B;
        const std::int64_t base = o * n * inner + i0;
        const T* xb = x + base;
        T* yb = Op == axis_op::logsumexp ? nullptr : y + base;
        T* ob = Op == axis_op::logsumexp ? out + o * inner + i0 : nullptr;
#ifdef HALIAX_NN_ISA_DISPATCH
        if (isa == host_isa::avx512) {
          block_op_avx512<Op>(xb, yb, ob, n, inner, b, param);
          return;
        }
        if (isa == host_isa::avx2) {
          block_op_avx2<Op>(xb, yb, ob, n, inner, b, param);
          return;
        }
#endif
        block_op_any<Op>(xb, yb, ob, n, inner, b, param);
      });
}

// ---------------------------------------------------------------------------------------------------------
// Backward kernels of the axis-wise ops, built like the forward ones: contiguous rows in fixed-width lane
// groups (compiled per ISA and picked at run time on x86 hosts), strided rows in blocks of neighbouring inner
// positions. Each row is read at most three times and written once; nothing is allocated but the result.
//
//   softmax      y = softmax(x):      dx = y * (g - sum(g * y))
//   log_softmax  y = log_softmax(x):  dx = g - exp(y) * sum(g)
//   logsumexp    z = logsumexp(x):    dx = g_z * exp(x - z)        (0 for a row whose z is -inf)
//   standardize  y = (x - mu) * r:    dx = r * (g - mean(g) - y * mean(g * y)), y recomputed from x

enum class grad_op { softmax, log_softmax, logsumexp, standardize };

/// sum_j f(a_j, b_j) over two rows, in chunks like row_sum_of.
template <int L, class T, class F>
HALIAX_NN_INLINE compute_t<T> row_sum2_of(const T* a, const T* b, std::int64_t n, F f) {
  using V = compute_t<T>;
  V total[L];
  for (int k = 0; k < L; ++k) total[k] = V(0);
  std::int64_t j = 0;
  while (j + L <= n) {
    const std::int64_t end = j + sum_chunk < n ? j + sum_chunk : n;
    V s[L];
    for (int k = 0; k < L; ++k) s[k] = V(0);
    for (; j + L <= end; j += L) {
      const T* p = a + j;
      const T* q = b + j;
      HALIAX_NN_LANES
      for (int k = 0; k < L; ++k) s[k] += f(ld(p, k), ld(q, k));
    }
    for (int k = 0; k < L; ++k) total[k] += s[k];
  }
  for (; j < n; ++j) total[0] += f(ld(a, j), ld(b, j));
  V r = V(0);
  for (int k = 0; k < L; ++k) r += total[k];
  return r;
}

/// q_k = f(p_k, r_k) for k < L.
template <int L, class T, class F>
HALIAX_NN_INLINE void map2_group(const T* KOKKOS_RESTRICT p, const T* KOKKOS_RESTRICT r, T* KOKKOS_RESTRICT q, F f) {
  HALIAX_NN_LANES
  for (int k = 0; k < L; ++k) st(q, k, f(ld(p, k), ld(r, k)));
}

/// y_j = f(a_j, b_j) for a row (y distinct from a and b), prefetching `next` along the way.
template <int L, class T, class F>
HALIAX_NN_INLINE void row_map2(const T* a, const T* b, T* y, std::int64_t n, F f, prefetch_rows<T> next = {}) {
  std::int64_t j = 0;
  for (; j + L <= n; j += L) {
    next.template fetch<L>(j);
    map2_group<L>(a + j, b + j, y + j, f);
  }
  for (; j < n; ++j) st(y, j, f(ld(a, j), ld(b, j)));
}

#ifdef HALIAX_NN_ISA_DISPATCH
// row_map2 for float rows with streaming stores (host x86, outputs larger than the caches, as the forward's
// streamed path): each group is computed into registers and written with a non-temporal store, so the output
// skips the read-for-ownership. One version per ISA, each compiled for its target as the intrinsics need.
#define HALIAX_NN_STREAM_MAP2(NAME, TARGET, W, LOAD, STREAM)                                                          \
  template <class F>                                                                                                  \
  TARGET inline void NAME(const float* a, const float* b, float* y, std::int64_t n, F f, prefetch_rows<float> next) { \
    std::int64_t j = 0;                                                                                               \
    for (; j < n && (reinterpret_cast<std::uintptr_t>(y + j) & (4 * W - 1)) != 0; ++j) y[j] = f(a[j], b[j]);          \
    alignas(4 * W) float tmp[W];                                                                                      \
    for (; j + W <= n; j += W) {                                                                                      \
      next.template fetch<W>(j);                                                                                      \
      map2_group<W>(a + j, b + j, tmp, f);                                                                            \
      STREAM(y + j, LOAD(tmp));                                                                                       \
    }                                                                                                                 \
    for (; j < n; ++j) y[j] = f(a[j], b[j]);                                                                          \
    _mm_sfence();                                                                                                     \
  }
HALIAX_NN_STREAM_MAP2(stream_map2_avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"))), 16,
                      _mm512_load_ps, _mm512_stream_ps)
HALIAX_NN_STREAM_MAP2(stream_map2_avx2, __attribute__((target("avx2,fma"))), 8, _mm256_load_ps, _mm256_stream_ps)
HALIAX_NN_STREAM_MAP2(stream_map2_sse, , 4, _mm_load_ps, _mm_stream_ps)
#undef HALIAX_NN_STREAM_MAP2
#endif

/// The last pass of a backward row: dx_j = f(a_j, g_j) in groups of L, with streaming stores when `stream`
/// (float rows on x86 hosts only; elsewhere `stream` is always false).
template <int VB, int L, class T, class F>
HALIAX_NN_INLINE void row_grad_write(const T* a, const T* g, T* dx, std::int64_t n, F f, prefetch_rows<T> next,
                                     bool stream) {
#ifdef HALIAX_NN_ISA_DISPATCH
  if constexpr (std::is_same_v<T, float>) {
    if (stream) {
      if constexpr (VB == 64) {
        stream_map2_avx512(a, g, dx, n, f, next);
      } else if constexpr (VB == 32) {
        stream_map2_avx2(a, g, dx, n, f, next);
      } else {
        stream_map2_sse(a, g, dx, n, f, next);
      }
      return;
    }
  }
#endif
  row_map2<L>(a, g, dx, n, f, next);
}

struct prod_fn {
  template <class V>
  HALIAX_NN_INLINE V operator()(V a, V b) const {
    return a * b;
  }
};
struct zero_fn {
  template <class V>
  HALIAX_NN_INLINE V operator()(V) const {
    return V(0);
  }
};
template <class V>
struct softmax_grad_fn {  // (y, g) -> y * (g - s)
  V s;
  HALIAX_NN_INLINE V operator()(V y, V g) const { return y * (g - s); }
};
template <class V>
struct log_softmax_grad_fn {  // (y, g) -> g - exp(y) * s; y <= 0 (a log-probability)
  V s;
  HALIAX_NN_INLINE V operator()(V y, V g) const { return g - fast_exp_nonpos(y) * s; }
};
template <class V>
struct standardize_gy_fn {  // (x, g) -> g * (x - mean) * r
  V mean, r;
  HALIAX_NN_INLINE V operator()(V x, V g) const { return g * ((x - mean) * r); }
};
template <class V>
struct standardize_grad_fn {  // (x, g) -> r * (g - mg - (x - mean) * r * mgy)
  V mean, r, mg, mgy;
  HALIAX_NN_INLINE V operator()(V x, V g) const { return r * (g - mg - ((x - mean) * r) * mgy); }
};

/// One contiguous row of a backward. `a` is the saved row (y for softmax and log_softmax, x for logsumexp and
/// standardize), `g` the gradient row, `dx` the output row; for logsumexp `g` and `z` point at the row's
/// reduced gradient and value. `param` is epsilon for standardize.
template <grad_op Op, int VB, class T>
HALIAX_NN_INLINE void row_grad(const T* a, const T* g, const T* z, T* dx, std::int64_t n, compute_t<T> param,
                               prefetch_rows<T> next, bool stream) {
  using V = compute_t<T>;
  constexpr int R = reduce_lanes<V, VB>;
  constexpr int E = exp_lanes<V, VB>;
  if constexpr (Op == grad_op::softmax) {
    const V s = row_sum2_of<R>(a, g, n, prod_fn{});
    row_grad_write<VB, R>(a, g, dx, n, softmax_grad_fn<V>{s}, next, stream);
  } else if constexpr (Op == grad_op::log_softmax) {
    const V s = row_sum_of<R>(g, n, identity_fn{});
    row_grad_write<VB, E>(a, g, dx, n, log_softmax_grad_fn<V>{s}, next, stream);
  } else if constexpr (Op == grad_op::logsumexp) {
    const V zv = ld(z, 0), gv = ld(g, 0);
    if (zv == neg_inf<V>()) {
      row_map<R>(a, dx, n, zero_fn{});
    } else if (haliax::detail::math::isfinite(zv)) {
      row_map<E>(a, dx, n, exp_scale_fn<V, true>{zv, gv});  // z >= every x of its row
    } else {
      row_map<E>(a, dx, n, exp_scale_fn<V, false>{zv, gv});
    }
  } else {
    const V inv_n = V(1) / static_cast<V>(n);
    const V mean = row_sum_of<R>(a, n, identity_fn{}) * inv_n;
    const V var = row_sum_of<R>(a, n, sq_dev_fn<V>{mean}) * inv_n;
    const V r = V(1) / haliax::detail::math::sqrt(var + param);
    const V mg = row_sum_of<R>(g, n, identity_fn{}) * inv_n;
    const V mgy = row_sum2_of<R>(a, g, n, standardize_gy_fn<V>{mean, r}) * inv_n;
    row_grad_write<VB, R>(a, g, dx, n, standardize_grad_fn<V>{mean, r, mg, mgy}, next, stream);
  }
}

/// The strided backward for one block of `b` neighbouring inner positions: `a`, `g` (not for logsumexp) and
/// `dx` point at position (o, 0, i0); for logsumexp `g` and `z` point at the reduced values at (o, i0).
template <grad_op Op, class T>
HALIAX_NN_INLINE void block_grad(const T* a, const T* g, const T* z, T* dx, std::int64_t n, std::int64_t inner, int b,
                                 compute_t<T> param) {
  using V = compute_t<T>;
  constexpr int B = block_width;
  V s[B], u[B], w[B], q[B];
  if constexpr (Op == grad_op::logsumexp) {
    for (int t = 0; t < b; ++t) {
      s[t] = ld(z, t);
      u[t] = ld(g, t);
    }
    for (std::int64_t j = 0; j < n; ++j) {
      const T* p = a + j * inner;
      T* o = dx + j * inner;
      for (int t = 0; t < b; ++t) st(o, t, s[t] == neg_inf<V>() ? V(0) : fast_exp(ld(p, t) - s[t]) * u[t]);
    }
  } else if constexpr (Op == grad_op::standardize) {
    for (int t = 0; t < b; ++t) u[t] = w[t] = s[t] = q[t] = V(0);
    const V inv_n = V(1) / static_cast<V>(n);
    for (std::int64_t j = 0; j < n; ++j) {
      const T* p = a + j * inner;
      for (int t = 0; t < b; ++t) u[t] += ld(p, t);
    }
    for (int t = 0; t < b; ++t) u[t] *= inv_n;
    for (std::int64_t j = 0; j < n; ++j) {
      const T* p = a + j * inner;
      for (int t = 0; t < b; ++t) w[t] += (ld(p, t) - u[t]) * (ld(p, t) - u[t]);
    }
    for (int t = 0; t < b; ++t) w[t] = V(1) / haliax::detail::math::sqrt(w[t] * inv_n + param);
    for (std::int64_t j = 0; j < n; ++j) {
      const T* p = a + j * inner;
      const T* h = g + j * inner;
      for (int t = 0; t < b; ++t) {
        s[t] += ld(h, t);
        q[t] += ld(h, t) * ((ld(p, t) - u[t]) * w[t]);
      }
    }
    for (int t = 0; t < b; ++t) {
      s[t] *= inv_n;
      q[t] *= inv_n;
    }
    for (std::int64_t j = 0; j < n; ++j) {
      const T* p = a + j * inner;
      const T* h = g + j * inner;
      T* o = dx + j * inner;
      for (int t = 0; t < b; ++t) st(o, t, w[t] * (ld(h, t) - s[t] - ((ld(p, t) - u[t]) * w[t]) * q[t]));
    }
  } else {
    for (int t = 0; t < b; ++t) s[t] = V(0);
    for (std::int64_t j = 0; j < n; ++j) {
      const T* p = a + j * inner;
      const T* h = g + j * inner;
      for (int t = 0; t < b; ++t) {
        if constexpr (Op == grad_op::softmax) {
          s[t] += ld(p, t) * ld(h, t);
        } else {
          s[t] += ld(h, t);
        }
      }
    }
    for (std::int64_t j = 0; j < n; ++j) {
      const T* p = a + j * inner;
      const T* h = g + j * inner;
      T* o = dx + j * inner;
      for (int t = 0; t < b; ++t) {
        if constexpr (Op == grad_op::softmax) {
          st(o, t, ld(p, t) * (ld(h, t) - s[t]));
        } else {
          st(o, t, ld(h, t) - fast_exp(ld(p, t)) * s[t]);
        }
      }
    }
  }
}

/// A full block gets a compile-time trip count so its inner loops vectorise.
template <grad_op Op, class T>
HALIAX_NN_INLINE void block_grad_any(const T* a, const T* g, const T* z, T* dx, std::int64_t n, std::int64_t inner,
                                     int b, compute_t<T> param) {
  if (b == block_width) {
    block_grad<Op>(a, g, z, dx, n, inner, block_width, param);
  } else {
    block_grad<Op>(a, g, z, dx, n, inner, b, param);
  }
}

#ifdef HALIAX_NN_ISA_DISPATCH
template <grad_op Op, class T>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,bmi,bmi2,f16c"))) void row_grad_avx512(
    const T* a, const T* g, const T* z, T* dx, std::int64_t n, compute_t<T> param, prefetch_rows<T> next, bool stream) {
  row_grad<Op, 64>(a, g, z, dx, n, param, next, stream);
}
template <grad_op Op, class T>
__attribute__((target("avx2,fma,bmi,bmi2,f16c"))) void row_grad_avx2(const T* a, const T* g, const T* z, T* dx,
                                                                     std::int64_t n, compute_t<T> param,
                                                                     prefetch_rows<T> next, bool stream) {
  row_grad<Op, 32>(a, g, z, dx, n, param, next, stream);
}
template <grad_op Op, class T>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,bmi,bmi2,f16c"))) void block_grad_avx512(
    const T* a, const T* g, const T* z, T* dx, std::int64_t n, std::int64_t inner, int b, compute_t<T> param) {
  block_grad_any<Op>(a, g, z, dx, n, inner, b, param);
}
template <grad_op Op, class T>
__attribute__((target("avx2,fma,bmi,bmi2,f16c"))) void block_grad_avx2(const T* a, const T* g, const T* z, T* dx,
                                                                       std::int64_t n, std::int64_t inner, int b,
                                                                       compute_t<T> param) {
  block_grad_any<Op>(a, g, z, dx, n, inner, b, param);
}
#endif

/// The portable path's contiguous rows of a backward (inner == 1): one team member per row, as `row_team_op`;
/// the formulas of `row_grad`.
template <grad_op Op, class T>
void row_team_grad(const char* label, const T* a, const T* g, const T* z, T* dx, std::int64_t outer,
                   std::int64_t n, compute_t<T> param) {
  using V = compute_t<T>;
  namespace hd = haliax::detail;
  Kokkos::parallel_for(label, hd::row_policy(outer), KOKKOS_LAMBDA(const hd::row_member& t) {
    HALIAX_CAPTURE(a, g, z, dx, param, n);
    const std::int64_t o = hd::row_of(t);
    if (o >= outer) return;
    const T* ar = a + o * n;
    T* dr = dx + o * n;
    if constexpr (Op == grad_op::logsumexp) {
      const V zv = ld(z, o), gv = ld(g, o);
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(t, n), [&](std::int64_t j) {
        st(dr, j, zv == neg_inf<V>() ? V(0) : fast_exp(ld(ar, j) - zv) * gv);
      });
    } else {
      const T* gr = g + o * n;
      if constexpr (Op == grad_op::softmax) {
        const V s = hd::lane_sum<V>(t, n, [&](std::int64_t j) { return ld(ar, j) * ld(gr, j); });
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(t, n),
                             [&](std::int64_t j) { st(dr, j, ld(ar, j) * (ld(gr, j) - s)); });
      } else if constexpr (Op == grad_op::log_softmax) {
        const V s = hd::lane_sum<V>(t, n, [&](std::int64_t j) { return ld(gr, j); });
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(t, n),
                             [&](std::int64_t j) { st(dr, j, ld(gr, j) - fast_exp(ld(ar, j)) * s); });
      } else {
        const V inv_n = V(1) / static_cast<V>(n);
        const V mean = hd::lane_sum<V>(t, n, [&](std::int64_t j) { return ld(ar, j); }) * inv_n;
        const V var = hd::lane_sum<V>(t, n, [&](std::int64_t j) {
                        const V d = ld(ar, j) - mean;
                        return d * d;
                      }) * inv_n;
        const V r = V(1) / haliax::detail::math::sqrt(var + param);
        const V mg = hd::lane_sum<V>(t, n, [&](std::int64_t j) { return ld(gr, j); }) * inv_n;
        const V mgy = hd::lane_sum<V>(t, n, [&](std::int64_t j) { return ld(gr, j) * ((ld(ar, j) - mean) * r); }) *
                      inv_n;
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(t, n), [&](std::int64_t j) {
          st(dr, j, r * (ld(gr, j) - mg - ((ld(ar, j) - mean) * r) * mgy));
        });
      }
    }
  });
}

/// Runs a backward over arrays split as outer x n x inner: `a`, `g` and `dx` have the full shape, except that
/// for logsumexp `g` and `z` have the reduced shape outer x inner.
template <grad_op Op, class T>
void run_axis_grad(const char* label, const T* a, const T* g, const T* z, T* dx, axis_split sp,
                   compute_t<T> param = {}) {
  const std::int64_t outer = sp.outer, n = sp.n, inner = sp.inner;
  if (outer == 0 || inner == 0 || n == 0) return;
  if (inner == 1 && !haliax::detail::use_host_kernels(haliax::kernels::family::softmax)) {
    row_team_grad<Op>(label, a, g, z, dx, outer, n, param);
    return;
  }
  [[maybe_unused]] const host_isa isa = detect_host_isa();
  constexpr bool reduced = Op == grad_op::logsumexp;
  constexpr bool host = std::is_same_v<haliax::memory_space, Kokkos::HostSpace>;
  if (inner == 1) {
    // Large float outputs are written with streaming stores (see the forward's streamed path).
    bool stream = false;
#ifdef HALIAX_NN_ISA_DISPATCH
    stream =
        std::is_same_v<T, float> && !reduced && outer * n * static_cast<std::int64_t>(sizeof(T)) >= stream_min_bytes;
#endif
    Kokkos::parallel_for(
        label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, outer), KOKKOS_LAMBDA(std::int64_t o) {
          const T* ar = a + o * n;
          const T* gr = reduced ? g + o : g + o * n;
          const T* zr = reduced ? z + o : nullptr;
          T* dr = dx + o * n;
          // The next row's inputs are fetched during this row's last pass, so its first pass reads from cache.
          prefetch_rows<T> next;
          if (host && o + 1 < outer) next = {ar + n, reduced ? nullptr : gr + n};
#ifdef HALIAX_NN_ISA_DISPATCH
          if (isa == host_isa::avx512) {
            row_grad_avx512<Op>(ar, gr, zr, dr, n, param, next, stream);
            return;
          }
          if (isa == host_isa::avx2) {
            row_grad_avx2<Op>(ar, gr, zr, dr, n, param, next, stream);
            return;
          }
#endif
          row_grad<Op, 16>(ar, gr, zr, dr, n, param, next, stream);
        });
    return;
  }
  constexpr int B = block_width;
  const std::int64_t nb = (inner + B - 1) / B;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, outer * nb), KOKKOS_LAMBDA(std::int64_t w) {
        const std::int64_t o = w / nb;
        const std::int64_t i0 = (w - o * nb) * B;
        const int b = inner - i0 < B ? static_cast<int>(inner - i0) : B;
        const std::int64_t base = o * n * inner + i0, red = o * inner + i0;
        const T* ab = a + base;
        const T* gb = reduced ? g + red : g + base;
        const T* zb = reduced ? z + red : nullptr;
        T* db = dx + base;
#ifdef HALIAX_NN_ISA_DISPATCH
        if (isa == host_isa::avx512) {
          block_grad_avx512<Op>(ab, gb, zb, db, n, inner, b, param);
          return;
        }
        if (isa == host_isa::avx2) {
          block_grad_avx2<Op>(ab, gb, zb, db, n, inner, b, param);
          return;
        }
#endif
        block_grad_any<Op>(ab, gb, zb, db, n, inner, b, param);
      });
}

/// `x` without its autodiff node: what a backward closure captures (it needs the values, not the graph).
template <class T, class Axes>
named_array<T, Axes> untracked(const named_array<T, Axes>& x) {
  auto c = x;
  c.set_ad_node(nullptr);
  return c;
}

/// Records the backward of softmax, log_softmax or standardize along A for `r` computed from `x`; `saved` is
/// the array the kernel reads (y or x).
template <grad_op Op, class A, class T, class Axes>
void record_axis_grad(named_array<T, Axes>& r, const named_array<T, Axes>& x, const named_array<T, Axes>& saved,
                      compute_t<T> param = {}) {
  haliax::detail::ad::record(
      r,
      [saved = untracked(saved), param](const named_array<T, Axes>& g, auto) {
        auto dx = named_array<T, Axes>::allocate(g.sizes(), "haliax::nn::axis_grad");
        run_axis_grad<Op>("haliax::nn::axis_grad", saved.data(), g.data(), static_cast<const T*>(nullptr), dx.data(),
                          split_at<Axes, A>(g.sizes()), param);
        return std::tuple{dx};
      },
      x);
}

// ---------------------------------------------------------------------------------------------------------
// Activation functors (compute-type in, compute-type out)

template <class V>
KOKKOS_INLINE_FUNCTION V sigmoid_v(V x) {
  // Never exponentiates a positive number, so neither branch overflows.
  const V e = haliax::detail::math::exp(x < V(0) ? x : -x);
  return x < V(0) ? e / (V(1) + e) : V(1) / (V(1) + e);
}

template <class V>
KOKKOS_INLINE_FUNCTION V softplus_v(V x) {
  const V ax = x < V(0) ? -x : x;
  return haliax::detail::math::log1p(haliax::detail::math::exp(-ax)) + (x > V(0) ? x : V(0));
}

#define HALIAX_NN_FUNCTOR(NAME, EXPR)                \
  struct NAME##_fn {                                 \
    template <class V>                               \
    KOKKOS_INLINE_FUNCTION V operator()(V x) const { \
      return EXPR;                                   \
    }                                                \
  };
HALIAX_NN_FUNCTOR(relu, x > V(0) ? x : V(0))
HALIAX_NN_FUNCTOR(relu6, x > V(0) ? (x < V(6) ? x : V(6)) : V(0))
HALIAX_NN_FUNCTOR(relu_squared, x > V(0) ? x * x : V(0))
HALIAX_NN_FUNCTOR(sigmoid, sigmoid_v(x))
HALIAX_NN_FUNCTOR(log_sigmoid, -softplus_v(-x))
HALIAX_NN_FUNCTOR(softplus, softplus_v(x))
HALIAX_NN_FUNCTOR(soft_sign, x / (V(1) + (x < V(0) ? -x : x)))
HALIAX_NN_FUNCTOR(silu, x* sigmoid_v(x))
HALIAX_NN_FUNCTOR(quick_gelu, x* sigmoid_v(V(1.702) * x))
HALIAX_NN_FUNCTOR(gelu_exact, V(0.5) * x * (V(1) + haliax::detail::math::erf(x * V(0.70710678118654752440))))
HALIAX_NN_FUNCTOR(gelu_tanh, V(0.5) * x * (V(1) + fast_tanh(V(0.79788456080286535588) * (x + V(0.044715) * x * x * x))))
HALIAX_NN_FUNCTOR(hard_sigmoid, (x + V(3) > V(0) ? (x + V(3) < V(6) ? x + V(3) : V(6)) : V(0)) / V(6))
HALIAX_NN_FUNCTOR(hard_silu, x*((x + V(3) > V(0) ? (x + V(3) < V(6) ? x + V(3) : V(6)) : V(0)) / V(6)))
HALIAX_NN_FUNCTOR(hard_tanh, x > V(1) ? V(1) : (x < V(-1) ? V(-1) : x))
#undef HALIAX_NN_FUNCTOR

struct gelu_fn {
  bool approximate;
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V x) const {
    return approximate ? gelu_tanh_fn{}(x) : gelu_exact_fn{}(x);
  }
};

struct leaky_relu_fn {
  double slope;
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V x) const {
    return x >= V(0) ? x : static_cast<V>(slope) * x;
  }
};

struct elu_fn {
  double alpha;
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V x) const {
    return x > V(0) ? x : static_cast<V>(alpha) * haliax::detail::math::expm1(x);
  }
};

struct celu_fn {
  double alpha;
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V x) const {
    const V a = static_cast<V>(alpha);
    return (x > V(0) ? x : V(0)) + a * haliax::detail::math::expm1((x < V(0) ? x : V(0)) / a);
  }
};

struct selu_fn {
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V x) const {
    constexpr double alpha = 1.6732632423543772848170429916717;
    constexpr double scale = 1.0507009873554804934193349852946;
    return static_cast<V>(scale) * (x > V(0) ? x : static_cast<V>(alpha) * haliax::detail::math::expm1(x));
  }
};

// Derivatives of the activations (compute-type in, compute-type out), with JAX's choices at the kinks: relu,
// relu6 and the hard_* family take 0 at their corners, leaky_relu, hard_tanh and elu the left-closed /
// inner side as their forward `where` does (leaky_relu'(0) = 1, hard_tanh'(+-1) = 1, elu'(0) = alpha).
#define HALIAX_NN_FUNCTOR(NAME, EXPR)                \
  struct NAME##_grad_fn {                            \
    template <class V>                               \
    KOKKOS_INLINE_FUNCTION V operator()(V x) const { \
      return EXPR;                                   \
    }                                                \
  };
HALIAX_NN_FUNCTOR(relu, x > V(0) ? V(1) : V(0))
HALIAX_NN_FUNCTOR(relu6, x > V(0) && x < V(6) ? V(1) : V(0))
HALIAX_NN_FUNCTOR(relu_squared, x > V(0) ? V(2) * x : V(0))
HALIAX_NN_FUNCTOR(sigmoid, sigmoid_v(x) * (V(1) - sigmoid_v(x)))
HALIAX_NN_FUNCTOR(log_sigmoid, sigmoid_v(-x))
HALIAX_NN_FUNCTOR(softplus, sigmoid_v(x))
HALIAX_NN_FUNCTOR(soft_sign, V(1) / ((V(1) + (x < V(0) ? -x : x)) * (V(1) + (x < V(0) ? -x : x))))
HALIAX_NN_FUNCTOR(silu, sigmoid_v(x) * (V(1) + x * (V(1) - sigmoid_v(x))))
HALIAX_NN_FUNCTOR(quick_gelu, sigmoid_v(V(1.702) * x) * (V(1) + V(1.702) * x * (V(1) - sigmoid_v(V(1.702) * x))))
HALIAX_NN_FUNCTOR(gelu_exact, V(0.5) * (V(1) + haliax::detail::math::erf(x * V(0.70710678118654752440))) +
                                  x * V(0.39894228040143267794) * haliax::detail::math::exp(V(-0.5) * x * x))
HALIAX_NN_FUNCTOR(hard_sigmoid, x > V(-3) && x < V(3) ? V(1) / V(6) : V(0))
HALIAX_NN_FUNCTOR(hard_silu, hard_sigmoid_fn{}(x) + (x > V(-3) && x < V(3) ? x / V(6) : V(0)))
HALIAX_NN_FUNCTOR(hard_tanh, x > V(1) || x < V(-1) ? V(0) : V(1))
#undef HALIAX_NN_FUNCTOR

struct gelu_tanh_grad_fn {
  template <class V>
  HALIAX_NN_INLINE V operator()(V x) const {
    constexpr V c = V(0.79788456080286535588), k = V(0.044715);
    const V t = fast_tanh(c * (x + k * x * x * x));
    return V(0.5) * (V(1) + t) + V(0.5) * x * (V(1) - t * t) * c * (V(1) + V(3) * k * x * x);
  }
};

struct gelu_grad_fn {
  bool approximate;
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V x) const {
    return approximate ? gelu_tanh_grad_fn{}(x) : gelu_exact_grad_fn{}(x);
  }
};

struct leaky_relu_grad_fn {
  double slope;
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V x) const {
    return x >= V(0) ? V(1) : static_cast<V>(slope);
  }
};

struct elu_grad_fn {
  double alpha;
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V x) const {
    return x > V(0) ? V(1) : static_cast<V>(alpha) * haliax::detail::math::exp(x);
  }
};

struct celu_grad_fn {  // max(x,0) + a expm1(min(x,0)/a): JAX splits max/min ties evenly, giving 1 at 0 as well
  double alpha;
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V x) const {
    return x > V(0) ? V(1) : haliax::detail::math::exp(x / static_cast<V>(alpha));
  }
};

struct selu_grad_fn {
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V x) const {
    constexpr double alpha = 1.6732632423543772848170429916717;
    constexpr double scale = 1.0507009873554804934193349852946;
    return static_cast<V>(scale) * (x > V(0) ? V(1) : static_cast<V>(alpha) * haliax::detail::math::exp(x));
  }
};

/// (g, x) -> g * f'(x): the backward of an activation with derivative functor D.
template <class D>
struct chain_fn {
  D d;
  template <class V>
  HALIAX_NN_INLINE V operator()(V g, V x) const {
    return g * d(x);
  }
};

/// Throws unless `out` has x's sizes and its own buffer, and x is not tracked by autodiff (the `_into` forms
/// write into a caller's buffer and record nothing, so a gradient through them would silently be lost).
template <class T, class Axes>
void check_into(const char* op, const named_array<T, Axes>& x, const named_array<T, Axes>& out) {
  if (haliax::detail::ad::any_tracked(x))
    throw std::logic_error(std::string(op) +
                           ": not differentiable; inside value_and_grad use the form that returns "
                           "a new array");
  if (out.sizes() != x.sizes())
    throw shape_error(std::string(op) + ": out has shape " + out.shape_string() + " but x has " + x.shape_string());
  if (x.element_count() > 0 && out.data() == x.data())
    throw std::invalid_argument(std::string(op) + ": out shares x's buffer; pass a separate array");
}

/// Elements from which a host activation is split over haliax's thread pool (below: one Kokkos kernel).
inline constexpr std::int64_t pooled_activation_min = std::int64_t{1} << 16;

/// out[i] = op(a[i]) (unary) or op(a[i], b[i]) (binary) for arrays of `n` elements: one Kokkos kernel, or on
/// the host, when the arrays are large, chunks of 16K elements spread over haliax's thread pool (activations of
/// an MLP are tens of millions of elements, and the Serial backend runs a kernel on one thread). Each element is
/// computed by the same expression either way, so results do not depend on the path or the thread count.
template <bool Binary, class T, class Op>
void elementwise_pooled(const char* label, const T* a, const T* b, T* out, std::int64_t n, Op op) {
  namespace hd = haliax::detail;
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, execution_space::memory_space>::accessible;
  if constexpr (host) {
    if (n >= pooled_activation_min && hd::thread_pool::instance().size() > 1 &&
        hd::use_host_kernels(haliax::kernels::family::elementwise)) {
      hd::profile::region prof([label] { return std::string(label); }, 0.0);
      constexpr std::int64_t chunk = 16384;
      hd::thread_pool::instance().run((n + chunk - 1) / chunk, [&](std::int64_t c) {
        const std::int64_t end = std::min(n, (c + 1) * chunk);
        for (std::int64_t i = c * chunk; i < end; ++i) {
          if constexpr (Binary)
            hd::store(out, i, op(hd::load(a, i), hd::load(b, i)));
          else
            hd::store(out, i, op(hd::load(a, i)));
        }
      });
      return;
    }
  }
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        HALIAX_CAPTURE(a, b, out, op);
        if constexpr (Binary)
          hd::store(out, i, op(hd::load(a, i), hd::load(b, i)));
        else
          hd::store(out, i, op(hd::load(a, i)));
      });
}

/// An elementwise activation f with derivative functor D; records g * f'(x) as its backward.
template <class T, class Axes, class F, class D>
named_array<T, Axes> activation(const char* label, const named_array<T, Axes>& x, F f, D df) {
  auto r = named_array<T, Axes>::allocate(x.sizes(), label);
  elementwise_pooled<false, T>(label, x.data(), static_cast<const T*>(nullptr), r.data(), x.element_count(), f);
  if (haliax::detail::ad::any_tracked(x))
    haliax::detail::ad::record(
        r,
        [xs = untracked(x), df](const named_array<T, Axes>& g, auto) {
          auto gx = named_array<T, Axes>::allocate(xs.sizes(), "haliax::nn::activation_grad");
          elementwise_pooled<true, T>("haliax::nn::activation_grad", g.data(), xs.data(), gx.data(),
                                      xs.element_count(), chain_fn<D>{df});
          return std::tuple{gx};
        },
        x);
  return r;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------------------
// Constraints: a wrong axis fails at the call site, naming the concept and the axis types.

/// `A` is an axis tag and one of the axes `Axes` of the array it is used with: `softmax(x, Vocab)`.
template <class A, class Axes>
concept AxisOf = AxisTag<A> && AxisIn<std::remove_cvref_t<A>, axis_types_of<Axes>>;

/// `C` is an axis tag that is not yet an axis of `Axes` (the class axis `one_hot` appends).
template <class C, class Axes>
concept NewAxisFor = AxisTag<C> && !detail::has_axis_v<Axes, C>;

// ---------------------------------------------------------------------------------------------------------
// Softmax family

/// Softmax along `axis` (upstream `haliax.nn.softmax`): exp(x - max) / sum(exp(x - max)) over that axis;
/// keeps every axis. Numerically stable for any magnitude; fused into three passes over each row.
/// Gradient: y * (g - sum(g * y)) along `axis`, one fused kernel reading y and g.
///   auto p = haliax::nn::softmax(logits, Vocab);   // {batch, vocab} -> {batch, vocab}
///   // every (batch) row of p sums to 1
template <FloatElement T, class Axes, AxisOf<Axes> A>
named_array<T, Axes> softmax(const named_array<T, Axes>& x, A axis) {
  auto r = named_array<T, Axes>::allocate(x.sizes(), "haliax::nn::softmax");
  detail::run_axis_op<detail::axis_op::softmax>("haliax::nn::softmax", x.data(), r.data(), static_cast<T*>(nullptr),
                                                detail::split_at<Axes, A>(x.sizes()));
  if (haliax::detail::ad::any_tracked(x)) detail::record_axis_grad<detail::grad_op::softmax, A>(r, x, r);
  return r;
}

/// Log of the softmax along `axis` (upstream `haliax.nn.log_softmax`): x - max - log(sum(exp(x - max)));
/// keeps every axis. Stable for large magnitudes (no log of an underflowed probability).
/// Gradient: g - exp(y) * sum(g) along `axis`, one fused kernel reading y and g.
///   auto lp = haliax::nn::log_softmax(logits, Vocab);   // {batch, vocab} -> {batch, vocab}
///   // exp(lp) == softmax(logits, Vocab)
template <FloatElement T, class Axes, AxisOf<Axes> A>
named_array<T, Axes> log_softmax(const named_array<T, Axes>& x, A axis) {
  auto r = named_array<T, Axes>::allocate(x.sizes(), "haliax::nn::log_softmax");
  detail::run_axis_op<detail::axis_op::log_softmax>("haliax::nn::log_softmax", x.data(), r.data(),
                                                    static_cast<T*>(nullptr), detail::split_at<Axes, A>(x.sizes()));
  if (haliax::detail::ad::any_tracked(x)) detail::record_axis_grad<detail::grad_op::log_softmax, A>(r, x, r);
  return r;
}

/// `softmax(x, axis)` written into an existing array `out` of the same axes and sizes (for loops that reuse
/// a buffer: a fresh multi-GB output costs more in page faults than the softmax itself). `out` must not
/// share x's buffer; throws `shape_error` on a size mismatch. Not differentiable: while a gradient is taken,
/// a tracked `x` throws `std::logic_error` (use `softmax`, which records its backward).
///   auto p = haliax::empty_like(logits);
///   haliax::nn::softmax_into(logits, Vocab, p);   // p = softmax(logits, Vocab)
template <FloatElement T, class Axes, AxisOf<Axes> A>
void softmax_into(const named_array<T, Axes>& x, A axis, const named_array<T, Axes>& out) {
  detail::check_into("haliax::nn::softmax_into", x, out);
  detail::run_axis_op<detail::axis_op::softmax>("haliax::nn::softmax", x.data(), out.data(), static_cast<T*>(nullptr),
                                                detail::split_at<Axes, A>(x.sizes()));
}

/// `log_softmax(x, axis)` written into an existing array `out` of the same axes and sizes; as `softmax_into`
/// (and, like it, not differentiable).
///   auto lp = haliax::empty_like(logits);
///   haliax::nn::log_softmax_into(logits, Vocab, lp);   // lp = log_softmax(logits, Vocab)
template <FloatElement T, class Axes, AxisOf<Axes> A>
void log_softmax_into(const named_array<T, Axes>& x, A axis, const named_array<T, Axes>& out) {
  detail::check_into("haliax::nn::log_softmax_into", x, out);
  detail::run_axis_op<detail::axis_op::log_softmax>("haliax::nn::log_softmax", x.data(), out.data(),
                                                    static_cast<T*>(nullptr), detail::split_at<Axes, A>(x.sizes()));
}

/// log(sum(exp(x))) along `axis`, computed stably (upstream `haliax.nn.logsumexp`); drops `axis`.
/// An empty axis or an all -inf row gives -inf. Gradient: g * exp(x - z), i.e. g times the softmax (zero for
/// an all -inf row).
///   auto z = haliax::nn::logsumexp(logits, Vocab);   // {batch, vocab} -> {batch}
///   // log_softmax(logits, Vocab) == logits - z
template <FloatElement T, class Axes, AxisOf<Axes> A>
named_array<T, detail::without_t<Axes, A>> logsumexp(const named_array<T, Axes>& x, A axis) {
  using R = named_array<T, detail::without_t<Axes, A>>;
  typename R::shape_type rsizes{};
  {
    constexpr std::size_t k = haliax::detail::index_of_v<haliax::detail::to_list<Axes>, std::remove_cvref_t<A>>;
    std::size_t d = 0;
    for (std::size_t i = 0; i < Axes::rank; ++i)
      if (i != k) rsizes[d++] = x.sizes()[i];
  }
  auto r = R::allocate(rsizes, "haliax::nn::logsumexp");
  detail::run_axis_op<detail::axis_op::logsumexp>("haliax::nn::logsumexp", x.data(), static_cast<T*>(nullptr), r.data(),
                                                  detail::split_at<Axes, A>(x.sizes()));
  if (haliax::detail::ad::any_tracked(x))
    haliax::detail::ad::record(
        r,
        [xs = detail::untracked(x), z = detail::untracked(r)](const R& g, auto) {
          auto dx = named_array<T, Axes>::allocate(xs.sizes(), "haliax::nn::logsumexp_grad");
          detail::run_axis_grad<detail::grad_op::logsumexp>("haliax::nn::logsumexp_grad", xs.data(), g.data(), z.data(),
                                                            dx.data(), detail::split_at<Axes, A>(xs.sizes()));
          return std::tuple{dx};
        },
        x);
  return r;
}

/// (x - mean) / sqrt(var + epsilon) along `axis`, with the mean and (biased) variance taken over that axis
/// (upstream `haliax.nn.standardize`); keeps every axis. The variance is computed in a second pass over
/// the centred values, not as E[x^2] - E[x]^2. Gradient: r * (g - mean(g) - y * mean(g * y)) with
/// r = 1 / sqrt(var + epsilon), one fused kernel that recomputes the row statistics from x.
///   auto z = haliax::nn::standardize(h, Embed);   // {batch, embed} -> {batch, embed}
///   // each (batch) row of z has mean 0 and variance ~1
template <FloatElement T, class Axes, AxisOf<Axes> A>
named_array<T, Axes> standardize(const named_array<T, Axes>& x, A axis, double epsilon = 1e-5) {
  auto r = named_array<T, Axes>::allocate(x.sizes(), "haliax::nn::standardize");
  detail::run_axis_op<detail::axis_op::standardize>("haliax::nn::standardize", x.data(), r.data(),
                                                    static_cast<T*>(nullptr), detail::split_at<Axes, A>(x.sizes()),
                                                    static_cast<compute_t<T>>(epsilon));
  if (haliax::detail::ad::any_tracked(x))
    detail::record_axis_grad<detail::grad_op::standardize, A>(r, x, x, static_cast<compute_t<T>>(epsilon));
  return r;
}

// ---------------------------------------------------------------------------------------------------------
// one_hot

namespace detail {
/// one_hot's rows (an axis-free function, for nvcc: see haliax::detail::fill_raw).
template <class R>
void one_hot_kernel(const std::int32_t* in, R* out, std::int64_t n, std::int64_t nc, compute_t<R> von,
                    compute_t<R> voff) {
  Kokkos::parallel_for(
      "haliax::nn::one_hot", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, n), KOKKOS_LAMBDA(std::int64_t e) {
        const std::int64_t label = in[e];
        R* row = out + e * nc;
        for (std::int64_t c = 0; c < nc; ++c) st(row, c, c == label ? von : voff);
      });
}
}  // namespace detail

/// One-hot encoding (upstream `haliax.nn.one_hot(x, class_axis)`): for integer labels `x` the result has x's
/// axes followed by `class_axis` last, `on` where the class equals the label and `off` elsewhere. A label
/// outside [0, size) (including negative) gives a row of all `off`. `R` is the element type (default float).
///   auto y = haliax::nn::one_hot(labels, 10 * Label);   // int32 {batch} -> float {batch, label}
///   // y[b, labels[b]] == 1, all else 0
template <FloatElement R = float, class Axes, NewAxisFor<Axes> C>
named_array<R, detail::with_last_t<Axes, C>> one_hot(const named_array<std::int32_t, Axes>& x, sized_axis<C> class_axis,
                                                     double on = 1.0, double off = 0.0) {
  using Out = named_array<R, detail::with_last_t<Axes, C>>;
  typename Out::shape_type rsizes{};
  for (std::size_t i = 0; i < Axes::rank; ++i) rsizes[i] = x.sizes()[i];
  rsizes[Axes::rank] = class_axis.size;
  auto r = Out::allocate(rsizes, "haliax::nn::one_hot");
  const std::int32_t* in = x.data();
  R* out = r.data();
  const std::int64_t nc = class_axis.size;
  const compute_t<R> von = static_cast<compute_t<R>>(on), voff = static_cast<compute_t<R>>(off);
  if (nc == 0) return r;
  detail::one_hot_kernel<R>(in, out, x.element_count(), nc, von, voff);
  return r;
}

/// One-hot vector of a single label: `one_hot(3, 10 * Label)` is {label=10} with a 1 at 3 (all `off` when
/// the label is out of range).
///   auto v = haliax::nn::one_hot(3, 10 * Label);   // float {label}
///   // v = [0, 0, 0, 1, 0, 0, 0, 0, 0, 0]
template <FloatElement R = float, std::integral I, AxisTag C>
array_for<R, sized_axis<C>> one_hot(I label, sized_axis<C> class_axis, double on = 1.0, double off = 0.0) {
  auto idx = scalar<std::int32_t>(std::in_range<std::int32_t>(label) ? static_cast<std::int32_t>(label) : -1);
  return one_hot<R>(idx, class_axis, on, off);
}

// ---------------------------------------------------------------------------------------------------------
// Activations: elementwise, keep every axis; computed in float for bf16 inputs.

/// max(x, 0); elementwise, keeps every axis.
///   auto h = haliax::nn::relu(x);   // {-1, 2} -> {0, 2}
///   // same axes and element type as x
template <FloatElement T, class Axes>
named_array<T, Axes> relu(const named_array<T, Axes>& x) {
  return detail::activation("haliax::nn::relu", x, detail::relu_fn{}, detail::relu_grad_fn{});
}

/// min(max(x, 0), 6); elementwise, keeps every axis.
///   auto h = haliax::nn::relu6(x);   // {-1, 7} -> {0, 6}
///   // same axes and element type as x
template <FloatElement T, class Axes>
named_array<T, Axes> relu6(const named_array<T, Axes>& x) {
  return detail::activation("haliax::nn::relu6", x, detail::relu6_fn{}, detail::relu6_grad_fn{});
}

/// max(x, 0)^2; elementwise, keeps every axis.
///   auto h = haliax::nn::relu_squared(x);   // {-1, 3} -> {0, 9}
///   // same axes and element type as x
template <FloatElement T, class Axes>
named_array<T, Axes> relu_squared(const named_array<T, Axes>& x) {
  return detail::activation("haliax::nn::relu_squared", x, detail::relu_squared_fn{}, detail::relu_squared_grad_fn{});
}

/// 1 / (1 + exp(-x)), never overflowing for large |x|; elementwise, keeps every axis.
///   auto h = haliax::nn::sigmoid(x);   // {-100, 0, 100} -> {3.7e-44, 0.5, 1}
///   // same axes and element type as x
template <FloatElement T, class Axes>
named_array<T, Axes> sigmoid(const named_array<T, Axes>& x) {
  return detail::activation("haliax::nn::sigmoid", x, detail::sigmoid_fn{}, detail::sigmoid_grad_fn{});
}

/// log(sigmoid(x)) computed as -softplus(-x), stable for large |x|; elementwise, keeps every axis.
///   auto h = haliax::nn::log_sigmoid(x);   // {-100, 100} -> {-100, 0}
///   // same axes and element type as x
template <FloatElement T, class Axes>
named_array<T, Axes> log_sigmoid(const named_array<T, Axes>& x) {
  return detail::activation("haliax::nn::log_sigmoid", x, detail::log_sigmoid_fn{}, detail::log_sigmoid_grad_fn{});
}

/// log(1 + exp(x)) computed as log1p(exp(-|x|)) + max(x, 0), stable for large |x|; elementwise, keeps every axis.
///   auto h = haliax::nn::softplus(x);   // {-100, 0, 100} -> {3.7e-44, 0.693, 100}
///   // same axes and element type as x
template <FloatElement T, class Axes>
named_array<T, Axes> softplus(const named_array<T, Axes>& x) {
  return detail::activation("haliax::nn::softplus", x, detail::softplus_fn{}, detail::softplus_grad_fn{});
}

/// x / (1 + |x|); elementwise, keeps every axis.
///   auto h = haliax::nn::soft_sign(x);   // {-1, 3} -> {-0.5, 0.75}
///   // same axes and element type as x
template <FloatElement T, class Axes>
named_array<T, Axes> soft_sign(const named_array<T, Axes>& x) {
  return detail::activation("haliax::nn::soft_sign", x, detail::soft_sign_fn{}, detail::soft_sign_grad_fn{});
}

/// x * sigmoid(x) (SiLU, also `swish`); elementwise, keeps every axis.
///   auto h = haliax::nn::silu(x);   // {0, 100} -> {0, 100}
///   // same axes and element type as x
template <FloatElement T, class Axes>
named_array<T, Axes> silu(const named_array<T, Axes>& x) {
  return detail::activation("haliax::nn::silu", x, detail::silu_fn{}, detail::silu_grad_fn{});
}

/// x * sigmoid(1.702 x); elementwise, keeps every axis.
///   auto h = haliax::nn::quick_gelu(x);   // {0} -> {0}
///   // same axes and element type as x
template <FloatElement T, class Axes>
named_array<T, Axes> quick_gelu(const named_array<T, Axes>& x) {
  return detail::activation("haliax::nn::quick_gelu", x, detail::quick_gelu_fn{}, detail::quick_gelu_grad_fn{});
}

/// relu6(x + 3) / 6; elementwise, keeps every axis.
///   auto h = haliax::nn::hard_sigmoid(x);   // {-4, 0, 4} -> {0, 0.5, 1}
///   // same axes and element type as x
template <FloatElement T, class Axes>
named_array<T, Axes> hard_sigmoid(const named_array<T, Axes>& x) {
  return detail::activation("haliax::nn::hard_sigmoid", x, detail::hard_sigmoid_fn{}, detail::hard_sigmoid_grad_fn{});
}

/// x * hard_sigmoid(x) (also `hard_swish`); elementwise, keeps every axis.
///   auto h = haliax::nn::hard_silu(x);   // {-4, 3} -> {0, 3}
///   // same axes and element type as x
template <FloatElement T, class Axes>
named_array<T, Axes> hard_silu(const named_array<T, Axes>& x) {
  return detail::activation("haliax::nn::hard_silu", x, detail::hard_silu_fn{}, detail::hard_silu_grad_fn{});
}

/// clip(x, -1, 1); elementwise, keeps every axis.
///   auto h = haliax::nn::hard_tanh(x);   // {-2, 0.5} -> {-1, 0.5}
///   // same axes and element type as x
template <FloatElement T, class Axes>
named_array<T, Axes> hard_tanh(const named_array<T, Axes>& x) {
  return detail::activation("haliax::nn::hard_tanh", x, detail::hard_tanh_fn{}, detail::hard_tanh_grad_fn{});
}

/// x * sigmoid(x), the same function as `silu`; elementwise, keeps every axis.
///   auto h = haliax::nn::swish(x);   // == silu(x)
template <FloatElement T, class Axes>
named_array<T, Axes> swish(const named_array<T, Axes>& x) {
  return detail::activation("haliax::nn::swish", x, detail::silu_fn{}, detail::silu_grad_fn{});
}

/// x * hard_sigmoid(x), the same function as `hard_silu`; elementwise, keeps every axis.
///   auto h = haliax::nn::hard_swish(x);   // == hard_silu(x)
template <FloatElement T, class Axes>
named_array<T, Axes> hard_swish(const named_array<T, Axes>& x) {
  return detail::activation("haliax::nn::hard_swish", x, detail::hard_silu_fn{}, detail::hard_silu_grad_fn{});
}

/// GELU; elementwise, keeps every axis. `approximate = true` (upstream's default) is the tanh form
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ("gelu_new"); `false` is the exact 0.5 x (1 + erf(x / sqrt 2)).
///   auto h = haliax::nn::gelu(x);          // tanh form
///   auto e = haliax::nn::gelu(x, false);   // erf form
template <FloatElement T, class Axes>
named_array<T, Axes> gelu(const named_array<T, Axes>& x, bool approximate = true) {
  return detail::activation("haliax::nn::gelu", x, detail::gelu_fn{approximate}, detail::gelu_grad_fn{approximate});
}

/// The tanh approximation of GELU (Hugging Face's "gelu_new"), i.e. `gelu(x, true)`; keeps every axis.
///   auto h = haliax::nn::gelu_new(x);   // == gelu(x, true)
template <FloatElement T, class Axes>
named_array<T, Axes> gelu_new(const named_array<T, Axes>& x) {
  return detail::activation("haliax::nn::gelu_new", x, detail::gelu_tanh_fn{}, detail::gelu_tanh_grad_fn{});
}

/// x for x >= 0, negative_slope * x otherwise (upstream default slope 0.01); keeps every axis.
///   auto h = haliax::nn::leaky_relu(x, 0.2);   // {-1, 2} -> {-0.2, 2}
template <FloatElement T, class Axes>
named_array<T, Axes> leaky_relu(const named_array<T, Axes>& x, double negative_slope = 0.01) {
  return detail::activation("haliax::nn::leaky_relu", x, detail::leaky_relu_fn{negative_slope},
                            detail::leaky_relu_grad_fn{negative_slope});
}

/// x for x > 0, alpha * (exp(x) - 1) otherwise; keeps every axis.
///   auto h = haliax::nn::elu(x);   // {-inf, 2} -> {-1, 2}
template <FloatElement T, class Axes>
named_array<T, Axes> elu(const named_array<T, Axes>& x, double alpha = 1.0) {
  return detail::activation("haliax::nn::elu", x, detail::elu_fn{alpha}, detail::elu_grad_fn{alpha});
}

/// max(x, 0) + alpha * expm1(min(x, 0) / alpha); keeps every axis.
///   auto h = haliax::nn::celu(x, 1.0);   // == elu(x) for alpha 1
template <FloatElement T, class Axes>
named_array<T, Axes> celu(const named_array<T, Axes>& x, double alpha = 1.0) {
  return detail::activation("haliax::nn::celu", x, detail::celu_fn{alpha}, detail::celu_grad_fn{alpha});
}

/// Scaled ELU with the self-normalising constants (scale 1.0507..., alpha 1.6733...); keeps every axis.
///   auto h = haliax::nn::selu(x);   // {1} -> {1.0507}
template <FloatElement T, class Axes>
named_array<T, Axes> selu(const named_array<T, Axes>& x) {
  return detail::activation("haliax::nn::selu", x, detail::selu_fn{}, detail::selu_grad_fn{});
}

/// Re-exported so that model code can write every activation as `nn::...`.
using haliax::tanh;

namespace detail {
/// glu's forward: out = a * sigmoid(b) for the two halves a, b of the split axis.
template <class T>
void glu_kernel(const T* in, T* out, std::int64_t outer, std::int64_t h, std::int64_t inner) {
  using V = compute_t<T>;
  Kokkos::parallel_for(
      "haliax::nn::glu", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, outer * h), KOKKOS_LAMBDA(std::int64_t w) {
        const std::int64_t o = w / h, j = w - o * h;
        const T* a = in + (o * 2 * h + j) * inner;
        const T* b = a + h * inner;
        T* q = out + w * inner;
        for (std::int64_t i = 0; i < inner; ++i) {
          const V av = ld(a, i);
          st(q, i, av * sigmoid_v(ld(b, i)));
        }
      });
}

/// glu's gradient: for each (outer, j) the gradient into both halves (a named function: nvcc does not allow a
/// device lambda inside the generic lambda that records the backward).
template <class T>
void glu_grad_kernel(const T* in, const T* pg, T* out, std::int64_t outer, std::int64_t h, std::int64_t inner) {
  using V = compute_t<T>;
  Kokkos::parallel_for(
      "haliax::nn::glu_grad", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, outer * h), KOKKOS_LAMBDA(std::int64_t w) {
        const std::int64_t o = w / h, j = w - o * h;
        const std::int64_t ia = (o * 2 * h + j) * inner, ib = ia + h * inner;
        const T* gq = pg + w * inner;
        for (std::int64_t i = 0; i < inner; ++i) {
          const V gv = ld(gq, i), av = ld(in + ia, i);
          const V s = sigmoid_v(ld(in + ib, i));
          st(out + ia, i, gv * s);
          st(out + ib, i, gv * av * s * (V(1) - s));
        }
      });
}
}  // namespace detail

/// Gated linear unit along `axis` (upstream `glu(x, axis)`): splits `axis` into a first half a and a second
/// half b and returns a * sigmoid(b). The result keeps every axis, with `axis` at half its size; an odd
/// size throws `shape_error`. Gradient: g * sigmoid(b) to a and g * a * sigmoid(b) * (1 - sigmoid(b)) to b.
///   auto h = haliax::nn::glu(x, Mlp);   // {batch, mlp=8} -> {batch, mlp=4}
///   // h[.., i] = x[.., i] * sigmoid(x[.., i + 4])
template <FloatElement T, class Axes, AxisOf<Axes> A>
named_array<T, Axes> glu(const named_array<T, Axes>& x, A axis) {
  constexpr std::size_t k = haliax::detail::index_of_v<haliax::detail::to_list<Axes>, std::remove_cvref_t<A>>;
  auto sp = detail::split_at<Axes, A>(x.sizes());
  if (sp.n % 2 != 0)
    throw shape_error("haliax::nn::glu: axis '" + std::string(std::remove_cvref_t<A>::name) + "' has odd size " +
                      std::to_string(sp.n) + " in " + x.shape_string() + "; it must split into two equal halves");
  auto rsizes = x.sizes();
  rsizes[k] = sp.n / 2;
  auto r = named_array<T, Axes>::allocate(rsizes, "haliax::nn::glu");
  const T* in = x.data();
  T* out = r.data();
  const std::int64_t h = sp.n / 2, inner = sp.inner;
  detail::glu_kernel<T>(in, out, sp.outer, h, inner);
  if (haliax::detail::ad::any_tracked(x))
    haliax::detail::ad::record(
        r,
        [xs = detail::untracked(x), h, inner, outer = sp.outer](const named_array<T, Axes>& g, auto) {
          auto dx = named_array<T, Axes>::allocate(xs.sizes(), "haliax::nn::glu_grad");
          detail::glu_grad_kernel<T>(xs.data(), g.data(), dx.data(), outer, h, inner);
          return std::tuple{dx};
        },
        x);
  return r;
}

}  // namespace haliax::nn
