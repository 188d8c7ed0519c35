// Tests for haliax/autodiff.hpp: the tape, value_and_grad/grad over arrays and modules, stop_gradient,
// checkpoint, and the finite-difference checker itself.
#include <doctest/doctest.h>

#include <haliax/autodiff.hpp>
#include <haliax/haliax.hpp>
#include <haliax/detail/tool_counters.hpp>

#include "gradcheck.hpp"
#include "test_axes.hpp"

using namespace test_axes;
namespace hax = haliax;
using hax::axes;
using hax::named_array;

namespace {
struct affine {
  BOOST_HANA_DEFINE_STRUCT(affine, (named_array<double, axes<Embed>>, w), (named_array<double, axes<>>, b),
                           (named_array<std::int32_t, axes<Embed>>, ids));
};
}  // namespace

TEST_CASE("grad of sum(x * w) is w, and value_and_grad returns the value") {
  auto x = random_array<double>(1, 3 * Batch, 4 * Embed);
  auto w = random_array<double>(2, 4 * Embed);
  auto [value, g] = hax::value_and_grad([&](const auto& xx) { return hax::sum(xx * w); })(x);
  CHECK(value.item() == doctest::Approx(hax::sum(x * w).item()));
  auto want = hax::broadcast_to(w, 3 * Batch, 4 * Embed).to_host();
  check_close(g.to_host(), want, 1e-12, 1e-12);
  CHECK(value.ad_node() == nullptr);
}

TEST_CASE("gradients of a module come back as the same module type, and int leaves pass through") {
  affine m{random_array<double>(3, 5 * Embed), hax::scalar(0.5), hax::arange(5 * Embed)};
  auto x = random_array<double>(4, 2 * Batch, 5 * Embed);
  auto f = [&](const affine& p) { return hax::sum(x * p.w + p.b); };
  affine g = hax::grad(f)(m);
  CHECK(g.b.item() == doctest::Approx(10.0));
  check_close(g.w.to_host(), hax::sum(x, Batch).to_host(), 1e-12, 1e-12);
  CHECK(g.ids.to_host() == m.ids.to_host());
  gradcheck::check_gradient(f, m);
}

TEST_CASE("nothing is recorded outside value_and_grad, and stop_gradient cuts the graph") {
  auto x = random_array<double>(5, 4 * Embed);
  auto y = x * x;
  CHECK(y.ad_node() == nullptr);
  CHECK_FALSE(hax::is_recording());
  auto g = hax::grad([](const auto& v) { return hax::sum(v * hax::stop_gradient(v)); })(x);
  check_close(g.to_host(), x.to_host(), 1e-12, 1e-12);
}

TEST_CASE("an input used twice accumulates both contributions") {
  auto x = random_array<double>(6, 3 * X);
  auto g = hax::grad([](const auto& v) { return hax::sum(v * v + v); })(x);
  auto want = (x * 2.0 + 1.0).to_host();
  check_close(g.to_host(), want, 1e-12, 1e-12);
}

TEST_CASE("a gradient with several contributions is summed by kernels, with no deep copy") {
  // The second contribution is added to the first into the node's own buffer by one kernel: a deep copy of the
  // first would fence a GPU twice, for each residual stream, fused projection and tied embedding, every step.
  auto x = random_array<float>(16, 64 * X, 32 * Y);
  auto w = random_array<float>(17, 64 * X, 32 * Y);
  auto v = random_array<float>(18, 64 * X, 32 * Y);
  auto u = random_array<float>(19, 64 * X, 32 * Y);
  auto run = [&](const auto& f) {
    hax::detail::tools::counter c;
    c.start();
    auto g = hax::grad(f)(x);
    const auto n = c.stop();
    return std::pair{g.to_host(), n.deep_copies};
  };
  const auto [g1, copies1] = run([&](const auto& a) { return hax::sum(a * w); });
  const auto [g3, copies3] = run([&](const auto& a) { return hax::sum(a * w + a * v + a * u); });
  CHECK(copies3 == copies1);  // three contributions cost no copy more than one
  check_close(g1, w.to_host(), 0, 0);
  check_close(g3, (w + v + u).to_host(), 1e-6, 1e-6);
}

TEST_CASE("aux outputs are returned alongside the loss") {
  auto x = random_array<double>(7, 3 * X);
  auto [out, g] = hax::value_and_grad([](const auto& v) {
    auto loss = hax::sum(v * v);
    return std::pair{loss, hax::sum(v, hax::where_mask{v > 0.0})};
  })(x);
  CHECK(out.first.item() == doctest::Approx(hax::sum(x * x).item()));
  CHECK(out.second.ad_node() == nullptr);
}

TEST_CASE("checkpoint gives identical values and gradients") {
  auto x = random_array<double>(8, 3 * Batch, 4 * Embed);
  affine m{random_array<double>(9, 4 * Embed), hax::scalar(0.25), hax::arange(4 * Embed)};
  auto layer = [](const affine& p, const named_array<double, axes<Batch, Embed>>& h) { return h * p.w * h + p.b; };
  auto plain = [&](const affine& p) { return hax::sum(layer(p, layer(p, x))); };
  auto ckpt = [&](const affine& p) {
    auto c = hax::checkpoint(layer);
    return hax::sum(c(p, c(p, x)));
  };
  auto [v1, g1] = hax::value_and_grad(plain)(m);
  auto [v2, g2] = hax::value_and_grad(ckpt)(m);
  CHECK(v1.item() == v2.item());
  CHECK(g1.w.to_host() == g2.w.to_host());
  CHECK(g1.b.item() == g2.b.item());
}

TEST_CASE("the gradient checker catches a wrong gradient") {
  // sum over a masked reduction is checked against differences; a mask excludes elements from both.
  auto x = random_array<double>(10, 2 * Batch, 3 * Embed);
  auto mask = x > 0.0;
  gradcheck::check_gradient([&](const auto& v) { return hax::sum(v * v, hax::where_mask{mask}, Batch, Embed); }, x);
}
