// haliax/tree.hpp: traversal of modules (structs of arrays) with stable dotted parameter names.
//
// A module is a plain struct whose fields are declared with Boost.Hana so they can be reflected:
//
//   struct linear {
//     BOOST_HANA_DEFINE_STRUCT(linear,
//       (haliax::named_array<float, haliax::axes<Embed, Mlp>>, weight),
//       (haliax::named_array<float, haliax::axes<Mlp>>, bias));
//   };
//
// Leaves are named arrays; fields may also be sub-modules, `std::vector`s of them (named `prefix.0`,
// `prefix.1`, ... as a torch Sequential), or `std::optional` arrays (skipped when empty). Fields of any other
// type (sizes, flags) are not leaves. One traversal serves the optimizer, checkpoints, sharding, exports and
// weight-decay masks, so every one of them sees the same names in the same order.
#pragma once

#include <boost/hana/accessors.hpp>
#include <boost/hana/concept/struct.hpp>
#include <boost/hana/define_struct.hpp>
#include <boost/hana/first.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/string.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core.hpp"

namespace haliax::tree {

namespace detail {

template <class T>
inline constexpr bool is_vector_v = false;
template <class T, class A>
inline constexpr bool is_vector_v<std::vector<T, A>> = true;

template <class T>
inline constexpr bool is_optional_v = false;
template <class T>
inline constexpr bool is_optional_v<std::optional<T>> = true;

inline std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

template <class M, class F>
void visit(M& m, const std::string& prefix, F& f) {
  using T = std::remove_const_t<M>;
  if constexpr (is_named_array_v<T>) {
    f(prefix, m);
  } else if constexpr (is_optional_v<T>) {
    if (m) visit(*m, prefix, f);
  } else if constexpr (is_vector_v<T>) {
    for (std::size_t i = 0; i < m.size(); ++i) visit(m[i], join(prefix, std::to_string(i)), f);
  } else if constexpr (boost::hana::Struct<T>::value) {
    boost::hana::for_each(boost::hana::accessors<T>(), [&](auto pair) {
      auto& field = boost::hana::second(pair)(m);
      visit(field, join(prefix, boost::hana::to<const char*>(boost::hana::first(pair))), f);
    });
  }
}

template <class M1, class M2, class F>
void visit2(M1& a, M2& b, const std::string& prefix, F& f) {
  using T = std::remove_const_t<M1>;
  static_assert(std::is_same_v<T, std::remove_const_t<M2>>, "haliax::tree::zip_leaves: modules of different types");
  if constexpr (is_named_array_v<T>) {
    f(prefix, a, b);
  } else if constexpr (is_optional_v<T>) {
    if (a.has_value() != b.has_value())
      throw shape_error("haliax::tree::zip_leaves: '" + prefix + "' is present in one module but not the other");
    if (a) visit2(*a, *b, prefix, f);
  } else if constexpr (is_vector_v<T>) {
    if (a.size() != b.size())
      throw shape_error("haliax::tree::zip_leaves: '" + prefix + "' has " + std::to_string(a.size()) +
                        " entries in one module and " + std::to_string(b.size()) + " in the other");
    for (std::size_t i = 0; i < a.size(); ++i) visit2(a[i], b[i], join(prefix, std::to_string(i)), f);
  } else if constexpr (boost::hana::Struct<T>::value) {
    boost::hana::for_each(boost::hana::accessors<T>(), [&](auto pair) {
      auto get = boost::hana::second(pair);
      visit2(get(a), get(b), join(prefix, boost::hana::to<const char*>(boost::hana::first(pair))), f);
    });
  }
}

template <class T, class F>
void visit_types(F& f) {
  if constexpr (is_named_array_v<T>) {
    f(T::axis_names());
  } else if constexpr (is_optional_v<T> || is_vector_v<T>) {
    visit_types<typename T::value_type>(f);
  } else if constexpr (boost::hana::Struct<T>::value) {
    boost::hana::for_each(boost::hana::accessors<T>(), [&](auto pair) {
      using G = std::remove_cvref_t<decltype(boost::hana::second(pair)(std::declval<T&>()))>;
      visit_types<G>(f);
    });
  }
}

}  // namespace detail

/// Calls `f(axis_names)` (an array of the axis names) for every kind of array leaf a module of type `M` can hold,
/// in declaration order: empty optionals and vectors included, so that a default-constructed module is not needed.
template <class M, class F>
void for_each_leaf_type(F&& f) {
  detail::visit_types<M>(f);
}

/// Calls `f(name, array)` for every array leaf of `module`, in declaration order, with dotted names
/// (`blocks.3.attn.weight`). `array` is a mutable reference when `module` is.
template <class M, class F>
void for_each_leaf(M& module, F&& f, const std::string& prefix = "") {
  detail::visit(module, prefix, f);
}

/// Calls `f(name, a_leaf, b_leaf)` for the matching leaves of two modules of the same type (e.g. parameters
/// and their gradients or optimizer moments). Throws `shape_error` when their structure differs.
template <class M, class F>
void zip_leaves(M& a, M& b, F&& f, const std::string& prefix = "") {
  detail::visit2(a, b, prefix, f);
}
template <class M, class F>
void zip_leaves(const M& a, const M& b, F&& f, const std::string& prefix = "") {
  detail::visit2(a, b, prefix, f);
}

/// A module of the same type whose every leaf is `f(name, leaf)` (which must return the leaf's type).
/// `map(grads, [](auto&, const auto& g) { return g * 0.5f; })`.
template <class M, class F>
M map(const M& module, F&& f) {
  M out = module;
  for_each_leaf(out, [&](const std::string& name, auto& leaf) { leaf = f(name, std::as_const(leaf)); });
  return out;
}

/// The dotted names of every leaf, in traversal order.
template <class M>
std::vector<std::string> leaf_names(const M& module) {
  std::vector<std::string> names;
  for_each_leaf(module, [&](const std::string& name, const auto&) { names.push_back(name); });
  return names;
}

/// Total number of elements over every leaf (the parameter count of a model).
template <class M>
std::int64_t parameter_count(const M& module) {
  std::int64_t n = 0;
  for_each_leaf(module, [&](const std::string&, const auto& leaf) { n += leaf.element_count(); });
  return n;
}

}  // namespace haliax::tree
