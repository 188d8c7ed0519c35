// Shared by the gradient tests of dot, the layout ops and the indexing ops (test_grad_dot.cpp,
// test_grad_layout.cpp, test_grad_indexing.cpp): axes, operand structs and index helpers. Three files instead
// of one so that no test translation unit takes minutes to compile.
#pragma once
#include <doctest/doctest.h>

#include <haliax/autodiff.hpp>
#include <haliax/haliax.hpp>
#include <vector>

#include "gradcheck.hpp"
#include "test_axes.hpp"

using namespace test_axes;
namespace hax = haliax;
using hax::axes;
using hax::ellipsis;
using hax::named_array;

namespace {

inline constexpr struct A final : hax::axis<"a"> {
} A;
inline constexpr struct B final : hax::axis<"b"> {
} B;
inline constexpr struct C final : hax::axis<"c"> {
} C;
inline constexpr struct Flat final : hax::axis<"flat"> {
} Flat;
inline constexpr struct Layers final : hax::axis<"layers"> {
} Layers;
inline constexpr struct K final : hax::axis<"k"> {
} K;

template <class AxA, class AxB>
struct pair_of {
  BOOST_HANA_DEFINE_STRUCT(pair_of, (named_array<double, AxA>, a), (named_array<double, AxB>, b));
};
template <class AxA, class AxB>
pair_of<AxA, AxB> make_pair_of(named_array<double, AxA> a, named_array<double, AxB> b) {
  return {std::move(a), std::move(b)};
}

template <class AxA, class AxB, class AxC>
struct triple_of {
  BOOST_HANA_DEFINE_STRUCT(triple_of, (named_array<double, AxA>, a), (named_array<double, AxB>, b),
                           (named_array<double, AxC>, c));
};

/// Random int32 indices in [lo, hi).
template <class... S>
auto random_indices(unsigned seed, std::int32_t lo, std::int32_t hi, S... s) {
  std::size_t n = (static_cast<std::size_t>(s.size) * ... * std::size_t{1});
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int32_t> dist(lo, hi - 1);
  std::vector<std::int32_t> v(n);
  for (auto& e : v) e = dist(gen);
  return hax::from_host<std::int32_t>(v, s...);
}

/// The type list of the axes named (what the dot layout computations work on).
template <auto... Ax>
using Ls = hax::detail::to_list<axes<Ax...>>;

}  // namespace
