// haliax/axis.hpp: compile-time axis names.
//
// An axis is a tag type whose name is a compile-time string. Declare one the way mp-units declares a unit,
// so that the type and its object share one name:
//
//   inline constexpr struct Embed final : haliax::axis<"embed"> {} Embed;
//
// User code passes the object (`sum(x, Embed)`), writes array types with it
// (`named_array<float, axes<Batch, Embed>>`) and gives a size at run time by multiplying, as mp-units makes
// a quantity: `768 * Embed` is the axis Embed with size 768. Sizes are not part of the type (they come from
// configs); two arrays that share an axis must agree on its size at run time.
//
// An alias (upstream `Pos.alias("key_position")`) is simply another tag:
//   inline constexpr struct KPos final : haliax::axis<"key_position"> {} KPos;
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace haliax {

/// A string usable as a template argument: `axis<"embed">`.
template <std::size_t N>
struct fixed_string {
  char value[N]{};
  constexpr fixed_string(const char (&s)[N]) { std::copy_n(s, N, value); }
  constexpr std::string_view view() const { return {value, N - 1}; }
};

/// Common base of every axis tag; lets concepts recognise tags without knowing their names.
struct axis_tag_base {};

/// Base class of axis tags. `Name` is the upstream string name, used in messages, checkpoints and exports.
template <fixed_string Name>
struct axis : axis_tag_base {
  static constexpr std::string_view name = Name.view();
  static constexpr auto fixed_name = Name;  // the name as a template argument (for diagnostics' types)
};

/// An axis tag: an empty, final type deriving from `haliax::axis<"...">`.
template <class T>
concept AxisTag = std::derived_from<std::remove_cvref_t<T>, axis_tag_base> && std::is_empty_v<std::remove_cvref_t<T>> &&
    std::is_final_v<std::remove_cvref_t<T>>;

/// An axis with a run-time size, made by `n * Axis` (e.g. `768 * Embed`).
template <AxisTag A>
struct sized_axis {
  using axis_type = A;
  std::int64_t size;
};

template <class T>
inline constexpr bool is_sized_axis_v = false;
template <class A>
inline constexpr bool is_sized_axis_v<sized_axis<A>> = true;

/// A value made by `n * Axis`.
template <class T>
concept SizedAxis = is_sized_axis_v<std::remove_cvref_t<T>>;

/// `768 * Embed`: the axis Embed with size 768.
template <std::integral I, AxisTag A>
constexpr sized_axis<std::remove_cvref_t<A>> operator*(I n, A) {
  return {static_cast<std::int64_t>(n)};
}

/// The upstream name of an axis tag, e.g. `axis_name(Embed) == "embed"`.
template <AxisTag A>
constexpr std::string_view axis_name(A) {
  return std::remove_cvref_t<A>::name;
}

/// Stands for "all other axes, in their current order" in a partial order such as
/// `rearrange<axes<Batch, ellipsis, Embed>>(x)` or a `dot` output order. It is not an axis of any array.
inline constexpr struct ellipsis final : axis<"..."> {
} ellipsis;

// ---------------------------------------------------------------------------------------------------------
// One name, one axis
//
// Checkpoints, exports and sharding key on the string names, so two distinct tags with the same name
// (`{embed=4, embed=3}`) must never meet in one array. `axes<...>` requires distinct names; a clash prints
// the shared name and both tags: `[with NameClash = haliax::same_axis_name<{"embed"}, Embed, OtherEmbed>]`.

/// What a name clash looks like in a compiler note: the shared name, then the two tags that carry it.
template <fixed_string Name, class A, class B>
struct same_axis_name {};

namespace detail {

/// (i, j), i < j, of the first two tags with the same name; (n, n) if every name is distinct.
template <class... Tag>
constexpr std::array<std::size_t, 2> first_name_clash() {
  constexpr std::size_t n = sizeof...(Tag);
  const std::string_view names[] = {Tag::name..., std::string_view{}};
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = i + 1; j < n; ++j)
      if (names[i] == names[j]) return {i, j};
  return {n, n};
}

template <std::size_t I, class... T>
struct nth_type;
template <class H, class... T>
struct nth_type<0, H, T...> {
  using type = H;
};
template <std::size_t I, class H, class... T>
struct nth_type<I, H, T...> : nth_type<I - 1, T...> {};

/// `void` when the names of `Tag...` are distinct, else `same_axis_name<name, first tag, second tag>`.
template <class... Tag>
struct name_clash {
  using type = void;
};
template <class... Tag>
requires(first_name_clash<Tag...>()[0] < sizeof...(Tag)) struct name_clash<Tag...> {
  static constexpr auto at = first_name_clash<Tag...>();
  using first = typename nth_type<at[0], Tag...>::type;
  using second = typename nth_type<at[1], Tag...>::type;
  using type = same_axis_name<first::fixed_name, first, second>;
};

}  // namespace detail

/// `NameClash` is `void` (no two axes share a name). The step of `DistinctAxisNames` that prints the clash.
template <class NameClash>
concept NoAxisNameClash = std::is_void_v<NameClash>;

/// The axis tags `Tag...` have pairwise distinct names (so distinct types too).
template <class... Tag>
concept DistinctAxisNames = NoAxisNameClash<typename detail::name_clash<Tag...>::type>;

/// An ordered list of axis tags, written with the tag objects: `axes<Batch, Pos, Embed>`.
/// This is the axis part of every array type; it carries no sizes. Names must be distinct: neither the same
/// tag twice nor two tags named alike (`DistinctAxisNames`).
template <auto... A>
requires(AxisTag<decltype(A)>&&...) && DistinctAxisNames<std::remove_cvref_t<decltype(A)>...> struct axes {
  static constexpr std::size_t rank = sizeof...(A);
};

/// The tag *types* of an axis list: `axis_types_of<axes<Batch, Embed>>` is `axis_types<Batch, Embed>`.
/// Concepts take these rather than `axes<...>` so that compiler notes print axis names: GCC prints the tag
/// objects inside `axes<...>` as `{}` (`axes<{}, {}>`), clang as `{{{}}}`.
template <class... Tag>
struct axis_types {
  static constexpr std::size_t rank = sizeof...(Tag);
};

namespace detail {
template <class Axes>
struct axis_types_of_impl;
template <auto... A>
struct axis_types_of_impl<axes<A...>> {
  using type = axis_types<std::remove_cvref_t<decltype(A)>...>;
};
template <class... Tag>
struct axis_types_of_impl<axis_types<Tag...>> {
  using type = axis_types<Tag...>;
};
}  // namespace detail

/// `axis_types<...>` for an `axes<...>` (or an `axis_types<...>`, unchanged; or a `named_array`, its axes).
template <class Axes>
using axis_types_of = typename detail::axis_types_of_impl<std::remove_cvref_t<Axes>>::type;

template <class T>
inline constexpr bool is_axes_v = false;
template <auto... A>
inline constexpr bool is_axes_v<axes<A...>> = true;

/// A specialisation of `haliax::axes`.
template <class T>
concept AxisList = is_axes_v<std::remove_cvref_t<T>>;

}  // namespace haliax
