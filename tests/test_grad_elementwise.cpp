// Gradient rules of the elementwise ops (ops/elementwise.hpp) and the reductions (ops/reduction.hpp), each
// checked against central finite differences in double, plus the JAX conventions at ties, kinks and boundaries
// with exact expected values, and float / bf16 smoke tests through astype.
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

// ---------------------------------------------------------------------------------------------------------
// Unary ops

TEST_CASE("unary exp/log family: gradients match finite differences") {
  auto x = random_array<double>(1, 3 * X, 4 * Y);
  auto pos = uniform(2, 0.5, 1.5, 3 * X, 4 * Y);
  gradcheck::check_output_gradient([](const auto& v) { return hax::exp(v); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::expm1(v); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::log(v); }, pos);
  gradcheck::check_output_gradient([](const auto& v) { return hax::log1p(v); }, x * 0.9);
  gradcheck::check_output_gradient([](const auto& v) { return hax::log2(v); }, pos);
  gradcheck::check_output_gradient([](const auto& v) { return hax::log10(v); }, pos);
  gradcheck::check_output_gradient([](const auto& v) { return hax::sqrt(v); }, pos);
  gradcheck::check_output_gradient([](const auto& v) { return hax::rsqrt(v); }, pos);
  gradcheck::check_output_gradient([](const auto& v) { return hax::reciprocal(v); }, pos);
  gradcheck::check_output_gradient([](const auto& v) { return hax::reciprocal(v); }, -pos);
}

TEST_CASE("unary trigonometric, hyperbolic and erf: gradients match finite differences") {
  auto x = random_array<double>(3, 3 * X, 4 * Y);
  gradcheck::check_output_gradient([](const auto& v) { return hax::tanh(v); }, x * 2.0);
  gradcheck::check_output_gradient([](const auto& v) { return hax::sinh(v); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::cosh(v); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::sin(v); }, x * 3.0);
  gradcheck::check_output_gradient([](const auto& v) { return hax::cos(v); }, x * 3.0);
  gradcheck::check_output_gradient([](const auto& v) { return hax::tan(v); }, x * 1.2);
  gradcheck::check_output_gradient([](const auto& v) { return hax::arcsin(v); }, x * 0.9);
  gradcheck::check_output_gradient([](const auto& v) { return hax::arccos(v); }, x * 0.9);
  gradcheck::check_output_gradient([](const auto& v) { return hax::arctan(v); }, x * 3.0);
  gradcheck::check_output_gradient([](const auto& v) { return hax::erf(v); }, x * 2.0);
}

TEST_CASE("abs, negative, unary minus, square: gradients match finite differences") {
  auto x = random_array<double>(4, 3 * X, 4 * Y);
  gradcheck::check_output_gradient([](const auto& v) { return hax::abs(v); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::negative(v); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return -v; }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::square(v); }, x);
}

TEST_CASE("abs at zero follows JAX: +1 for x >= 0 (signed zero included)") {
  auto x = hax::from_host<double>({0.0, -0.0, -2.0, 3.0}, 4 * X);
  CHECK(grad_of_sum([](const auto& v) { return hax::abs(v); }, x) == std::vector<double>{1.0, 1.0, -1.0, 1.0});
}

TEST_CASE("sign, floor, ceil, trunc, round have zero gradient (as JAX) and record nothing") {
  // Values kept away from the jumps (integers, and half-integers for round) so differences are 0 too.
  auto x = hax::from_host<double>({-2.7, -1.2, -0.3, 0.2, 0.7, 1.6, 2.4, 3.9}, 2 * X, 4 * Y);
  const std::vector<double> zeros(8, 0.0);
  auto with_linear = [](auto f) { return [f](const auto& v) { return f(v) + v; }; };
  // `+ v` keeps the loss tracked; the gradient is then exactly 1 from that term alone.
  const std::vector<double> ones(8, 1.0);
  CHECK(grad_of_sum(with_linear([](const auto& v) { return hax::sign(v); }), x) == ones);
  CHECK(grad_of_sum(with_linear([](const auto& v) { return hax::floor(v); }), x) == ones);
  CHECK(grad_of_sum(with_linear([](const auto& v) { return hax::ceil(v); }), x) == ones);
  CHECK(grad_of_sum(with_linear([](const auto& v) { return hax::trunc(v); }), x) == ones);
  CHECK(grad_of_sum(with_linear([](const auto& v) { return hax::round(v); }), x) == ones);
  CHECK(grad_of_sum([](const auto& v) { return hax::floor(v); }, x) == zeros);
  gradcheck::check_output_gradient([](const auto& v) { return hax::round(v) * v; }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::sign(v) * hax::ceil(v) + hax::trunc(v); }, x);
  hax::grad([](const auto& v) {
    auto f = hax::floor(v);
    CHECK(f.ad_node() == nullptr);
    auto b = hax::isfinite(v);  // bool results never record
    CHECK(b.ad_node() == nullptr);
    auto i = hax::astype<std::int32_t>(v) * 2;  // nor do int ones
    CHECK(i.ad_node() == nullptr);
    return hax::sum(v);
  })(x);
}

// ---------------------------------------------------------------------------------------------------------
// Binary ops

TEST_CASE("binary ops, same axes: gradients of both operands match finite differences") {
  auto a = random_array<double>(5, 3 * X, 4 * Y);
  auto b = random_array<double>(6, 3 * X, 4 * Y);
  auto bpos = uniform(7, 0.5, 1.5, 3 * X, 4 * Y);
  check_binary([](const auto& p, const auto& q) { return hax::subtract(p, q); }, a, b);
  check_binary([](const auto& p, const auto& q) { return p - q; }, a, b);
  check_binary([](const auto& p, const auto& q) { return hax::divide(p, q); }, a, bpos);
  check_binary([](const auto& p, const auto& q) { return p / q; }, a, -bpos);
  check_binary([](const auto& p, const auto& q) { return hax::maximum(p, q); }, a, b);
  check_binary([](const auto& p, const auto& q) { return hax::minimum(p, q); }, a, b);
  check_binary([](const auto& p, const auto& q) { return hax::power(p, q); }, bpos, a * 2.0);
  check_binary([](const auto& p, const auto& q) { return hax::fmod(p, q); }, a * 3.0,
               uniform(8, 0.7, 1.3, 3 * X, 4 * Y));
  check_binary([](const auto& p, const auto& q) { return hax::fmod(p, q); }, a * 3.0,
               -uniform(9, 0.7, 1.3, 3 * X, 4 * Y));
  check_binary([](const auto& p, const auto& q) { return hax::arctan2(p, q); }, a, b);
  check_binary([](const auto& p, const auto& q) { return hax::logaddexp(p, q); }, a * 3.0, b * 3.0);
}

TEST_CASE("binary ops broadcast by name: gradients are summed over the broadcast axes") {
  auto a = random_array<double>(10, 3 * X, 4 * Y);
  auto row = random_array<double>(11, 4 * Y);
  auto rowpos = uniform(12, 0.5, 1.5, 4 * Y);
  auto s = hax::scalar(0.3);
  auto t = random_array<double>(13, 4 * Y, 3 * X);  // same axes, other order
  check_binary([](const auto& p, const auto& q) { return hax::subtract(p, q); }, a, row);
  check_binary([](const auto& p, const auto& q) { return hax::subtract(p, q); }, row, a);
  check_binary([](const auto& p, const auto& q) { return hax::subtract(p, q); }, a, t);
  check_binary([](const auto& p, const auto& q) { return hax::divide(p, q); }, a, rowpos);
  check_binary([](const auto& p, const auto& q) { return hax::divide(p, q); }, rowpos, a * 0.5 + 2.0);
  check_binary([](const auto& p, const auto& q) { return hax::maximum(p, q); }, a, row);
  check_binary([](const auto& p, const auto& q) { return hax::minimum(p, q); }, s, a);
  check_binary([](const auto& p, const auto& q) { return hax::minimum(p, q); }, a, t);
  check_binary([](const auto& p, const auto& q) { return hax::power(p, q); }, a * 0.5 + 1.0, row);
  check_binary([](const auto& p, const auto& q) { return hax::power(p, q); }, rowpos, a);
  check_binary([](const auto& p, const auto& q) { return hax::fmod(p, q); }, a * 3.0, rowpos);
  check_binary([](const auto& p, const auto& q) { return hax::arctan2(p, q); }, row, a);
  check_binary([](const auto& p, const auto& q) { return hax::arctan2(p, q); }, a, s);
  check_binary([](const auto& p, const auto& q) { return hax::logaddexp(p, q); }, a, row);
  check_binary([](const auto& p, const auto& q) { return hax::logaddexp(p, q); }, s, a);
}

TEST_CASE("binary ops with a scalar operand on either side") {
  auto a = random_array<double>(14, 3 * X, 4 * Y);
  auto pos = uniform(15, 0.5, 1.5, 3 * X, 4 * Y);
  auto check = [](const auto& f, const auto& x) { gradcheck::check_output_gradient(f, x); };
  check([](const auto& v) { return hax::subtract(v, 0.7); }, a);
  check([](const auto& v) { return 0.7 - v; }, a);
  check([](const auto& v) { return hax::divide(v, 0.7); }, a);
  check([](const auto& v) { return 0.7 / v; }, pos);
  check([](const auto& v) { return hax::maximum(v, 0.1); }, a);
  check([](const auto& v) { return hax::maximum(0.1, v); }, a);
  check([](const auto& v) { return hax::minimum(v, -0.1); }, a);
  check([](const auto& v) { return hax::minimum(-0.1, v); }, a);
  check([](const auto& v) { return hax::power(v, 1.7); }, pos);
  check([](const auto& v) { return hax::power(v, 3); }, a);
  check([](const auto& v) { return hax::power(1.3, v); }, a);
  check([](const auto& v) { return hax::fmod(v * 3.0, 0.7); }, a);
  check([](const auto& v) { return hax::fmod(2.5, v); }, pos);
  check([](const auto& v) { return hax::arctan2(v, 0.4); }, a);
  check([](const auto& v) { return hax::arctan2(-0.4, v); }, a);
  check([](const auto& v) { return hax::logaddexp(v, 0.2); }, a * 3.0);
  check([](const auto& v) { return hax::logaddexp(0.2, v); }, a * 3.0);
}

TEST_CASE("maximum and minimum split the gradient 0.5 / 0.5 at ties (JAX)") {
  auto a = hax::from_host<double>({1.0, 2.0, 3.0, -1.0}, 4 * X);
  auto b = hax::from_host<double>({1.0, 0.0, 5.0, -1.0}, 4 * X);
  using P = operands<named_array<double, axes<X>>, named_array<double, axes<X>>>;
  auto gmax = hax::grad([](const P& p) { return hax::sum(hax::maximum(p.a, p.b)); })(P{a, b});
  CHECK(host(gmax.a) == std::vector<double>{0.5, 1.0, 0.0, 0.5});
  CHECK(host(gmax.b) == std::vector<double>{0.5, 0.0, 1.0, 0.5});
  auto gmin = hax::grad([](const P& p) { return hax::sum(hax::minimum(p.a, p.b)); })(P{a, b});
  CHECK(host(gmin.a) == std::vector<double>{0.5, 0.0, 1.0, 0.5});
  CHECK(host(gmin.b) == std::vector<double>{0.5, 1.0, 0.0, 0.5});
  // relu through maximum: 0.5 at exactly 0.
  auto x = hax::from_host<double>({-1.0, 0.0, 2.0}, 3 * X);
  CHECK(grad_of_sum([](const auto& v) { return hax::maximum(v, 0.0); }, x) == std::vector<double>{0.0, 0.5, 1.0});
  // A broadcast operand collects its share from every tie.
  auto row = hax::from_host<double>({1.0, 2.0}, 2 * Y);
  auto m = hax::from_host<double>({1.0, 2.0, 1.0, 0.0, 3.0, 2.0}, 3 * X, 2 * Y);
  auto grow = hax::grad([&](const auto& r) { return hax::sum(hax::maximum(m, r)); })(row);
  CHECK(host(grow) == std::vector<double>{1.0, 2.0});
}

TEST_CASE("power at zero base or zero exponent follows JAX (no NaN)") {
  auto a = hax::from_host<double>({0.0, 0.0, 2.0}, 3 * X);
  auto b = hax::from_host<double>({0.0, 2.0, 0.0}, 3 * X);
  using P = operands<named_array<double, axes<X>>, named_array<double, axes<X>>>;
  auto g = hax::grad([](const P& p) { return hax::sum(hax::power(p.a, p.b)); })(P{a, b});
  CHECK(host(g.a) == std::vector<double>{0.0, 0.0, 0.0});
  CHECK(host(g.b) == std::vector<double>{0.0, 0.0, std::log(2.0)});
}

// ---------------------------------------------------------------------------------------------------------
// Broadcasting helpers, where, clip

TEST_CASE("broadcast_to and broadcast_axis: gradient summed back over the new axes") {
  auto row = random_array<double>(20, 4 * Y);
  auto a = random_array<double>(21, 3 * X, 4 * Y);
  gradcheck::check_output_gradient([](const auto& v) { return hax::broadcast_to(v, 3 * X, 4 * Y); }, row);
  gradcheck::check_output_gradient([](const auto& v) { return hax::broadcast_to(v, 4 * Y, 2 * Z, 3 * X); }, a);
  gradcheck::check_output_gradient([](const auto& v) { return hax::broadcast_to(v, 4 * Y, 3 * X); }, a);
  gradcheck::check_output_gradient([](const auto& v) { return hax::broadcast_axis(v, 2 * Z); }, a);
  gradcheck::check_output_gradient([](const auto& v) { return hax::broadcast_axis(v, 2 * Z, 3 * X); }, row);
  auto g = hax::grad([](const auto& v) { return hax::sum(hax::broadcast_axis(v, 5 * X)); })(row);
  CHECK(host(g) == std::vector<double>(4, 5.0));
}

TEST_CASE("where: gradient to x where cond, to y elsewhere, summed over broadcast axes") {
  auto a = random_array<double>(22, 3 * X, 4 * Y);
  auto b = random_array<double>(23, 3 * X, 4 * Y);
  auto row = random_array<double>(24, 4 * Y);
  auto cond = random_array<double>(25, 3 * X, 4 * Y) > 0.0;
  auto cond_row = random_array<double>(26, 4 * Y) > 0.0;
  check_binary([&](const auto& p, const auto& q) { return hax::where(cond, p, q); }, a, b);
  check_binary([&](const auto& p, const auto& q) { return hax::where(cond, p, q); }, a, row);
  check_binary([&](const auto& p, const auto& q) { return hax::where(cond, p, q); }, row, a);
  check_binary([&](const auto& p, const auto& q) { return hax::where(cond_row, p, q); }, a, b);
  check_binary([&](const auto& p, const auto& q) { return hax::where(cond_row, p, q); }, row, hax::scalar(0.5));
  gradcheck::check_output_gradient([&](const auto& v) { return hax::where(cond, v, 0.5); }, a);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::where(cond, -0.5, v); }, a);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::where(cond, v, 0.5); }, row);
  auto c = hax::from_host(std::vector<bool>{true, false, true}, 3 * X);
  auto x = hax::from_host<double>({1.0, 2.0, 3.0}, 3 * X);
  CHECK(grad_of_sum([&](const auto& v) { return hax::where(c, v, v * 3.0); }, x) == std::vector<double>{1.0, 3.0, 1.0});
}

TEST_CASE("where (now on the gradient kernel engine) keeps int32, bool and bf16 values exactly") {
  auto c = hax::from_host(std::vector<bool>{true, false, true}, 3 * X);
  auto i = hax::arange(3 * X);
  CHECK(hax::where(c, i, i * 10).to_host() == std::vector<std::int32_t>{0, 10, 2});
  CHECK(hax::where(c, i, 7).to_host() == std::vector<std::int32_t>{0, 7, 2});
  CHECK(hax::where(c, !c, c).to_host() == std::vector<bool>{false, false, false});
  auto b = hax::astype<hax::bf16>(hax::from_host<float>({1.5f, -2.25f, 3.0e30f}, 3 * X));
  auto z = hax::astype<hax::bf16>(hax::scalar(0.1f));
  auto hb = host(b);
  CHECK(host(hax::where(c, b, z)) == std::vector<double>{hb[0], host(z)[0], hb[2]});
}

TEST_CASE("clip: gradient 1 inside, 0 outside, 0.5 on a bound (JAX's jnp.clip)") {
  auto x = hax::from_host<double>({-1.0, -0.5, 0.0, 0.5, 1.0}, 5 * X);
  CHECK(grad_of_sum([](const auto& v) { return hax::clip(v, -0.5, 0.5); }, x) ==
        std::vector<double>{0.0, 0.5, 1.0, 0.5, 0.0});
  auto lo = hax::full<double>(-0.5, 5 * X);
  auto hi = hax::scalar(0.5);
  CHECK(grad_of_sum([&](const auto& v) { return hax::clip(v, lo, hi); }, x) ==
        std::vector<double>{0.0, 0.5, 1.0, 0.5, 0.0});
  // The array form passes the rest of the gradient to the bounds.
  CHECK(grad_of_sum([&](const auto& l) { return hax::clip(x, l, hi); }, lo) ==
        std::vector<double>{1.0, 0.5, 0.0, 0.0, 0.0});
  // Finite differences away from the bounds, for both forms.
  auto a = random_array<double>(27, 3 * X, 4 * Y) * 2.0;
  gradcheck::check_output_gradient([](const auto& v) { return hax::clip(v, -0.9, 0.8); }, a);
  auto lo_row = hax::from_host<double>({-0.9, -0.5, -0.3, -1.1}, 4 * Y);
  auto hi_s = hax::scalar(0.7);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::clip(v, lo_row, hi_s); }, a);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::clip(a, v, hi_s); }, lo_row);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::clip(a, lo_row, v); }, hi_s);
  // int32 clip still works (no gradient).
  CHECK(hax::clip(hax::arange(5 * X), 1, 3).to_host() == std::vector<std::int32_t>{1, 1, 2, 3, 3});
}

// ---------------------------------------------------------------------------------------------------------
// copy and astype

TEST_CASE("copy and astype pass gradients through, casts to and from int32 / bool do not") {
  auto x = random_array<double>(30, 3 * X, 4 * Y);
  gradcheck::check_output_gradient([](const auto& v) { return hax::copy(v); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::astype<double>(v); }, x);
  auto w = random_array<double>(31, 3 * X, 4 * Y);
  // double -> float -> double: the gradient is w, rounded through float on the way back.
  auto g = hax::grad([&](const auto& v) { return hax::sum(hax::astype<double>(hax::astype<float>(v)) * w); })(x);
  CHECK(host(g) == host(hax::astype<double>(hax::astype<float>(w))));
  // Through int32 and bool nothing flows: only the `+ v` term contributes.
  auto gi = hax::grad([&](const auto& v) {
    auto as_int = hax::astype<double>(hax::astype<std::int32_t>(v * 4.0));
    auto as_bool = hax::astype<double>(hax::astype<bool>(v));
    return hax::sum(as_int * w + as_bool + v);
  })(x);
  CHECK(host(gi) == std::vector<double>(12, 1.0));
}

TEST_CASE("float and bf16 gradients flow through astype") {
  auto xf = hax::astype<float>(random_array<double>(32, 3 * X, 4 * Y));
  auto gf = hax::grad([](const auto& v) { return hax::sum(hax::tanh(v) * 2.0f); })(xf);
  static_assert(std::is_same_v<decltype(gf), named_array<float, axes<X, Y>>>);
  auto want = host(hax::tanh(hax::astype<double>(xf)));
  auto got = host(gf);
  for (std::size_t i = 0; i < got.size(); ++i)
    CHECK(got[i] == doctest::Approx(2 * (1 - want[i] * want[i])).epsilon(1e-6));

  // A bf16 parameter used in float math (mixed precision): the loss is float, the gradient comes back in bf16.
  auto xb = hax::astype<hax::bf16>(random_array<double>(33, 3 * X, 4 * Y));
  auto wf = hax::astype<float>(random_array<double>(34, 3 * X, 4 * Y));
  auto gb = hax::grad([&](const auto& v) { return hax::sum(hax::exp(hax::astype<float>(v)) * wf); })(xb);
  static_assert(std::is_same_v<decltype(gb), named_array<hax::bf16, axes<X, Y>>>);
  auto e = host(hax::exp(hax::astype<double>(xb)));
  auto wv = host(wf);
  auto gv = host(gb);
  for (std::size_t i = 0; i < gv.size(); ++i) CHECK(gv[i] == doctest::Approx(e[i] * wv[i]).epsilon(1e-2).scale(1e-2));

  // bf16 end to end, reduced to a float loss at the end.
  auto gb2 = hax::grad([](const auto& v) {
    return hax::astype<float>(hax::mean(hax::square(v) * hax::astype<hax::bf16>(hax::scalar(3.0f))));
  })(xb);
  auto xv = host(xb);
  auto g2 = host(gb2);
  for (std::size_t i = 0; i < g2.size(); ++i)
    CHECK(g2[i] == doctest::Approx(6.0 * xv[i] / 12.0).epsilon(2e-2).scale(1e-2));
}

// ---------------------------------------------------------------------------------------------------------
// Reductions

TEST_CASE("sum and mean, plain and masked: gradients match finite differences") {
  auto x = random_array<double>(40, 3 * X, 4 * Y, 2 * Z);
  auto mask = random_array<double>(41, 3 * X, 4 * Y, 2 * Z) > -0.3;
  auto mask_y = hax::from_host(std::vector<bool>{true, false, true, true}, 4 * Y);
  gradcheck::check_output_gradient([](const auto& v) { return hax::mean(v); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::mean(v, Y); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::mean(v, X, Z); }, x);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::mean(v, hax::where_mask{mask}); }, x);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::mean(v, hax::where_mask{mask}, Y); }, x);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::mean(v, hax::where_mask{mask_y}, Y, Z); }, x);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::mean(v, hax::where_mask{mask_y}, Y); }, x);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::sum(v, hax::where_mask{mask_y}, X); }, x);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::sum(v, hax::where_mask{mask}, Z); }, x);
  auto v4 = hax::from_host<double>({1.0, 2.0, 3.0, 4.0}, 4 * Y);
  CHECK(grad_of_sum([&](const auto& v) { return hax::mean(v, hax::where_mask{mask_y}); }, v4) ==
        std::vector<double>{1.0 / 3, 0.0, 1.0 / 3, 1.0 / 3});
}

TEST_CASE("prod: gradient is the product of the other elements, exact with zeros") {
  auto x = random_array<double>(42, 3 * X, 4 * Y) * 0.5 + 1.0;
  auto mask = random_array<double>(43, 3 * X, 4 * Y) > -0.4;
  gradcheck::check_output_gradient([](const auto& v) { return hax::prod(v); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::prod(v, Y); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::prod(v, X); }, -x);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::prod(v, hax::where_mask{mask}, Y); }, x);
  auto p = [](const auto& v) { return hax::prod(v, Y); };
  CHECK(grad_of_sum(p, hax::from_host<double>({2.0, 3.0, 4.0}, 1 * X, 3 * Y)) == std::vector<double>{12.0, 8.0, 6.0});
  CHECK(grad_of_sum(p, hax::from_host<double>({2.0, 0.0, 3.0}, 1 * X, 3 * Y)) == std::vector<double>{0.0, 6.0, 0.0});
  CHECK(grad_of_sum(p, hax::from_host<double>({0.0, 2.0, 0.0}, 1 * X, 3 * Y)) == std::vector<double>{0.0, 0.0, 0.0});
  // A masked-out zero does not count.
  auto m = hax::from_host(std::vector<bool>{true, false, true}, 3 * Y);
  CHECK(grad_of_sum([&](const auto& v) { return hax::prod(v, hax::where_mask{m}, Y); },
                    hax::from_host<double>({2.0, 0.0, 3.0}, 1 * X, 3 * Y)) == std::vector<double>{3.0, 0.0, 2.0});
}

TEST_CASE("max and min: gradients match finite differences without ties") {
  auto x = random_array<double>(44, 3 * X, 4 * Y, 2 * Z);
  auto mask = random_array<double>(45, 3 * X, 4 * Y, 2 * Z) > -0.5;
  gradcheck::check_output_gradient([](const auto& v) { return hax::max(v); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::max(v, Y); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::min(v, X, Z); }, x);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::max(v, hax::where_mask{mask}, Y); }, x);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::min(v, hax::where_mask{mask}); }, x);
}

TEST_CASE("max and min share the gradient evenly among tied elements (JAX)") {
  auto x = hax::from_host<double>({3.0, 1.0, 3.0, 2.0}, 4 * Y);
  CHECK(grad_of_sum([](const auto& v) { return hax::max(v); }, x) == std::vector<double>{0.5, 0.0, 0.5, 0.0});
  auto m = hax::from_host<double>({1.0, 5.0, 5.0, 2.0, 2.0, 0.0}, 2 * X, 3 * Y);
  auto w = hax::from_host<double>({2.0, 4.0}, 2 * X);
  auto g = hax::grad([&](const auto& v) { return hax::sum(hax::max(v, Y) * w); })(m);
  CHECK(host(g) == std::vector<double>{0.0, 1.0, 1.0, 2.0, 2.0, 0.0});
  auto gmin = hax::grad([&](const auto& v) { return hax::sum(hax::min(v, X) * 3.0); })(m);
  CHECK(host(gmin) == std::vector<double>{3.0, 0.0, 0.0, 0.0, 3.0, 3.0});
  auto three = hax::from_host<double>({7.0, 7.0, 7.0}, 3 * Y);
  CHECK(grad_of_sum([](const auto& v) { return hax::min(v); }, three) ==
        std::vector<double>{1.0 / 3, 1.0 / 3, 1.0 / 3});
  // With a mask, the masked-out maximum gets nothing and the largest remaining element all of it.
  auto mask = hax::from_host(std::vector<bool>{false, true, true, true}, 4 * Y);
  CHECK(grad_of_sum([&](const auto& v) { return hax::max(v, hax::where_mask{mask}); }, x) ==
        std::vector<double>{0.0, 0.0, 1.0, 0.0});
}

TEST_CASE("var and std, plain and masked: gradients match finite differences") {
  auto x = random_array<double>(46, 3 * X, 4 * Y, 2 * Z);
  auto mask = random_array<double>(47, 3 * X, 4 * Y, 2 * Z) > -0.3;
  auto mask_y = hax::from_host(std::vector<bool>{true, false, true, true}, 4 * Y);
  gradcheck::check_output_gradient([](const auto& v) { return hax::var(v); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::var(v, Y); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::var(v, X, Z); }, x);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::var(v, hax::where_mask{mask}, Y); }, x);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::var(v, hax::where_mask{mask_y}); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::std(v, Y); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::std(v); }, x);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::std(v, hax::where_mask{mask}, X, Y); }, x);
  // var records a single node: its value matches the composite definition.
  auto direct = hax::var(x, Y).to_host();
  auto composite = hax::mean(hax::square(x - hax::mean(x, Y)), Y).to_host();
  check_close(direct, composite, 1e-14, 1e-15);
}

TEST_CASE("logsumexp: gradient is softmax times g, matches finite differences") {
  auto x = random_array<double>(48, 3 * X, 4 * Y, 2 * Z) * 4.0;
  gradcheck::check_output_gradient([](const auto& v) { return hax::logsumexp(v); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::logsumexp(v, Y); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::logsumexp(v, X, Z); }, x);
  // Large values: the shift keeps both value and gradient finite.
  auto big = hax::from_host<double>({1000.0, 1000.0, 990.0}, 3 * Y);
  auto g = host(hax::grad([](const auto& v) { return hax::logsumexp(v); })(big));
  const double e = std::exp(-10.0);
  CHECK(g[0] == doctest::Approx(1 / (2 + e)));
  CHECK(g[1] == doctest::Approx(1 / (2 + e)));
  CHECK(g[2] == doctest::Approx(e / (2 + e)));
}

TEST_CASE("a composite loss over many ops matches finite differences") {
  using P = operands<named_array<double, axes<X, Y>>, named_array<double, axes<Y>>>;
  P p{random_array<double>(50, 3 * X, 4 * Y), random_array<double>(51, 4 * Y)};
  auto cond = random_array<double>(52, 3 * X, 4 * Y) > 0.2;
  gradcheck::check_gradient(
      [&](const P& m) {
        auto h = hax::tanh(m.a * 1.5 - m.b) / (hax::exp(m.b) + 1.0);
        auto s = hax::where(cond, hax::logaddexp(h, m.b), hax::sqrt(hax::square(h) + 0.1));
        auto r = hax::logsumexp(s, Y) + hax::var(s, Y) - hax::max(hax::clip(s, -0.95, 0.95), Y) * 0.3;
        return hax::mean(r) + hax::prod(hax::cos(m.b)) + hax::sum(hax::power(hax::abs(m.a) + 0.5, m.b));
      },
      p);
}
