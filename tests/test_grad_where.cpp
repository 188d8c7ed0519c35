// Gradient rules of broadcasting, where, clip and the casts (ops/elementwise.hpp), each checked against central
// finite differences in double, plus the JAX conventions at boundaries with exact expected values, and float /
// bf16 smoke tests through astype.
#include "grad_elementwise_helpers.hpp"

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
