// Per-element transforms from random bits to values, bit-compatible with
// jax.random on the XLA CPU backend.
//
// JAX expresses its samplers with XLA ops; XLA CPU then expands the
// transcendental ops with its own approximations (not libm), and its LLVM
// backend runs with FP-op fusion enabled, so a multiply whose only use is an
// add or subtract becomes one fused multiply-add on any CPU with FMA.  The
// functions below follow that machine code operation by operation: same
// constants, same order, ffma() exactly where XLA CPU emits an FMA, plain
// rounded operations elsewhere.  Sources of the facts: jax/_src/random/core.py
// (sampler formulas), XLA's ErfInv32 expansion (Giles' polynomial), the
// LLVM IR and object code XLA CPU emits for its log, log1p and erf
// (XLA_FLAGS=--xla_dump_to).  Checked exhaustively against JAX 0.10.2 over all
// 2^23 float32 uniform mantissas (tests/test_random_bits.cpp).
//
// Other products must not be contracted by the C++ compiler either.  The
// fmul/fadd helpers below make that true on the host (an empty asm hides the
// product from the contraction pass) and on CUDA/HIP devices (the _rn
// intrinsics are never contracted).
#pragma once

#include <Kokkos_Macros.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "haliax/detail/threefry.hpp"

namespace haliax::detail::random_dists {

// ---------------------------------------------------------------------------
// Exactly rounded arithmetic helpers.

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define HALIAX_RNG_DEVICE_PASS 1
#endif

#if !defined(HALIAX_RNG_DEVICE_PASS) && (defined(__GNUC__) || defined(__clang__))
#if defined(__x86_64__) || defined(__i386__)
#define HALIAX_RNG_OPAQUE(v) __asm__("" : "+x"(v))
#elif defined(__aarch64__)
#define HALIAX_RNG_OPAQUE(v) __asm__("" : "+w"(v))
#else
#define HALIAX_RNG_OPAQUE(v) __asm__("" : "+m"(v))
#endif
#else
#define HALIAX_RNG_OPAQUE(v) ((void)0)
#endif

KOKKOS_FORCEINLINE_FUNCTION float fmul(float a, float b) {
#ifdef HALIAX_RNG_DEVICE_PASS
  return __fmul_rn(a, b);
#else
  float r = a * b;
  HALIAX_RNG_OPAQUE(r);
  return r;
#endif
}
KOKKOS_FORCEINLINE_FUNCTION double fmul(double a, double b) {
#ifdef HALIAX_RNG_DEVICE_PASS
  return __dmul_rn(a, b);
#else
  double r = a * b;
  HALIAX_RNG_OPAQUE(r);
  return r;
#endif
}
KOKKOS_FORCEINLINE_FUNCTION float fadd(float a, float b) {
#ifdef HALIAX_RNG_DEVICE_PASS
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KOKKOS_FORCEINLINE_FUNCTION double fadd(double a, double b) {
#ifdef HALIAX_RNG_DEVICE_PASS
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
KOKKOS_FORCEINLINE_FUNCTION float fsub(float a, float b) { return fadd(a, -b); }
KOKKOS_FORCEINLINE_FUNCTION double fsub(double a, double b) { return fadd(a, -b); }
KOKKOS_FORCEINLINE_FUNCTION float ffma(float a, float b, float c) { return ::fmaf(a, b, c); }
KOKKOS_FORCEINLINE_FUNCTION double ffma(double a, double b, double c) { return ::fma(a, b, c); }

KOKKOS_FORCEINLINE_FUNCTION float f32_from_bits(std::uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
KOKKOS_FORCEINLINE_FUNCTION std::uint32_t bits_from_f32(float f) {
  std::uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
KOKKOS_FORCEINLINE_FUNCTION double f64_from_bits(std::uint64_t u) {
  double f;
  memcpy(&f, &u, sizeof f);
  return f;
}
KOKKOS_FORCEINLINE_FUNCTION std::uint64_t bits_from_f64(double f) {
  std::uint64_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

KOKKOS_FORCEINLINE_FUNCTION bool sign_bit(float f) { return (bits_from_f32(f) >> 31) != 0u; }
KOKKOS_FORCEINLINE_FUNCTION bool sign_bit(double f) { return (bits_from_f64(f) >> 63) != 0u; }

/// XLA maximum / minimum: NaN-propagating, -0 < +0.
template <class T>
KOKKOS_INLINE_FUNCTION T xla_max(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a == b) return sign_bit(a) ? b : a;
  return a > b ? a : b;
}
template <class T>
KOKKOS_INLINE_FUNCTION T xla_min(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a == b) return sign_bit(a) ? a : b;
  return a < b ? a : b;
}

/// lax.nextafter for float32 (XLA's bit-level expansion).
KOKKOS_INLINE_FUNCTION float nextafter_f32(float from, float to) {
  if (from != from || to != to) return f32_from_bits(0x7FC00000u);
  if (from == to) return to;
  const std::uint32_t b = bits_from_f32(from);
  if ((b & 0x7FFFFFFFu) == 0u)  // +-0: smallest subnormal toward `to`
    return f32_from_bits(to > 0.0f ? 1u : 0x80000001u);
  const bool away = (from < to) == (from > 0.0f);
  return f32_from_bits(away ? b + 1u : b - 1u);
}

// ---------------------------------------------------------------------------
// XLA CPU float32 transcendental expansions.

/// XLA CPU log(x) for float32 (Cephes-style range reduction to [sqrt(.5),
/// sqrt(2)), degree-8 polynomial, ln2 split in two).  Subnormal inputs are
/// flushed to FLT_MIN like XLA does.
KOKKOS_INLINE_FUNCTION float xla_log_f32(float v) {
  const float min_norm = 0x1p-126f;
  const float c = v > min_norm ? v : min_norm;
  const std::uint32_t cb = bits_from_f32(c);
  const float m = f32_from_bits((cb & 0x807FFFFFu) | 0x3F000000u);  // in [0.5, 1)
  float e = fadd(static_cast<float>(static_cast<std::int32_t>(cb >> 23) - 127), 1.0f);
  const bool small = m < 0x1.6a09e6p-1f;  // sqrt(0.5)
  e = fsub(e, small ? 1.0f : 0.0f);
  const float x = fadd(fadd(m, -1.0f), small ? m : 0.0f);
  const float x2 = fmul(x, x);
  const float x3 = fmul(x2, x);
  float y0 = ffma(x, 0x1.204376p-4f, -0x1.d7a370p-4f);
  float y1 = ffma(x, -0x1.fcba9ep-4f, 0x1.23d37ep-3f);
  float y2 = ffma(x, 0x1.999d58p-3f, -0x1.fffff8p-3f);
  y0 = ffma(y0, x, 0x1.de4a34p-4f);
  y1 = ffma(y1, x, -0x1.555ca0p-3f);
  y2 = ffma(y2, x, 0x1.555554p-2f);
  float y = ffma(y0, x3, y1);
  y = ffma(y, x3, y2);
  y = ffma(y, x3, fmul(e, -0x1.bd0106p-13f));
  float r = ffma(-x2, 0.5f, x);
  r = fadd(r, y);
  r = ffma(e, 0x1.630000p-1f, r);
  // Special values, selected bitwise as XLA does.
  if (v == 0.0f) return f32_from_bits(0xFF800000u);    // -inf
  if (v == f32_from_bits(0x7F800000u)) return v;       // +inf
  if (!(v > 0.0f)) return f32_from_bits(0xFFFFFFFFu);  // NaN (negative or NaN input)
  return r;
}

/// XLA CPU log1p(x) for float32: a rational approximation for |x| < sqrt(2)-1,
/// else log(1 + x).
KOKKOS_INLINE_FUNCTION float xla_log1p_f32(float x) {
  const float ax = x < 0.0f ? -x : x;
  if (!(ax < 0x1.a8279ap-2f)) return xla_log_f32(fadd(x, 1.0f));
  const float x2 = fmul(x, x);
  constexpr float den[7] = {0x1.000000p+0f, 0x1.e2035ap+3f, 0x1.4c30b6p+6f, 0x1.bb865ap+7f,
                            0x1.351946p+8f, 0x1.b0db14p+7f, 0x1.e0f304p+5f};
  constexpr float num[7] = {0x1.7bc096p-15f, 0x1.fe818ap-2f, 0x1.a509f4p+2f, 0x1.de9738p+4f,
                            0x1.e798ecp+5f,  0x1.c8e75ap+5f, 0x1.40a202p+4f};
  float q = den[0];
  float p = num[0];
  for (int k = 1; k < 7; ++k) {
    q = ffma(q, x, den[k]);
    p = ffma(p, x, num[k]);
  }
  const float ratio = p / q;
  const float y = ffma(x2, -0.5f, fmul(fmul(x, x2), ratio));
  return fadd(x, y);
}

/// XLA CPU erf(x) for float32: clamp to |x| <= 3.7439213, odd rational
/// approximation evaluated with fused multiply-adds.
KOKKOS_INLINE_FUNCTION float xla_erf_f32(float x) {
  const float lim = 0x1.df38d0p+1f;
  const float ax = x < 0.0f ? -x : x;
  if (ax >= lim) return x < 0.0f ? -1.0f : 1.0f;
  const float xc = xla_min(xla_max(x, -lim), lim);
  const float x2 = fmul(xc, xc);
  float p = ffma(x2, 0x1.e05aa2p-13f, 0x1.bebb44p-9f);
  p = ffma(p, x2, 0x1.a16dd6p-5f);
  p = ffma(p, x2, 0x1.7b4e80p-3f);
  p = ffma(p, x2, 0x1.20dd74p+0f);
  const float num = fmul(xc, p);
  float q = ffma(x2, -0x1.fa720cp-24f, 0x1.8b11bep-16f);
  q = ffma(q, x2, 0x1.0ada50p-10f);
  q = ffma(q, x2, 0x1.cd0fa8p-7f);
  q = ffma(q, x2, 0x1.c69842p-4f);
  q = ffma(q, x2, 0x1.fd6894p-2f);
  q = ffma(q, x2, 1.0f);
  return num / q;
}

/// XLA's ErfInv expansion for float32 (Giles 2010, single precision).
KOKKOS_INLINE_FUNCTION float xla_erfinv_f32(float u) {
  const float w = -xla_log1p_f32(fmul(u, -u));
  const bool central = w < 5.0f;
  constexpr float lt[9] = {0x1.e2cb10p-26f,  0x1.70966cp-22f, -0x1.d8e6aep-19f, -0x1.26b582p-18f, 0x1.ca65b6p-13f,
                           -0x1.48a810p-10f, -0x1.11c9dep-8f, 0x1.f91ec6p-3f,   0x1.805c5ep+0f};
  constexpr float ge[9] = {-0x1.a3e136p-13f, 0x1.a76ad6p-14f, 0x1.61b8e4p-10f, -0x1.e17bcep-9f, 0x1.7824f6p-8f,
                           -0x1.f38baep-8f,  0x1.354afcp-7f,  0x1.006db6p+0f,  0x1.6a9efcp+1f};
  const float* c = central ? lt : ge;
  const float t = central ? fadd(w, -2.5f) : fadd(::sqrtf(w), -3.0f);
  float p = c[0];
  for (int k = 1; k < 9; ++k) p = ffma(p, t, c[k]);
  const float au = u < 0.0f ? -u : u;
  return au == 1.0f ? fmul(u, f32_from_bits(0x7F800000u)) : fmul(p, u);
}

// ---------------------------------------------------------------------------
// Samplers (one element from its random bits).

/// jax.random.uniform float32: mantissa trick then affine map, clamped below.
KOKKOS_INLINE_FUNCTION float uniform_f32(std::uint32_t bits, float minval, float maxval) {
  const float f = fadd(f32_from_bits((bits >> 9) | 0x3F800000u), -1.0f);
  return xla_max(minval, ffma(f, fsub(maxval, minval), minval));
}

/// jax.random.uniform float64 (x64 mode, 64 random bits per value).
KOKKOS_INLINE_FUNCTION double uniform_f64(std::uint64_t bits, double minval, double maxval) {
  const double f = fadd(f64_from_bits((bits >> 12) | 0x3FF0000000000000ull), -1.0);
  return xla_max(minval, ffma(f, fsub(maxval, minval), minval));
}

/// jax.random.normal float32: sqrt(2) * erfinv(uniform(nextafter(-1, 0), 1)).
KOKKOS_INLINE_FUNCTION float normal_f32(std::uint32_t bits) {
  const float u = uniform_f32(bits, -0x1.fffffep-1f, 1.0f);
  return fmul(xla_erfinv_f32(u), 0x1.6a09e6p+0f);
}

/// jax.random.bernoulli(p) for float32 p.
KOKKOS_INLINE_FUNCTION bool bernoulli_f32(std::uint32_t bits, float p) { return uniform_f32(bits, 0.0f, 1.0f) < p; }
KOKKOS_INLINE_FUNCTION bool bernoulli_f64(std::uint64_t bits, double p) { return uniform_f64(bits, 0.0, 1.0) < p; }

/// jax.random.gumbel float32, mode "low": -log(-log(uniform(tiny, 1))).
KOKKOS_INLINE_FUNCTION float gumbel_f32(std::uint32_t bits) {
  const float u = uniform_f32(bits, 0x1p-126f, 1.0f);
  return -xla_log_f32(-xla_log_f32(u));
}

/// Precomputed bounds of jax.random.truncated_normal(lower, upper), float32.
struct truncated_normal_params {
  float a;        ///< erf(lower / sqrt 2): uniform minval
  float b;        ///< erf(upper / sqrt 2): uniform maxval
  float clip_lo;  ///< nextafter(lower, +inf)
  float clip_hi;  ///< nextafter(upper, -inf)
};

KOKKOS_INLINE_FUNCTION truncated_normal_params make_truncated_normal_params(float lower, float upper) {
  // XLA rewrites x / sqrt(2) as x * (1 / sqrt(2)) with the float32 reciprocal.
  const float rsqrt2 = 0x1.6a09e6p-1f;
  truncated_normal_params p{};
  p.a = xla_erf_f32(fmul(lower, rsqrt2));
  p.b = xla_erf_f32(fmul(upper, rsqrt2));
  p.clip_lo = nextafter_f32(lower, f32_from_bits(0x7F800000u));
  p.clip_hi = nextafter_f32(upper, f32_from_bits(0xFF800000u));
  return p;
}

KOKKOS_INLINE_FUNCTION float truncated_normal_f32(std::uint32_t bits, const truncated_normal_params& p) {
  const float u = uniform_f32(bits, p.a, p.b);
  const float out = fmul(xla_erfinv_f32(u), 0x1.6a09e6p+0f);
  return xla_min(p.clip_hi, xla_max(p.clip_lo, out));
}

/// Precomputed span arithmetic of jax.random.randint for 32-bit integers.
/// minval / maxval are the user's (wider) values; they are clipped to the
/// int32 range like JAX does, and maxval > INT32_MAX widens the span by one.
struct randint_params {
  std::int32_t minval;
  std::uint32_t span;
  std::uint32_t multiplier;
};

KOKKOS_INLINE_FUNCTION randint_params make_randint_params(std::int64_t minval, std::int64_t maxval) {
  constexpr std::int64_t lo = -2147483648LL, hi = 2147483647LL;
  const bool max_out_of_range = maxval > hi;
  const std::int64_t mn = minval < lo ? lo : (minval > hi ? hi : minval);
  const std::int64_t mx = maxval < lo ? lo : (maxval > hi ? hi : maxval);
  std::uint32_t span = static_cast<std::uint32_t>(mx) - static_cast<std::uint32_t>(mn);
  if (mx <= mn) span = 1u;
  if (max_out_of_range && mx > mn) span += 1u;
  randint_params p{};
  p.minval = static_cast<std::int32_t>(mn);
  p.span = span;
  if (span == 0u) {  // 2^32 wraps to 0: remainders by zero are identity in XLA
    p.multiplier = 0u;
  } else {
    std::uint32_t m = 65536u % span;
    p.multiplier = (m * m) % span;
  }
  return p;
}

/// XLA unsigned remainder: x % 0 == x.
KOKKOS_FORCEINLINE_FUNCTION std::uint32_t xla_urem(std::uint32_t x, std::uint32_t y) { return y == 0u ? x : x % y; }

/// One jax.random.randint int32 value from the two bit draws (the first from
/// split(key)[0], the second from split(key)[1]).
KOKKOS_INLINE_FUNCTION std::int32_t randint_i32(std::uint32_t higher_bits, std::uint32_t lower_bits,
                                                const randint_params& p) {
  std::uint32_t off = xla_urem(higher_bits, p.span) * p.multiplier + xla_urem(lower_bits, p.span);
  off = xla_urem(off, p.span);
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(p.minval) + off);
}

// ---------------------------------------------------------------------------
// Host-side samplers that need more than one element.

namespace tf = haliax::detail::threefry;

/// jax.random.categorical(key, logits, axis) for a row-major float32 logits
/// array of shape `shape`; returns the int32 indices (shape with `axis`
/// removed).  Gumbel noise is drawn for the full logits shape.
inline std::vector<std::int32_t> categorical_f32(tf::key_data key, const float* logits,
                                                 const std::vector<std::size_t>& shape, int axis,
                                                 tf::counter_mode mode = tf::default_counter_mode) {
  const int rank = static_cast<int>(shape.size());
  if (axis < 0) axis += rank;
  std::size_t n = 1, outer = 1, inner = 1;
  for (int d = 0; d < rank; ++d) {
    n *= shape[d];
    if (d < axis) outer *= shape[d];
    if (d > axis) inner *= shape[d];
  }
  const std::size_t k = shape[axis];
  std::vector<std::int32_t> out(outer * inner);
  for (std::size_t o = 0; o < outer; ++o) {
    for (std::size_t in = 0; in < inner; ++in) {
      std::int32_t best = 0;
      float best_v = 0.0f;
      for (std::size_t j = 0; j < k; ++j) {
        const std::size_t flat = (o * k + j) * inner + in;
        const float v = fadd(gumbel_f32(tf::bits32_at(key, flat, n, mode)), logits[flat]);
        const bool take = j == 0 || (v != v && best_v == best_v) || v > best_v;
        if (take) {
          best = static_cast<std::int32_t>(j);
          best_v = v;
        }
      }
      out[o * inner + in] = best;
    }
  }
  return out;
}

/// Number of sort rounds jax.random.permutation uses for n elements.
inline int permutation_rounds(std::size_t n) {
  const double size = static_cast<double>(n < 1 ? 1 : n);
  return static_cast<int>(std::ceil(3.0 * std::log(size) / std::log(4294967295.0)));
}

/// jax.random.permutation(key, n): repeated stable sorts by fresh 32-bit keys.
inline std::vector<std::int32_t> permutation(tf::key_data key, std::size_t n,
                                             tf::counter_mode mode = tf::default_counter_mode) {
  std::vector<std::int32_t> x(n);
  std::iota(x.begin(), x.end(), 0);
  std::vector<std::pair<std::uint32_t, std::int32_t>> kv(n);
  const int rounds = permutation_rounds(n);
  for (int r = 0; r < rounds; ++r) {
    const tf::key_data next = tf::split_at(key, 0, 2, mode);
    const tf::key_data sub = tf::split_at(key, 1, 2, mode);
    key = next;
    for (std::size_t i = 0; i < n; ++i) kv[i] = {tf::bits32_at(sub, i, n, mode), x[i]};
    std::stable_sort(kv.begin(), kv.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (std::size_t i = 0; i < n; ++i) x[i] = kv[i].second;
  }
  return x;
}

}  // namespace haliax::detail::random_dists
