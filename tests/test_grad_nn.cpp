// Gradient tests for haliax/nn/functions.hpp: every float-valued function is checked against central
// differences in double (gradcheck.hpp) away from kinks; the kinks themselves against JAX's sub-gradients; the
// fused float kernels of the softmax family against the double gradients on every host ISA variant.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <haliax/autodiff.hpp>
#include <haliax/haliax.hpp>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <vector>

#include "gradcheck.hpp"
#include "test_axes.hpp"

using namespace test_axes;
namespace hax = haliax;
namespace nn = haliax::nn;
using hax::axes;
using hax::named_array;

namespace {

/// Random values in [-lo_hi, lo_hi) kept at least `gap` away from every kink in `kinks`.
std::vector<double> away_from(std::vector<double> v, double scale, std::initializer_list<double> kinks,
                              double gap = 1e-2) {
  for (auto& e : v) {
    e *= scale;
    for (double k : kinks)
      if (std::abs(e - k) < gap) e = k + (e < k ? -gap : gap);
  }
  return v;
}

/// A double {x=3, y=4} array of values in [-scale, scale) away from `kinks`.
named_array<double, axes<X, Y>> input(unsigned seed, double scale = 4.0, std::initializer_list<double> kinks = {}) {
  return hax::from_host<double>(away_from(random_values<double>(12, seed), scale, kinks), 3 * X, 4 * Y);
}

/// d/dx sum(f(x)) at the single point v (an array of one element).
template <class F>
double derivative_at(F f, double v) {
  auto x = hax::from_host<double>({v}, 1 * X);
  auto g = hax::grad([&](const auto& a) { return hax::sum(f(a)); })(x);
  return g.to_host()[0];
}

}  // namespace

TEST_CASE("softmax gradient along the last, a middle and the first axis") {
  auto x = random_array<double>(1, 3 * X, 4 * Y, 5 * Z);
  gradcheck::check_output_gradient([](const auto& a) { return nn::softmax(a, Z); }, x);
  gradcheck::check_output_gradient([](const auto& a) { return nn::softmax(a, Y); }, x);
  gradcheck::check_output_gradient([](const auto& a) { return nn::softmax(a, X); }, x);
}

TEST_CASE("log_softmax gradient along every axis") {
  auto x = random_array<double>(2, 3 * X, 4 * Y, 5 * Z) * 3.0;
  gradcheck::check_output_gradient([](const auto& a) { return nn::log_softmax(a, Z); }, x);
  gradcheck::check_output_gradient([](const auto& a) { return nn::log_softmax(a, Y); }, x);
  gradcheck::check_output_gradient([](const auto& a) { return nn::log_softmax(a, X); }, x);
}

TEST_CASE("logsumexp gradient along every axis, and it is the softmax") {
  auto x = random_array<double>(3, 3 * X, 4 * Y, 5 * Z) * 3.0;
  gradcheck::check_output_gradient([](const auto& a) { return nn::logsumexp(a, Z); }, x);
  gradcheck::check_output_gradient([](const auto& a) { return nn::logsumexp(a, Y); }, x);
  gradcheck::check_output_gradient([](const auto& a) { return nn::logsumexp(a, X); }, x);
  auto g = hax::grad([](const auto& a) { return hax::sum(nn::logsumexp(a, Y)); })(x);
  check_close(g.to_host(), nn::softmax(x, Y).to_host(), 1e-12, 1e-14);
}

TEST_CASE("logsumexp of an all -inf row has a zero gradient") {
  const double inf = std::numeric_limits<double>::infinity();
  auto x = hax::from_host<double>({-inf, -inf, 0.5, 1.5}, 2 * X, 2 * Y);
  auto g = hax::grad([](const auto& a) { return hax::sum(nn::logsumexp(a, Y)); })(x);
  auto h = g.to_host();
  CHECK(h[0] == 0.0);
  CHECK(h[1] == 0.0);
  CHECK(h[2] + h[3] == doctest::Approx(1.0));
}

TEST_CASE("standardize gradient along the last and the first axis, with and without epsilon") {
  auto x = random_array<double>(4, 3 * X, 4 * Y, 5 * Z) * 2.0;
  gradcheck::check_output_gradient([](const auto& a) { return nn::standardize(a, Z); }, x);
  gradcheck::check_output_gradient([](const auto& a) { return nn::standardize(a, X); }, x);
  gradcheck::check_output_gradient([](const auto& a) { return nn::standardize(a, Y, 0.0); }, x);
  gradcheck::check_output_gradient([](const auto& a) { return nn::standardize(a, Y, 0.5); }, x);
}

TEST_CASE("the softmax family composes with other ops under grad") {
  auto x = random_array<double>(5, 3 * X, 4 * Y);
  auto w = random_array<double>(6, 4 * Y);
  gradcheck::check_gradient(
      [&](const auto& a) {
        auto p = nn::softmax(a * w, Y);
        return hax::sum(nn::log_softmax(p + a, X) * nn::standardize(a, Y) + nn::logsumexp(a, X) * 0.5);
      },
      x);
}

TEST_CASE("activations: gradients against central differences") {
  using F = named_array<double, axes<X, Y>>;
  auto check = [](const char* name, auto f, std::initializer_list<double> kinks, double scale = 4.0) {
    INFO(name);
    gradcheck::check_output_gradient(f, input(11, scale, kinks));
  };
  check("relu", [](const F& a) { return nn::relu(a); }, {0.0});
  check(
      "relu6", [](const F& a) { return nn::relu6(a); }, {0.0, 6.0}, 8.0);
  check("relu_squared", [](const F& a) { return nn::relu_squared(a); }, {0.0});
  check("sigmoid", [](const F& a) { return nn::sigmoid(a); }, {});
  check(
      "log_sigmoid", [](const F& a) { return nn::log_sigmoid(a); }, {}, 20.0);
  check(
      "softplus", [](const F& a) { return nn::softplus(a); }, {}, 20.0);
  check("soft_sign", [](const F& a) { return nn::soft_sign(a); }, {0.0});
  check("silu", [](const F& a) { return nn::silu(a); }, {});
  check("swish", [](const F& a) { return nn::swish(a); }, {});
  check("quick_gelu", [](const F& a) { return nn::quick_gelu(a); }, {});
  check("gelu (tanh)", [](const F& a) { return nn::gelu(a); }, {});
  check("gelu (erf)", [](const F& a) { return nn::gelu(a, false); }, {});
  check("gelu_new", [](const F& a) { return nn::gelu_new(a); }, {});
  check("hard_sigmoid", [](const F& a) { return nn::hard_sigmoid(a); }, {-3.0, 3.0});
  check("hard_silu", [](const F& a) { return nn::hard_silu(a); }, {-3.0, 3.0});
  check("hard_swish", [](const F& a) { return nn::hard_swish(a); }, {-3.0, 3.0});
  check(
      "hard_tanh", [](const F& a) { return nn::hard_tanh(a); }, {-1.0, 1.0}, 2.0);
  check("leaky_relu", [](const F& a) { return nn::leaky_relu(a); }, {0.0});
  check("leaky_relu 0.2", [](const F& a) { return nn::leaky_relu(a, 0.2); }, {0.0});
  check("elu", [](const F& a) { return nn::elu(a); }, {0.0});
  check("elu 0.5", [](const F& a) { return nn::elu(a, 0.5); }, {0.0});
  check("celu 2", [](const F& a) { return nn::celu(a, 2.0); }, {0.0});
  check("selu", [](const F& a) { return nn::selu(a); }, {0.0});
}

TEST_CASE("activations: gelu's two forms have their own derivatives") {
  // At x = 1: d/dx [x Phi(x)] = Phi(1) + phi(1); the tanh form differs in the fourth digit.
  const double exact = 0.5 * (1 + std::erf(1 / std::sqrt(2.0))) + std::exp(-0.5) / std::sqrt(2 * std::numbers::pi);
  CHECK(derivative_at([](const auto& a) { return nn::gelu(a, false); }, 1.0) == doctest::Approx(exact).epsilon(1e-12));
  const double approx = derivative_at([](const auto& a) { return nn::gelu(a); }, 1.0);
  CHECK(approx == doctest::Approx(exact).epsilon(1e-3));
  CHECK(approx != doctest::Approx(exact).epsilon(1e-6));
}

TEST_CASE("activations: sub-gradients at the kinks are JAX's") {
  auto d = [](auto f, double v) { return derivative_at(f, v); };
  CHECK(d([](const auto& a) { return nn::relu(a); }, 0.0) == 0.0);
  CHECK(d([](const auto& a) { return nn::relu6(a); }, 0.0) == 0.0);
  CHECK(d([](const auto& a) { return nn::relu6(a); }, 6.0) == 0.0);
  CHECK(d([](const auto& a) { return nn::relu6(a); }, 3.0) == 1.0);
  CHECK(d([](const auto& a) { return nn::relu_squared(a); }, 0.0) == 0.0);
  CHECK(d([](const auto& a) { return nn::hard_sigmoid(a); }, -3.0) == 0.0);
  CHECK(d([](const auto& a) { return nn::hard_sigmoid(a); }, 3.0) == 0.0);
  CHECK(d([](const auto& a) { return nn::hard_silu(a); }, 3.0) == doctest::Approx(1.0));  // hard_sigmoid(3) + 0
  CHECK(d([](const auto& a) { return nn::hard_tanh(a); }, 1.0) == 1.0);
  CHECK(d([](const auto& a) { return nn::hard_tanh(a); }, -1.0) == 1.0);
  CHECK(d([](const auto& a) { return nn::leaky_relu(a, 0.2); }, 0.0) == 1.0);
  CHECK(d([](const auto& a) { return nn::elu(a, 0.5); }, 0.0) == doctest::Approx(0.5));
  CHECK(d([](const auto& a) { return nn::celu(a, 0.5); }, 0.0) == doctest::Approx(1.0));
  CHECK(d([](const auto& a) { return nn::selu(a); }, 0.0) ==
        doctest::Approx(1.0507009873554804934 * 1.6732632423543772848));
  CHECK(d([](const auto& a) { return nn::soft_sign(a); }, 0.0) == 1.0);
  CHECK(d([](const auto& a) { return nn::silu(a); }, 0.0) == doctest::Approx(0.5));
  CHECK(d([](const auto& a) { return nn::softplus(a); }, 0.0) == doctest::Approx(0.5));
}

TEST_CASE("activations: stable gradients for large magnitudes") {
  auto x = hax::from_host<double>({-800.0, -50.0, 50.0, 800.0}, 4 * X);
  for (auto h : {hax::grad([](const auto& a) { return hax::sum(nn::sigmoid(a)); })(x).to_host(),
                 hax::grad([](const auto& a) { return hax::sum(nn::log_sigmoid(a)); })(x).to_host(),
                 hax::grad([](const auto& a) { return hax::sum(nn::softplus(a)); })(x).to_host(),
                 hax::grad([](const auto& a) { return hax::sum(nn::silu(a)); })(x).to_host()})
    for (double v : h) CHECK(std::isfinite(v));
  auto g = hax::grad([](const auto& a) { return hax::sum(nn::log_sigmoid(a)); })(x).to_host();
  CHECK(g[0] == doctest::Approx(1.0));
  CHECK(g[3] == 0.0);
}

TEST_CASE("glu gradient along the last and the first axis") {
  auto x = random_array<double>(7, 4 * X, 6 * Y) * 3.0;
  gradcheck::check_output_gradient([](const auto& a) { return nn::glu(a, Y); }, x);
  gradcheck::check_output_gradient([](const auto& a) { return nn::glu(a, X); }, x);
}

TEST_CASE("float and bf16 gradients of the activations follow the double ones") {
  auto xd = random_array<double>(8, 5 * X, 7 * Y) * 3.0;
  auto xf = hax::astype<float>(xd);
  auto xb = hax::astype<hax::bf16>(xd);
  auto gd = hax::grad([](const auto& a) { return hax::sum(nn::gelu(a) + nn::silu(a) * nn::softplus(a)); })(xd);
  auto gf = hax::grad([](const auto& a) { return hax::sum(nn::gelu(a) + nn::silu(a) * nn::softplus(a)); })(xf);
  check_close(gf.to_host(), gd.to_host(), 1e-5, 1e-6);
  auto gb = hax::grad([](const auto& a) { return hax::sum(nn::silu(a)); })(xb);
  auto gbd = hax::grad([](const auto& a) { return hax::sum(nn::silu(a)); })(hax::astype<double>(xb));
  check_close(gb.to_host(), gbd.to_host(), 1e-2, 1e-2);
}

TEST_CASE("fused float backward of the softmax family matches double on long rows, on every ISA variant") {
  // Rows longer than the lane groups and the sum chunks, contiguous (last axis) and strided (first axis).
  // The double reference runs on the float inputs, so that only the kernels' rounding is compared.
  auto xf = hax::astype<float>(random_array<double>(9, 3 * X, 3001 * Vocab) * 8.0);
  auto wf = random_array<float>(10, 3 * X, 3001 * Vocab);
  auto xd = hax::astype<double>(xf);
  auto wd = hax::astype<double>(wf);
  auto loss = [](const auto& w, auto op) { return [w, op](const auto& a) { return hax::sum(op(a) * w); }; };
  auto sm = [](const auto& a) { return nn::softmax(a, Vocab); };
  auto lsm = [](const auto& a) { return nn::log_softmax(a, Vocab); };
  auto lse = [](const auto& a) { return nn::logsumexp(a, Vocab) * 1.0; };
  auto stdz = [](const auto& a) { return nn::standardize(a, Vocab); };
  auto sm0 = [](const auto& a) { return nn::softmax(a, X); };
  auto stdz0 = [](const auto& a) { return nn::standardize(a, X); };
  auto& limit = nn::detail::host_isa_limit();
  const auto saved = limit;
  for (auto isa : {nn::detail::host_isa::generic, nn::detail::host_isa::avx2, nn::detail::host_isa::avx512}) {
    limit = isa;
    INFO("isa limit " << static_cast<int>(isa));
    {
      auto gd = hax::grad(loss(wd, sm))(xd);
      auto gf = hax::grad(loss(wf, sm))(xf);
      check_close(gf.to_host(), gd.to_host(), 2e-4, 1e-9);
    }
    {
      auto gd = hax::grad(loss(wd, lsm))(xd);
      auto gf = hax::grad(loss(wf, lsm))(xf);
      check_close(gf.to_host(), gd.to_host(), 1e-4, 1e-6);
    }
    {
      auto gd = hax::grad([&](const auto& a) { return hax::sum(lse(a)); })(xd);
      auto gf = hax::grad([&](const auto& a) { return hax::sum(lse(a)); })(xf);
      check_close(gf.to_host(), gd.to_host(), 1e-4, 1e-9);
    }
    {
      auto gd = hax::grad(loss(wd, stdz))(xd);
      auto gf = hax::grad(loss(wf, stdz))(xf);
      check_close(gf.to_host(), gd.to_host(), 1e-3, 1e-5);
    }
    {
      auto gd = hax::grad(loss(wd, sm0))(xd);
      auto gf = hax::grad(loss(wf, sm0))(xf);
      check_close(gf.to_host(), gd.to_host(), 1e-4, 1e-6);  // rows of 3: y ~ 1, float rounding ~1e-7 absolute
    }
    {
      auto gd = hax::grad(loss(wd, stdz0))(xd);
      auto gf = hax::grad(loss(wf, stdz0))(xf);
      check_close(gf.to_host(), gd.to_host(), 1e-3, 1e-5);
    }
  }
  limit = saved;
}

TEST_CASE("bf16 softmax backward computes in float") {
  auto xd = random_array<double>(12, 4 * X, 64 * Vocab) * 4.0;
  auto wd = random_array<double>(13, 4 * X, 64 * Vocab);
  auto xb = hax::astype<hax::bf16>(xd);
  auto wb = hax::astype<hax::bf16>(wd);
  auto gb = hax::grad([&](const auto& a) { return hax::sum(nn::softmax(a, Vocab) * wb); })(xb);
  auto gd = hax::grad([&](const auto& a) { return hax::sum(nn::softmax(a, Vocab) * hax::astype<double>(wb)); })(
      hax::astype<double>(xb));
  check_close(gb.to_host(), gd.to_host(), 3e-2, 3e-3);
}

TEST_CASE("softmax_into and log_softmax_into refuse a tracked input") {
  auto x = random_array<double>(14, 2 * X, 3 * Y);
  auto out = hax::empty_like(x);
  CHECK_THROWS_AS(hax::grad([&](const auto& a) {
                    nn::softmax_into(a, Y, out);
                    return hax::sum(a);
                  })(x),
                  std::logic_error);
  CHECK_THROWS_AS(hax::grad([&](const auto& a) {
                    nn::log_softmax_into(a, Y, out);
                    return hax::sum(a);
                  })(x),
                  std::logic_error);
  nn::softmax_into(x, Y, out);  // outside a gradient it works as before
  check_close(out.to_host(), nn::softmax(x, Y).to_host(), 0, 0);
}

TEST_CASE("large float outputs take the streamed backward and agree with double") {
  // 2035 rows of 1031: above the streaming threshold (8 MiB of output), rows starting at every alignment.
  auto xf = hax::astype<float>(random_array<double>(15, 2035 * X, 1031 * Vocab) * 6.0);
  auto wf = random_array<float>(16, 2035 * X, 1031 * Vocab);
  auto xd = hax::astype<double>(xf);
  auto wd = hax::astype<double>(wf);
  auto compare = [](const auto& got, const auto& want, double rtol, double atol) {
    auto g = got.to_host();
    auto w = want.to_host();
    REQUIRE(g.size() == w.size());
    std::size_t bad = 0;
    double worst = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      const double err = std::abs(static_cast<double>(g[i]) - w[i]);
      worst = std::max(worst, err);
      if (!(err <= atol + rtol * std::abs(w[i]))) ++bad;
    }
    CHECK_MESSAGE(bad == 0, bad << " elements off, worst absolute error " << worst);
  };
  auto sm = [](const auto& w) { return [w](const auto& a) { return hax::sum(nn::softmax(a, Vocab) * w); }; };
  auto lsm = [](const auto& w) { return [w](const auto& a) { return hax::sum(nn::log_softmax(a, Vocab) * w); }; };
  auto stdz = [](const auto& w) { return [w](const auto& a) { return hax::sum(nn::standardize(a, Vocab) * w); }; };
  compare(hax::grad(sm(wf))(xf), hax::grad(sm(wd))(xd), 1e-4, 1e-8);
  compare(hax::grad(lsm(wf))(xf), hax::grad(lsm(wd))(xd), 1e-4, 1e-6);
  compare(hax::grad(stdz(wf))(xf), hax::grad(stdz(wd))(xd), 1e-3, 1e-5);
}
