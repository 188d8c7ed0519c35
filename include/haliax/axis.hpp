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

/// An ordered list of axis tags, written with the tag objects: `axes<Batch, Pos, Embed>`.
/// This is the axis part of every array type; it carries no sizes.
template <auto... A>
requires(AxisTag<decltype(A)>&&...) struct axes {
  static constexpr std::size_t rank = sizeof...(A);
};

template <class T>
inline constexpr bool is_axes_v = false;
template <auto... A>
inline constexpr bool is_axes_v<axes<A...>> = true;

/// A specialisation of `haliax::axes`.
template <class T>
concept AxisList = is_axes_v<std::remove_cvref_t<T>>;

}  // namespace haliax
