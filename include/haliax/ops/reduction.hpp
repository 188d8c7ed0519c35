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

#include <array>
#include <cstdint>
#include <limits>
#include <tuple>
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
      label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, p.out_count), KOKKOS_LAMBDA(std::int64_t o) {
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

/// The axes `f(x, R...)` reduces, as a type list: R..., or all of x's axes when none are listed.
template <class Axes, class... R>
using reduced_list_t = std::conditional_t<sizeof...(R) == 0, to_list<Axes>, mp::mp_list<std::remove_cvref_t<R>...>>;

template <class Out, class Op, class T, class Axes, class AxM, class... R>
auto reduce(const char* label, const named_array<T, Axes>& x, const named_array<bool, AxM>* mask, Op op) {
  using AxR = reduced_axes_t<Axes, R...>;
  using RList = reduced_list_t<Axes, R...>;
  if (mask) check_shared_sizes(label, x, *mask);
  auto plan = make_reduce_plan<Axes, RList, AxM>(x.sizes(), mask ? &mask->sizes() : nullptr);
  std::array<std::int64_t, AxR::rank> rsizes{};
  if constexpr (AxR::rank > 0) rsizes = sizes_in<AxR, Axes>(x.sizes());
  auto r = named_array<Out, AxR>::allocate(rsizes, label);
  run_reduction<Out>(label, plan, x.data(), mask ? mask->data() : nullptr, r.data(), op);
  return r;
}

// ---------------------------------------------------------------------------------------------------------
// Gradient rules. A reduction's gradient has x's shape; each rule is one kernel over x (elementwise with `g`
// broadcast back), or, where an output's elements depend on each other (prod, max, min), one kernel over
// the outputs that walks each output's elements like the forward does.

/// Calls `f(off_in, off_mask)` for every input element that output `o` of plan `p` reduces, in row-major order.
template <class F>
KOKKOS_INLINE_FUNCTION void for_each_reduced(const reduce_plan& p, std::int64_t o, const F& f) {
  std::int64_t base_in = 0, base_m = 0, rem = o;
  for (int d = p.kept_rank - 1; d >= 0; --d) {
    const std::int64_t i = rem % p.kept_extent[d];
    rem /= p.kept_extent[d];
    base_in += i * p.kept_in[d];
    base_m += i * p.kept_mask[d];
  }
  if (p.red_count == 0) return;
  if (p.red_rank == 0) {
    f(base_in, base_m);
    return;
  }
  const int last = p.red_rank - 1;
  const std::int64_t n_last = p.red_extent[last], s_in = p.red_in[last], s_m = p.red_mask[last];
  std::int64_t n_outer = 1;
  for (int d = 0; d < last; ++d) n_outer *= p.red_extent[d];
  for (std::int64_t t = 0; t < n_outer; ++t) {
    std::int64_t off_in = base_in, off_m = base_m, r = t;
    for (int d = last - 1; d >= 0; --d) {
      const std::int64_t i = r % p.red_extent[d];
      r /= p.red_extent[d];
      off_in += i * p.red_in[d];
      off_m += i * p.red_mask[d];
    }
    for (std::int64_t j = 0; j < n_last; ++j) f(off_in + j * s_in, off_m + j * s_m);
  }
}

// Kernels of the masked counts and of prod's and max/min's gradients (axis-free functions, for nvcc: see
// haliax::detail::fill_raw).
inline void masked_counts_kernel(const reduce_plan& p, const bool* pm, double* pc) {
  Kokkos::parallel_for(
      "haliax::masked_counts", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, p.out_count), KOKKOS_LAMBDA(std::int64_t o) {
        std::int64_t n = 0;
        for_each_reduced(p, o, [&](std::int64_t, std::int64_t om) { n += pm[om] ? 1 : 0; });
        pc[o] = static_cast<double>(n);
      });
}

template <class T>
void prod_grad_kernel(const reduce_plan& p, const T* px, const T* pg, const bool* pm, T* po) {
  Kokkos::parallel_for(
      "haliax::prod_grad", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, p.out_count), KOKKOS_LAMBDA(std::int64_t o) {
        std::int64_t zeros = 0;
        double others = 1;  // the product of the non-zero elements
        for_each_reduced(p, o, [&](std::int64_t oi, std::int64_t om) {
          if (pm && !pm[om]) return;
          const double v = static_cast<double>(load(px, oi));
          if (v == 0) {
            ++zeros;
          } else {
            others *= v;
          }
        });
        const double gv = static_cast<double>(load(pg, o));
        for_each_reduced(p, o, [&](std::int64_t oi, std::int64_t om) {
          double d = 0;
          if (!pm || pm[om]) {
            const double v = static_cast<double>(load(px, oi));
            if (zeros == 0) {
              d = gv * (others / v);
            } else if (zeros == 1 && v == 0) {
              d = gv * others;
            }
          }
          store(po, oi, d);
        });
      });
}

template <class T>
void extremum_grad_kernel(const reduce_plan& p, const T* px, const T* py, const T* pg, const bool* pm, T* po) {
  Kokkos::parallel_for(
      "haliax::extremum_grad", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, p.out_count), KOKKOS_LAMBDA(std::int64_t o) {
        const auto ans = load(py, o);
        std::int64_t ties = 0;
        for_each_reduced(p, o, [&](std::int64_t oi, std::int64_t om) {
          if ((!pm || pm[om]) && load(px, oi) == ans) ++ties;
        });
        const double share = static_cast<double>(load(pg, o)) / static_cast<double>(ties);
        for_each_reduced(p, o, [&](std::int64_t oi, std::int64_t om) {
          if (pm && !pm[om]) {
            store(po, oi, 0.0);
          } else {
            store(po, oi, load(px, oi) == ans ? share : 0.0 * share);
          }
        });
      });
}

/// For each output of a masked reduction over `RList` of an array of axes `Axes` and sizes `sx`: how many
/// elements take part (the mask broadcast against the array by name).
template <class Axes, class RList, class AxR, class AxM>
named_array<double, AxR> masked_counts(const std::array<std::int64_t, Axes::rank>& sx,
                                       const named_array<bool, AxM>& mask) {
  const reduce_plan p = make_reduce_plan<Axes, RList, AxM>(sx, &mask.sizes());
  std::array<std::int64_t, AxR::rank> rsizes{};
  if constexpr (AxR::rank > 0) rsizes = sizes_in<AxR, Axes>(sx);
  auto r = named_array<double, AxR>::allocate(rsizes, "haliax::masked_counts");
  masked_counts_kernel(p, mask.data(), r.data());
  return r;
}

/// g / n for a reduction over n elements.
struct mean_grad_fn {
  double n;
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V g) const {
    return static_cast<V>(static_cast<double>(g) / n);
  }
};
/// g / count, per output of a masked mean.
struct masked_mean_scale_fn {
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V g, double count) const {
    return static_cast<V>(static_cast<double>(g) / count);
  }
};

/// Sum: `g` broadcast back (0 where masked out).
template <class RList, class T, class AxR, class Axes, class AxM>
void record_sum_grad(named_array<T, AxR>& r, const named_array<T, Axes>& x, const named_array<bool, AxM>* mask) {
  if constexpr (FloatElement<T>) {
    if (!ad::any_tracked(x)) return;
    if (!mask) {
      ad::record(
          r,
          [sx = x.sizes()](const named_array<T, AxR>& g, auto) {
            return std::tuple{broadcast_copy<Axes>("haliax::sum_grad", g, sx)};
          },
          x);
    } else {
      ad::record(
          r,
          [sx = x.sizes(), m = *mask](const named_array<T, AxR>& g, auto) {
            return std::tuple{nary<T, Axes>("haliax::sum_grad", sx, where_grad_fn<true>{}, g, m)};
          },
          x);
    }
  }
}

/// Mean: `g / n` broadcast back; with a mask, `g / count` where it is true and 0 elsewhere.
template <class RList, class T, class AxR, class Axes, class AxM>
void record_mean_grad(named_array<T, AxR>& r, const named_array<T, Axes>& x, const named_array<bool, AxM>* mask) {
  if constexpr (FloatElement<T>) {
    if (!ad::any_tracked(x)) return;
    if (!mask) {
      double n = 1;
      mp::mp_for_each<RList>(
          [&]<class Tag>(Tag) { n *= static_cast<double>(x.sizes()[index_of_v<to_list<Axes>, Tag>]); });
      ad::record(
          r,
          [sx = x.sizes(), n](const named_array<T, AxR>& g, auto) {
            return std::tuple{nary<T, Axes>("haliax::mean_grad", sx, mean_grad_fn{n}, g)};
          },
          x);
    } else {
      ad::record(
          r,
          [sx = x.sizes(), m = *mask](const named_array<T, AxR>& g, auto) {
            auto counts = masked_counts<Axes, RList, AxR>(sx, m);
            auto scale = nary<T, AxR>("haliax::mean_grad", g.sizes(), masked_mean_scale_fn{}, g, counts);
            return std::tuple{nary<T, Axes>("haliax::mean_grad", sx, where_grad_fn<true>{}, scale, m)};
          },
          x);
    }
  }
}

/// The gradient of prod over RList (masked by `m` when valid): `g` times the product of the other elements of
/// each output, exact with zeros (with one zero only that element gets a gradient, with two or more none does).
/// Masked-out elements get 0.
template <class RList, class T, class Axes, class AxR, class AxM>
named_array<T, Axes> prod_grad(const named_array<T, Axes>& x, const named_array<T, AxR>& g,
                               const named_array<bool, AxM>& m) {
  const reduce_plan p = make_reduce_plan<Axes, RList, AxM>(x.sizes(), m.valid() ? &m.sizes() : nullptr);
  auto gx = named_array<T, Axes>::allocate(x.sizes(), "haliax::prod_grad");
  const T* px = x.data();
  const T* pg = g.data();
  const bool* pm = m.valid() ? m.data() : nullptr;
  T* po = gx.data();
  prod_grad_kernel<T>(p, px, pg, pm, po);
  return gx;
}

/// The gradient of max / min over RList with result `y` (masked by `m` when valid), JAX's rule: `g` split
/// evenly among the elements equal to the result, 0 for the others and for masked-out elements. A NaN result
/// has no equal element: its elements get NaN (0 * g / 0), as in JAX.
template <class RList, class T, class Axes, class AxR, class AxM>
named_array<T, Axes> extremum_grad(const named_array<T, Axes>& x, const named_array<T, AxR>& y,
                                   const named_array<T, AxR>& g, const named_array<bool, AxM>& m) {
  const reduce_plan p = make_reduce_plan<Axes, RList, AxM>(x.sizes(), m.valid() ? &m.sizes() : nullptr);
  auto gx = named_array<T, Axes>::allocate(x.sizes(), "haliax::extremum_grad");
  const T* px = x.data();
  const T* py = y.data();
  const T* pg = g.data();
  const bool* pm = m.valid() ? m.data() : nullptr;
  T* po = gx.data();
  extremum_grad_kernel<T>(p, px, py, pg, pm, po);
  return gx;
}

/// Product: see `prod_grad`.
template <class RList, class T, class AxR, class Axes, class AxM>
void record_prod_grad(named_array<T, AxR>& r, const named_array<T, Axes>& x, const named_array<bool, AxM>* mask) {
  if constexpr (FloatElement<T>) {
    if (!ad::any_tracked(x)) return;
    named_array<bool, AxM> m;
    if (mask) m = *mask;
    ad::record(
        r,
        [x = without_node(x), m](const named_array<T, AxR>& g, auto) { return std::tuple{prod_grad<RList>(x, g, m)}; },
        x);
  }
}

/// max / min: see `extremum_grad`.
template <class RList, class T, class AxR, class Axes, class AxM>
void record_extremum_grad(named_array<T, AxR>& r, const named_array<T, Axes>& x, const named_array<bool, AxM>* mask) {
  if constexpr (FloatElement<T>) {
    if (!ad::any_tracked(x)) return;
    named_array<bool, AxM> m;
    if (mask) m = *mask;
    ad::record(
        r,
        [x = without_node(x), y = without_node(r), m](const named_array<T, AxR>& g, auto) {
          return std::tuple{extremum_grad<RList>(x, y, g, m)};
        },
        x);
  }
}

/// The gradient of the (population) variance given the mean `mu`: 2 (x - mu) g / n; the term through the mean
/// vanishes because the deviations sum to zero.
struct var_grad_fn {
  double two_over_n;
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V x, V g, V mu) const {
    return g * (x - mu) * static_cast<V>(two_over_n);
  }
};
struct masked_var_grad_fn {
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V x, V g, V mu, double count, bool keep) const {
    return keep ? static_cast<V>(2.0 * static_cast<double>(g * (x - mu)) / count) : V(0);
  }
};

/// Variance: one kernel, from x and the mean the forward computed.
template <class RList, class T, class AxR, class Axes, class AxM>
void record_var_grad(named_array<T, AxR>& r, const named_array<T, Axes>& x, const named_array<T, AxR>& mu,
                     const named_array<bool, AxM>* mask) {
  if constexpr (FloatElement<T>) {
    if (!ad::any_tracked(x)) return;
    if (!mask) {
      double n = 1;
      mp::mp_for_each<RList>(
          [&]<class Tag>(Tag) { n *= static_cast<double>(x.sizes()[index_of_v<to_list<Axes>, Tag>]); });
      ad::record(
          r,
          [x = without_node(x), mu = without_node(mu), n](const named_array<T, AxR>& g, auto) {
            return std::tuple{nary<T, Axes>("haliax::var_grad", x.sizes(), var_grad_fn{2.0 / n}, x, g, mu)};
          },
          x);
    } else {
      ad::record(
          r,
          [x = without_node(x), mu = without_node(mu), m = *mask](const named_array<T, AxR>& g, auto) {
            auto counts = masked_counts<Axes, RList, AxR>(x.sizes(), m);
            return std::tuple{nary<T, Axes>("haliax::var_grad", x.sizes(), masked_var_grad_fn{}, x, g, mu, counts, m)};
          },
          x);
    }
  }
}

/// g * exp(x - logsumexp(x)): g times the softmax.
struct logsumexp_grad_fn {
  template <class V>
  KOKKOS_INLINE_FUNCTION V operator()(V x, V g, V lse) const {
    return g * math::exp(x - lse);
  }
};

}  // namespace detail

// Each reduction has two forms: `f(x, Axes...)` and `f(x, where_mask{m}, Axes...)`; no axes means all. RULE
// records the gradient (float elements).
#define HALIAX_DEFINE_REDUCTION(NAME, CONSTRAINT, OP, RULE, DOC)                                                    \
  /** DOC Drops the listed axes (all axes when none are listed). */                                                 \
  template <CONSTRAINT T, class Axes, class... R>                                                                   \
  requires ReducibleAxes<Axes, R...>                                                                                \
  auto NAME(const named_array<T, Axes>& x, R...) {                                                                  \
    auto r = detail::reduce<T, OP, T, Axes, axes<>, R...>("haliax::" #NAME, x, nullptr, OP{});                      \
    detail::RULE<detail::reduced_list_t<Axes, R...>>(r, x, static_cast<const named_array<bool, axes<>>*>(nullptr)); \
    return r;                                                                                                       \
  }                                                                                                                 \
  /** DOC Only elements where the mask is true take part; the mask broadcasts against x by name. */                 \
  template <CONSTRAINT T, class Axes, class AxM, class... R>                                                        \
  requires ReducibleAxes<Axes, R...> && detail::subset_v<detail::to_list<AxM>, detail::to_list<Axes>>               \
  auto NAME(const named_array<T, Axes>& x, const where_mask<AxM>& m, R...) {                                        \
    auto r = detail::reduce<T, OP, T, Axes, AxM, R...>("haliax::" #NAME, x, &m.mask, OP{});                         \
    detail::RULE<detail::reduced_list_t<Axes, R...>>(r, x, &m.mask);                                                \
    return r;                                                                                                       \
  }

// Gradients (float elements): sum, `g` broadcast back (0 where masked out); prod, `g` times the product of the
// other elements; mean, `g / count` broadcast back; max / min (JAX), `g` shared evenly among the elements equal
// to the result.
HALIAX_DEFINE_REDUCTION(sum, NumericElement, detail::sum_op<T>, record_sum_grad, Sum of the elements.)
HALIAX_DEFINE_REDUCTION(prod, NumericElement, detail::prod_op<T>, record_prod_grad, Product of the elements.)
HALIAX_DEFINE_REDUCTION(mean, FloatElement, detail::mean_op<T>, record_mean_grad, Arithmetic mean; NaN if empty.)
HALIAX_DEFINE_REDUCTION(max, NumericElement, detail::max_op<T>, record_extremum_grad, Maximum; NaN propagates.)
HALIAX_DEFINE_REDUCTION(min, NumericElement, detail::min_op<T>, record_extremum_grad, Minimum; NaN propagates.)
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
/// Gradient: 2 (x - mean) g / n, one kernel.
template <FloatElement T, class Axes, class... R>
requires ReducibleAxes<Axes, R...>
auto var(const named_array<T, Axes>& x, R... r) {
  named_array<T, reduced_axes_t<Axes, R...>> m, v;
  {
    detail::ad::pause_guard pause;  // one node for the whole computation, recorded below
    m = mean(x, r...);
    v = mean(square(x - m), r...);
  }
  detail::record_var_grad<detail::reduced_list_t<Axes, R...>>(v, x, m,
                                                              static_cast<const named_array<bool, axes<>>*>(nullptr));
  return v;
}
/// Variance over the elements where the mask is true. Gradient: 2 (x - mean) g / count there, 0 elsewhere.
template <FloatElement T, class Axes, class AxM, class... R>
requires ReducibleAxes<Axes, R...> && detail::subset_v<detail::to_list<AxM>, detail::to_list<Axes>>
auto var(const named_array<T, Axes>& x, const where_mask<AxM>& w, R... r) {
  named_array<T, reduced_axes_t<Axes, R...>> m, v;
  {
    detail::ad::pause_guard pause;
    m = mean(x, w, r...);
    v = mean(square(x - m), w, r...);
  }
  detail::record_var_grad<detail::reduced_list_t<Axes, R...>>(v, x, m, &w.mask);
  return v;
}

/// Standard deviation (ddof = 0) over the listed axes (all when none): sqrt(var), and differentiated as such.
template <FloatElement T, class Axes, class... R>
requires ReducibleAxes<Axes, R...>
auto std(const named_array<T, Axes>& x, R... r) { return sqrt(var(x, r...)); }
template <FloatElement T, class Axes, class AxM, class... R>
requires ReducibleAxes<Axes, R...> && detail::subset_v<detail::to_list<AxM>, detail::to_list<Axes>>
auto std(const named_array<T, Axes>& x, const where_mask<AxM>& w, R... r) { return sqrt(var(x, w, r...)); }

/// log(sum(exp(x))) over the listed axes (all when none), computed stably by shifting by the maximum.
/// For a single axis, `haliax::nn::logsumexp` (nn/functions.hpp) is the fused, vectorised kernel.
/// An all -inf slice gives -inf. Gradient: `g` times softmax(x) over the listed axes, one kernel (the shift is a
/// constant and never recorded).
template <FloatElement T, class Axes, class... R>
requires ReducibleAxes<Axes, R...>
auto logsumexp(const named_array<T, Axes>& x, R... r) {
  const bool rec = detail::ad::any_tracked(x);
  named_array<T, reduced_axes_t<Axes, R...>> lse;
  {
    detail::ad::pause_guard pause;
    auto m = max(x, r...);
    auto shift = where(isfinite(m), m, 0.0);
    lse = log(sum(exp(x - shift), r...)) + shift;
  }
  if (rec)
    detail::ad::record(
        lse,
        [x = detail::without_node(x), y = detail::without_node(lse)](const auto& g, auto) {
          return std::tuple{
              detail::nary<T, Axes>("haliax::logsumexp_grad", x.sizes(), detail::logsumexp_grad_fn{}, x, g, y)};
        },
        x);
  return lse;
}

}  // namespace haliax
