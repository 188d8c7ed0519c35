// haliax/ops/layout.hpp: axis order, names and grouping: rearrange, rename, flatten/unflatten, split,
// concatenate, stack, unbind, roll.
//
// Every op is constrained by a named concept, so a wrong axis fails at the call site with the op and the axis
// type in the message. Sizes are checked at run time and a mismatch throws `shape_error` naming both shapes.
//
//   auto y = haliax::rearrange<axes<Batch, ellipsis, Embed>>(x);       // {pos, batch, embed} -> {batch, pos, embed}
//   auto q = haliax::unflatten_axis(x, Embed, 12 * Head, 64 * HeadDim);  // {batch, embed} -> {batch, head, head_dim}
//
// Buffers: ops that only relabel (`rename`, `unflatten_axis`, `rearrange` to the same order, `flatten_axes` of
// axes already adjacent and in order) share `x`'s buffer, as copying a handle does. Ops that take a part of
// an array along an axis (`split`, `unbind`, and `index`/`slice` in indexing.hpp) share it too when the part
// is contiguous (every axis before the split axis has size 1, e.g. the leading axis); otherwise they copy.
// Arrays are treated as values: no op writes into its inputs.
//
// Gradients (see autodiff.hpp): every op records its backward rule for float arrays, including the ones that
// return views of x's buffer. Relabelling ops pass the gradient back relabelled (no copy); `rearrange` and
// `roll` apply the inverse permutation; `concatenate`/`stack` hand each input its part of the gradient;
// `split`/`unbind` assemble one gradient for x from the parts that were used (zeros elsewhere).
#pragma once

#include <algorithm>
#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core.hpp"
#include "../detail/ad.hpp"
#include "../detail/axis_algebra.hpp"
#include "../detail/copy.hpp"
#include "../detail/nd_loop.hpp"

namespace haliax {

// `AxisOf<Ax, Axes>` (core.hpp) and the partial-order tag `ellipsis` (axis.hpp) are used throughout.

/// `Ax` is an axis tag that is not an axis of `Axes` (a name a new axis may take).
template <class Ax, class Axes>
concept NewAxisFor = AxisTag<Ax> && AxisList<Axes> &&
    !detail::contains_v<detail::to_list<std::remove_cvref_t<Axes>>, std::remove_cvref_t<Ax>>;

/// Two axis lists hold the same axes, maybe in different orders.
template <class AxA, class AxB>
concept SameAxesAs = AxisList<AxA> && AxisList<AxB> &&
    detail::same_set_v<detail::to_list<std::remove_cvref_t<AxA>>, detail::to_list<std::remove_cvref_t<AxB>>>;

namespace detail::layout {

template <class T>
using view_t = Kokkos::View<T*, memory_space>;

template <class T>
view_t<T> alloc(const char* label, std::int64_t n) {
  ensure_initialized();
  return view_t<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), static_cast<std::size_t>(n));
}

/// Elements [off, off + n) of a buffer, sharing it.
template <class T>
view_t<T> subbuffer(const view_t<T>& v, std::int64_t off, std::int64_t n) {
  return Kokkos::subview(
      v, std::pair<std::size_t, std::size_t>(static_cast<std::size_t>(off), static_cast<std::size_t>(off + n)));
}

template <std::size_t N>
std::int64_t product(const std::array<std::int64_t, N>& s, std::size_t begin, std::size_t end) {
  std::int64_t p = 1;
  for (std::size_t i = begin; i < end; ++i) p *= s[i];
  return p;
}

/// `rows` rows of `width` contiguous elements: dst[r * dst_row + c] = src[r * src_row + c].
template <class T>
void copy_rows(const char* label, T* dst, std::int64_t dst_row, const T* src, std::int64_t src_row, std::int64_t rows,
               std::int64_t width) {
  if (rows <= 0 || width <= 0) return;
  const std::int64_t ext[2] = {rows, width};
  const std::int64_t ds[2] = {dst_row, 1};
  const std::int64_t ss[2] = {src_row, 1};
  copy_strided<T>(label, 2, dst, ds, src, ss, ext);
}

/// The block of an array (sizes `s`) with indices [start, start + len) along dim k, as a contiguous buffer in
/// the same axis order (sizes `s` with s[k] = len). Shares the buffer when the block is contiguous in it.
template <class T, std::size_t N>
view_t<T> slab(const char* label, const view_t<T>& v, const std::array<std::int64_t, N>& s, std::size_t k,
               std::int64_t start, std::int64_t len) {
  const std::int64_t outer = product(s, 0, k);
  const std::int64_t inner = product(s, k + 1, N);
  if (outer * len * inner == 0) return alloc<T>(label, 0);
  if (start == 0 && len == s[k]) return v;
  if (outer == 1) return subbuffer(v, start * inner, len * inner);
  auto out = alloc<T>(label, outer * len * inner);
  copy_rows<T>(label, out.data(), len * inner, v.data() + start * inner, s[k] * inner, outer, len * inner);
  return out;
}

/// `slab` of `x` as an array of axes R with sizes `rs`: x's buffer where the slab is contiguous (sharing it), else a
/// copy in a buffer from the cache (so that a steady-state step allocates nothing for it).
template <class R, class T, class Ax>
named_array<T, R> slab_array(const char* label, const named_array<T, Ax>& x, const std::array<std::int64_t, R::rank>& rs,
                             std::size_t k, std::int64_t start, std::int64_t len) {
  const auto& s = x.sizes();
  const std::int64_t outer = product(s, 0, k);
  const std::int64_t inner = product(s, k + 1, Ax::rank);
  if (outer * len * inner == 0 || (start == 0 && len == s[k]) || outer == 1)
    return named_array<T, R>(slab<T>(label, x.view(), s, k, start, len), rs, x);
  auto out = named_array<T, R>::allocate(rs, label);
  copy_rows<T>(label, out.data(), len * inner, x.data() + start * inner, s[k] * inner, outer, len * inner);
  return out;
}

/// Copies `x` (axes AxA) into a new buffer in the order AxR (a permutation of AxA).
template <class AxR, class T, class AxA>
named_array<T, AxR> permute_copy(const char* label, const named_array<T, AxA>& x) {
  constexpr std::size_t N = AxA::rank;
  constexpr auto pos = positions_v<to_list<AxA>, to_list<AxR>>;
  const auto xs = row_major_strides(x.sizes());
  std::array<std::int64_t, N> rsizes{}, src{};
  for (std::size_t i = 0; i < N; ++i) {
    rsizes[i] = x.sizes()[pos[i]];
    src[i] = xs[pos[i]];
  }
  auto r = named_array<T, AxR>::allocate(rsizes, label);
  const auto dst = row_major_strides(rsizes);
  copy_strided<T>(label, static_cast<int>(N), r.data(), dst.data(), x.data(), src.data(), rsizes.data());
  return r;
}

/// Sizes of `x` (axes AxA) read in the order of AxR (a permutation of AxA).
template <class AxR, class AxA, std::size_t N>
std::array<std::int64_t, N> permuted_sizes(const std::array<std::int64_t, N>& s) {
  constexpr auto pos = positions_v<to_list<AxA>, to_list<AxR>>;
  std::array<std::int64_t, N> r{};
  for (std::size_t i = 0; i < N; ++i) r[i] = s[pos[i]];
  return r;
}

/// Strides of `x` (axes AxA, sizes s) read in the order of AxR (a permutation of AxA).
template <class AxR, class AxA, std::size_t N>
std::array<std::int64_t, N> permuted_strides(const std::array<std::int64_t, N>& s) {
  return permuted_sizes<AxR, AxA>(row_major_strides(s));
}

/// Throws unless arrays with axes AxA/AxB (same set) agree on every axis except `Skip` (void: every axis).
template <class Skip, class AxA, class AxB, std::size_t N>
void check_sizes_except(std::string_view op, const std::array<std::int64_t, N>& sa,
                        const std::array<std::int64_t, N>& sb) {
  using LA = to_list<AxA>;
  using LB = to_list<AxB>;
  mp::mp_for_each<mp::mp_remove<LA, Skip>>([&]<class Tag>(Tag) {
    constexpr auto ia = index_of_v<LA, Tag>;
    constexpr auto ib = index_of_v<LB, Tag>;
    if (sa[ia] != sb[ib])
      throw shape_error(std::string(op) + ": axis '" + std::string(Tag::name) + "' has size " + std::to_string(sa[ia]) +
                        " in " + shape_string(axis_names<AxA>(), sa) + " but " + std::to_string(sb[ib]) + " in " +
                        shape_string(axis_names<AxB>(), sb));
  });
}

template <class... S>
std::string sized_list_string(const S&... s) {
  std::string r = "{";
  bool first = true;
  ((r += (first ? "" : ", "), r += std::string(S::axis_type::name) + "=" + std::to_string(s.size), first = false), ...);
  return r + "}";
}

// ---- gradient helpers -------------------------------------------------------------------------------

/// a + b, in float for bf16.
template <class T>
KOKKOS_INLINE_FUNCTION T grad_add(T a, T b) {
  if constexpr (std::is_same_v<T, bf16>) {
    return bf16(static_cast<float>(a) + static_cast<float>(b));
  } else {
    return a + b;
  }
}

/// `rows` rows of `width` contiguous elements: dst[r * dst_row + c] += src[r * src_row + c]. Every destination
/// element is written by one thread (deterministic).
template <class T>
void add_rows(const char* label, T* dst, std::int64_t dst_row, const T* src, std::int64_t src_row, std::int64_t rows,
              std::int64_t width) {
  if (rows <= 0 || width <= 0) return;
  const std::int64_t ext[2] = {rows, width};
  const std::int64_t ds[2] = {dst_row, 1};
  const std::int64_t ss[2] = {src_row, 1};
  const std::int64_t* st[2] = {ds, ss};
  auto plan = make_plan<2>(2, ext, st);
  nd_for_each<2>(
      label, plan, KOKKOS_LAMBDA(const std::int64_t* off, const std::int64_t* s, std::int64_t n) {
        T* o = dst + off[0];
        const T* in = src + off[1];
        for (std::int64_t j = 0; j < n; ++j) o[j * s[0]] = grad_add(o[j * s[0]], in[j * s[1]]);
      });
}

/// unslab's copy (an axis-free function, for nvcc: see haliax::detail::fill_raw).
template <class T>
void unslab_kernel(const char* label, const T* src, T* po, std::int64_t rows, std::int64_t dst_w, std::int64_t src_w,
                   std::int64_t c0, std::int64_t c1, std::int64_t shift) {
  constexpr std::int64_t block = host_memory ? 4096 : 1;  // elements per work item: runs on the host, one on a device
  const std::int64_t nb = (dst_w + block - 1) / block;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, rows * nb), KOKKOS_LAMBDA(std::int64_t t) {
        const std::int64_t row = t / nb;
        const std::int64_t b0 = (t - row * nb) * block;
        const std::int64_t b1 = b0 + block < dst_w ? b0 + block : dst_w;
        const std::int64_t a = c0 < b0 ? b0 : (c0 > b1 ? b1 : c0);
        const std::int64_t e = c1 < a ? a : (c1 > b1 ? b1 : c1);
        T* o = po + row * dst_w;
        const std::int64_t in = row * src_w + shift;
        for (std::int64_t c = b0; c < a; ++c) o[c] = T(0);
        for (std::int64_t c = a; c < e; ++c) o[c] = src[in + c];
        for (std::int64_t c = e; c < b1; ++c) o[c] = T(0);
      });
}

/// The gradient of a part along one axis: an array of sizes `s` (axes Axes) that is zero except at positions
/// [start, start + len) of dim k (clipped to [0, s[k])), which hold the matching positions of `src`, a
/// contiguous buffer in the same axis order with `len` positions along k. One pass, each element written once.
template <class Axes, class T>
named_array<T, Axes> unslab(const char* label, const T* src, const std::array<std::int64_t, Axes::rank>& s,
                            std::size_t k, std::int64_t start, std::int64_t len) {
  auto r = named_array<T, Axes>::allocate(s, label);
  if (r.element_count() == 0) return r;
  const std::int64_t n = s[k];
  const std::int64_t inner = product(s, k + 1, Axes::rank);
  const std::int64_t rows = product(s, 0, k);
  const std::int64_t lo = std::clamp<std::int64_t>(start, 0, n), hi = std::clamp<std::int64_t>(start + len, 0, n);
  const std::int64_t dst_w = n * inner, src_w = len * inner;
  const std::int64_t c0 = lo * inner, c1 = hi * inner, shift = -start * inner;  // column c reads src column c + shift
  unslab_kernel<T>(label, src, r.data(), rows, dst_w, src_w, c0, c1, shift);
  return r;
}

/// Adds `src` (a contiguous slab of `len` positions along dim k, in dst's axis order) into positions
/// [start, start + len) of dim k of `dst`.
template <class T, class Axes>
void add_slab(const named_array<T, Axes>& dst, std::size_t k, std::int64_t start, std::int64_t len, const T* src) {
  const auto& s = dst.sizes();
  const std::int64_t inner = product(s, k + 1, Axes::rank);
  add_rows<T>("haliax::grad_gather", dst.data() + start * inner, s[k] * inner, src, len * inner, product(s, 0, k),
              len * inner);
}

/// Positions [start, start + bs[k]) of dim k of `g` (axes AxG), as an array with axes AxB (a permutation of
/// AxG) and sizes `bs`: a view of g's buffer when the part is contiguous and in order, else one strided copy.
template <class AxB, class T, class AxG>
named_array<T, AxB> slab_as(const named_array<T, AxG>& g, std::size_t k, std::int64_t start,
                            const std::array<std::int64_t, AxB::rank>& bs) {
  if constexpr (std::is_same_v<AxB, AxG>) {
    return slab_array<AxB>("haliax::grad_part", g, bs, k, start, bs[k]);
  } else {
    auto r = named_array<T, AxB>::allocate(bs, "haliax::grad_part");
    if (r.element_count() == 0) return r;
    const auto gs = row_major_strides(g.sizes());
    const auto dst = row_major_strides(bs);
    const auto src = permuted_strides<AxB, AxG>(g.sizes());
    copy_strided<T>("haliax::grad_part", static_cast<int>(AxB::rank), r.data(), dst.data(), g.data() + start * gs[k],
                    src.data(), bs.data());
    return r;
  }
}

/// Records `bwd` for `out` when T is a float type and one of `in...` is tracked (see detail/ad.hpp).
template <class T, class Axes, class Bwd, class... In>
void record_grad(named_array<T, Axes>& out, Bwd bwd, const In&... in) {
  if constexpr (FloatElement<T>) {
    if (ad::any_tracked(in...)) ad::record(out, std::move(bwd), in...);
  }
}

/// `g` (axes AxG) relabelled as axes AxX with sizes `s` (the same elements in the same order): no copy.
template <class AxX, class T, class AxG>
named_array<T, AxX> relabel(const named_array<T, AxG>& g, const std::array<std::int64_t, AxX::rank>& s) {
  return named_array<T, AxX>(g.view(), s, g);
}

/// `x` read as an array of axes AxR with sizes `s` (the same elements in the same order, no copy); the gradient is
/// read back the same way.
template <class AxR, class T, class AxX>
named_array<T, AxR> reinterpret(const named_array<T, AxX>& x, const std::array<std::int64_t, AxR::rank>& s) {
  auto r = relabel<AxR>(x, s);
  record_grad(
      r, [xs = x.sizes()](const named_array<T, AxR>& g, auto) { return std::tuple{relabel<AxX>(g, xs)}; }, x);
  return r;
}

// ---- rename -----------------------------------------------------------------------------------------

template <class Olds, class News>
struct renamer {
  // mp_find gives size(Olds) when T is not renamed, which indexes T itself in News + [T].
  template <class T>
  using fn = mp::mp_at<mp::mp_push_back<News, T>, mp::mp_find<Olds, T>>;
};
template <class L, class Olds, class News>
using renamed = mp::mp_transform_q<renamer<Olds, News>, L>;

/// Splits a pack `Old1, New1, Old2, New2, ...` into its olds and news.
template <class... P>
struct pairs {
  using olds = mp::mp_list<>;
  using news = mp::mp_list<>;
  static constexpr bool even = true;
};
template <class A>
struct pairs<A> {
  using olds = mp::mp_list<>;
  using news = mp::mp_list<>;
  static constexpr bool even = false;
};
template <class A, class B, class... R>
struct pairs<A, B, R...> {
  using olds = mp::mp_push_front<typename pairs<R...>::olds, A>;
  using news = mp::mp_push_front<typename pairs<R...>::news, B>;
  static constexpr bool even = pairs<R...>::even;
};

template <class L, class... P>
struct rename_pairs {
  using pr = pairs<P...>;
  static constexpr bool valid = pr::even && is_unique_v<typename pr::olds> && subset_v<typename pr::olds, L> &&
                                is_unique_v<renamed<L, typename pr::olds, typename pr::news>>;
};

// ---- flatten_axes -----------------------------------------------------------------------------------

template <class LX, class LO, class New>
struct flatten {
  static constexpr std::size_t first = mp::mp_find_if_q<LX, in_list<LO>>::value;
  using before = mp::mp_take_c<LX, first>;
  using rest = difference<mp::mp_drop_c<LX, first>, LO>;
  using intermediate = mp::mp_append<before, LO, rest>;  // the old axes gathered where the first one was
  using result = mp::mp_append<before, mp::mp_list<New>, rest>;
  static constexpr bool valid =
      !mp::mp_empty<LO>::value && is_unique_v<LO> && subset_v<LO, LX> && !contains_v<difference<LX, LO>, New>;
};

// ---- unflatten_axis ---------------------------------------------------------------------------------

template <class LX, class Ax, class LN>
struct unflatten {
  static constexpr std::size_t k = mp::mp_find<LX, Ax>::value;
  using result = mp::mp_append<mp::mp_take_c<LX, k>, LN, mp::mp_drop_c<LX, k + 1>>;
  static constexpr bool valid = contains_v<LX, Ax> && is_unique_v<result>;
};

}  // namespace detail::layout

/// `Order` is a permutation of `Axes`, or a partial order of some of its axes with one `ellipsis` standing
/// for the rest (upstream `PartialAxisSpec` with at most one `...`).
template <class Order, class Axes>
concept ArrangementOf = AxisList<Order> && AxisList<Axes> &&
    detail::valid_order_v<detail::to_list<std::remove_cvref_t<Axes>>, detail::to_list<std::remove_cvref_t<Order>>>;

/// `P...` is a list of pairs `Old, New` that renames axes of `Axes`: every Old is an axis of it (each at most
/// once) and the renamed list has no duplicate (a New may be an existing axis only if that one is renamed too).
template <class Axes, class... P>
concept RenamingOf =
    AxisList<Axes> && sizeof...(P) > 0 &&
    (AxisTag<P> && ...) && detail::layout::rename_pairs<detail::to_list<Axes>, std::remove_cvref_t<P>...>::valid;

/// `Old` (an axis list) can be flattened into the axis `New` in an array with axes `Axes`: Old is non-empty,
/// has no duplicate, holds axes of `Axes` only, and New is not one of the axes that remain.
template <class Old, class New, class Axes>
concept FlattenableInto = AxisList<Old> && AxisTag<New> && AxisList<Axes> &&
    detail::layout::flatten<detail::to_list<Axes>, detail::to_list<Old>, std::remove_cvref_t<New>>::valid;

/// `Ax` is an axis of `Axes` and the new axes `New...` (tags) can take its place without duplicates.
template <class Ax, class Axes, class... New>
concept UnflattenableInto =
    AxisTag<Ax> && AxisList<Axes> &&(AxisTag<New>&&...) &&
    detail::layout::unflatten<detail::to_list<Axes>, std::remove_cvref_t<Ax>, detail::mp::mp_list<New...>>::valid;

/// `New` can replace the axis `Ax` of `Axes` (same axis, or one not already in `Axes`).
template <class New, class Ax, class Axes>
concept ReplacementFor = AxisOf<Ax, Axes> && AxisTag<New> &&
    (std::same_as<std::remove_cvref_t<New>, std::remove_cvref_t<Ax>> || NewAxisFor<New, Axes>);

namespace detail::layout {
template <class Order, class Axes>
requires ArrangementOf<Order, Axes>
using arranged_axes = to_axes<resolve_order<to_list<Axes>, to_list<Order>>>;

template <class Axes, class Ax>
using without_axis = to_axes<mp::mp_remove<to_list<Axes>, std::remove_cvref_t<Ax>>>;

template <class New, class Axes>
using prepended = to_axes<mp::mp_push_front<to_list<Axes>, std::remove_cvref_t<New>>>;

template <class Axes, class Ax, class New>
using replaced_axis = to_axes<replace<to_list<Axes>, std::remove_cvref_t<Ax>, std::remove_cvref_t<New>>>;
}  // namespace detail::layout

// ---------------------------------------------------------------------------------------------------------
// rearrange

/// `x` with its axes in the order `Order` (upstream `rearrange(x, axes)`): a permutation of x's axes, or a
/// partial order with one `ellipsis` that keeps the unlisted axes in their original order there. Keeps every
/// axis. Returns `x` itself (shared buffer) when the order is unchanged, otherwise a permuted copy.
/// Gradient: g permuted back to x's order.
///   auto y = rearrange<axes<Embed, Batch>>(x);                  // {batch, embed} -> {embed, batch}
///   auto z = rearrange<axes<Batch, ellipsis, Embed>>(w);        // {pos, embed, batch} -> {batch, pos, embed}
template <class Order, class T, class Axes>
requires ArrangementOf<Order, Axes> named_array<T, detail::layout::arranged_axes<Order, Axes>> rearrange(
    const named_array<T, Axes>& x) {
  using R = detail::layout::arranged_axes<Order, Axes>;
  if constexpr (std::is_same_v<R, Axes>) {
    return x;
  } else {
    auto r = detail::layout::permute_copy<R>("haliax::rearrange", x);
    detail::layout::record_grad(
        r,
        [](const named_array<T, R>& g, auto) {
          return std::tuple{detail::layout::permute_copy<Axes>("haliax::rearrange_grad", g)};
        },
        x);
    return r;
  }
}

/// `rearrange(x, axes<Embed, Batch>{})`: the same with the order passed as a value.
///   auto y = rearrange(x, axes<Embed, Batch>{});
template <class T, class Axes, AxisList Order>
requires ArrangementOf<Order, Axes>
auto rearrange(const named_array<T, Axes>& x, Order) { return rearrange<Order>(x); }

/// `rearrange(x, Batch, ellipsis, Embed)`: the order written with the axis objects, as upstream's
/// `rearrange(x, (Batch, ..., Embed))`.
///   auto y = rearrange(x, Embed, Batch);
template <class T, class Axes, AxisTag... A>
requires(sizeof...(A) > 0) && ArrangementOf<detail::to_axes<detail::mp::mp_list<A...>>, Axes> auto rearrange(
                                  const named_array<T, Axes>& x, A...) {
  return rearrange<detail::to_axes<detail::mp::mp_list<A...>>>(x);
}

// ---------------------------------------------------------------------------------------------------------
// rename

/// `x` with axis `Old` renamed to `New` (upstream `rename(x, {old: new})`); same buffer, no copy. `Old` must be
/// an axis of x and `New` must not be (renaming an axis to itself is allowed). Gradient: g renamed back.
///   auto k = rename(x, Pos, KPos);   // {batch, position, embed} -> {batch, key_position, embed}
template <class T, class Axes, AxisTag Old, AxisTag New>
requires AxisOf<Old, Axes> && ReplacementFor<New, Old, Axes>
    named_array<T, detail::layout::replaced_axis<Axes, Old, New>> rename(const named_array<T, Axes>& x, Old, New) {
  using namespace detail;
  using R = layout::replaced_axis<Axes, Old, New>;
  named_array<T, R> r(x.view(), x.sizes(), x);
  layout::record_grad(
      r, [](const named_array<T, R>& g, auto) { return std::tuple{layout::relabel<Axes>(g, g.sizes())}; }, x);
  return r;
}

/// Several renames at once: `rename(x, Old1, New1, Old2, New2, ...)`, applied simultaneously (so
/// `rename(x, X, Y, Y, X)` swaps two names). Same buffer, no copy.
///   auto s = rename(x, Pos, KPos, Head, KHead);
template <class T, class Axes, AxisTag... P>
requires(sizeof...(P) >= 4) && RenamingOf<Axes, P...> auto rename(const named_array<T, Axes>& x, P...) {
  using namespace detail;
  using pr = layout::pairs<std::remove_cvref_t<P>...>;
  using R = to_axes<layout::renamed<to_list<Axes>, typename pr::olds, typename pr::news>>;
  named_array<T, R> r(x.view(), x.sizes(), x);
  layout::record_grad(
      r, [](const named_array<T, R>& g, auto) { return std::tuple{layout::relabel<Axes>(g, g.sizes())}; }, x);
  return r;
}

// ---------------------------------------------------------------------------------------------------------
// flatten_axes / unflatten_axis

/// Merges the axes `Old` (an `axes<...>` list) into one new axis `New` whose size is their product (upstream
/// `flatten_axes(x, old_axes, new_axis)`). The new axis takes the place of the first of them in x's order;
/// the others are dropped; the merged index runs row-major over `Old` in the order given there. The old axes
/// need not be adjacent (the data is permuted then); when they already are, in that order, the buffer is
/// shared. Gradient: g unflattened (and permuted back when x was permuted).
///   auto f = flatten_axes<axes<Head, HeadDim>>(x, Embed);   // {batch, head, head_dim} -> {batch, embed}
///   auto g = flatten_axes<axes<Batch, Pos>>(y, Token);      // {batch, embed, position} -> {token, embed}
template <class Old, class T, class Axes, AxisTag New>
requires FlattenableInto<Old, New, Axes>
auto flatten_axes(const named_array<T, Axes>& x, New) {
  using namespace detail;
  using F = layout::flatten<to_list<Axes>, to_list<Old>, std::remove_cvref_t<New>>;
  using I = to_axes<typename F::intermediate>;
  using R = to_axes<typename F::result>;
  constexpr std::size_t k = F::first;
  constexpr std::size_t nold = Old::rank;
  auto sizes = layout::permuted_sizes<I, Axes>(x.sizes());
  std::array<std::int64_t, R::rank> rs{};
  for (std::size_t i = 0; i < k; ++i) rs[i] = sizes[i];
  rs[k] = layout::product(sizes, k, k + nold);
  for (std::size_t i = k + nold; i < Axes::rank; ++i) rs[i - nold + 1] = sizes[i];
  named_array<T, R> r;
  if constexpr (std::is_same_v<I, Axes>) {
    r = named_array<T, R>(x.view(), rs, x);
  } else {
    const auto permuted = layout::permute_copy<I>("haliax::flatten_axes", x);
    r = named_array<T, R>(permuted.view(), rs, permuted);
  }
  layout::record_grad(
      r,
      [sizes](const named_array<T, R>& g, auto) {
        auto gi = layout::relabel<I>(g, sizes);
        if constexpr (std::is_same_v<I, Axes>) {
          return std::tuple{gi};
        } else {
          return std::tuple{layout::permute_copy<Axes>("haliax::flatten_axes_grad", gi)};
        }
      },
      x);
  return r;
}

/// `flatten_axes(x, axes<Head, HeadDim>{}, Embed)`: the same with the old axes passed as a value.
///   auto f = flatten_axes(x, axes<Head, HeadDim>{}, Embed);
template <class T, class Axes, AxisList Old, AxisTag New>
requires FlattenableInto<Old, New, Axes>
auto flatten_axes(const named_array<T, Axes>& x, Old, New n) { return flatten_axes<Old>(x, n); }

/// `flatten_axes<Old>(x, 768 * Embed)`: the same, checking that the product of the old sizes is 768
/// (throws `shape_error` naming the shape otherwise).
///   auto f = flatten_axes<axes<Head, HeadDim>>(x, 768 * Embed);
template <class Old, class T, class Axes, AxisTag New>
requires FlattenableInto<Old, New, Axes>
auto flatten_axes(const named_array<T, Axes>& x, sized_axis<New> n) {
  auto r = flatten_axes<Old>(x, New{});
  if (r.size(New{}) != n.size)
    throw shape_error("haliax::flatten_axes: axis '" + std::string(New::name) + "' was given size " +
                      std::to_string(n.size) + " but the flattened axes of " + x.shape_string() + " hold " +
                      std::to_string(r.size(New{})));
  return r;
}

/// Splits axis `Ax` into the sized new axes `new_axes...`, in place (upstream `unflatten_axis`); the product
/// of their sizes must equal Ax's size (else `shape_error` naming both). Row-major: the last new axis varies
/// fastest. Same buffer, no copy. With no new axes it removes an axis of size 1. Gradient: g flattened back.
///   auto h = unflatten_axis(x, Embed, 12 * Head, 64 * HeadDim);   // {batch, embed} -> {batch, head, head_dim}
///   auto s = unflatten_axis(y, One);                              // drops the size-1 axis One
template <class T, class Axes, AxisTag Ax, SizedAxis... S>
requires AxisOf<Ax, Axes> && UnflattenableInto<Ax, Axes, typename S::axis_type...>
auto unflatten_axis(const named_array<T, Axes>& x, Ax, S... new_axes) {
  using namespace detail;
  using U = layout::unflatten<to_list<Axes>, std::remove_cvref_t<Ax>, mp::mp_list<typename S::axis_type...>>;
  using R = to_axes<typename U::result>;
  constexpr std::size_t k = U::k;
  constexpr std::size_t m = sizeof...(S);
  const std::array<std::int64_t, m> ns{new_axes.size...};
  std::int64_t prod = 1;
  for (auto n : ns) prod *= n;
  if (prod != x.sizes()[k])
    throw shape_error("haliax::unflatten_axis: axis '" + std::string(std::remove_cvref_t<Ax>::name) + "' of " +
                      x.shape_string() + " has size " + std::to_string(x.sizes()[k]) + " but " +
                      layout::sized_list_string(new_axes...) + " hold " + std::to_string(prod));
  std::array<std::int64_t, R::rank> rs{};
  for (std::size_t i = 0; i < k; ++i) rs[i] = x.sizes()[i];
  for (std::size_t i = 0; i < m; ++i) rs[k + i] = ns[i];
  for (std::size_t i = k + 1; i < Axes::rank; ++i) rs[i - 1 + m] = x.sizes()[i];
  named_array<T, R> r(x.view(), rs, x);
  layout::record_grad(
      r, [xs = x.sizes()](const named_array<T, R>& g, auto) { return std::tuple{layout::relabel<Axes>(g, xs)}; }, x);
  return r;
}

// ---------------------------------------------------------------------------------------------------------
// split / unbind

namespace detail::layout {
/// Records `part`, the positions [start, start + len) of dim k of a tracked array whose gradient `gn`
/// assembles (len defaults to the part's size along k), and advances `start` past it.
template <class T, class AxP, class AxX>
void record_part(named_array<T, AxP>& part, const std::shared_ptr<ad::gather_node<T, AxX>>& gn, std::size_t k,
                 std::int64_t& start, std::int64_t len = -1) {
  if (len < 0) len = part.sizes()[k];
  ad::record_custom(part, [gn, k, s0 = start, len](const named_array<T, AxP>& g) {
    add_slab(gn->ensure_grad(), k, s0, len, g.data());
  });
  start += len;
}
}  // namespace detail::layout

/// Splits `x` along `Ax` into consecutive pieces, one per sized new axis (upstream `split(x, axis, new_axes)`):
/// piece i has Ax replaced (in place) by new axis i with its size. The sizes must add up to Ax's size (else
/// `shape_error`). Returns a `std::tuple`. Pieces share x's buffer when contiguous in it, else are copies.
/// Gradient: x receives one gradient assembled from the pieces' (zeros where a piece is unused).
///   auto [q, k] = split(x, Embed, 64 * QDim, 64 * KDim);   // {pos, embed=128} -> {pos, q_dim}, {pos, k_dim}
template <class T, class Axes, AxisTag Ax, SizedAxis... S>
requires(sizeof...(S) > 0) && AxisOf<Ax, Axes> &&
    (ReplacementFor<typename S::axis_type, Ax, Axes> && ...) auto split(const named_array<T, Axes>& x, Ax,
                                                                        S... pieces) {
  using namespace detail;
  using A = std::remove_cvref_t<Ax>;
  constexpr std::size_t k = index_of_v<to_list<Axes>, A>;
  std::int64_t total = (pieces.size + ... + std::int64_t{0});
  bool negative = ((pieces.size < 0) || ...);
  if (negative || total != x.sizes()[k])
    throw shape_error("haliax::split: pieces " + layout::sized_list_string(pieces...) + " add up to " +
                      std::to_string(total) + " but axis '" + std::string(A::name) + "' has size " +
                      std::to_string(x.sizes()[k]) + " in " + x.shape_string());
  std::int64_t start = 0;
  auto piece = [&]<class P>(const P& p) {
    using R = layout::replaced_axis<Axes, A, typename P::axis_type>;
    auto s = x.sizes();
    s[k] = p.size;
    auto v = layout::slab_array<R>("haliax::split", x, s, k, start, p.size);
    start += p.size;
    return v;
  };
  // Braced init evaluates left to right, so the pieces get consecutive starts.
  auto out = std::tuple{piece(pieces)...};
  if constexpr (FloatElement<T>) {
    if (ad::tracked(x)) {
      auto gn = ad::make_gather(x);
      std::int64_t s0 = 0;
      std::apply([&](auto&... p) { (layout::record_part(p, gn, k, s0), ...); }, out);
    }
  }
  return out;
}

/// Splits `x` along `Ax` into pieces of the given sizes, each keeping the axis name (useful for fused
/// q/k/v projections). The sizes must add up to Ax's size (else `shape_error`). Pieces share x's buffer when
/// contiguous in it, else are copies. Gradient as for the other `split`.
///   auto parts = split(qkv, Embed, {768, 768, 768});   // three {pos, embed=768} from {pos, embed=2304}
template <class T, class Axes, AxisTag Ax>
requires AxisOf<Ax, Axes> std::vector<named_array<T, Axes>> split(const named_array<T, Axes>& x, Ax,
                                                                  const std::vector<std::int64_t>& sizes) {
  using namespace detail;
  using A = std::remove_cvref_t<Ax>;
  constexpr std::size_t k = index_of_v<to_list<Axes>, A>;
  std::int64_t total = 0;
  bool negative = false;
  std::string list = "[";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    total += sizes[i];
    negative = negative || sizes[i] < 0;
    list += (i ? ", " : "") + std::to_string(sizes[i]);
  }
  if (negative || total != x.sizes()[k])
    throw shape_error("haliax::split: sizes " + list + "] add up to " + std::to_string(total) + " but axis '" +
                      std::string(A::name) + "' has size " + std::to_string(x.sizes()[k]) + " in " + x.shape_string());
  std::vector<named_array<T, Axes>> out;
  out.reserve(sizes.size());
  std::int64_t start = 0;
  for (auto n : sizes) {
    auto s = x.sizes();
    s[k] = n;
    out.push_back(layout::slab_array<Axes>("haliax::split", x, s, k, start, n));
    start += n;
  }
  if constexpr (FloatElement<T>) {
    if (ad::tracked(x)) {
      auto gn = ad::make_gather(x);
      std::int64_t s0 = 0;
      for (auto& p : out) layout::record_part(p, gn, k, s0);
    }
  }
  return out;
}

/// The slices of `x` along `Ax`, each without that axis (upstream `unbind`): element i is x at index i of Ax.
/// Slices share x's buffer when contiguous in it (e.g. Ax leading), else are copies. Gradient: x receives one
/// gradient assembled from the slices' (zeros where a slice is unused).
///   auto layers = unbind(w, Layers);   // {layers, embed, mlp} -> vector of {embed, mlp}
template <class T, class Axes, AxisTag Ax>
requires AxisOf<Ax, Axes> std::vector<named_array<T, detail::layout::without_axis<Axes, Ax>>> unbind(
    const named_array<T, Axes>& x, Ax) {
  using namespace detail;
  using A = std::remove_cvref_t<Ax>;
  using R = layout::without_axis<Axes, A>;
  constexpr std::size_t k = index_of_v<to_list<Axes>, A>;
  std::array<std::int64_t, R::rank> rs{};
  for (std::size_t i = 0, j = 0; i < Axes::rank; ++i)
    if (i != k) rs[j++] = x.sizes()[i];
  std::vector<named_array<T, R>> out;
  out.reserve(static_cast<std::size_t>(x.sizes()[k]));
  for (std::int64_t i = 0; i < x.sizes()[k]; ++i)
    out.push_back(layout::slab_array<R>("haliax::unbind", x, rs, k, i, 1));
  if constexpr (FloatElement<T>) {
    if (ad::tracked(x)) {
      auto gn = ad::make_gather(x);
      std::int64_t s0 = 0;
      for (auto& p : out) layout::record_part(p, gn, k, s0, 1);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// concatenate / stack

namespace detail::layout {
/// Copies `a` (axes AxA, a permutation of AxR) into `dst` (a buffer with axes AxR and sizes rsizes) at
/// offset `start` along dim k of the result.
template <class AxR, class T, class AxA>
void place(const char* label, T* dst, const std::array<std::int64_t, AxR::rank>& rsizes, std::size_t k,
           std::int64_t start, const named_array<T, AxA>& a) {
  constexpr std::size_t N = AxR::rank;
  const auto dst_strides = row_major_strides(rsizes);
  const auto src_strides = permuted_strides<AxR, AxA>(a.sizes());
  const auto ext = permuted_sizes<AxR, AxA>(a.sizes());
  copy_strided<T>(label, static_cast<int>(N), dst + start * dst_strides[k], dst_strides.data(), a.data(),
                  src_strides.data(), ext.data());
}

template <class Ax, class T, class Axes, class... Rest>
named_array<T, Axes> concatenate_impl(const named_array<T, Axes>& first, const named_array<T, Rest>&... rest) {
  constexpr std::size_t k = index_of_v<to_list<Axes>, Ax>;
  auto rs = first.sizes();
  [[maybe_unused]] auto check_and_add = [&]<class AxB>(const named_array<T, AxB>& b) {
    check_sizes_except<Ax, Axes, AxB>("haliax::concatenate", first.sizes(), b.sizes());
    rs[k] += b.sizes()[index_of_v<to_list<AxB>, Ax>];
  };
  (check_and_add(rest), ...);
  auto r = named_array<T, Axes>::allocate(rs, "haliax::concatenate");
  std::int64_t start = 0;
  std::array<std::int64_t, 1 + sizeof...(Rest)> starts{};
  std::size_t i = 0;
  auto put = [&]<class AxB>(const named_array<T, AxB>& b) {
    place<Axes>("haliax::concatenate", r.data(), rs, k, start, b);
    starts[i++] = start;
    start += b.sizes()[index_of_v<to_list<AxB>, Ax>];
  };
  put(first);
  (put(rest), ...);
  // Gradient: each input gets its part of g, in its own axis order.
  record_grad(
      r,
      [starts, sf = first.sizes(), sr = std::tuple{rest.sizes()...}](const named_array<T, Axes>& g, auto needs) {
        return [&]<std::size_t... I>(std::index_sequence<I...>) {
          auto part = [&]<class AxB>(std::size_t j, const std::array<std::int64_t, AxB::rank>& bs) {
            return needs[j] ? slab_as<AxB>(g, k, starts[j], bs) : named_array<T, AxB>{};
          };
          return std::tuple{part.template operator()<Axes>(0, sf),
                            part.template operator()<Rest>(I + 1, std::get<I>(sr))...};
        }(std::index_sequence_for<Rest...>{});
      },
      first, rest...);
  return r;
}
}  // namespace detail::layout

/// Joins arrays end to end along the existing axis `Ax` (upstream `concatenate(axis, arrays)`). All arrays
/// must have the same axes (in any order; the result takes the first's order) and agree on every size but
/// Ax's, which add up (else `shape_error` naming both shapes). Gradient: each input gets its part of g.
///   auto c = concatenate(Pos, a, b);   // {pos=3, embed}, {embed, pos=5} -> {pos=8, embed}
template <AxisTag Ax, class T, class Axes, class... Rest>
requires AxisOf<Ax, Axes> &&
    (SameAxesAs<Rest, Axes>&&...)named_array<T, Axes> concatenate(Ax, const named_array<T, Axes>& first,
                                                                  const named_array<T, Rest>&... rest) {
  return detail::layout::concatenate_impl<std::remove_cvref_t<Ax>>(first, rest...);
}

/// `concatenate(Ax, std::vector<array>)`: the same over a run-time number of same-typed arrays (at least one).
/// Gradient: each input gets its part of g (a view of g's buffer when contiguous there).
///   auto c = concatenate(Pos, chunks);
template <AxisTag Ax, class T, class Axes>
requires AxisOf<Ax, Axes> named_array<T, Axes> concatenate(Ax, const std::vector<named_array<T, Axes>>& arrays) {
  using namespace detail;
  using A = std::remove_cvref_t<Ax>;
  if (arrays.empty()) throw shape_error("haliax::concatenate: needs at least one array (got an empty vector)");
  constexpr std::size_t k = index_of_v<to_list<Axes>, A>;
  auto rs = arrays[0].sizes();
  for (std::size_t i = 1; i < arrays.size(); ++i) {
    layout::check_sizes_except<A, Axes, Axes>("haliax::concatenate", arrays[0].sizes(), arrays[i].sizes());
    rs[k] += arrays[i].sizes()[k];
  }
  auto r = named_array<T, Axes>::allocate(rs, "haliax::concatenate");
  std::int64_t start = 0;
  for (const auto& a : arrays) {
    layout::place<Axes>("haliax::concatenate", r.data(), rs, k, start, a);
    start += a.sizes()[k];
  }
  if constexpr (FloatElement<T>) {
    if (ad::recording()) {
      // (node, start, sizes) of each tracked input
      std::vector<std::tuple<ad::node_ptr<T, Axes>, std::int64_t, typename named_array<T, Axes>::shape_type>> parts;
      start = 0;
      for (const auto& a : arrays) {
        if (ad::tracked(a)) parts.emplace_back(a.ad_node(), start, a.sizes());
        start += a.sizes()[k];
      }
      if (!parts.empty())
        ad::record_custom(r, [parts = std::move(parts)](const named_array<T, Axes>& g) {
          for (const auto& [n, s0, bs] : parts) ad::accumulate(*n, layout::slab_as<Axes>(g, k, s0, bs));
        });
    }
  }
  return r;
}

/// Stacks same-shaped arrays along a new leading axis `New` of size `arrays.size()` (upstream
/// `stack(axis, arrays)`). All must agree on every size (else `shape_error`); at least one array. Gradient: array
/// i gets g at position i of New (a view of g's buffer).
///   auto s = stack(Layers, blocks);   // n x {embed, mlp} -> {layers=n, embed, mlp}
template <AxisTag New, class T, auto... A>
requires NewAxisFor<New, axes<A...>> named_array<T, detail::layout::prepended<New, axes<A...>>> stack(
    New, const std::vector<named_array<T, axes<A...>>>& arrays) {
  using Axes = axes<A...>;
  using R = detail::layout::prepended<New, Axes>;
  if (arrays.empty()) throw shape_error("haliax::stack: needs at least one array (got an empty vector)");
  std::array<std::int64_t, R::rank> rs{};
  rs[0] = static_cast<std::int64_t>(arrays.size());
  for (std::size_t i = 0; i < Axes::rank; ++i) rs[i + 1] = arrays[0].sizes()[i];
  for (std::size_t i = 1; i < arrays.size(); ++i)
    detail::layout::check_sizes_except<void, Axes, Axes>("haliax::stack", arrays[0].sizes(), arrays[i].sizes());
  auto r = named_array<T, R>::allocate(rs, "haliax::stack");
  const std::int64_t n = arrays[0].element_count();
  for (std::size_t i = 0; i < arrays.size(); ++i)
    detail::layout::copy_rows<T>("haliax::stack", r.data() + static_cast<std::int64_t>(i) * n, 0, arrays[i].data(), 0,
                                 1, n);
  if constexpr (FloatElement<T>) {
    namespace ad = detail::ad;
    if (ad::recording()) {
      std::vector<std::pair<ad::node_ptr<T, Axes>, std::int64_t>> parts;  // (node, position) of each tracked input
      for (std::size_t i = 0; i < arrays.size(); ++i)
        if (ad::tracked(arrays[i])) parts.emplace_back(arrays[i].ad_node(), static_cast<std::int64_t>(i));
      if (!parts.empty())
        ad::record_custom(r, [parts = std::move(parts), s = arrays[0].sizes(), n](const named_array<T, R>& g) {
          for (const auto& [node, i] : parts)
            ad::accumulate(*node, named_array<T, Axes>(detail::layout::subbuffer(g.view(), i * n, n), s, g));
        });
    }
  }
  return r;
}

/// `stack(New, a, b, ...)`: the same over arrays that may list their axes in different orders (each is
/// rearranged to the first's order, as upstream does). Gradient: each array gets g at its position, in its order.
///   auto s = stack(Layers, a, b);   // {embed, mlp}, {mlp, embed} -> {layers=2, embed, mlp}
template <AxisTag New, class T, auto... A, class... Rest>
requires NewAxisFor<New, axes<A...>> &&(SameAxesAs<Rest, axes<A...>>&&...)
    named_array<T, detail::layout::prepended<New, axes<A...>>> stack(New, const named_array<T, axes<A...>>& first,
                                                                     const named_array<T, Rest>&... rest) {
  using Axes = axes<A...>;
  using R = detail::layout::prepended<New, Axes>;
  std::array<std::int64_t, R::rank> rs{};
  rs[0] = static_cast<std::int64_t>(1 + sizeof...(Rest));
  for (std::size_t i = 0; i < Axes::rank; ++i) rs[i + 1] = first.sizes()[i];
  (detail::layout::check_sizes_except<void, Axes, Rest>("haliax::stack", first.sizes(), rest.sizes()), ...);
  auto r = named_array<T, R>::allocate(rs, "haliax::stack");
  const std::int64_t n = first.element_count();
  std::int64_t i = 0;
  auto put = [&]<class AxB>(const named_array<T, AxB>& b) {
    detail::layout::place<Axes>("haliax::stack", r.data() + i * n, first.sizes(), 0, 0, b);
    ++i;
  };
  put(first);
  (put(rest), ...);
  detail::layout::record_grad(
      r,
      [s = first.sizes(), n](const named_array<T, R>& g, auto needs) {
        return [&]<std::size_t... I>(std::index_sequence<I...>) {
          auto part = [&]<class AxB>(std::size_t j) {
            if (!needs[j]) return named_array<T, AxB>{};
            named_array<T, Axes> gi(detail::layout::subbuffer(g.view(), static_cast<std::int64_t>(j) * n, n), s, g);
            if constexpr (std::is_same_v<AxB, Axes>) {
              return gi;
            } else {
              return detail::layout::permute_copy<AxB>("haliax::stack_grad", gi);
            }
          };
          return std::tuple{part.template operator()<Axes>(0), part.template operator()<Rest>(I + 1)...};
        }(std::index_sequence_for<Rest...>{});
      },
      first, rest...);
  return r;
}

// ---------------------------------------------------------------------------------------------------------
// roll

/// Rotates `x` by `shift` positions along `Ax` (numpy/upstream `roll`): out[(i + shift) mod n] = x[i];
/// negative shifts rotate the other way. Keeps every axis; returns a new array. Gradient: g rolled back.
///   auto r = roll(x, 1, Pos);    // pos [a b c d] -> [d a b c]
///   auto l = roll(x, -1, Pos);   // pos [a b c d] -> [b c d a]
template <class T, class Axes, AxisTag Ax>
requires AxisOf<Ax, Axes> named_array<T, Axes> roll(const named_array<T, Axes>& x, std::int64_t shift, Ax) {
  using namespace detail;
  constexpr std::size_t k = index_of_v<to_list<Axes>, std::remove_cvref_t<Ax>>;
  auto r = named_array<T, Axes>::allocate(x.sizes(), "haliax::roll");
  const std::int64_t n = x.sizes()[k];
  if (r.element_count() == 0) return r;
  const std::int64_t s = ((shift % n) + n) % n;
  const std::int64_t outer = layout::product(x.sizes(), 0, k);
  const std::int64_t inner = layout::product(x.sizes(), k + 1, Axes::rank);
  // x[0, n - s) -> r[s, n) and x[n - s, n) -> r[0, s), each a block of rows.
  layout::copy_rows<T>("haliax::roll", r.data() + s * inner, n * inner, x.data(), n * inner, outer, (n - s) * inner);
  layout::copy_rows<T>("haliax::roll", r.data(), n * inner, x.data() + (n - s) * inner, n * inner, outer, s * inner);
  layout::record_grad(
      r, [back = n - s](const named_array<T, Axes>& g, auto) { return std::tuple{roll(g, back, Ax{})}; }, x);
  return r;
}

}  // namespace haliax
