// haliax/ops/elementwise.hpp: elementwise unary and binary ops with broadcasting by axis name.
//
// Broadcasting follows upstream Haliax: two arrays combine only if one's axis set contains the other's; the
// result has the axes, order and sizes of the larger one. Anything else (e.g. `axes<Batch>` with
// `axes<Embed>`) does not compile; use `broadcast_axis` / `broadcast_to` to say what you mean.
//
//   auto y = x * w + b;            // x: {batch, embed}, w: {embed}, b: {} -> {batch, embed}
//   auto m = haliax::maximum(y, 0.0f);
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../core.hpp"
#include "../detail/ad.hpp"
#include "../detail/copy.hpp"
#include "../detail/math.hpp"
#include "../detail/nd_loop.hpp"

namespace haliax {

/// One of the axis lists `A`, `B` (`axis_types<...>`) contains the other: the step of `BroadcastCompatible`
/// that names both lists.
template <class A, class B>
concept NestedAxes = detail::subset_v<A, B> || detail::subset_v<B, A>;

/// Axis lists that broadcast together: one contains the other.
template <class AxA, class AxB>
concept BroadcastCompatible = NestedAxes<axis_types_of<AxA>, axis_types_of<AxB>>;

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

// map's and zip's kernels: functions of element types and the functor only (never of axis lists, which nvcc
// cannot name a device lambda by; see haliax::detail::fill_raw).
template <class Out, class T, class Op>
void map_kernel(const char* label, const T* in, Out* out, std::int64_t n, Op op) {
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { store(out, i, op(load(in, i))); });
}

template <class Out, class TA, class TB, class Op>
void zip_kernel(const char* label, const nd_plan<3>& plan, const TA* pa, const TB* pb, Out* po, Op op) {
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
}

template <class U, class T>
void astype_kernel(const T* in, U* out, std::int64_t n) {
  Kokkos::parallel_for(
      "haliax::astype", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        HALIAX_CAPTURE(in, out);
        if constexpr (std::is_same_v<U, bool>) {
          out[i] = static_cast<compute_t<T>>(in[i]) != compute_t<T>(0);
        } else if constexpr (std::is_same_v<U, bf16>) {
          out[i] = bf16(static_cast<float>(static_cast<compute_t<T>>(in[i])));
        } else {
          out[i] = static_cast<U>(static_cast<compute_t<T>>(in[i]));
        }
      });
}

/// out = op(x) elementwise; the output element type is `Out`.
template <class Out, class T, class Axes, class Op>
named_array<Out, Axes> map(const char* label, const named_array<T, Axes>& x, Op op) {
  auto r = named_array<Out, Axes>::allocate(x.sizes(), label);
  map_kernel<Out, T, Op>(label, x.data(), r.data(), x.element_count(), op);
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
  zip_kernel<Out, TA, TB, Op>(label, plan, a.data(), b.data(), r.data(), op);
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

// ---------------------------------------------------------------------------------------------------------
// Gradient machinery shared by the elementwise rules (and the reductions in reduction.hpp).

/// `x` without its autodiff node: what a backward rule captures. A rule keeps values only, so an output it
/// saves never holds its own node (which would be a reference cycle).
template <class T, class Axes>
named_array<T, Axes> without_node(named_array<T, Axes> x) {
  x.set_ad_node(nullptr);
  return x;
}

/// An operand element for `nary`. Bool arrays are read as bytes: GCC vectorises a byte load, not a bool one.
template <class T>
KOKKOS_INLINE_FUNCTION auto nary_load(const T* p, std::int64_t i) {
  if constexpr (std::is_same_v<T, bool>) {
    return reinterpret_cast<const unsigned char*>(p)[i] != 0;
  } else {
    return load(p, i);
  }
}

/// One operand of a unit-stride `nary` loop: contiguous along the loop, or (Const) broadcast along it, its one
/// value read once.
template <class T, bool Const>
struct nary_operand {
  const T* p;
  KOKKOS_INLINE_FUNCTION explicit nary_operand(const T* q) : p(q) {}
  KOKKOS_INLINE_FUNCTION auto operator()(std::int64_t j) const { return nary_load(p, j); }
};
template <class T>
struct nary_operand<T, true> {
  decltype(nary_load(static_cast<const T*>(nullptr), 0)) v;
  KOKKOS_INLINE_FUNCTION explicit nary_operand(const T* q) : v(nary_load(q, 0)) {}
  KOKKOS_INLINE_FUNCTION auto operator()(std::int64_t) const { return v; }
};

/// The body of `nary`: operand pointers are kept type-erased (a plain array copies to a device), each
/// restored to its element type where it is read. An inner run where every operand is contiguous or broadcast
/// takes a unit-stride loop specialised on which operands are broadcast (for up to 3 operands, 8 variants), so
/// it vectorises; any other run takes a strided loop.
template <class Out, class Op, class... T>
struct nary_kernel {
  static constexpr std::size_t K = sizeof...(T);
  Out* out;
  const void* in[K];
  Op op;

  template <class... P>
  KOKKOS_INLINE_FUNCTION void unit_loop(Out* o, std::int64_t n, P... p) const {
    for (std::int64_t j = 0; j < n; ++j) store(o, j, op(p(j)...));
  }
  template <unsigned Mask, std::size_t... I>
  KOKKOS_INLINE_FUNCTION void unit_run(Out* o, const std::int64_t* off, std::int64_t n,
                                       std::index_sequence<I...>) const {
    unit_loop(o, n, nary_operand<T, ((Mask >> I) & 1u) != 0>(static_cast<const T*>(in[I]) + off[I + 1])...);
  }
  template <std::size_t... I, unsigned... M>
  KOKKOS_INLINE_FUNCTION void dispatch(Out* o, const std::int64_t* off, std::int64_t n, unsigned mask,
                                       std::index_sequence<I...> is, std::integer_sequence<unsigned, M...>) const {
    (void)((mask == M ? (unit_run<M>(o, off, n, is), true) : false) || ...);
  }

  template <std::size_t... I>
  KOKKOS_INLINE_FUNCTION void run(const std::int64_t* off, const std::int64_t* s, std::int64_t n,
                                  std::index_sequence<I...> is) const {
    Out* o = out + off[0];
    if constexpr (K <= 3) {
      if (s[0] == 1 && ((s[I + 1] == 1 || s[I + 1] == 0) && ...)) {
        const unsigned mask = ((s[I + 1] == 0 ? 1u << I : 0u) | ... | 0u);
        dispatch(o, off, n, mask, is, std::make_integer_sequence<unsigned, (1u << K)>{});
        return;
      }
    } else {
      if (s[0] == 1 && ((s[I + 1] == 1) && ...)) {
        unit_run<0u>(o, off, n, is);
        return;
      }
    }
    for (std::int64_t j = 0; j < n; ++j)
      store(o, j * s[0], op(nary_load(static_cast<const T*>(in[I]) + off[I + 1], j * s[I + 1])...));
  }
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t* off, const std::int64_t* s, std::int64_t n) const {
    run(off, s, n, std::index_sequence_for<T...>{});
  }
};

/// out = op(in...) elementwise in one kernel. The result has axes `AxR` and sizes `rsizes`; every operand's
/// axes are a subset of AxR (any order) and it is broadcast along the ones it lacks. `op` takes compute-type
/// values (bool for bool operands). The engine under the gradient rules.
template <class Out, class AxR, class Op, class... T, class... Ax>
named_array<Out, AxR> nary(const char* label, const std::array<std::int64_t, AxR::rank>& rsizes, Op op,
                           const named_array<T, Ax>&... in) {
  constexpr int N = static_cast<int>(sizeof...(T)) + 1;
  auto r = named_array<Out, AxR>::allocate(rsizes, label);
  std::array<std::array<std::int64_t, AxR::rank>, N> strides{row_major_strides(rsizes),
                                                             strides_in<AxR, Ax>(in.sizes())...};
  const std::int64_t* st[N];
  for (int k = 0; k < N; ++k) st[k] = strides[k].data();
  auto plan = make_plan<N>(static_cast<int>(AxR::rank), rsizes.data(), st);
  nd_for_each<N>(label, plan, nary_kernel<Out, Op, T...>{r.data(), {static_cast<const void*>(in.data())...}, op});
  return r;
}

/// The derivative of a unary functor F, as a map from the output gradient g to the input gradient given the
/// input x and the output y: `d(g, x, y)`. Only what `uses_x` / `uses_y` name is loaded (and saved by the
/// forward), so rules expressible from the output (exp, tanh, sqrt, ...) keep the output only. The primary
/// template means "no gradient": piecewise-constant functions (sign, floor, ceil, trunc, round, as JAX) and
/// predicates, whose outputs are constants.
template <class F>
struct unary_grad {
  static constexpr bool defined = false;
};

#define HALIAX_UNARY_GRAD(NAME, USES_X, USES_Y, EXPR)                                                             \
  template <>                                                                                                     \
  struct unary_grad<NAME##_fn> {                                                                                  \
    static constexpr bool defined = true, uses_x = USES_X, uses_y = USES_Y;                                       \
    template <class V>                                                                                            \
    KOKKOS_INLINE_FUNCTION V operator()([[maybe_unused]] V g, [[maybe_unused]] V x, [[maybe_unused]] V y) const { \
      return EXPR;                                                                                                \
    }                                                                                                             \
  };
// abs: JAX's convention, +g for x >= 0 (so +1 at 0) and -g below.
HALIAX_UNARY_GRAD(abs, true, false, x >= V(0) ? g : -g)
HALIAX_UNARY_GRAD(negative, false, false, -g)
HALIAX_UNARY_GRAD(square, true, false, V(2) * x * g)
HALIAX_UNARY_GRAD(exp, false, true, g* y)
HALIAX_UNARY_GRAD(expm1, false, true, g*(y + V(1)))
HALIAX_UNARY_GRAD(log, true, false, g / x)
HALIAX_UNARY_GRAD(log1p, true, false, g / (V(1) + x))
HALIAX_UNARY_GRAD(log2, true, false, g / (x * V(0.693147180559945309417232121458176568)))
HALIAX_UNARY_GRAD(log10, true, false, g / (x * V(2.302585092994045684017991454684364208)))
HALIAX_UNARY_GRAD(sqrt, false, true, g* V(0.5) / y)
HALIAX_UNARY_GRAD(rsqrt, false, true, V(-0.5) * g * y * y * y)
HALIAX_UNARY_GRAD(reciprocal, false, true, -g* y* y)
HALIAX_UNARY_GRAD(tanh, false, true, g*(V(1) - y * y))
HALIAX_UNARY_GRAD(sinh, true, false, g* math::cosh(x))
HALIAX_UNARY_GRAD(cosh, true, false, g* math::sinh(x))
HALIAX_UNARY_GRAD(sin, true, false, g* math::cos(x))
HALIAX_UNARY_GRAD(cos, true, false, -g* math::sin(x))
HALIAX_UNARY_GRAD(tan, false, true, g*(V(1) + y * y))
HALIAX_UNARY_GRAD(arcsin, true, false, g / math::sqrt(V(1) - x * x))
HALIAX_UNARY_GRAD(arccos, true, false, -g / math::sqrt(V(1) - x * x))
HALIAX_UNARY_GRAD(arctan, true, false, g / (V(1) + x * x))
HALIAX_UNARY_GRAD(erf, true, false, g* V(1.128379167095512573896158903121545172) * math::exp(-x * x))
#undef HALIAX_UNARY_GRAD

/// Adapters from `unary_grad<F>` to `nary` operands: (g), (g, x), (g, y) or (g, x, y).
template <class D, bool X, bool Y>
struct unary_grad_op {
  D d;
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V g) const {
    return d(g, V(0), V(0));
  }
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V g, V v) const {
    if constexpr (X) {
      return d(g, v, V(0));
    } else {
      return d(g, V(0), v);
    }
  }
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V g, V x, V y) const {
    return d(g, x, y);
  }
};

/// Records the backward rule of the unary op F that produced `y` from `x` (nothing when F has no gradient,
/// the element type is not float, or `x` is not tracked). Backward is one fused kernel.
template <class F, class Out, class T, class Axes>
void record_unary(const char* label, named_array<Out, Axes>& y, const named_array<T, Axes>& x) {
  if constexpr (FloatElement<T> && std::is_same_v<Out, T> && unary_grad<F>::defined) {
    if (!ad::any_tracked(x)) return;
    using D = unary_grad<F>;
    using Op = unary_grad_op<D, D::uses_x, D::uses_y>;
    named_array<T, Axes> sx, sy;
    if constexpr (D::uses_x) sx = without_node(x);
    if constexpr (D::uses_y) sy = without_node(y);
    ad::record(
        y,
        [label, sx, sy](const named_array<T, Axes>& g, auto) {
          if constexpr (D::uses_x && D::uses_y) {
            return std::tuple{nary<T, Axes>(label, g.sizes(), Op{}, g, sx, sy)};
          } else if constexpr (D::uses_x) {
            return std::tuple{nary<T, Axes>(label, g.sizes(), Op{}, g, sx)};
          } else if constexpr (D::uses_y) {
            return std::tuple{nary<T, Axes>(label, g.sizes(), Op{}, g, sy)};
          } else {
            return std::tuple{nary<T, Axes>(label, g.sizes(), Op{}, g)};
          }
        },
        x);
  }
}

/// 1 / (1 + exp(-d)), exponentiating only non-positive numbers (no overflow).
template <class V>
KOKKOS_INLINE_FUNCTION V stable_logistic(V d) {
  const V e = math::exp(d < V(0) ? d : -d);
  return d < V(0) ? e / (V(1) + e) : V(1) / (V(1) + e);
}

/// `a > b` without a floating-point exception on NaN (a quiet comparison, like `==`). Under GCC's default
/// -ftrapping-math a kernel that mixes `>` with `==` keeps its branches and does not vectorise; one that uses
/// this instead does.
template <class V>
KOKKOS_INLINE_FUNCTION bool quiet_greater(V a, V b) {
#if defined(__GNUC__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__) && !defined(__SYCL_DEVICE_ONLY__)
  return __builtin_isgreater(a, b);
#else
  return a > b;
#endif
}

/// The share of the gradient that `a` gets when the larger of a and b is chosen (JAX's rule): 1 where a > b,
/// 0.5 at a tie, 0 where a < b or either is NaN. Branch-free, so gradient kernels vectorise.
template <class V>
KOKKOS_INLINE_FUNCTION V tie_weight(V a, V b) {
  return (quiet_greater(a, b) ? V(1) : V(0)) + (a == b ? V(0.5) : V(0));
}

/// The partial derivatives of a binary functor F: `da(g, a, b)` and `db(g, a, b)` map the output gradient to
/// each operand's (before summing over broadcast axes). The primary template means "no gradient".
template <class F>
struct binary_grad {
  static constexpr bool defined = false;
};

#define HALIAX_BINARY_GRAD(NAME, DA, DB)                                                                  \
  template <>                                                                                             \
  struct binary_grad<NAME##_fn> {                                                                         \
    static constexpr bool defined = true;                                                                 \
    template <class V>                                                                                    \
    KOKKOS_INLINE_FUNCTION V da([[maybe_unused]] V g, [[maybe_unused]] V a, [[maybe_unused]] V b) const { \
      return DA;                                                                                          \
    }                                                                                                     \
    template <class V>                                                                                    \
    KOKKOS_INLINE_FUNCTION V db([[maybe_unused]] V g, [[maybe_unused]] V a, [[maybe_unused]] V b) const { \
      return DB;                                                                                          \
    }                                                                                                     \
  };
HALIAX_BINARY_GRAD(divide, g / b, -g* a / (b * b))
// maximum / minimum: the operand that is the result gets g; a tie splits it 0.5 / 0.5 (JAX). NaN gets 0.
HALIAX_BINARY_GRAD(maximum, g* tie_weight(a, b), g* tie_weight(b, a))
HALIAX_BINARY_GRAD(minimum, g* tie_weight(b, a), g* tie_weight(a, b))
// power: d/da is 0 where b == 0 (so 0^0 does not give NaN), d/db uses log(1) where a == 0 (JAX).
HALIAX_BINARY_GRAD(power, b == V(0) ? V(0) : g * b * V(math::pow(a, b - V(1))),
                   g* V(math::log(a == V(0) ? V(1) : a)) * V(math::pow(a, b)))
// fmod(a, b) = a - trunc(a / b) * b.
HALIAX_BINARY_GRAD(fmod, g, -g* V(math::trunc(a / b)))
HALIAX_BINARY_GRAD(arctan2, g* b / (a * a + b * b), -g* a / (a * a + b * b))
// logaddexp: each operand's softmax weight, sigmoid(a - b) and sigmoid(b - a); a tie (equal infinities
// included) gives 0.5 each.
HALIAX_BINARY_GRAD(logaddexp, g*(a == b ? V(0.5) : stable_logistic(a - b)),
                   g*(a == b ? V(0.5) : stable_logistic(b - a)))
#undef HALIAX_BINARY_GRAD

/// The gradient of operand A (Left) or B of a binary functor as a `nary` op on (g, a, b), or with the other
/// operand a bound scalar on (g, a).
template <class P, bool Left>
struct binary_grad_op {
  P p;
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V g, V a, V b) const {
    if constexpr (Left) {
      return p.da(g, a, b);
    } else {
      return p.db(g, a, b);
    }
  }
};
template <class P, class S, bool ScalarOnLeft>
struct binary_grad_scalar_op {
  P p;
  S s;
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V g, V x) const {
    if constexpr (ScalarOnLeft) {
      return p.db(g, static_cast<V>(s), x);
    } else {
      return p.da(g, x, static_cast<V>(s));
    }
  }
};

/// Records the backward rule of the binary op F that produced `r` from `a` and `b` (broadcast by name): each
/// operand's gradient is one fused kernel over the result, summed over the axes that operand lacks.
template <class F, class Out, class AxR, class T, class AxA, class AxB>
void record_binary(const char* label, named_array<Out, AxR>& r, const named_array<T, AxA>& a,
                   const named_array<T, AxB>& b) {
  if constexpr (FloatElement<T> && std::is_same_v<Out, T> && binary_grad<F>::defined) {
    if (!ad::any_tracked(a, b)) return;
    using P = binary_grad<F>;
    ad::record(
        r,
        [label, a = without_node(a), b = without_node(b)](const named_array<T, AxR>& g, auto needs) {
          named_array<T, AxA> ga;
          named_array<T, AxB> gb;
          if (needs[0])
            ga = ad::unbroadcast<AxA>(nary<T, AxR>(label, g.sizes(), binary_grad_op<P, true>{}, g, a, b), a.sizes());
          if (needs[1])
            gb = ad::unbroadcast<AxB>(nary<T, AxR>(label, g.sizes(), binary_grad_op<P, false>{}, g, a, b), b.sizes());
          return std::tuple{ga, gb};
        },
        a, b);
  }
}

/// Records the backward rule of the binary op F applied to array `x` and a scalar `s` (on the left when
/// ScalarOnLeft): one fused kernel.
template <class F, bool ScalarOnLeft, class Out, class Axes, class T, class V>
void record_binary_scalar(const char* label, named_array<Out, Axes>& r, const named_array<T, Axes>& x, V s) {
  if constexpr (FloatElement<T> && std::is_same_v<Out, T> && binary_grad<F>::defined) {
    if (!ad::any_tracked(x)) return;
    using Op = binary_grad_scalar_op<binary_grad<F>, V, ScalarOnLeft>;
    ad::record(
        r,
        [label, x = without_node(x), s](const named_array<T, Axes>& g, auto) {
          return std::tuple{nary<T, Axes>(label, g.sizes(), Op{{}, s}, g, x)};
        },
        x);
  }
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------------------
// Unary ops: the result has the input's axes. Float-only ones are constrained to float element types.

#define HALIAX_DEFINE_UNARY(NAME, CONSTRAINT)                                                                     \
  /** Elementwise NAME; keeps every axis. Gradient (float elements): `detail::unary_grad<NAME##_fn>`, one fused   \
   * kernel; none for the piecewise-constant ops and predicates. */                                               \
  template <CONSTRAINT T, class Axes>                                                                             \
  auto NAME(const named_array<T, Axes>& x) {                                                                      \
    auto r = detail::map<detail::unary_result_t<detail::NAME##_fn, T>>("haliax::" #NAME, x, detail::NAME##_fn{}); \
    detail::record_unary<detail::NAME##_fn>("haliax::" #NAME "_grad", r, x);                                      \
    return r;                                                                                                     \
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

#define HALIAX_DEFINE_BINARY(NAME, CONSTRAINT)                                                                  \
  /** Elementwise NAME with broadcasting by axis name: one operand's axes must contain the other's. Gradient of \
   * the float ops (comparisons have none): `detail::binary_grad<NAME##_fn>`, one fused kernel per operand that \
   * needs it, summed over the axes it was broadcast along. */                                                  \
  template <CONSTRAINT T, class AxA, class AxB>                                                                 \
  requires BroadcastCompatible<AxA, AxB>                                                                        \
  auto NAME(const named_array<T, AxA>& a, const named_array<T, AxB>& b) {                                       \
    auto r = detail::zip<detail::binary_result_t<detail::NAME##_fn, T>, broadcast_axes_t<AxA, AxB>>(            \
        "haliax::" #NAME, a, b, detail::NAME##_fn{});                                                           \
    detail::record_binary<detail::NAME##_fn>("haliax::" #NAME "_grad", r, a, b);                                \
    return r;                                                                                                   \
  }                                                                                                             \
  /** Elementwise NAME of an array and a scalar. */                                                             \
  template <CONSTRAINT T, class Axes, Scalar S>                                                                 \
  auto NAME(const named_array<T, Axes>& a, S s) {                                                               \
    using V = compute_t<T>;                                                                                     \
    auto r = detail::map<detail::binary_result_t<detail::NAME##_fn, T>>(                                        \
        "haliax::" #NAME, a, detail::bind_scalar<detail::NAME##_fn, V, false>{{}, static_cast<V>(s)});          \
    detail::record_binary_scalar<detail::NAME##_fn, false>("haliax::" #NAME "_grad", r, a, static_cast<V>(s));  \
    return r;                                                                                                   \
  }                                                                                                             \
  /** Elementwise NAME of a scalar and an array. */                                                             \
  template <CONSTRAINT T, class Axes, Scalar S>                                                                 \
  auto NAME(S s, const named_array<T, Axes>& a) {                                                               \
    using V = compute_t<T>;                                                                                     \
    auto r = detail::map<detail::binary_result_t<detail::NAME##_fn, T>>(                                        \
        "haliax::" #NAME, a, detail::bind_scalar<detail::NAME##_fn, V, true>{{}, static_cast<V>(s)});           \
    detail::record_binary_scalar<detail::NAME##_fn, true>("haliax::" #NAME "_grad", r, a, static_cast<V>(s));   \
    return r;                                                                                                   \
  }
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
      detail::ad::record(
          r, [](const auto& g, auto) { return std::tuple{g}; }, a);
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
            if (needs[0])
              ga = detail::ad::unbroadcast<AxA>(
                  detail::zip<T, AxR>("haliax::multiply_grad", g, b, detail::multiply_fn{}), a.sizes());
            if (needs[1])
              gb = detail::ad::unbroadcast<AxB>(
                  detail::zip<T, AxR>("haliax::multiply_grad", g, a, detail::multiply_fn{}), b.sizes());
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
  auto r =
      detail::map<T>("haliax::multiply", a, detail::bind_scalar<detail::multiply_fn, V, false>{{}, static_cast<V>(s)});
  if constexpr (FloatElement<T>) {
    if (detail::ad::any_tracked(a))
      detail::ad::record(
          r,
          [v = static_cast<V>(s)](const auto& g, auto) {
            return std::tuple{
                detail::map<T>("haliax::multiply_grad", g, detail::bind_scalar<detail::multiply_fn, V, false>{{}, v})};
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

/// Elementwise difference with broadcasting by axis name. Gradient: `g` to `a` and `-g` to `b`, each summed over
/// the axes it was broadcast along (`b`'s negated after the sum, on the smaller array).
template <NumericElement T, class AxA, class AxB>
requires BroadcastCompatible<AxA, AxB>
auto subtract(const named_array<T, AxA>& a, const named_array<T, AxB>& b) {
  auto r = detail::zip<T, broadcast_axes_t<AxA, AxB>>("haliax::subtract", a, b, detail::subtract_fn{});
  if constexpr (FloatElement<T>) {
    if (detail::ad::any_tracked(a, b))
      detail::ad::record(
          r,
          [sa = a.sizes(), sb = b.sizes()](const auto& g, auto needs) {
            named_array<T, AxA> ga;
            named_array<T, AxB> gb;
            if (needs[0]) ga = detail::ad::unbroadcast<AxA>(g, sa);
            if (needs[1])
              gb = detail::map<T>("haliax::subtract_grad", detail::ad::unbroadcast<AxB>(g, sb), detail::negative_fn{});
            return std::tuple{ga, gb};
          },
          a, b);
  }
  return r;
}
/// Elementwise difference of an array and a scalar. Gradient: `g`.
template <NumericElement T, class Axes, Scalar S>
auto subtract(const named_array<T, Axes>& a, S s) {
  using V = compute_t<T>;
  auto r =
      detail::map<T>("haliax::subtract", a, detail::bind_scalar<detail::subtract_fn, V, false>{{}, static_cast<V>(s)});
  if constexpr (FloatElement<T>) {
    if (detail::ad::any_tracked(a))
      detail::ad::record(
          r, [](const auto& g, auto) { return std::tuple{g}; }, a);
  }
  return r;
}
/// Elementwise difference of a scalar and an array. Gradient: `-g`.
template <NumericElement T, class Axes, Scalar S>
auto subtract(S s, const named_array<T, Axes>& a) {
  using V = compute_t<T>;
  auto r =
      detail::map<T>("haliax::subtract", a, detail::bind_scalar<detail::subtract_fn, V, true>{{}, static_cast<V>(s)});
  if constexpr (FloatElement<T>) {
    if (detail::ad::any_tracked(a))
      detail::ad::record(
          r,
          [](const auto& g, auto) {
            return std::tuple{detail::map<T>("haliax::subtract_grad", g, detail::negative_fn{})};
          },
          a);
  }
  return r;
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

namespace detail {
/// Records the gradient of a broadcast (or broadcasting permute) `r` of `x`: `g` summed back to x's axes.
template <class T, class AxR, class AxA>
void record_broadcast(named_array<T, AxR>& r, const named_array<T, AxA>& x) {
  if constexpr (FloatElement<T>) {
    if (ad::any_tracked(x))
      ad::record(
          r, [sx = x.sizes()](const named_array<T, AxR>& g, auto) { return std::tuple{ad::unbroadcast<AxA>(g, sx)}; },
          x);
  }
}
}  // namespace detail

/// `x` with extra axes: `broadcast_to(x, 4 * Batch, 768 * Embed)` has exactly the listed axes in that order
/// (upstream `broadcast_to` with `ensure_order=True`). Every axis of `x` must be listed; shared axes must
/// agree in size. Gradient: `g` summed over the new axes, in x's axis order.
template <class T, class AxA, SizedAxis... S>
requires detail::subset_v<detail::to_list<AxA>, detail::mp::mp_list<typename S::axis_type...>> array_for<T, S...>
broadcast_to(const named_array<T, AxA>& x, S... s) {
  using AxR = typename array_for<T, S...>::axes_type;
  std::array<std::int64_t, sizeof...(S)> rsizes{s.size...};
  detail::check_shared_sizes_raw<AxA, AxR>("haliax::broadcast_to", x.sizes(), rsizes);
  auto r = detail::broadcast_copy<AxR>("haliax::broadcast_to", x, rsizes);
  detail::record_broadcast(r, x);
  return r;
}

/// `x` with new leading axes prepended (upstream `broadcast_axis`): `broadcast_axis(x, 4 * Batch)` turns
/// {embed} into {batch, embed}. The new axes must not already be axes of `x`. Gradient: `g` summed over the
/// new axes.
template <class T, auto... A, SizedAxis... S>
requires(sizeof...(S) > 0 &&
         detail::disjoint_v<detail::mp::mp_list<typename S::axis_type...>,
                            detail::to_list<axes<A...>>>) auto broadcast_axis(const named_array<T, axes<A...>>& x,
                                                                              S... s) {
  using AxR = detail::to_axes<detail::mp::mp_list<typename S::axis_type..., std::remove_cvref_t<decltype(A)>...>>;
  std::array<std::int64_t, AxR::rank> rsizes;
  std::size_t i = 0;
  const std::array<std::int64_t, sizeof...(S)> fresh{s.size...};  // (nvcc's host pass rejects a braced pack in a range-for)
  for (auto n : fresh) rsizes[i++] = n;
  for (auto n : x.sizes()) rsizes[i++] = n;
  auto r = detail::broadcast_copy<AxR>("haliax::broadcast_axis", x, rsizes);
  detail::record_broadcast(r, x);
  return r;
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

/// The gradient of where's `x` (Keep = true) or `y` branch: `g` where the condition picked it, else 0.
template <bool Keep>
struct where_grad_fn {
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V g, bool c) const {
    return c == Keep ? g : V(0);
  }
};

/// clip with scalar bounds as one kernel: minimum(maximum(x, lo), hi), NaN passing through.
template <class V>
struct clip_fn {
  V lo, hi;
  KOKKOS_INLINE_FUNCTION V operator()(V x) const { return minimum_fn{}(maximum_fn{}(x, lo), hi); }
};

/// The gradient of clip with scalar bounds, exactly that of minimum(maximum(x, lo), hi) under the 0.5 tie rule
/// (JAX's jnp.clip): g inside (lo, hi), 0 outside, g / 2 on a bound.
template <class V>
struct clip_grad_fn {
  V lo, hi;
  KOKKOS_INLINE_FUNCTION V operator()(V g, V x) const {
    // d maximum(x, lo) / dx times d minimum(m, hi) / dm; wherever the first is not 0, m == x.
    return g * tie_weight(x, lo) * tie_weight(hi, x);
  }
};
}  // namespace detail

/// `where(cond, x, y)`: elementwise `cond ? x : y` with broadcasting by name among the three (one operand's
/// axes must contain the other two's). `x` or `y` may be a scalar. Gradient: `g` to `x` where `cond`, to `y`
/// elsewhere (0 in the other), each summed over the axes it was broadcast along.
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
  auto r = detail::nary<T, AxR>("haliax::where", rsizes, detail::where_fn<T>{}, cond, x, y);
  if constexpr (FloatElement<T>) {
    if (detail::ad::any_tracked(x, y))
      detail::ad::record(
          r,
          [cond, sx = x.sizes(), sy = y.sizes()](const named_array<T, AxR>& g, auto needs) {
            named_array<T, AxX> gx;
            named_array<T, AxY> gy;
            if (needs[0])
              gx = detail::ad::unbroadcast<AxX>(
                  detail::nary<T, AxR>("haliax::where_grad", g.sizes(), detail::where_grad_fn<true>{}, g, cond), sx);
            if (needs[1])
              gy = detail::ad::unbroadcast<AxY>(
                  detail::nary<T, AxR>("haliax::where_grad", g.sizes(), detail::where_grad_fn<false>{}, g, cond), sy);
            return std::tuple{gx, gy};
          },
          x, y);
  }
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

/// Clamps every element into [lo, hi] (upstream `clip`); NaN stays NaN. One kernel. Gradient (as JAX's
/// `jnp.clip`, i.e. of minimum(maximum(x, lo), hi)): `g` strictly inside, 0 outside, `g / 2` on a bound.
template <NumericElement T, class Axes, Scalar S1, Scalar S2>
named_array<T, Axes> clip(const named_array<T, Axes>& x, S1 lo, S2 hi) {
  using V = compute_t<T>;
  const V l = static_cast<V>(lo), h = static_cast<V>(hi);
  auto r = detail::map<T>("haliax::clip", x, detail::clip_fn<V>{l, h});
  if constexpr (FloatElement<T>) {
    if (detail::ad::any_tracked(x))
      detail::ad::record(
          r,
          [x = detail::without_node(x), l, h](const named_array<T, Axes>& g, auto) {
            return std::tuple{
                detail::nary<T, Axes>("haliax::clip_grad", g.sizes(), detail::clip_grad_fn<V>{l, h}, g, x)};
          },
          x);
  }
  return r;
}

/// Clamps with array bounds, broadcast by name against `x` (bounds' axes must be subsets of x's). Gradient:
/// that of minimum(maximum(x, lo), hi), to `x` and to the bounds (summed over their broadcast axes).
template <NumericElement T, class Axes, class AxL, class AxH>
requires detail::subset_v<detail::to_list<AxL>, detail::to_list<Axes>> &&
    detail::subset_v<detail::to_list<AxH>, detail::to_list<Axes>>
        named_array<T, Axes> clip(const named_array<T, Axes>& x, const named_array<T, AxL>& lo,
                                  const named_array<T, AxH>& hi) {
  return minimum(maximum(x, lo), hi);
}

// ---------------------------------------------------------------------------------------------------------
// Copies and element type conversion

/// A deep copy (new buffer) of `x`. Gradient: `g`.
template <class T, class Axes>
named_array<T, Axes> copy(const named_array<T, Axes>& x) {
  auto r = named_array<T, Axes>::allocate(x.sizes(), "haliax::copy");
  if (x.element_count() > 0) Kokkos::deep_copy(r.view(), x.view());
  if constexpr (FloatElement<T>) {
    if (detail::ad::any_tracked(x))
      detail::ad::record(
          r, [](const named_array<T, Axes>& g, auto) { return std::tuple{g}; }, x);
  }
  return r;
}

/// Element type conversion (float to bf16 rounds to nearest even): `astype<bf16>(x)`. Gradient between float
/// types (float, double, bf16): `g` converted back to x's element type; none to or from int32 and bool.
template <Element U, class T, class Axes>
named_array<U, Axes> astype(const named_array<T, Axes>& x) {
  auto r = named_array<U, Axes>::allocate(x.sizes(), "haliax::astype");
  detail::astype_kernel<U, T>(x.data(), r.data(), x.element_count());
  if constexpr (FloatElement<T> && FloatElement<U>) {
    if (detail::ad::any_tracked(x))
      detail::ad::record(
          r,
          [](const named_array<U, Axes>& g, auto) {
            if constexpr (std::is_same_v<T, U>) {
              return std::tuple{g};
            } else {
              return std::tuple{astype<T>(g)};
            }
          },
          x);
  }
  return r;
}

}  // namespace haliax
