// Shared by the gradient tests of the elementwise ops and the reductions (test_grad_elementwise.cpp,
// test_grad_reduction.cpp): operand structs and host helpers. Two files instead of one so that no test
// translation unit takes minutes to compile.
#pragma once
#include <doctest/doctest.h>

#include <boost/hana/define_struct.hpp>
#include <cmath>
#include <haliax/autodiff.hpp>
#include <haliax/haliax.hpp>
#include <vector>

#include "gradcheck.hpp"
#include "test_axes.hpp"

using namespace test_axes;
namespace hax = haliax;
using hax::axes;
using hax::named_array;

namespace {

/// Two arrays differentiated together (both operands of a binary op tracked at once).
template <class A, class B>
struct operands {
  BOOST_HANA_DEFINE_STRUCT(operands, (A, a), (B, b));
};

/// Checks a binary op's gradient with respect to both operands together and to each alone.
template <class F, class A, class B>
void check_binary(const F& f, const A& a, const B& b) {
  gradcheck::check_output_gradient([&](const operands<A, B>& p) { return f(p.a, p.b); }, operands<A, B>{a, b});
  gradcheck::check_output_gradient([&](const A& v) { return f(v, b); }, a);
  gradcheck::check_output_gradient([&](const B& v) { return f(a, v); }, b);
}

/// Random data in [lo, hi) with the given sized axes.
template <class... S>
auto uniform(unsigned seed, double lo, double hi, S... s) {
  return random_array<double>(seed, s...) * ((hi - lo) / 2) + (hi + lo) / 2;
}

template <class T, class Axes>
std::vector<double> host(const named_array<T, Axes>& x) {
  std::vector<double> out;
  for (auto v : x.to_host()) out.push_back(static_cast<double>(v));
  return out;
}

/// The gradient of sum(f(x)) as a host vector.
template <class F, class X>
std::vector<double> grad_of_sum(const F& f, const X& x) {
  return host(hax::grad([&](const X& v) { return hax::sum(f(v)); })(x));
}

}  // namespace
