// haliax/ops/elementwise.hpp: elementwise unary and binary ops with broadcasting by axis name.
//
// Broadcasting follows upstream Haliax: two arrays combine only if one's axis set contains the other's; the
// result has the axes, order and sizes of the larger one. Anything else (e.g. `axes<Batch>` with
// `axes<Embed>`) does not compile; use `broadcast_axis` / `broadcast_to` to say what you mean.
//
//   auto y = x * w + b;            // x: {batch, embed}, w: {embed}, b: {} -> {batch, embed}
//   auto m = haliax::maximum(y, 0.0f);
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "../core.hpp"
#include "../detail/ad.hpp"
#include "../detail/copy.hpp"
#include "../detail/math.hpp"
#include "../detail/nd_loop.hpp"

namespace haliax {

/// Axis lists that broadcast together: one contains the other.
template <class AxA, class AxB>
concept BroadcastCompatible = detail::subset_v<detail::to_list<AxA>, detail::to_list<AxB>> ||
    detail::subset_v<detail::to_list<AxB>, detail::to_list<AxA>>;

/// The axes of the result of broadcasting `AxA` with `AxB` (the superset, with its order).
template <class AxA, class AxB>
using broadcast_axes_t = std::conditional_t<detail::subset_v<detail::to_list<AxB>, detail::to_list<AxA>>, AxA, AxB>;

/// A plain number usable as the scalar side of an elementwise op.
template <class S>
concept Scalar = std::is_arithmetic_v<std::remove_cvref_t<S>>;

namespace detail {

/// Strides of array `a` (axes AxA, sizes sa) along each axis of result axes AxR (0 where AxA lacks the axis).
template <class AxR, class AxA, std::size_t NA>
std::array<std::int64_t, AxR::rank> strides_in(const std::array<std::int64_t, NA>& sa) {
  using LR = to_list<AxR>;
  using LA = to_list<AxA>;
  auto rs = row_major_strides(sa);
  std::array<std::int64_t, AxR::rank> out{};
  constexpr auto pos = positions_v<LA, LR>;
  for (std::size_t i = 0; i < AxR::rank; ++i) out[i] = pos[i] < static_cast<int>(NA) ? rs[pos[i]] : 0;
  return out;
}

/// Sizes of result axes AxR taken from array `a` whose axes contain them.
template <class AxR, class AxA, std::size_t NA>
std::array<std::int64_t, AxR::rank> sizes_in(const std::array<std::int64_t, NA>& sa) {
  constexpr auto pos = positions_v<to_list<AxA>, to_list<AxR>>;
  std::array<std::int64_t, AxR::rank> out{};
  for (std::size_t i = 0; i < AxR::rank; ++i) out[i] = sa[pos[i]];
  return out;
}

template <class In, class R>
using stored_t = std::conditional_t<std::is_same_v<R, bool>, bool, In>;

template <class T>
KOKKOS_INLINE_FUNCTION compute_t<T> load(const T* p, std::int64_t i) {
  return static_cast<compute_t<T>>(p[i]);
}

template <class T, class V>
KOKKOS_INLINE_FUNCTION void store(T* p, std::int64_t i, V v) {
  if constexpr (std::is_same_v<T, bf16>) {
    p[i] = bf16(static_cast<float>(v));
  } else {
    p[i] = static_cast<T>(v);
  }
}

/// out = op(x) elementwise; the output element type is `Out`.
template <class Out, class T, class Axes, class Op>
named_array<Out, Axes> map(const char* label, const named_array<T, Axes>& x, Op op) {
  auto r = named_array<Out, Axes>::allocate(x.sizes(), label);
  const T* in = x.data();
  Out* out = r.data();
  const std::int64_t n = x.element_count();
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<execution_space>(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { store(out, i, op(load(in, i))); });
  return r;
}

/// out = op(a, b) with broadcasting by name; `AxR` is the result's axis list.
template <class Out, class AxR, class TA, class AxA, class TB, class AxB, class Op>
named_array<Out, AxR> zip(const char* label, const named_array<TA, AxA>& a, const named_array<TB, AxB>& b, Op op) {
  check_shared_sizes(label, a, b);
  using LR = to_list<AxR>;
  std::array<std::int64_t, AxR::rank> rsizes;
  if constexpr (subset_v<LR, to_list<AxA>>) {
    rsizes = sizes_in<AxR, AxA>(a.sizes());
  } else {
    rsizes = sizes_in<AxR, AxB>(b.sizes());
  }
  auto r = named_array<Out, AxR>::allocate(rsizes, label);
  auto so = row_major_strides(rsizes);
  auto sa = strides_in<AxR, AxA>(a.sizes());
  auto sb = strides_in<AxR, AxB>(b.sizes());
  const std::int64_t* st[3] = {so.data(), sa.data(), sb.data()};
  auto plan = make_plan<3>(static_cast<int>(AxR::rank), rsizes.data(), st);
  const TA* pa = a.data();
  const TB* pb = b.data();
  Out* po = r.data();
  nd_for_each<3>(
      label, plan, KOKKOS_LAMBDA(const std::int64_t* off, const std::int64_t* s, std::int64_t n) {
        Out* o = po + off[0];
        const TA* x = pa + off[1];
        const TB* y = pb + off[2];
        if (s[0] == 1 && s[1] == 1 && s[2] == 1) {
          for (std::int64_t j = 0; j < n; ++j) store(o, j, op(load(x, j), load(y, j)));
        } else if (s[0] == 1 && s[1] == 1 && s[2] == 0) {
          const auto yv = load(y, 0);
          for (std::int64_t j = 0; j < n; ++j) store(o, j, op(load(x, j), yv));
        } else if (s[0] == 1 && s[1] == 0 && s[2] == 1) {
          const auto xv = load(x, 0);
          for (std::int64_t j = 0; j < n; ++j) store(o, j, op(xv, load(y, j)));
        } else {
          for (std::int64_t j = 0; j < n; ++j) store(o, j * s[0], op(load(x, j * s[1]), load(y, j * s[2])));
        }
      });
  return r;
}

/// Copies `x` into a new array whose axes are `AxR` (a superset or permutation of x's), given result sizes.
/// Axes missing from x are broadcast.
template <class AxR, class T, class AxA>
named_array<T, AxR> broadcast_copy(const char* label, const named_array<T, AxA>& x,
                                   const std::array<std::int64_t, AxR::rank>& rsizes) {
  auto r = named_array<T, AxR>::allocate(rsizes, label);
  auto so = row_major_strides(rsizes);
  auto sa = strides_in<AxR, AxA>(x.sizes());
  copy_strided<T>(label, static_cast<int>(AxR::rank), r.data(), so.data(), x.data(), sa.data(), rsizes.data());
  return r;
}

// Functors. Each takes compute-type values and returns a compute-type value (or bool for predicates).
#define HALIAX_UNARY_FUNCTOR(NAME, EXPR)                \
  struct NAME##_fn {                                    \
    template <class V>                                  \
    KOKKOS_INLINE_FUNCTION auto operator()(V x) const { \
      return EXPR;                                      \
    }                                                   \
  };
HALIAX_UNARY_FUNCTOR(abs, x < V(0) ? -x : x)
HALIAX_UNARY_FUNCTOR(negative, -x)
HALIAX_UNARY_FUNCTOR(exp, math::exp(x))
HALIAX_UNARY_FUNCTOR(expm1, math::expm1(x))
HALIAX_UNARY_FUNCTOR(log, math::log(x))
HALIAX_UNARY_FUNCTOR(log1p, math::log1p(x))
HALIAX_UNARY_FUNCTOR(log2, math::log2(x))
HALIAX_UNARY_FUNCTOR(log10, math::log10(x))
HALIAX_UNARY_FUNCTOR(sqrt, math::sqrt(x))
HALIAX_UNARY_FUNCTOR(rsqrt, V(1) / math::sqrt(x))
HALIAX_UNARY_FUNCTOR(square, x* x)
HALIAX_UNARY_FUNCTOR(reciprocal, V(1) / x)
HALIAX_UNARY_FUNCTOR(tanh, math::tanh(x))
HALIAX_UNARY_FUNCTOR(sinh, math::sinh(x))
HALIAX_UNARY_FUNCTOR(cosh, math::cosh(x))
HALIAX_UNARY_FUNCTOR(sin, math::sin(x))
HALIAX_UNARY_FUNCTOR(cos, math::cos(x))
HALIAX_UNARY_FUNCTOR(tan, math::tan(x))
HALIAX_UNARY_FUNCTOR(arcsin, math::asin(x))
HALIAX_UNARY_FUNCTOR(arccos, math::acos(x))
HALIAX_UNARY_FUNCTOR(arctan, math::atan(x))
HALIAX_UNARY_FUNCTOR(erf, math::erf(x))
HALIAX_UNARY_FUNCTOR(sign, V((V(0) < x) - (x < V(0))))
HALIAX_UNARY_FUNCTOR(floor, math::floor(x))
HALIAX_UNARY_FUNCTOR(ceil, math::ceil(x))
HALIAX_UNARY_FUNCTOR(trunc, math::trunc(x))
HALIAX_UNARY_FUNCTOR(round, math::nearbyint(x))
HALIAX_UNARY_FUNCTOR(isnan, bool(math::isnan(x)))
HALIAX_UNARY_FUNCTOR(isinf, bool(math::isinf(x)))
HALIAX_UNARY_FUNCTOR(isfinite, bool(math::isfinite(x)))
HALIAX_UNARY_FUNCTOR(logical_not, !x)
#undef HALIAX_UNARY_FUNCTOR

#define HALIAX_BINARY_FUNCTOR(NAME, EXPR)                    \
  struct NAME##_fn {                                         \
    template <class V>                                       \
    KOKKOS_INLINE_FUNCTION auto operator()(V a, V b) const { \
      return EXPR;                                           \
    }                                                        \
  };
HALIAX_BINARY_FUNCTOR(add, a + b)
HALIAX_BINARY_FUNCTOR(subtract, a - b)
HALIAX_BINARY_FUNCTOR(multiply, a* b)
HALIAX_BINARY_FUNCTOR(divide, a / b)
HALIAX_BINARY_FUNCTOR(power, V(math::pow(a, b)))
HALIAX_BINARY_FUNCTOR(maximum, (a != a) ? a : ((b != b) ? b : (a > b ? a : b)))
HALIAX_BINARY_FUNCTOR(minimum, (a != a) ? a : ((b != b) ? b : (a < b ? a : b)))
HALIAX_BINARY_FUNCTOR(fmod, V(math::fmod(a, b)))
HALIAX_BINARY_FUNCTOR(arctan2, V(math::atan2(a, b)))
HALIAX_BINARY_FUNCTOR(logaddexp, (a > b ? a : b) + math::log1p(math::exp(-((a > b ? a - b : b - a)))))
HALIAX_BINARY_FUNCTOR(equal, bool(a == b))
HALIAX_BINARY_FUNCTOR(not_equal, bool(a != b))
HALIAX_BINARY_FUNCTOR(less, bool(a < b))
HALIAX_BINARY_FUNCTOR(less_equal, bool(a <= b))
HALIAX_BINARY_FUNCTOR(greater, bool(a > b))
HALIAX_BINARY_FUNCTOR(greater_equal, bool(a >= b))
HALIAX_BINARY_FUNCTOR(logical_and, bool(a&& b))
HALIAX_BINARY_FUNCTOR(logical_or, bool(a || b))
HALIAX_BINARY_FUNCTOR(logical_xor, bool(bool(a) != bool(b)))
#undef HALIAX_BINARY_FUNCTOR

template <class F, class T>
using unary_result_t = stored_t<T, decltype(std::declval<F>()(std::declval<compute_t<T>>()))>;
template <class F, class T>
using binary_result_t =
    stored_t<T, decltype(std::declval<F>()(std::declval<compute_t<T>>(), std::declval<compute_t<T>>()))>;

/// Binds a scalar as the right (or left) operand of a binary functor.
template <class F, class V, bool ScalarOnLeft>
struct bind_scalar {
  F f;
  V s;
  template <class X>
  KOKKOS_INLINE_FUNCTION auto operator()(X x) const {
    if constexpr (ScalarOnLeft) {
      return f(static_cast<X>(s), x);
    } else {
      return f(x, static_cast<X>(s));
    }
  }
};

}  // namespace detail

// ---------------------------------------------------------------------------------------------------------
// Unary ops: the result has the input's axes. Float-only ones are constrained to float element types.

#define HALIAX_DEFINE_UNARY(NAME, CONSTRAINT)                                                                   \
  /** Elementwise NAME; keeps every axis. */                                                                    \
  template <CONSTRAINT T, class Axes>                                                                           \
  auto NAME(const named_array<T, Axes>& x) {                                                                    \
    return detail::map<detail::unary_result_t<detail::NAME##_fn, T>>("haliax::" #NAME, x, detail::NAME##_fn{}); \
  }
HALIAX_DEFINE_UNARY(abs, NumericElement)
HALIAX_DEFINE_UNARY(negative, NumericElement)
HALIAX_DEFINE_UNARY(square, NumericElement)
HALIAX_DEFINE_UNARY(sign, NumericElement)
HALIAX_DEFINE_UNARY(exp, FloatElement)
HALIAX_DEFINE_UNARY(expm1, FloatElement)
HALIAX_DEFINE_UNARY(log, FloatElement)
HALIAX_DEFINE_UNARY(log1p, FloatElement)
HALIAX_DEFINE_UNARY(log2, FloatElement)
HALIAX_DEFINE_UNARY(log10, FloatElement)
HALIAX_DEFINE_UNARY(sqrt, FloatElement)
HALIAX_DEFINE_UNARY(rsqrt, FloatElement)
HALIAX_DEFINE_UNARY(reciprocal, FloatElement)
HALIAX_DEFINE_UNARY(tanh, FloatElement)
HALIAX_DEFINE_UNARY(sinh, FloatElement)
HALIAX_DEFINE_UNARY(cosh, FloatElement)
HALIAX_DEFINE_UNARY(sin, FloatElement)
HALIAX_DEFINE_UNARY(cos, FloatElement)
HALIAX_DEFINE_UNARY(tan, FloatElement)
HALIAX_DEFINE_UNARY(arcsin, FloatElement)
HALIAX_DEFINE_UNARY(arccos, FloatElement)
HALIAX_DEFINE_UNARY(arctan, FloatElement)
HALIAX_DEFINE_UNARY(erf, FloatElement)
HALIAX_DEFINE_UNARY(floor, FloatElement)
HALIAX_DEFINE_UNARY(ceil, FloatElement)
HALIAX_DEFINE_UNARY(trunc, FloatElement)
HALIAX_DEFINE_UNARY(round, FloatElement)
HALIAX_DEFINE_UNARY(isnan, FloatElement)
HALIAX_DEFINE_UNARY(isinf, FloatElement)
HALIAX_DEFINE_UNARY(isfinite, FloatElement)
#undef HALIAX_DEFINE_UNARY

/// Elementwise logical not of a bool array.
template <class Axes>
named_array<bool, Axes> logical_not(const named_array<bool, Axes>& x) {
  return detail::map<bool>("haliax::logical_not", x, detail::logical_not_fn{});
}

template <NumericElement T, class Axes>
named_array<T, Axes> operator-(const named_array<T, Axes>& x) {
  return negative(x);
}
template <class Axes>
named_array<bool, Axes> operator!(const named_array<bool, Axes>& x) {
  return logical_not(x);
}

// ---------------------------------------------------------------------------------------------------------
// Binary ops: array-array (broadcast by name, same element type), array-scalar and scalar-array.

#define HALIAX_DEFINE_BINARY(NAME, CONSTRAINT)                                                         \
  /** Elementwise NAME with broadcasting by axis name: one operand's axes must contain the other's. */ \
  template <CONSTRAINT T, class AxA, class AxB>                                                        \
  requires BroadcastCompatible<AxA, AxB>                                                               \
  auto NAME(const named_array<T, AxA>& a, const named_array<T, AxB>& b) {                              \
    return detail::zip<detail::binary_result_t<detail::NAME##_fn, T>, broadcast_axes_t<AxA, AxB>>(     \
        "haliax::" #NAME, a, b, detail::NAME##_fn{});                                                  \
  }                                                                                                    \
  /** Elementwise NAME of an array and a scalar. */                                                    \
  template <CONSTRAINT T, class Axes, Scalar S>                                                        \
  auto NAME(const named_array<T, Axes>& a, S s) {                                                      \
    using V = compute_t<T>;                                                                            \
    return detail::map<detail::binary_result_t<detail::NAME##_fn, T>>(                                 \
        "haliax::" #NAME, a, detail::bind_scalar<detail::NAME##_fn, V, false>{{}, static_cast<V>(s)}); \
  }                                                                                                    \
  /** Elementwise NAME of a scalar and an array. */                                                    \
  template <CONSTRAINT T, class Axes, Scalar S>                                                        \
  auto NAME(S s, const named_array<T, Axes>& a) {                                                      \
    using V = compute_t<T>;                                                                            \
    return detail::map<detail::binary_result_t<detail::NAME##_fn, T>>(                                 \
        "haliax::" #NAME, a, detail::bind_scalar<detail::NAME##_fn, V, true>{{}, static_cast<V>(s)});  \
  }
HALIAX_DEFINE_BINARY(subtract, NumericElement)
HALIAX_DEFINE_BINARY(divide, NumericElement)
HALIAX_DEFINE_BINARY(maximum, NumericElement)
HALIAX_DEFINE_BINARY(minimum, NumericElement)
HALIAX_DEFINE_BINARY(power, FloatElement)
HALIAX_DEFINE_BINARY(fmod, FloatElement)
HALIAX_DEFINE_BINARY(arctan2, FloatElement)
HALIAX_DEFINE_BINARY(logaddexp, FloatElement)
HALIAX_DEFINE_BINARY(equal, Element)
HALIAX_DEFINE_BINARY(not_equal, Element)
HALIAX_DEFINE_BINARY(less, NumericElement)
HALIAX_DEFINE_BINARY(less_equal, NumericElement)
HALIAX_DEFINE_BINARY(greater, NumericElement)
HALIAX_DEFINE_BINARY(greater_equal, NumericElement)
#undef HALIAX_DEFINE_BINARY

/// Elementwise sum with broadcasting by axis name: one operand's axes must contain the other's.
/// Gradient: `g` to each operand, summed over the axes it was broadcast along.
template <NumericElement T, class AxA, class AxB>
requires BroadcastCompatible<AxA, AxB>
auto add(const named_array<T, AxA>& a, const named_array<T, AxB>& b) {
  auto r = detail::zip<T, broadcast_axes_t<AxA, AxB>>("haliax::add", a, b, detail::add_fn{});
  if constexpr (FloatElement<T>) {
    if (detail::ad::any_tracked(a, b))
      detail::ad::record(
          r,
          [sa = a.sizes(), sb = b.sizes()](const auto& g, auto needs) {
            named_array<T, AxA> ga;
            named_array<T, AxB> gb;
            if (needs[0]) ga = detail::ad::unbroadcast<AxA>(g, sa);
            if (needs[1]) gb = detail::ad::unbroadcast<AxB>(g, sb);
            return std::tuple{ga, gb};
          },
          a, b);
  }
  return r;
}
/// Elementwise sum of an array and a scalar.
template <NumericElement T, class Axes, Scalar S>
auto add(const named_array<T, Axes>& a, S s) {
  using V = compute_t<T>;
  auto r = detail::map<T>("haliax::add", a, detail::bind_scalar<detail::add_fn, V, false>{{}, static_cast<V>(s)});
  if constexpr (FloatElement<T>) {
    if (detail::ad::any_tracked(a))
      detail::ad::record(r, [](const auto& g, auto) { return std::tuple{g}; }, a);
  }
  return r;
}
/// Elementwise sum of a scalar and an array.
template <NumericElement T, class Axes, Scalar S>
auto add(S s, const named_array<T, Axes>& a) {
  return add(a, s);
}

/// Elementwise product with broadcasting by axis name. Gradient: `g * b` to `a` and `g * a` to `b`, each
/// summed over the axes it was broadcast along.
template <NumericElement T, class AxA, class AxB>
requires BroadcastCompatible<AxA, AxB>
auto multiply(const named_array<T, AxA>& a, const named_array<T, AxB>& b) {
  using AxR = broadcast_axes_t<AxA, AxB>;
  auto r = detail::zip<T, AxR>("haliax::multiply", a, b, detail::multiply_fn{});
  if constexpr (FloatElement<T>) {
    if (detail::ad::any_tracked(a, b))
      detail::ad::record(
          r,
          [a, b](const named_array<T, AxR>& g, auto needs) {
            named_array<T, AxA> ga;
            named_array<T, AxB> gb;
            if (needs[0]) ga = detail::ad::unbroadcast<AxA>(detail::zip<T, AxR>("haliax::multiply_grad", g, b, detail::multiply_fn{}), a.sizes());
            if (needs[1]) gb = detail::ad::unbroadcast<AxB>(detail::zip<T, AxR>("haliax::multiply_grad", g, a, detail::multiply_fn{}), b.sizes());
            return std::tuple{ga, gb};
          },
          a, b);
  }
  return r;
}
/// Elementwise product of an array and a scalar.
template <NumericElement T, class Axes, Scalar S>
auto multiply(const named_array<T, Axes>& a, S s) {
  using V = compute_t<T>;
  auto r = detail::map<T>("haliax::multiply", a, detail::bind_scalar<detail::multiply_fn, V, false>{{}, static_cast<V>(s)});
  if constexpr (FloatElement<T>) {
    if (detail::ad::any_tracked(a))
      detail::ad::record(
          r,
          [v = static_cast<V>(s)](const auto& g, auto) {
            return std::tuple{detail::map<T>("haliax::multiply_grad", g,
                                             detail::bind_scalar<detail::multiply_fn, V, false>{{}, v})};
          },
          a);
  }
  return r;
}
/// Elementwise product of a scalar and an array.
template <NumericElement T, class Axes, Scalar S>
auto multiply(S s, const named_array<T, Axes>& a) {
  return multiply(a, s);
}

/// Bool arrays only: elementwise and / or / xor with broadcasting by name.
#define HALIAX_DEFINE_LOGICAL(NAME)                                                                    \
  template <class AxA, class AxB>                                                                      \
  requires BroadcastCompatible<AxA, AxB>                                                               \
  auto NAME(const named_array<bool, AxA>& a, const named_array<bool, AxB>& b) {                        \
    return detail::zip<bool, broadcast_axes_t<AxA, AxB>>("haliax::" #NAME, a, b, detail::NAME##_fn{}); \
  }
HALIAX_DEFINE_LOGICAL(logical_and)
HALIAX_DEFINE_LOGICAL(logical_or)
HALIAX_DEFINE_LOGICAL(logical_xor)
#undef HALIAX_DEFINE_LOGICAL

// Operators: the same rules as the named functions.
#define HALIAX_DEFINE_OPERATOR(OP, NAME)                                                              \
  template <NumericElement T, class AxA, class AxB>                                                   \
  requires BroadcastCompatible<AxA, AxB>                                                              \
  auto operator OP(const named_array<T, AxA>& a, const named_array<T, AxB>& b) { return NAME(a, b); } \
  template <NumericElement T, class Axes, Scalar S>                                                   \
  auto operator OP(const named_array<T, Axes>& a, S s) {                                              \
    return NAME(a, s);                                                                                \
  }                                                                                                   \
  template <NumericElement T, class Axes, Scalar S>                                                   \
  auto operator OP(S s, const named_array<T, Axes>& a) {                                              \
    return NAME(s, a);                                                                                \
  }
HALIAX_DEFINE_OPERATOR(+, add)
HALIAX_DEFINE_OPERATOR(-, subtract)
HALIAX_DEFINE_OPERATOR(*, multiply)
HALIAX_DEFINE_OPERATOR(/, divide)
HALIAX_DEFINE_OPERATOR(<, less)
HALIAX_DEFINE_OPERATOR(<=, less_equal)
HALIAX_DEFINE_OPERATOR(>, greater)
HALIAX_DEFINE_OPERATOR(>=, greater_equal)
#undef HALIAX_DEFINE_OPERATOR

template <class AxA, class AxB>
requires BroadcastCompatible<AxA, AxB>
auto operator&&(const named_array<bool, AxA>& a, const named_array<bool, AxB>& b) { return logical_and(a, b); }
template <class AxA, class AxB>
requires BroadcastCompatible<AxA, AxB>
auto operator||(const named_array<bool, AxA>& a, const named_array<bool, AxB>& b) { return logical_or(a, b); }

// ---------------------------------------------------------------------------------------------------------
// Broadcasting helpers, where, clip

/// `x` with extra axes: `broadcast_to(x, 4 * Batch, 768 * Embed)` has exactly the listed axes in that order
/// (upstream `broadcast_to` with `ensure_order=True`). Every axis of `x` must be listed; shared axes must
/// agree in size.
template <class T, class AxA, SizedAxis... S>
requires detail::subset_v<detail::to_list<AxA>, detail::mp::mp_list<typename S::axis_type...>> array_for<T, S...>
broadcast_to(const named_array<T, AxA>& x, S... s) {
  using AxR = typename array_for<T, S...>::axes_type;
  std::array<std::int64_t, sizeof...(S)> rsizes{s.size...};
  detail::check_shared_sizes_raw<AxA, AxR>("haliax::broadcast_to", x.sizes(), rsizes);
  return detail::broadcast_copy<AxR>("haliax::broadcast_to", x, rsizes);
}

/// `x` with new leading axes prepended (upstream `broadcast_axis`): `broadcast_axis(x, 4 * Batch)` turns
/// {embed} into {batch, embed}. The new axes must not already be axes of `x`.
template <class T, auto... A, SizedAxis... S>
requires(sizeof...(S) > 0 &&
         detail::disjoint_v<detail::mp::mp_list<typename S::axis_type...>,
                            detail::to_list<axes<A...>>>) auto broadcast_axis(const named_array<T, axes<A...>>& x,
                                                                              S... s) {
  using AxR = detail::to_axes<detail::mp::mp_list<typename S::axis_type..., std::remove_cvref_t<decltype(A)>...>>;
  std::array<std::int64_t, AxR::rank> rsizes;
  std::size_t i = 0;
  for (auto n : {s.size...}) rsizes[i++] = n;
  for (auto n : x.sizes()) rsizes[i++] = n;
  return detail::broadcast_copy<AxR>("haliax::broadcast_axis", x, rsizes);
}

namespace detail {
template <class L1, class L2, class L3>
using union3 = union_<union_<L1, L2>, L3>;

/// The axes of a three-way broadcast: the operand whose axes contain the other two.
template <class A1, class A2, class A3>
using broadcast3_axes_t = broadcast_axes_t<broadcast_axes_t<A1, A2>, A3>;

template <class A1, class A2, class A3>
concept Broadcast3 = BroadcastCompatible<A1, A2> && BroadcastCompatible<broadcast_axes_t<A1, A2>, A3>;

template <class T>
struct where_fn {
  template <class C, class V>
  KOKKOS_INLINE_FUNCTION V operator()(C c, V x, V y) const {
    return c ? x : y;
  }
};
}  // namespace detail

/// `where(cond, x, y)`: elementwise `cond ? x : y` with broadcasting by name among the three (one operand's
/// axes must contain the other two's). `x` or `y` may be a scalar.
template <class AxC, class T, class AxX, class AxY>
requires detail::Broadcast3<AxC, AxX, AxY>
auto where(const named_array<bool, AxC>& cond, const named_array<T, AxX>& x, const named_array<T, AxY>& y) {
  using AxR = detail::broadcast3_axes_t<AxC, AxX, AxY>;
  detail::check_shared_sizes("haliax::where", cond, x);
  detail::check_shared_sizes("haliax::where", cond, y);
  detail::check_shared_sizes("haliax::where", x, y);
  std::array<std::int64_t, AxR::rank> rsizes;
  if constexpr (std::is_same_v<AxR, AxC>) {
    rsizes = cond.sizes();
  } else if constexpr (std::is_same_v<AxR, AxX>) {
    rsizes = x.sizes();
  } else {
    rsizes = y.sizes();
  }
  auto r = named_array<T, AxR>::allocate(rsizes, "haliax::where");
  auto so = detail::row_major_strides(rsizes);
  auto sc = detail::strides_in<AxR, AxC>(cond.sizes());
  auto sx = detail::strides_in<AxR, AxX>(x.sizes());
  auto sy = detail::strides_in<AxR, AxY>(y.sizes());
  const std::int64_t* st[4] = {so.data(), sc.data(), sx.data(), sy.data()};
  auto plan = detail::make_plan<4>(static_cast<int>(AxR::rank), rsizes.data(), st);
  const bool* pc = cond.data();
  const T* px = x.data();
  const T* py = y.data();
  T* po = r.data();
  detail::nd_for_each<4>(
      "haliax::where", plan, KOKKOS_LAMBDA(const std::int64_t* off, const std::int64_t* s, std::int64_t n) {
        for (std::int64_t j = 0; j < n; ++j)
          po[off[0] + j * s[0]] = pc[off[1] + j * s[1]] ? px[off[2] + j * s[2]] : py[off[3] + j * s[3]];
      });
  return r;
}

/// `where(cond, x, scalar)`.
template <class AxC, class T, class AxX, Scalar S>
requires BroadcastCompatible<AxC, AxX>
auto where(const named_array<bool, AxC>& cond, const named_array<T, AxX>& x, S y) {
  return where(cond, x, full<T>(detail::from_double<T>(static_cast<double>(y))));
}

/// `where(cond, scalar, y)`.
template <class AxC, class T, class AxY, Scalar S>
requires BroadcastCompatible<AxC, AxY>
auto where(const named_array<bool, AxC>& cond, S x, const named_array<T, AxY>& y) {
  return where(cond, full<T>(detail::from_double<T>(static_cast<double>(x))), y);
}

/// Clamps every element into [lo, hi] (upstream `clip`); NaN stays NaN.
template <NumericElement T, class Axes, Scalar S1, Scalar S2>
named_array<T, Axes> clip(const named_array<T, Axes>& x, S1 lo, S2 hi) {
  return minimum(maximum(x, lo), hi);
}

/// Clamps with array bounds, broadcast by name against `x` (bounds' axes must be subsets of x's).
template <NumericElement T, class Axes, class AxL, class AxH>
requires detail::subset_v<detail::to_list<AxL>, detail::to_list<Axes>> &&
    detail::subset_v<detail::to_list<AxH>, detail::to_list<Axes>>
        named_array<T, Axes> clip(const named_array<T, Axes>& x, const named_array<T, AxL>& lo,
                                  const named_array<T, AxH>& hi) {
  return minimum(maximum(x, lo), hi);
}

}  // namespace haliax
