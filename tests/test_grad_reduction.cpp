// Gradient rules of the reductions (ops/reduction.hpp), each checked against central finite differences in
// double, plus the JAX conventions at ties with exact expected values.
#include "grad_elementwise_helpers.hpp"

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
