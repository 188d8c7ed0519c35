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

namespace {
// A linear_side adding x . C beside every float Linear: C is read from the thread, not passed as an argument.
struct add_xc final : hax::nn::linear_side {
  named_array<float, axes<hax::nn::SideIn, hax::nn::SideOut>> c;
  std::optional<named_array<float, axes<hax::nn::SideRows, hax::nn::SideOut>>> apply(
      const float*, const named_array<float, axes<hax::nn::SideRows, hax::nn::SideIn>>& x) const override {
    return hax::dot<axes<hax::nn::SideRows, hax::nn::SideOut>>(x, c, hax::nn::SideIn);
  }
  std::shared_ptr<const hax::ambient> rebound(std::uint64_t outer,
                                              std::vector<std::function<void()>>& transfers) const override {
    auto copy = std::make_shared<add_xc>(*this);
    hax::detail::ad::rebind_leaves(copy->c, outer, transfers);
    return copy;
  }
};
}  // namespace

TEST_CASE("checkpoint recomputes under the ambient value it first ran with (a linear_side's gradient survives)") {
  using lin_t = hax::nn::Linear<axes<Embed>, axes<Mlp>>;
  const auto lin = lin_t::init(hax::random::make_key(1), 4 * Embed, 3 * Mlp);
  const auto x = hax::random::normal(hax::random::make_key(2), 5 * Batch, 4 * Embed);
  const auto c0 = hax::random::normal(hax::random::make_key(3), 4 * hax::nn::SideIn, 3 * hax::nn::SideOut);
  auto apply = [](const lin_t& l, const named_array<float, axes<Batch, Embed>>& h) { return l(h); };
  // the scope ends when the loss returns: a checkpointed recomputation in backward runs after it
  auto loss = [&](const named_array<float, axes<hax::nn::SideIn, hax::nn::SideOut>>& c, bool remat) {
    auto side = std::make_shared<add_xc>();
    side->c = c;
    hax::ambient_scope scope(side);
    auto y = remat ? hax::checkpoint(apply)(lin, x) : apply(lin, x);
    return hax::sum(y * y);
  };
  auto [v1, g1] = hax::value_and_grad([&](const auto& c) { return loss(c, false); })(c0);
  auto [v2, g2] = hax::value_and_grad([&](const auto& c) { return loss(c, true); })(c0);
  CHECK(v1.item() == v2.item());
  CHECK(g1.to_host() == g2.to_host());
  CHECK(v1.item() != hax::sum(lin(x) * lin(x)).item());  // the side acted
  // d/dC sum(y^2) = 2 x^T y, with y = x W + b + x C
  const auto y = hax::add(lin(x), hax::dot<axes<Batch, Mlp>>(x, hax::rename(hax::rename(c0, hax::nn::SideIn, Embed), hax::nn::SideOut, Mlp), Embed));
  check_close(g1.to_host(), hax::multiply(hax::dot<axes<Embed, Mlp>>(x, y, Batch), 2.0f).to_host(), 1e-4, 1e-4);
}

TEST_CASE("the gradient checker catches a wrong gradient") {
  // sum over a masked reduction is checked against differences; a mask excludes elements from both.
  auto x = random_array<double>(10, 2 * Batch, 3 * Embed);
  auto mask = x > 0.0;
  gradcheck::check_gradient([&](const auto& v) { return hax::sum(v * v, hax::where_mask{mask}, Batch, Embed); }, x);
}
