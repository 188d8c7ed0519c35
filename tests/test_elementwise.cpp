// Tests for haliax/ops/elementwise.hpp against naive references on random data.
#include <doctest/doctest.h>

#include "test_axes.hpp"

using namespace test_axes;
namespace hax = haliax;

TEST_CASE("binary ops on identical axes") {
  auto a = random_array(1, 3 * X, 4 * Y);
  auto b = random_array(2, 3 * X, 4 * Y);
  auto ha = a.to_host(), hb = b.to_host();
  std::vector<float> sum(12), prod(12), mx(12);
  for (int i = 0; i < 12; ++i) {
    sum[i] = ha[i] + hb[i];
    prod[i] = ha[i] * hb[i];
    mx[i] = std::max(ha[i], hb[i]);
  }
  check_close((a + b).to_host(), sum);
  check_close((a * b).to_host(), prod);
  check_close(hax::maximum(a, b).to_host(), mx);
}

TEST_CASE("broadcasting by name follows the superset's order") {
  auto x = random_array(3, 2 * Batch, 3 * Pos, 4 * Embed);
  auto w = random_array(4, 4 * Embed, 2 * Batch);  // subset, different order
  auto r = x - w;
  static_assert(std::is_same_v<decltype(r), hax::named_array<float, hax::axes<Batch, Pos, Embed>>>);
  auto r2 = w - x;  // order is still the superset's
  static_assert(std::is_same_v<decltype(r2), hax::named_array<float, hax::axes<Batch, Pos, Embed>>>);
  auto hx = x.to_host(), hw = w.to_host();
  std::vector<float> want(24), want2(24);
  for (int b = 0; b < 2; ++b)
    for (int p = 0; p < 3; ++p)
      for (int e = 0; e < 4; ++e) {
        want[(b * 3 + p) * 4 + e] = hx[(b * 3 + p) * 4 + e] - hw[e * 2 + b];
        want2[(b * 3 + p) * 4 + e] = -want[(b * 3 + p) * 4 + e];
      }
  check_close(r.to_host(), want);
  check_close(r2.to_host(), want2);
}

TEST_CASE("mismatched sizes of a shared axis throw with both shapes") {
  auto a = hax::zeros<float>(2 * Batch, 768 * Embed);
  auto b = hax::zeros<float>(1024 * Embed);
  CHECK_THROWS_WITH_AS(a + b,
                       doctest::Contains("'embed' has size 768 in {batch=2, embed=768} but 1024 in {embed=1024}"),
                       hax::shape_error);
}

TEST_CASE("scalar forms and unary ops") {
  auto a = random_array(5, 7 * X);
  auto h = a.to_host();
  std::vector<float> w1(7), w2(7), w3(7), w4(7);
  for (int i = 0; i < 7; ++i) {
    w1[i] = 2.0f * h[i] + 1.0f;
    w2[i] = 1.0f - h[i];
    w3[i] = std::exp(h[i]);
    w4[i] = std::tanh(h[i]);
  }
  check_close((2.0f * a + 1.0f).to_host(), w1);
  check_close((1.0 - a).to_host(), w2);
  check_close(hax::exp(a).to_host(), w3);
  check_close(hax::tanh(a).to_host(), w4);
}

TEST_CASE("comparisons give bool arrays, and where selects") {
  auto a = hax::from_host<float>({-1.0f, 2.0f, 0.5f, -3.0f}, 4 * X);
  auto m = a > 0.0f;
  static_assert(std::is_same_v<decltype(m), hax::named_array<bool, hax::axes<X>>>);
  auto h = m.to_host();
  CHECK(std::vector<bool>(h.begin(), h.end()) == std::vector<bool>{false, true, true, false});
  auto r = hax::where(m, a, 0.0f);
  CHECK(r.to_host() == std::vector<float>{0.0f, 2.0f, 0.5f, 0.0f});
  CHECK(hax::clip(a, -1.0f, 1.0f).to_host() == std::vector<float>{-1.0f, 1.0f, 0.5f, -1.0f});
}

namespace {
template <class F, class R>
void check_unary(const hax::named_array<double, hax::axes<X, Y>>& x, F op, R ref, double tol = 1e-12) {
  auto h = x.to_host();
  std::vector<double> want(h.size());
  for (std::size_t i = 0; i < h.size(); ++i) want[i] = ref(h[i]);
  check_close(op(x).to_host(), want, tol, tol);
}
}  // namespace

TEST_CASE("every unary op matches the C library in double") {
  auto x = random_array<double>(31, 5 * X, 7 * Y);  // in [-1, 1)
  auto pos = hax::abs(x) + 0.01;                    // in (0, 1.01)
  check_unary(
      x, [](auto a) { return hax::abs(a); }, [](double v) { return std::abs(v); });
  check_unary(
      x, [](auto a) { return hax::negative(a); }, [](double v) { return -v; });
  check_unary(
      x, [](auto a) { return -a; }, [](double v) { return -v; });
  check_unary(
      x, [](auto a) { return hax::square(a); }, [](double v) { return v * v; });
  check_unary(
      x, [](auto a) { return hax::sign(a); }, [](double v) { return double((v > 0) - (v < 0)); });
  check_unary(
      x, [](auto a) { return hax::exp(a); }, [](double v) { return std::exp(v); });
  check_unary(
      x, [](auto a) { return hax::expm1(a); }, [](double v) { return std::expm1(v); });
  check_unary(
      pos, [](auto a) { return hax::log(a); }, [](double v) { return std::log(v); });
  check_unary(
      x, [](auto a) { return hax::log1p(a + 1.5); }, [](double v) { return std::log1p(v + 1.5); });
  check_unary(
      pos, [](auto a) { return hax::log2(a); }, [](double v) { return std::log2(v); });
  check_unary(
      pos, [](auto a) { return hax::log10(a); }, [](double v) { return std::log10(v); });
  check_unary(
      pos, [](auto a) { return hax::sqrt(a); }, [](double v) { return std::sqrt(v); });
  check_unary(
      pos, [](auto a) { return hax::rsqrt(a); }, [](double v) { return 1 / std::sqrt(v); });
  check_unary(
      pos, [](auto a) { return hax::reciprocal(a); }, [](double v) { return 1 / v; });
  check_unary(
      x, [](auto a) { return hax::tanh(a); }, [](double v) { return std::tanh(v); });
  check_unary(
      x, [](auto a) { return hax::sinh(a); }, [](double v) { return std::sinh(v); });
  check_unary(
      x, [](auto a) { return hax::cosh(a); }, [](double v) { return std::cosh(v); });
  check_unary(
      x, [](auto a) { return hax::sin(a); }, [](double v) { return std::sin(v); });
  check_unary(
      x, [](auto a) { return hax::cos(a); }, [](double v) { return std::cos(v); });
  check_unary(
      x, [](auto a) { return hax::tan(a); }, [](double v) { return std::tan(v); });
  check_unary(
      x, [](auto a) { return hax::arcsin(a); }, [](double v) { return std::asin(v); });
  check_unary(
      x, [](auto a) { return hax::arccos(a); }, [](double v) { return std::acos(v); });
  check_unary(
      x, [](auto a) { return hax::arctan(a); }, [](double v) { return std::atan(v); });
  check_unary(
      x, [](auto a) { return hax::erf(a); }, [](double v) { return std::erf(v); });
  auto big = x * 4.0;
  check_unary(
      big, [](auto a) { return hax::floor(a); }, [](double v) { return std::floor(v); });
  check_unary(
      big, [](auto a) { return hax::ceil(a); }, [](double v) { return std::ceil(v); });
  check_unary(
      big, [](auto a) { return hax::trunc(a); }, [](double v) { return std::trunc(v); });
  check_unary(
      big, [](auto a) { return hax::round(a); }, [](double v) { return std::nearbyint(v); });
  // round is half-to-even, as numpy
  CHECK(hax::round(hax::from_host<double>({0.5, 1.5, 2.5, -0.5}, 4 * X)).to_host() ==
        std::vector<double>{0.0, 2.0, 2.0, -0.0});
}

TEST_CASE("every binary op matches a naive loop, array-array and with scalars") {
  auto a = random_array<double>(32, 4 * X, 6 * Y);
  auto b = random_array<double>(33, 6 * Y);  // broadcasts over X
  auto ha = a.to_host(), hb = b.to_host();
  auto run = [&](auto op, auto ref) {
    auto got = op(a, b).to_host();
    std::vector<double> want(ha.size());
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 6; ++j) want[i * 6 + j] = ref(ha[i * 6 + j], hb[j]);
    check_close(got, want, 1e-12, 1e-12);
  };
  run([](auto p, auto q) { return p + q; }, [](double p, double q) { return p + q; });
  run([](auto p, auto q) { return p - q; }, [](double p, double q) { return p - q; });
  run([](auto p, auto q) { return p * q; }, [](double p, double q) { return p * q; });
  run([](auto p, auto q) { return p / q; }, [](double p, double q) { return p / q; });
  run([](auto p, auto q) { return hax::maximum(p, q); }, [](double p, double q) { return std::max(p, q); });
  run([](auto p, auto q) { return hax::minimum(p, q); }, [](double p, double q) { return std::min(p, q); });
  run([](auto p, auto q) { return hax::power(hax::abs(p), q); },
      [](double p, double q) { return std::pow(std::abs(p), q); });
  run([](auto p, auto q) { return hax::fmod(p, q); }, [](double p, double q) { return std::fmod(p, q); });
  run([](auto p, auto q) { return hax::arctan2(p, q); }, [](double p, double q) { return std::atan2(p, q); });
  run([](auto p, auto q) { return hax::logaddexp(p, q); },
      [](double p, double q) { return std::log(std::exp(p) + std::exp(q)); });
  auto cmp = [&](auto op, auto ref) {
    auto got = op(a, b).to_host();
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 6; ++j) CHECK(got[i * 6 + j] == ref(ha[i * 6 + j], hb[j]));
  };
  cmp([](auto p, auto q) { return p < q; }, [](double p, double q) { return p < q; });
  cmp([](auto p, auto q) { return p <= q; }, [](double p, double q) { return p <= q; });
  cmp([](auto p, auto q) { return p > q; }, [](double p, double q) { return p > q; });
  cmp([](auto p, auto q) { return p >= q; }, [](double p, double q) { return p >= q; });
  cmp([](auto p, auto q) { return hax::equal(p, p * 1.0); }, [](double, double) { return true; });
  cmp([](auto p, auto q) { return hax::not_equal(p, q); }, [](double p, double q) { return p != q; });
  // scalars on either side
  auto s1 = (3.0 - a).to_host(), s2 = (a / 4.0).to_host(), s3 = hax::maximum(a, 0.25).to_host();
  for (std::size_t i = 0; i < ha.size(); ++i) {
    CHECK(s1[i] == 3.0 - ha[i]);
    CHECK(s2[i] == ha[i] / 4.0);
    CHECK(s3[i] == std::max(ha[i], 0.25));
  }
}

TEST_CASE("logical ops, integer arithmetic and bf16 arithmetic") {
  auto p = hax::from_host(std::vector<bool>{true, true, false, false}, 4 * X);
  auto q = hax::from_host(std::vector<bool>{true, false, true, false}, 4 * X);
  auto as_vec = [](auto arr) {
    auto h = arr.to_host();
    return std::vector<bool>(h.begin(), h.end());
  };
  CHECK(as_vec(p && q) == std::vector<bool>{true, false, false, false});
  CHECK(as_vec(p || q) == std::vector<bool>{true, true, true, false});
  CHECK(as_vec(hax::logical_xor(p, q)) == std::vector<bool>{false, true, true, false});
  CHECK(as_vec(!p) == std::vector<bool>{false, false, true, true});
  auto i = hax::from_host<std::int32_t>({1, -2, 3}, 3 * X);
  CHECK((i * 3 + 1).to_host() == std::vector<std::int32_t>{4, -5, 10});
  CHECK(hax::abs(i).to_host() == std::vector<std::int32_t>{1, 2, 3});
  auto bf = hax::astype<hax::bf16>(hax::from_host<float>({1.0f, 2.0f, 3.0f}, 3 * X));
  auto r = hax::astype<float>(bf * 2.0f + 0.5f).to_host();
  CHECK(r == std::vector<float>{2.5f, 4.5f, 6.5f});
}

TEST_CASE("broadcast_to and broadcast_axis") {
  auto e = hax::from_host<float>({1, 2, 3}, 3 * Embed);
  auto b = hax::broadcast_axis(e, 2 * Batch);
  static_assert(std::is_same_v<decltype(b), hax::named_array<float, hax::axes<Batch, Embed>>>);
  CHECK(b.to_host() == std::vector<float>{1, 2, 3, 1, 2, 3});
  auto t = hax::broadcast_to(e, 3 * Embed, 2 * Batch);
  static_assert(std::is_same_v<decltype(t), hax::named_array<float, hax::axes<Embed, Batch>>>);
  CHECK(t.to_host() == std::vector<float>{1, 1, 2, 2, 3, 3});
  CHECK_THROWS_AS(hax::broadcast_to(e, 4 * Embed, 2 * Batch), hax::shape_error);
}

TEST_CASE("where broadcasts condition and branches by name") {
  auto c = hax::from_host(std::vector<bool>{true, false}, 2 * Batch);
  auto x = random_array(34, 2 * Batch, 3 * Embed);
  auto y = random_array(35, 3 * Embed);
  auto r = hax::where(c, x, y);
  static_assert(std::is_same_v<decltype(r), hax::named_array<float, hax::axes<Batch, Embed>>>);
  auto hx = x.to_host(), hy = y.to_host(), hr = r.to_host();
  for (int e = 0; e < 3; ++e) {
    CHECK(hr[e] == hx[e]);
    CHECK(hr[3 + e] == hy[e]);
  }
}
