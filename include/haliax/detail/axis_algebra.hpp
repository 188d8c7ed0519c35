// Axis-list algebra on type lists (Boost.MP11). Private: nothing here appears in public type names.
// Lists are mp_list<Tag...> of axis tag types; `axes<...>` converts to and from them at the edges.
#pragma once

#include <array>
#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>
#include <boost/mp11/set.hpp>
#include <cstddef>
#include <type_traits>

#include "../axis.hpp"

namespace haliax::detail {

namespace mp = boost::mp11;

template <class Axes>
struct to_list_impl;
template <auto... A>
struct to_list_impl<axes<A...>> {
  using type = mp::mp_list<std::remove_cvref_t<decltype(A)>...>;
};
/// `axes<Batch, Embed>` -> mp_list<Batch-type, Embed-type>.
template <class Axes>
using to_list = typename to_list_impl<Axes>::type;

// No `type` unless the tags make a valid `axes<...>`: then a signature that spells `to_axes<L>` (a return type)
// fails softly, as a substitution failure at the caller, even where a compiler substitutes into the return type
// before checking the function's constraints (clang 14).
template <class L>
struct to_axes_impl {};
/// The tag object of type T, as a named constant: `axes<tag_v<T>...>` is the same type as `axes<T{}...>`, but
/// a compiler that prints it back as source (nvcc's host pass does, for every function body) prints a name
/// rather than an aggregate literal it cannot parse again.
template <class T>
inline constexpr T tag_v{};
template <class... T>
requires(AxisTag<T>&&...) && DistinctAxisNames<T...> struct to_axes_impl<mp::mp_list<T...>> {
  using type = axes<tag_v<T>...>;
};
/// mp_list of tag types -> `axes<...>`.
template <class L>
using to_axes = typename to_axes_impl<L>::type;

template <class L, class T>
inline constexpr bool contains_v = mp::mp_contains<L, T>::value;

template <class L, class T>
inline constexpr std::size_t index_of_v = mp::mp_find<L, T>::value;

template <class L>
inline constexpr bool is_unique_v = mp::mp_is_set<L>::value;

template <class L2>
struct in_list {
  template <class T>
  using fn = mp::mp_contains<L2, T>;
};
template <class L2>
struct not_in_list {
  template <class T>
  using fn = mp::mp_not<mp::mp_contains<L2, T>>;
};

/// Elements of L1 (in L1's order) that are not in L2.
template <class L1, class L2>
using difference = mp::mp_copy_if_q<L1, not_in_list<L2>>;

/// Elements of L1 (in L1's order) that are also in L2.
template <class L1, class L2>
using intersection = mp::mp_copy_if_q<L1, in_list<L2>>;

/// L1 followed by the elements of L2 that are not in L1.
template <class L1, class L2>
using union_ = mp::mp_append<L1, difference<L2, L1>>;

/// Every element of L1 is in L2.
template <class L1, class L2>
inline constexpr bool subset_v = mp::mp_all_of_q<L1, in_list<L2>>::value;

template <class L1, class L2>
inline constexpr bool same_set_v =
    subset_v<L1, L2>&& subset_v<L2, L1>&& mp::mp_size<L1>::value == mp::mp_size<L2>::value;

template <class L1, class L2>
inline constexpr bool disjoint_v = mp::mp_empty<intersection<L1, L2>>::value;

/// L with Old replaced by New.
template <class L, class Old, class New>
using replace = mp::mp_replace<L, Old, New>;

template <class From, class To>
struct positions_impl;
template <class From, class... T>
struct positions_impl<From, mp::mp_list<T...>> {
  static constexpr std::array<int, sizeof...(T)> value{static_cast<int>(index_of_v<From, T>)...};
};
/// For each element of To, its position in From (as an array of ints).
template <class From, class To>
inline constexpr auto positions_v = positions_impl<From, To>::value;

/// Resolves a partial order `Spec` (which may hold one `ellipsis`) against the full list `Full`: the named
/// elements go where the spec puts them and the ellipsis stands for the rest, in Full's order. Without an
/// ellipsis the spec must name every element of Full.
template <class Full, class Spec, class = void>
struct resolve_order_impl {
  using type = Spec;
};
template <class Full, class Spec>
struct resolve_order_impl<Full, Spec,
                          std::enable_if_t<mp::mp_contains<Spec, std::remove_cvref_t<decltype(ellipsis)>>::value>> {
  static constexpr std::size_t pos = mp::mp_find<Spec, std::remove_cvref_t<decltype(ellipsis)>>::value;
  using before = mp::mp_take_c<Spec, pos>;
  using after = mp::mp_drop_c<Spec, pos + 1>;
  using rest = difference<Full, mp::mp_append<before, after>>;
  using type = mp::mp_append<before, rest, after>;
};
template <class Full, class Spec>
using resolve_order = typename resolve_order_impl<Full, Spec>::type;

/// `Spec` (with at most one ellipsis) is a valid partial order for `Full`.
template <class Full, class Spec>
inline constexpr bool valid_order_v = mp::mp_count<Spec, std::remove_cvref_t<decltype(ellipsis)>>::value <= 1 &&
                                      is_unique_v<Spec>&& same_set_v<resolve_order<Full, Spec>, Full>;

/// The axes of `Need` that `Have` lacks, as `axis_types<...>` (each an `axes`, `axis_types` or `named_array`).
/// A named struct, so that a concept note reads `missing_axes<Have, Need>`, never MP11's internals.
template <class Have, class Need>
struct missing_axes {
  using type = difference<axis_types_of<Need>, axis_types_of<Have>>;
};

/// The axes of `Forbidden` that `Have` has, as `axis_types<...>`.
template <class Have, class Forbidden>
struct present_axes {
  using type = intersection<axis_types_of<Forbidden>, axis_types_of<Have>>;
};

template <class L>
struct name_clash_in_impl;
template <template <class...> class L, class... T>
struct name_clash_in_impl<L<T...>> {
  using type = typename name_clash<T...>::type;
};
/// `void` if the tags of list L have distinct names, else the first clash (`same_axis_name<...>`).
template <class L>
using name_clash_in = typename name_clash_in_impl<L>::type;

/// Whether every element of L is an axis tag.
template <class L>
struct all_tags;
template <class... T>
struct all_tags<mp::mp_list<T...>> : std::bool_constant<(AxisTag<T> && ...)> {};

}  // namespace haliax::detail
