// haliax/ops/reduction.hpp: reductions over named axes.
//
//   sum(x)                   // every axis: a rank-0 array
//   mean(x, Batch)           // {batch, embed} -> {embed}
//   max(x, Batch, Pos)       // several axes at once
//   sum(x, where_mask{m}, Pos)   // only where m is true (m broadcasts against x by name)
//   argmax(logits, Vocab)    // int32, one axis only
//
// Reduction order is fixed (each output walks its inputs in row-major order, accumulating in double for
// floating types), so results never depend on thread count.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

#include "elementwise.hpp"

namespace haliax {

/// The axes to reduce exist in the array and are listed once.
template <class Axes, class... R>
concept ReducibleAxes = (AxisOf<R, Axes> && ...) && detail::is_unique_v<detail::mp::mp_list<std::remove_cvref_t<R>...>>;

/// Axes left after reducing `R...` (every axis when none is given).
template <class Axes, class... R>
using reduced_axes_t = std::conditional_t<
    sizeof...(R) == 0, axes<>,
    detail::to_axes<detail::difference<detail::to_list<Axes>, detail::mp::mp_list<std::remove_cvref_t<R>...>>>>;

/// A boolean mask restricting a reduction (upstream `where=`). Its axes must be a subset of the input's.
template <class AxM>
struct where_mask {
  named_array<bool, AxM> mask;
};
template <class AxM>
where_mask(named_array<bool, AxM>) -> where_mask<AxM>;

namespace detail {

/// Per-output reduction plan: the kept dimensions (output row-major) and the reduced ones, each with the
/// input and mask strides.
struct reduce_plan {
  int kept_rank = 0;
  std::int64_t kept_extent[max_rank]{};
  std::int64_t kept_in[max_rank]{};
  std::int64_t kept_mask[max_rank]{};
  int red_rank = 0;
  std::int64_t red_extent[max_rank]{};
  std::int64_t red_in[max_rank]{};
  std::int64_t red_mask[max_rank]{};
  std::int64_t out_count = 1;
  std::int64_t red_count = 1;
};

template <class Axes, class RList, class AxM>
reduce_plan make_reduce_plan(const std::array<std::int64_t, Axes::rank>& sizes,
                             const std::array<std::int64_t, AxM::rank>* mask_sizes) {
  using L = to_list<Axes>;
  reduce_plan p;
  auto in_strides = row_major_strides(sizes);
  std::array<std::int64_t, Axes::rank> mstr{};
  if (mask_sizes) mstr = strides_in<Axes, AxM>(*mask_sizes);
  std::array<bool, Axes::rank> reduced{};
  mp::mp_for_each<RList>([&]<class Tag>(Tag) { reduced[index_of_v<L, Tag>] = true; });
  auto push = [](int& rank, std::int64_t* ext, std::int64_t* s_in, std::int64_t* s_m, std::int64_t e, std::int64_t si,
                 std::int64_t sm) {
    if (e == 1) return;
    if (rank > 0 && s_in[rank - 1] == si * e && s_m[rank - 1] == sm * e) {
      ext[rank - 1] *= e;
      s_in[rank - 1] = si;
      s_m[rank - 1] = sm;
      return;
    }
    ext[rank] = e;
    s_in[rank] = si;
    s_m[rank] = sm;
    ++rank;
  };
  for (std::size_t d = 0; d < Axes::rank; ++d) {
    if (reduced[d]) {
      push(p.red_rank, p.red_extent, p.red_in, p.red_mask, sizes[d], in_strides[d], mstr[d]);
      p.red_count *= sizes[d];
    } else {
      push(p.kept_rank, p.kept_extent, p.kept_in, p.kept_mask, sizes[d], in_strides[d], mstr[d]);
      p.out_count *= sizes[d];
    }
  }
  return p;
}

/// Runs `op` over every output of the plan. `Op` provides `acc_type init()`, `void step(acc_type&, value,
/// std::int64_t index_along_reduction)`, and `out finish(const acc_type&)`.
template <class Out, class T, class Op>
void run_reduction(const char* label, const reduce_plan& plan, const T* in, const bool* mask, Out* out, Op op) {
  const reduce_plan p = plan;
  if (p.out_count == 0) return;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<execution_space>(0, p.out_count), KOKKOS_LAMBDA(std::int64_t o) {
        std::int64_t base_in = 0, base_m = 0;
        std::int64_t rem = o;
        for (int d = p.kept_rank - 1; d >= 0; --d) {
          std::int64_t i = rem % p.kept_extent[d];
          rem /= p.kept_extent[d];
          base_in += i * p.kept_in[d];
          base_m += i * p.kept_mask[d];
        }
        auto acc = op.init();
        if (p.red_count > 0) {
          if (p.red_rank == 0) {
            if (!mask || mask[base_m]) op.step(acc, static_cast<compute_t<T>>(in[base_in]), 0);
          } else {
            const int last = p.red_rank - 1;
            const std::int64_t n_last = p.red_extent[last], s_in = p.red_in[last], s_m = p.red_mask[last];
            std::int64_t n_outer = 1;
            for (int d = 0; d < last; ++d) n_outer *= p.red_extent[d];
            std::int64_t counter = 0;
            for (std::int64_t t = 0; t < n_outer; ++t) {
              std::int64_t off_in = base_in, off_m = base_m, r = t;
              for (int d = last - 1; d >= 0; --d) {
                std::int64_t i = r % p.red_extent[d];
                r /= p.red_extent[d];
                off_in += i * p.red_in[d];
                off_m += i * p.red_mask[d];
              }
              if (mask) {
                for (std::int64_t j = 0; j < n_last; ++j)
                  if (mask[off_m + j * s_m])
                    op.step(acc, static_cast<compute_t<T>>(in[off_in + j * s_in]), counter + j);
              } else if (s_in == 1) {
                const T* row = in + off_in;
                for (std::int64_t j = 0; j < n_last; ++j) op.step(acc, static_cast<compute_t<T>>(row[j]), counter + j);
              } else {
                for (std::int64_t j = 0; j < n_last; ++j)
                  op.step(acc, static_cast<compute_t<T>>(in[off_in + j * s_in]), counter + j);
              }
              counter += n_last;
            }
          }
        }
        store(out, o, op.finish(acc));
      });
}

template <class T>
using accum_t = std::conditional_t<std::is_same_v<T, std::int32_t>, std::int64_t,
                                   std::conditional_t<std::is_same_v<T, bool>, bool, double>>;

template <class T>
struct sum_op {
  using A = accum_t<T>;
  KOKKOS_INLINE_FUNCTION A init() const { return A(0); }
  template <class V>
  KOKKOS_INLINE_FUNCTION void step(A& a, V v, std::int64_t) const {
    a += static_cast<A>(v);
  }
  KOKKOS_INLINE_FUNCTION A finish(const A& a) const { return a; }
};

template <class T>
struct prod_op {
  using A = accum_t<T>;
  KOKKOS_INLINE_FUNCTION A init() const { return A(1); }
  template <class V>
  KOKKOS_INLINE_FUNCTION void step(A& a, V v, std::int64_t) const {
    a *= static_cast<A>(v);
  }
  KOKKOS_INLINE_FUNCTION A finish(const A& a) const { return a; }
};

template <class T>
struct mean_op {
  struct A {
    double sum;
    std::int64_t n;
  };
  KOKKOS_INLINE_FUNCTION A init() const { return {0.0, 0}; }
  template <class V>
  KOKKOS_INLINE_FUNCTION void step(A& a, V v, std::int64_t) const {
    a.sum += static_cast<double>(v);
    a.n += 1;
  }
  KOKKOS_INLINE_FUNCTION double finish(const A& a) const {
    return a.n == 0 ? std::numeric_limits<double>::quiet_NaN() : a.sum / static_cast<double>(a.n);
  }
};

/// max (IsMax) or min; NaN propagates as in numpy/JAX. The empty reduction gives -inf / +inf (int: lowest /
/// highest value).
template <class T, bool IsMax>
struct extremum_op {
  using V = compute_t<T>;
  KOKKOS_INLINE_FUNCTION V init() const {
    if constexpr (std::is_floating_point_v<V>) {
      return IsMax ? -std::numeric_limits<V>::infinity() : std::numeric_limits<V>::infinity();
    } else {
      return IsMax ? std::numeric_limits<V>::lowest() : std::numeric_limits<V>::max();
    }
  }
  KOKKOS_INLINE_FUNCTION void step(V& a, V v, std::int64_t) const {
    if (a != a) return;
    if (v != v || (IsMax ? v > a : v < a)) a = v;
  }
  KOKKOS_INLINE_FUNCTION V finish(const V& a) const { return a; }
};

template <class T>
using max_op = extremum_op<T, true>;
template <class T>
using min_op = extremum_op<T, false>;

/// argmax (IsMax) / argmin along one axis: index of the first extreme value; the first NaN wins.
template <class T, bool IsMax>
struct arg_op {
  using V = compute_t<T>;
  struct A {
    V best;
    std::int32_t index;
    bool any;
  };
  KOKKOS_INLINE_FUNCTION A init() const { return {V(0), 0, false}; }
  KOKKOS_INLINE_FUNCTION void step(A& a, V v, std::int64_t i) const {
    if (!a.any) {
      a = {v, static_cast<std::int32_t>(i), true};
      return;
    }
    if (a.best != a.best) return;
    if (v != v || (IsMax ? v > a.best : v < a.best)) {
      a.best = v;
      a.index = static_cast<std::int32_t>(i);
    }
  }
  KOKKOS_INLINE_FUNCTION std::int32_t finish(const A& a) const { return a.index; }
};

struct any_op {
  KOKKOS_INLINE_FUNCTION bool init() const { return false; }
  KOKKOS_INLINE_FUNCTION void step(bool& a, bool v, std::int64_t) const { a = a || v; }
  KOKKOS_INLINE_FUNCTION bool finish(bool a) const { return a; }
};
struct all_op {
  KOKKOS_INLINE_FUNCTION bool init() const { return true; }
  KOKKOS_INLINE_FUNCTION void step(bool& a, bool v, std::int64_t) const { a = a && v; }
  KOKKOS_INLINE_FUNCTION bool finish(bool a) const { return a; }
};

template <class Out, class Op, class T, class Axes, class AxM, class... R>
auto reduce(const char* label, const named_array<T, Axes>& x, const named_array<bool, AxM>* mask, Op op) {
  using AxR = reduced_axes_t<Axes, R...>;
  using RList = std::conditional_t<sizeof...(R) == 0, to_list<Axes>, mp::mp_list<std::remove_cvref_t<R>...>>;
  if (mask) check_shared_sizes(label, x, *mask);
  auto plan = make_reduce_plan<Axes, RList, AxM>(x.sizes(), mask ? &mask->sizes() : nullptr);
  std::array<std::int64_t, AxR::rank> rsizes{};
  if constexpr (AxR::rank > 0) rsizes = sizes_in<AxR, Axes>(x.sizes());
  auto r = named_array<Out, AxR>::allocate(rsizes, label);
  run_reduction<Out>(label, plan, x.data(), mask ? mask->data() : nullptr, r.data(), op);
  return r;
}

}  // namespace detail

// Each reduction has two forms: `f(x, Axes...)` and `f(x, where_mask{m}, Axes...)`; no axes means all.
#define HALIAX_DEFINE_REDUCTION(NAME, CONSTRAINT, OUT, OP, DOC)                                       \
  /** DOC Drops the listed axes (all axes when none are listed). */                                   \
  template <CONSTRAINT T, class Axes, class... R>                                                     \
  requires ReducibleAxes<Axes, R...>                                                                  \
  auto NAME(const named_array<T, Axes>& x, R...) {                                                    \
    return detail::reduce<OUT, OP, T, Axes, axes<>, R...>("haliax::" #NAME, x, nullptr, OP{});        \
  }                                                                                                   \
  /** DOC Only elements where the mask is true take part; the mask broadcasts against x by name. */   \
  template <CONSTRAINT T, class Axes, class AxM, class... R>                                          \
  requires ReducibleAxes<Axes, R...> && detail::subset_v<detail::to_list<AxM>, detail::to_list<Axes>> \
  auto NAME(const named_array<T, Axes>& x, const where_mask<AxM>& m, R...) {                          \
    return detail::reduce<OUT, OP, T, Axes, AxM, R...>("haliax::" #NAME, x, &m.mask, OP{});           \
  }

/// Sum of the elements. Drops the listed axes (all axes when none are listed). Gradient: `g` broadcast back.
template <NumericElement T, class Axes, class... R>
requires ReducibleAxes<Axes, R...>
auto sum(const named_array<T, Axes>& x, R...) {
  auto r = detail::reduce<T, detail::sum_op<T>, T, Axes, axes<>, R...>("haliax::sum", x, nullptr, detail::sum_op<T>{});
  if constexpr (FloatElement<T>) {
    if (detail::ad::any_tracked(x))
      detail::ad::record(
          r,
          [sx = x.sizes()](const auto& g, auto) {
            return std::tuple{detail::broadcast_copy<Axes>("haliax::sum_grad", g, sx)};
          },
          x);
  }
  return r;
}
/// Sum of the elements where the mask is true; the mask broadcasts against x by name.
template <NumericElement T, class Axes, class AxM, class... R>
requires ReducibleAxes<Axes, R...> && detail::subset_v<detail::to_list<AxM>, detail::to_list<Axes>>
auto sum(const named_array<T, Axes>& x, const where_mask<AxM>& m, R...) {
  auto r = detail::reduce<T, detail::sum_op<T>, T, Axes, AxM, R...>("haliax::sum", x, &m.mask, detail::sum_op<T>{});
  if constexpr (FloatElement<T>) {
    if (detail::ad::any_tracked(x))
      detail::ad::record(
          r,
          [sx = x.sizes(), mask = m.mask](const auto& g, auto) {
            auto gx = detail::broadcast_copy<Axes>("haliax::sum_grad", g, sx);
            return std::tuple{detail::zip<T, Axes>("haliax::sum_grad", gx, mask,
                                                   [](auto v, auto keep) { return keep ? v : decltype(v)(0); })};
          },
          x);
  }
  return r;
}
HALIAX_DEFINE_REDUCTION(prod, NumericElement, T, detail::prod_op<T>, Product of the elements.)
HALIAX_DEFINE_REDUCTION(mean, FloatElement, T, detail::mean_op<T>, Arithmetic mean; NaN for an empty set.)
HALIAX_DEFINE_REDUCTION(max, NumericElement, T, detail::max_op<T>, Maximum; NaN propagates.)
HALIAX_DEFINE_REDUCTION(min, NumericElement, T, detail::min_op<T>, Minimum; NaN propagates.)
#undef HALIAX_DEFINE_REDUCTION

/// True if any element is true. Drops the listed axes (all when none are listed).
template <class Axes, class... R>
requires ReducibleAxes<Axes, R...>
auto any(const named_array<bool, Axes>& x, R...) {
  return detail::reduce<bool, detail::any_op, bool, Axes, axes<>, R...>("haliax::any", x, nullptr, {});
}
template <class Axes, class AxM, class... R>
requires ReducibleAxes<Axes, R...> && detail::subset_v<detail::to_list<AxM>, detail::to_list<Axes>>
auto any(const named_array<bool, Axes>& x, const where_mask<AxM>& m, R...) {
  return detail::reduce<bool, detail::any_op, bool, Axes, AxM, R...>("haliax::any", x, &m.mask, {});
}

/// True if every element is true. Drops the listed axes (all when none are listed).
template <class Axes, class... R>
requires ReducibleAxes<Axes, R...>
auto all(const named_array<bool, Axes>& x, R...) {
  return detail::reduce<bool, detail::all_op, bool, Axes, axes<>, R...>("haliax::all", x, nullptr, {});
}
template <class Axes, class AxM, class... R>
requires ReducibleAxes<Axes, R...> && detail::subset_v<detail::to_list<AxM>, detail::to_list<Axes>>
auto all(const named_array<bool, Axes>& x, const where_mask<AxM>& m, R...) {
  return detail::reduce<bool, detail::all_op, bool, Axes, AxM, R...>("haliax::all", x, &m.mask, {});
}

/// Index (int32) of the first maximum along one axis, which is dropped: `argmax(logits, Vocab)`.
template <NumericElement T, class Axes, AxisTag R>
requires ReducibleAxes<Axes, R>
auto argmax(const named_array<T, Axes>& x, R) {
  return detail::reduce<std::int32_t, detail::arg_op<T, true>, T, Axes, axes<>, R>("haliax::argmax", x, nullptr, {});
}

/// Index (int32) of the first minimum along one axis, which is dropped.
template <NumericElement T, class Axes, AxisTag R>
requires ReducibleAxes<Axes, R>
auto argmin(const named_array<T, Axes>& x, R) {
  return detail::reduce<std::int32_t, detail::arg_op<T, false>, T, Axes, axes<>, R>("haliax::argmin", x, nullptr, {});
}

/// Variance (population, ddof = 0) over the listed axes (all when none): mean((x - mean(x))^2).
template <FloatElement T, class Axes, class... R>
requires ReducibleAxes<Axes, R...>
auto var(const named_array<T, Axes>& x, R... r) {
  auto m = mean(x, r...);
  return mean(square(x - m), r...);
}
/// Variance over the elements where the mask is true.
template <FloatElement T, class Axes, class AxM, class... R>
requires ReducibleAxes<Axes, R...> && detail::subset_v<detail::to_list<AxM>, detail::to_list<Axes>>
auto var(const named_array<T, Axes>& x, const where_mask<AxM>& w, R... r) {
  auto m = mean(x, w, r...);
  return mean(square(x - m), w, r...);
}

/// Standard deviation (ddof = 0) over the listed axes (all when none).
template <FloatElement T, class Axes, class... R>
requires ReducibleAxes<Axes, R...>
auto std(const named_array<T, Axes>& x, R... r) { return sqrt(var(x, r...)); }
template <FloatElement T, class Axes, class AxM, class... R>
requires ReducibleAxes<Axes, R...> && detail::subset_v<detail::to_list<AxM>, detail::to_list<Axes>>
auto std(const named_array<T, Axes>& x, const where_mask<AxM>& w, R... r) { return sqrt(var(x, w, r...)); }

/// log(sum(exp(x))) over the listed axes (all when none), computed stably by shifting by the maximum.
/// For a single axis, `haliax::nn::logsumexp` (nn/functions.hpp) is the fused, vectorised kernel.
/// An all -inf slice gives -inf.
template <FloatElement T, class Axes, class... R>
requires ReducibleAxes<Axes, R...>
auto logsumexp(const named_array<T, Axes>& x, R... r) {
  auto m = max(x, r...);
  auto shift = where(isfinite(m), m, 0.0);
  return log(sum(exp(x - shift), r...)) + shift;
}

}  // namespace haliax
