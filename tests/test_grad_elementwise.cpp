// Gradient rules of the unary and binary elementwise ops (ops/elementwise.hpp), each checked against central
// finite differences in double, plus the JAX conventions at ties, kinks and zero with exact expected values.
#include <algorithm>
#include <random>

#include "grad_elementwise_helpers.hpp"

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

TEST_CASE("a broadcast's gradient sums each column in 128-row chunks, then the chunks in order") {
  // The column sums behind bias and norm-weight gradients run in two fixed-shape stages (a GPU gets
  // rows / 128 x cols threads, not one per column): each 128-row chunk in order, in double, then the chunks in
  // order. The result must be exactly that order's, on any build and thread count; values over sixteen orders
  // of magnitude make the order visible (a single pass over the rows gives other bits).
  constexpr std::size_t R = 1000, Cn = 700;  // 8 chunks, the last one short; two host column blocks
  std::mt19937_64 gen(90);
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  std::uniform_int_distribution<int> expo(-8, 8);
  std::vector<double> hw(R * Cn);
  for (auto& v : hw) v = mant(gen) * std::pow(10.0, expo(gen));
  auto w = hax::from_host<double>(hw, 1000 * X, 700 * Y);
  auto x = random_array<double>(91, 1000 * X, 700 * Y);
  auto b = random_array<double>(92, 700 * Y);
  auto g = hax::grad([&](const auto& bb) { return hax::sum((x + bb) * w); })(b).to_host();
  std::vector<double> chunked(Cn, 0.0), serial(Cn, 0.0);
  for (std::size_t c = 0; c < Cn; ++c) {
    for (std::size_t r0 = 0; r0 < R; r0 += 128) {
      double part = 0.0;
      for (std::size_t r = r0; r < std::min(R, r0 + 128); ++r) part += hw[r * Cn + c];
      chunked[c] += part;
    }
    for (std::size_t r = 0; r < R; ++r) serial[c] += hw[r * Cn + c];
  }
  CHECK(g == chunked);
  CHECK(g != serial);  // the test data tells the two orders apart
  check_close(g, serial, 1e-6, 1e-9);
  // and with at most one chunk, one pass (the same bits as two stages over one chunk)
  auto w1 = hax::slice(w, X, 0, 128);
  auto x1 = hax::slice(x, X, 0, 128);
  auto g1 = hax::grad([&](const auto& bb) { return hax::sum((x1 + bb) * w1); })(b).to_host();
  for (std::size_t c = 0; c < Cn; ++c) {
    double s1 = 0.0;
    for (std::size_t r = 0; r < 128; ++r) s1 += hw[r * Cn + c];
    CHECK(g1[c] == s1);
  }
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
