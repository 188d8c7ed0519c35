// haliax/random.hpp: counter-based random numbers on named arrays, equal to jax.random bit for bit.
//
//   namespace hr = haliax::random;
//   hr::key k = hr::make_key(0);                       // jax.random.PRNGKey(0)
//   auto [k1, k2] = hr::split(k);                      // jax.random.split(k)
//   auto w = hr::normal(k1, 768 * Embed, 3072 * Mlp);  // == jax.random.normal(k1, (768, 3072))
//   auto u = hr::uniform(k2, 4 * Batch, -1.0f, 1.0f);  // == jax.random.uniform(k2, (4,), minval=-1, maxval=1)
//   auto ids = hr::categorical(k, logits, Vocab);      // == jax.random.categorical(k, logits, axis=<Vocab's index>)
//
// A sampler takes a key, then sized axes, then its scalar parameters. The values are those jax.random
// produces for the shape formed by the sizes in the given order (the array's axis order), on the CPU backend
// with JAX's defaults: jax_threefry_partitionable=True and jax_enable_x64=False. Both settings have
// counterparts here (set_threefry_partitionable, seed_mode). Values are generated inside Kokkos kernels.
//
// float32 is exact for every sampler. float64 (JAX with x64 enabled) is supported by uniform and bernoulli.
// truncated_normal equals eager jax.random.truncated_normal and any jit in which the bounds are traced
// values; with literal bounds inside jit, XLA constant-folds erf with the C library and JAX's own results
// can differ from eager ones in the last bit.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core.hpp"
#include "detail/axis_algebra.hpp"
#include "detail/random_dists.hpp"
#include "detail/threefry.hpp"

namespace haliax::random {

using counter_mode = detail::threefry::counter_mode;
using seed_mode = detail::threefry::seed_mode;

// ---------------------------------------------------------------------------------------------------------
// Settings

namespace detail {
inline counter_mode& mode_setting() {
  static counter_mode m = haliax::detail::threefry::default_counter_mode;
  return m;
}
}  // namespace detail

/// jax_threefry_partitionable: true (JAX's default since 0.5) or false (the older counter layout).
/// Affects split and every sampler. Not thread-safe; set it once at start-up.
inline void set_threefry_partitionable(bool on) {
  detail::mode_setting() = on ? counter_mode::partitionable : counter_mode::original;
}
inline bool threefry_partitionable() { return detail::mode_setting() == counter_mode::partitionable; }

// ---------------------------------------------------------------------------------------------------------
// Keys

/// A threefry PRNG key: the two uint32 words of a JAX `uint32[2]` key.
struct key {
  std::uint32_t k0 = 0;
  std::uint32_t k1 = 0;

  constexpr key() = default;
  constexpr key(std::uint32_t w0, std::uint32_t w1) : k0(w0), k1(w1) {}
  constexpr explicit key(haliax::detail::threefry::key_data d) : k0(d.k0), k1(d.k1) {}

  constexpr haliax::detail::threefry::key_data data() const { return {k0, k1}; }
  friend constexpr bool operator==(const key&, const key&) = default;
};

/// jax.random.PRNGKey(seed). With seed_mode::x32 (JAX's default, x64 disabled) a seed of 2^32 or more wraps
/// to its low 32 bits; seed_mode::x64 keeps the high word as JAX does when x64 is enabled.
constexpr key make_key(std::uint64_t seed, seed_mode mode = seed_mode::x32) {
  return key(haliax::detail::threefry::prng_key(seed, mode));
}

/// jax.random.split(k): two new keys.
inline std::pair<key, key> split(key k) {
  const auto m = detail::mode_setting();
  return {key(haliax::detail::threefry::split_at(k.data(), 0, 2, m)),
          key(haliax::detail::threefry::split_at(k.data(), 1, 2, m))};
}

/// jax.random.split(k, n): n new keys.
inline std::vector<key> split(key k, std::size_t n) {
  std::vector<key> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i)
    out.emplace_back(haliax::detail::threefry::split_at(k.data(), i, n, detail::mode_setting()));
  return out;
}

/// jax.random.fold_in(k, data).
constexpr key fold_in(key k, std::uint32_t data) { return key(haliax::detail::threefry::fold_in(k.data(), data)); }

// ---------------------------------------------------------------------------------------------------------
// Sampler argument handling: a key, leading sized axes, then scalars.

namespace detail {
namespace mp = haliax::detail::mp;

template <class... Args>
constexpr std::size_t leading_sized_count() {
  constexpr bool is_sized[] = {SizedAxis<Args>..., false};
  std::size_t i = 0;
  while (is_sized[i]) ++i;
  return i;
}

template <class S>
using axis_of = typename std::remove_cvref_t<S>::axis_type;

template <class... Args>
using sized_prefix = mp::mp_take_c<mp::mp_list<std::remove_cvref_t<Args>...>, leading_sized_count<Args...>()>;

/// The array type a sampler returns for `Args` (its sized axes) and element type T.
template <class T, class... Args>
using result_t = named_array<T, haliax::detail::to_axes<mp::mp_transform<axis_of, sized_prefix<Args...>>>>;

/// Args are sized axes followed by exactly `NScalars` arithmetic values (or by none when `Optional`).
template <std::size_t NScalars, bool Optional, class... Args>
constexpr bool sampler_args_v = [] {
  constexpr std::size_t n_sized = leading_sized_count<Args...>();
  constexpr std::size_t n_rest = sizeof...(Args) - n_sized;
  constexpr bool arith[] = {std::is_arithmetic_v<std::remove_cvref_t<Args>>..., true};
  bool rest_arith = true;
  for (std::size_t i = n_sized; i < sizeof...(Args); ++i) rest_arith = rest_arith && arith[i];
  return rest_arith && (n_rest == NScalars || (Optional && n_rest == 0));
}();

template <class R, class... Args>
R allocate_result(const char* label, const std::tuple<Args...>& t) {
  constexpr std::size_t n = leading_sized_count<Args...>();
  return [&]<std::size_t... I>(std::index_sequence<I...>) { return R::allocate({std::get<I>(t).size...}, label); }
  (std::make_index_sequence<n>{});
}

/// The j-th scalar after the sized axes, converted to V (or `fallback` if there are none).
template <class V, std::size_t J, class... Args>
V scalar_arg(const std::tuple<Args...>& t, V fallback) {
  constexpr std::size_t n = leading_sized_count<Args...>();
  if constexpr (n + J < sizeof...(Args)) {
    return static_cast<V>(std::get<n + J>(t));
  } else {
    return fallback;
  }
}

/// Runs `f(i, n)` for every flat index of `out` in a Kokkos kernel and stores the result.
template <class T, class F>
void generate_raw(const char* label, T* p, std::int64_t n, F f) {
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        p[i] = static_cast<T>(f(static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(n)));
      });
}
template <class R, class F>
void generate(const char* label, R& out, F f) {
  generate_raw<typename R::value_type, F>(label, out.data(), out.element_count(), f);
}

namespace rd = haliax::detail::random_dists;
namespace tf = haliax::detail::threefry;

// The samplers' per-element functions, as functors (not device lambdas: nvcc names a lambda by its enclosing
// function, and cannot print a sampler's `axes<Tag{}...>` result type back as C++).
template <class KD, class M>
struct uniform32_fn {
  KD kd;
  M m;
  float lo, hi;
  KOKKOS_INLINE_FUNCTION float operator()(std::uint64_t i, std::uint64_t n) const {
    return rd::uniform_f32(tf::bits32_at(kd, i, n, m), lo, hi);
  }
};
template <class KD, class M>
struct uniform64_fn {
  KD kd;
  M m;
  double lo, hi;
  KOKKOS_INLINE_FUNCTION double operator()(std::uint64_t i, std::uint64_t n) const {
    return rd::uniform_f64(tf::bits64_at(kd, i, n, m), lo, hi);
  }
};
template <class KD, class M>
struct normal32_fn {
  KD kd;
  M m;
  KOKKOS_INLINE_FUNCTION float operator()(std::uint64_t i, std::uint64_t n) const {
    return rd::normal_f32(tf::bits32_at(kd, i, n, m));
  }
};
template <class KD, class M, class P>
struct truncated_normal32_fn {
  KD kd;
  M m;
  P p;
  KOKKOS_INLINE_FUNCTION float operator()(std::uint64_t i, std::uint64_t n) const {
    return rd::truncated_normal_f32(tf::bits32_at(kd, i, n, m), p);
  }
};
template <class KD, class M>
struct gumbel32_fn {
  KD kd;
  M m;
  KOKKOS_INLINE_FUNCTION float operator()(std::uint64_t i, std::uint64_t n) const {
    return rd::gumbel_f32(tf::bits32_at(kd, i, n, m));
  }
};
template <class KD, class M>
struct bernoulli32_fn {
  KD kd;
  M m;
  float p;
  KOKKOS_INLINE_FUNCTION bool operator()(std::uint64_t i, std::uint64_t n) const {
    return rd::bernoulli_f32(tf::bits32_at(kd, i, n, m), p);
  }
};
template <class KD, class M>
struct bernoulli64_fn {
  KD kd;
  M m;
  double p;
  KOKKOS_INLINE_FUNCTION bool operator()(std::uint64_t i, std::uint64_t n) const {
    return rd::bernoulli_f64(tf::bits64_at(kd, i, n, m), p);
  }
};
template <class KD, class M, class P>
struct randint32_fn {
  KD k_hi, k_lo;
  M m;
  P p;
  KOKKOS_INLINE_FUNCTION std::int32_t operator()(std::uint64_t i, std::uint64_t n) const {
    return rd::randint_i32(tf::bits32_at(k_hi, i, n, m), tf::bits32_at(k_lo, i, n, m), p);
  }
};

}  // namespace detail

/// The sized axes that lead a sampler's arguments have distinct names (a clash fails at the call and prints
/// `same_axis_name<{"embed"}, Embed, OtherEmbed>`).
template <class... Args>
concept DistinctSampledAxes = NoAxisNameClash<
    haliax::detail::name_clash_in<haliax::detail::mp::mp_transform<detail::axis_of, detail::sized_prefix<Args...>>>>;

// ---------------------------------------------------------------------------------------------------------
// Samplers

/// jax.random.uniform(k, shape, T, minval, maxval): `uniform(k, 4 * Batch)` in [0, 1) or
/// `uniform(k, 4 * Batch, 3 * Embed, -1.0f, 1.0f)`. T is float (32 random bits per value) or double (64
/// bits, JAX with x64 enabled).
template <class T = float, class... Args>
requires(std::is_same_v<T, float> || std::is_same_v<T, double>) &&
    detail::sampler_args_v<2, true, Args...> &&
    DistinctSampledAxes<Args...> detail::result_t<T, Args...> uniform(key k, Args... args) {
  using R = detail::result_t<T, Args...>;
  const std::tuple<Args...> t(args...);
  R out = detail::allocate_result<R>("haliax::random::uniform", t);
  const T lo = detail::scalar_arg<T, 0>(t, T(0)), hi = detail::scalar_arg<T, 1>(t, T(1));
  const auto kd = k.data();
  const auto m = detail::mode_setting();
  if constexpr (std::is_same_v<T, float>) {
    detail::generate(
        "haliax::random::uniform", out, detail::uniform32_fn<decltype(kd), decltype(m)>{kd, m, lo, hi});
  } else {
    detail::generate(
        "haliax::random::uniform", out, detail::uniform64_fn<decltype(kd), decltype(m)>{kd, m, lo, hi});
  }
  return out;
}

/// jax.random.normal(k, shape) (float32): `normal(k, 768 * Embed, 3072 * Mlp)`.
template <class T = float, class... Args>
requires std::is_same_v<T, float> && detail::sampler_args_v<0, true, Args...> &&
    DistinctSampledAxes<Args...> detail::result_t<T, Args...> normal(
    key k, Args... args) {
  using R = detail::result_t<T, Args...>;
  const std::tuple<Args...> t(args...);
  R out = detail::allocate_result<R>("haliax::random::normal", t);
  const auto kd = k.data();
  const auto m = detail::mode_setting();
  detail::generate(
      "haliax::random::normal", out, detail::normal32_fn<decltype(kd), decltype(m)>{kd, m});
  return out;
}

/// jax.random.truncated_normal(k, lower, upper, shape) (float32): `truncated_normal(k, 4 * X, -2.0f, 2.0f)`.
/// Values lie in the open interval (lower, upper).
template <class T = float, class... Args>
requires std::is_same_v<T, float> && detail::sampler_args_v<2, false, Args...> &&
    DistinctSampledAxes<Args...> detail::result_t<T, Args...>
truncated_normal(key k, Args... args) {
  using R = detail::result_t<T, Args...>;
  const std::tuple<Args...> t(args...);
  R out = detail::allocate_result<R>("haliax::random::truncated_normal", t);
  const auto p = detail::rd::make_truncated_normal_params(detail::scalar_arg<float, 0>(t, -2.0f),
                                                          detail::scalar_arg<float, 1>(t, 2.0f));
  const auto kd = k.data();
  const auto m = detail::mode_setting();
  detail::generate(
      "haliax::random::truncated_normal", out, detail::truncated_normal32_fn<decltype(kd), decltype(m), decltype(p)>{kd, m, p});
  return out;
}

/// jax.random.gumbel(k, shape) (float32, mode "low").
template <class T = float, class... Args>
requires std::is_same_v<T, float> && detail::sampler_args_v<0, true, Args...> &&
    DistinctSampledAxes<Args...> detail::result_t<T, Args...> gumbel(
    key k, Args... args) {
  using R = detail::result_t<T, Args...>;
  const std::tuple<Args...> t(args...);
  R out = detail::allocate_result<R>("haliax::random::gumbel", t);
  const auto kd = k.data();
  const auto m = detail::mode_setting();
  detail::generate(
      "haliax::random::gumbel", out, detail::gumbel32_fn<decltype(kd), decltype(m)>{kd, m});
  return out;
}

/// jax.random.bernoulli(k, p, shape): a bool array, `bernoulli(k, 4 * Batch, 0.3f)`. T is the type of p
/// (float, or double for JAX with x64 enabled); p defaults to 0.5.
template <class T = float, class... Args>
requires(std::is_same_v<T, float> || std::is_same_v<T, double>) &&
    detail::sampler_args_v<1, true, Args...> &&
    DistinctSampledAxes<Args...> detail::result_t<bool, Args...> bernoulli(key k, Args... args) {
  using R = detail::result_t<bool, Args...>;
  const std::tuple<Args...> t(args...);
  R out = detail::allocate_result<R>("haliax::random::bernoulli", t);
  const T p = detail::scalar_arg<T, 0>(t, T(0.5));
  const auto kd = k.data();
  const auto m = detail::mode_setting();
  if constexpr (std::is_same_v<T, float>) {
    detail::generate(
        "haliax::random::bernoulli", out, detail::bernoulli32_fn<decltype(kd), decltype(m)>{kd, m, p});
  } else {
    detail::generate(
        "haliax::random::bernoulli", out, detail::bernoulli64_fn<decltype(kd), decltype(m)>{kd, m, p});
  }
  return out;
}

/// jax.random.randint(k, shape, minval, maxval) as int32: `randint(k, 8 * Batch, 0, 50257)`. Bounds are
/// clipped to the int32 range as JAX does; maxval <= minval gives minval everywhere.
template <class... Args>
requires detail::sampler_args_v<2, false, Args...> &&
    DistinctSampledAxes<Args...> detail::result_t<std::int32_t, Args...> randint(key k,
                                                                                                   Args... args) {
  using R = detail::result_t<std::int32_t, Args...>;
  const std::tuple<Args...> t(args...);
  R out = detail::allocate_result<R>("haliax::random::randint", t);
  const auto p = detail::rd::make_randint_params(detail::scalar_arg<std::int64_t, 0>(t, 0),
                                                 detail::scalar_arg<std::int64_t, 1>(t, 0));
  const auto m = detail::mode_setting();
  const auto k_hi = detail::tf::split_at(k.data(), 0, 2, m), k_lo = detail::tf::split_at(k.data(), 1, 2, m);
  detail::generate(
      "haliax::random::randint", out, detail::randint32_fn<decltype(k_hi), decltype(m), decltype(p)>{k_hi, k_lo, m, p});
  return out;
}

namespace detail {
/// categorical's Gumbel-max (a named function: nvcc allows no device lambda in a function with a deduced return
/// type).
template <class KD, class M>
void categorical_kernel(KD kd, M m, const float* lp, std::int32_t* op, std::uint64_t n, std::int64_t outer,
                        std::int64_t inner, std::int64_t kcat) {
  Kokkos::parallel_for(
      "haliax::random::categorical", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, outer * inner),
      KOKKOS_LAMBDA(std::int64_t r) {
        const std::int64_t o = r / inner, in = r % inner;
        std::int32_t best = 0;
        float best_v = 0.0f;
        for (std::int64_t j = 0; j < kcat; ++j) {
          const std::int64_t flat = (o * kcat + j) * inner + in;
          const float v = detail::rd::fadd(
              detail::rd::gumbel_f32(detail::tf::bits32_at(kd, static_cast<std::uint64_t>(flat), n, m)), lp[flat]);
          if (j == 0 || (v != v && best_v == best_v) || v > best_v) {
            best = static_cast<std::int32_t>(j);
            best_v = v;
          }
        }
        op[r] = best;
      });
}
}  // namespace detail

/// jax.random.categorical(k, logits, axis) with the axis given by name: int32 indices along `Ax`, with the
/// other axes of `logits` in their order. Gumbel-max over float32 logits.
template <class Axes, AxisTag Ax>
requires AxisOf<Ax, Axes>
auto categorical(key k, const named_array<float, Axes>& logits, Ax) {
  namespace hd = haliax::detail;
  using L = hd::to_list<Axes>;
  using A = std::remove_cvref_t<Ax>;
  using R = named_array<std::int32_t, hd::to_axes<hd::difference<L, hd::mp::mp_list<A>>>>;
  constexpr std::size_t ax = hd::index_of_v<L, A>;
  const auto& sizes = logits.sizes();
  typename R::shape_type out_sizes{};
  std::int64_t outer = 1, inner = 1;
  for (std::size_t d = 0, o = 0; d < Axes::rank; ++d) {
    if (d < ax) outer *= sizes[d];
    if (d > ax) inner *= sizes[d];
    if (d != ax) out_sizes[o++] = sizes[d];
  }
  const std::int64_t kcat = sizes[ax];
  R out = R::allocate(out_sizes, "haliax::random::categorical");
  const std::uint64_t n = static_cast<std::uint64_t>(logits.element_count());
  const float* lp = logits.data();
  std::int32_t* op = out.data();
  detail::categorical_kernel(k.data(), detail::mode_setting(), lp, op, n, outer, inner, kcat);
  return out;
}

/// jax.random.permutation(k, n) for the sized axis `n * Ax`: a shuffled int32 arange along Ax.
template <AxisTag A>
array_for<std::int32_t, sized_axis<A>> permutation(key k, sized_axis<A> s) {
  const auto perm =
      haliax::detail::random_dists::permutation(k.data(), static_cast<std::size_t>(s.size), detail::mode_setting());
  return from_host<std::int32_t>(std::span<const std::int32_t>(perm.data(), perm.size()), s);
}

}  // namespace haliax::random
