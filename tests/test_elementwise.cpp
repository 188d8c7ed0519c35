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
  CHECK_THROWS_WITH_AS(a + b, doctest::Contains("'embed' has size 768 in {batch=2, embed=768} but 1024 in {embed=1024}"),
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

TEST_CASE("comparisons give bool arrays; where selects") {
  auto a = hax::from_host<float>({-1.0f, 2.0f, 0.5f, -3.0f}, 4 * X);
  auto m = a > 0.0f;
  static_assert(std::is_same_v<decltype(m), hax::named_array<bool, hax::axes<X>>>);
  auto h = m.to_host();
  CHECK(std::vector<bool>(h.begin(), h.end()) == std::vector<bool>{false, true, true, false});
  auto r = hax::where(m, a, 0.0f);
  CHECK(r.to_host() == std::vector<float>{0.0f, 2.0f, 0.5f, 0.0f});
  CHECK(hax::clip(a, -1.0f, 1.0f).to_host() == std::vector<float>{-1.0f, 1.0f, 0.5f, -1.0f});
}
