// Tests for the nn modules (Linear, Embedding, LayerNorm, RmsNorm, Dropout, Mlp, Stacked): shapes, upstream
// initialisation, reflected names, finite-difference gradients, and stacked folds with every checkpoint policy.
#include <doctest/doctest.h>

#include <haliax/haliax.hpp>

#include "gradcheck.hpp"
#include "test_axes.hpp"

using namespace test_axes;
namespace hax = haliax;
namespace nn = haliax::nn;
using hax::axes;
using hax::named_array;

namespace {
inline constexpr struct Layers final : haliax::axis<"layers"> {
} Layers;

// Named at namespace scope: nvcc 13's host pass mis-prints `nn::Linear<axes<Embed>, ...>::init(...)` written
// inside a test function (docs/portability.md, "Writing kernels nvcc accepts").
using linear_to_heads = nn::Linear<axes<Embed>, axes<Head, Mlp>>;
using linear_to_mlp = nn::Linear<axes<Embed>, axes<Mlp>>;

template <class T, class... S>
auto rnd(unsigned seed, S... s) {
  return random_array<T>(seed, s...);
}

template <class Pre = axes<>>
struct block {
  BOOST_HANA_DEFINE_STRUCT(block, (nn::LayerNorm<Embed, Pre, double>, ln), (nn::Mlp<Embed, Mlp, Pre, double>, mlp));
  template <class X>
  X operator()(const X& x) const requires std::is_same_v<Pre, axes<>> {
    return x + mlp(ln(x));
  }
};

block<> make_block(unsigned seed) {
  block<> b;
  b.ln.weight = hax::add(rnd<double>(seed, 4 * Embed), 1.0);
  b.ln.bias = rnd<double>(seed + 1, 4 * Embed);
  b.ln.eps = 1e-5;
  b.mlp.c_fc.weight = rnd<double>(seed + 2, 4 * Embed, 6 * Mlp);
  b.mlp.c_fc.bias = rnd<double>(seed + 3, 6 * Mlp);
  b.mlp.c_proj.weight = rnd<double>(seed + 4, 6 * Mlp, 4 * Embed);
  b.mlp.c_proj.bias = rnd<double>(seed + 5, 4 * Embed);
  b.mlp.act = nn::activation::gelu_new;
  return b;
}
}  // namespace

TEST_CASE("Linear: shapes, multi-axis in/out, upstream init statistics") {
  auto key = hax::random::make_key(0);
  auto lin = linear_to_heads::init(key, 64 * Embed, 4 * Head, 32 * Mlp);
  CHECK(lin.weight.shape_string() == "{embed=64, head=4, mlp=32}");
  REQUIRE(lin.bias.has_value());
  CHECK(lin.bias->shape_string() == "{head=4, mlp=32}");
  auto w = lin.weight.to_host();
  double s = 0, s2 = 0, mx = 0;
  for (float v : w) {
    s += v;
    s2 += double(v) * v;
    mx = std::max(mx, std::abs(double(v)));
  }
  const double sd = std::sqrt(s2 / w.size());
  // truncated normal in [-3, 3] has sd 0.9866; scaled by 1/sqrt(64)
  CHECK(sd == doctest::Approx(0.9866 / 8.0).epsilon(0.05));
  CHECK(mx <= 3.0 / 8.0 + 1e-6);
  auto x = hax::ones<float>(2 * Batch, 64 * Embed);
  auto y = lin(x);
  CHECK(y.shape_string() == "{batch=2, head=4, mlp=32}");
  CHECK(hax::tree::leaf_names(lin) == std::vector<std::string>{"weight", "bias"});
  auto nobias = linear_to_mlp::init(key, 8 * Embed, 3 * Mlp, false);
  CHECK_FALSE(nobias.bias.has_value());
  CHECK(hax::tree::leaf_names(nobias) == std::vector<std::string>{"weight"});
}

TEST_CASE("Linear: finite-difference gradient over weight and bias, several in and out axes") {
  nn::Linear<axes<Embed, Head>, axes<Mlp, Z>, axes<>, double> lin;
  lin.weight = rnd<double>(1, 3 * Embed, 2 * Head, 4 * Mlp, 2 * Z);
  lin.bias = rnd<double>(2, 4 * Mlp, 2 * Z);
  auto x = rnd<double>(3, 2 * Batch, 3 * Embed, 2 * Head);
  gradcheck::check_output_gradient([&](const auto& m) { return m(x); }, lin);
  gradcheck::check_output_gradient([&](const auto& xx) { return lin(xx); }, x);
}

TEST_CASE("Embedding: embed gathers rows, unembed contracts embed, and gradients scatter-add") {
  nn::Embedding<Vocab, Embed, axes<>, double> emb;
  emb.weight = rnd<double>(4, 7 * Vocab, 3 * Embed);
  auto ids = hax::from_host<std::int32_t>({1, 3, 1, 6, 0}, 5 * Pos);
  auto e = emb.embed(ids);
  CHECK(e.shape_string() == "{position=5, embed=3}");
  auto w = emb.weight.to_host();
  CHECK(e.to_host()[3] == w[3 * 3]);
  gradcheck::check_output_gradient([&](const auto& m) { return m.embed(ids); }, emb);
  auto x = rnd<double>(5, 2 * Pos, 3 * Embed);
  gradcheck::check_output_gradient([&](const auto& m) { return m.unembed(x); }, emb);
}

TEST_CASE("LayerNorm and RmsNorm: values and gradients") {
  auto x = rnd<double>(6, 3 * Batch, 5 * Embed);
  nn::LayerNorm<Embed, axes<>, double> ln;
  ln.weight = rnd<double>(7, 5 * Embed);
  ln.bias = rnd<double>(8, 5 * Embed);
  ln.eps = 1e-5;
  auto y = ln(x).to_host();
  auto xs = x.to_host();
  auto wv = ln.weight->to_host();
  auto bv = ln.bias->to_host();
  for (int b = 0; b < 3; ++b) {
    double m = 0, v = 0;
    for (int e = 0; e < 5; ++e) m += xs[b * 5 + e] / 5;
    for (int e = 0; e < 5; ++e) v += (xs[b * 5 + e] - m) * (xs[b * 5 + e] - m) / 5;
    for (int e = 0; e < 5; ++e)
      CHECK(y[b * 5 + e] == doctest::Approx((xs[b * 5 + e] - m) / std::sqrt(v + 1e-5) * wv[e] + bv[e]));
  }
  gradcheck::check_output_gradient([&](const auto& m) { return m(x); }, ln);
  gradcheck::check_output_gradient([&](const auto& xx) { return ln(xx); }, x);

  nn::RmsNorm<Embed, axes<>, double> rms;
  rms.weight = rnd<double>(9, 5 * Embed);
  rms.eps = 1e-6;
  rms.unit_offset = false;
  auto r = rms(x).to_host();
  for (int b = 0; b < 3; ++b) {
    double ms = 0;
    for (int e = 0; e < 5; ++e) ms += xs[b * 5 + e] * xs[b * 5 + e] / 5;
    for (int e = 0; e < 5; ++e) CHECK(r[b * 5 + e] == doctest::Approx(xs[b * 5 + e] / std::sqrt(ms + 1e-6) * rms.weight->to_host()[e]));
  }
  gradcheck::check_output_gradient([&](const auto& m) { return m(x); }, rms);
  gradcheck::check_output_gradient([&](const auto& xx) { return rms(xx); }, x);

  // Gemma's form: the scale is (1 + weight), and the weight starts at 0 (so the norm starts as the plain one).
  auto gemma = nn::RmsNorm<Embed, axes<>, double>::init(5 * Embed, 1e-6, true, false, true);
  for (double w : gemma.weight->to_host()) CHECK(w == 0.0);
  gemma.weight = rms.weight;
  auto rg = gemma(x).to_host();
  for (int b = 0; b < 3; ++b) {
    double ms = 0;
    for (int e = 0; e < 5; ++e) ms += xs[b * 5 + e] * xs[b * 5 + e] / 5;
    for (int e = 0; e < 5; ++e)
      CHECK(rg[b * 5 + e] ==
            doctest::Approx(xs[b * 5 + e] / std::sqrt(ms + 1e-6) * (1.0 + rms.weight->to_host()[e])));
  }
  gradcheck::check_output_gradient([&](const auto& m) { return m(x); }, gemma);
  gradcheck::check_output_gradient([&](const auto& xx) { return gemma(xx); }, x);
  auto plain = nn::LayerNorm<Embed>::init(5 * Embed, 1e-5, false, false);
  CHECK(hax::tree::leaf_names(plain).empty());
}

TEST_CASE("Dropout: keyed and deterministic, identity at inference, inverted scaling, gradient through the mask") {
  nn::Dropout drop{0.25};
  auto x = hax::ones<double>(40 * Batch, 50 * Embed);
  auto k = hax::random::make_key(3);
  auto a = drop(x, k).to_host();
  auto b = drop(x, k).to_host();
  CHECK(a == b);
  auto c = drop(x, hax::random::make_key(4)).to_host();
  CHECK(a != c);
  int zeros = 0;
  for (double v : a) {
    if (v == 0.0) ++zeros;
    else CHECK(v == doctest::Approx(1.0 / 0.75));
  }
  CHECK(zeros == doctest::Approx(500).epsilon(0.15));
  CHECK(drop(x, k, true).to_host() == x.to_host());
  auto xr = rnd<double>(10, 4 * Batch, 5 * Embed);
  gradcheck::check_output_gradient([&](const auto& xx) { return drop(xx, k); }, xr);
  CHECK_THROWS_AS((nn::Dropout{1.0}(x, k)), std::invalid_argument);
}

TEST_CASE("Mlp: gradient check and activation names") {
  auto b = make_block(20);
  auto x = rnd<double>(11, 2 * Batch, 4 * Embed);
  gradcheck::check_output_gradient([&](const auto& m) { return m(x); }, b.mlp);
  CHECK(nn::activation_from_name("gelu_new") == nn::activation::gelu_new);
  CHECK_THROWS_WITH(nn::activation_from_name("gelu2"), doctest::Contains("valid: relu"));
}

TEST_CASE("activation registry: one table for names, lookups and messages, no tanh") {
  for (const auto& e : nn::activation_table) {
    CHECK(nn::find_activation(e.name) == e.value);
    CHECK(nn::activation_from_name(e.name) == e.value);
    CHECK(nn::find_activation(nn::activation_name(e.value)) == e.value);
    CHECK(nn::activation_names().find(std::string(e.name)) != std::string::npos);
  }
  CHECK(nn::activation_from_name("swish") == nn::activation::silu);
  CHECK(nn::activation_name(nn::activation::silu) == "silu");
  CHECK(nn::activation_names() == "relu, gelu, gelu_new, quick_gelu, silu, swish");
  CHECK_FALSE(nn::find_activation("tanh").has_value());
  CHECK_FALSE(nn::find_activation("GELU").has_value());
  CHECK_THROWS_WITH(nn::activation_from_name("tanh"),
                    "haliax::nn: unknown activation 'tanh' (valid: relu, gelu, gelu_new, quick_gelu, silu, swish)");
}

TEST_CASE("Stacked: stacked parameters, names, fold == manual loop, gradients identical for every policy") {
  std::vector<block<>> layers;
  for (unsigned i = 0; i < 5; ++i) layers.push_back(make_block(30 + 10 * i));
  using stack_t = nn::Stacked<Layers, block>;
  auto st = stack_t::from_layers(layers);
  CHECK(st.num_layers() == 5);
  CHECK(st.stacked.mlp.c_fc.weight.shape_string() == "{layers=5, embed=4, mlp=6}");
  auto names = hax::tree::leaf_names(st);
  CHECK(names.front() == "stacked.ln.weight");
  CHECK(names.back() == "stacked.mlp.c_proj.bias");

  auto x = rnd<double>(12, 3 * Batch, 4 * Embed);
  auto step = [](const block<>& layer, const named_array<double, axes<Batch, Embed>>& h, std::int64_t) {
    return layer(h);
  };
  auto manual = x;
  for (auto& l : layers) manual = l(manual);
  check_close(st.fold(x, step).to_host(), manual.to_host(), 1e-12, 1e-12);

  auto loss_for = [&](nn::checkpoint_policy p) {
    return [&, p](const stack_t& s) { return hax::sum(hax::square(s.fold(x, step, p))); };
  };
  auto [v0, g0] = hax::value_and_grad(loss_for(nn::checkpoint_policy::none))(st);
  for (auto p : {nn::checkpoint_policy::per_layer, nn::checkpoint_policy::nested}) {
    auto [v, g] = hax::value_and_grad(loss_for(p))(st);
    CHECK(v.item() == v0.item());
    hax::tree::zip_leaves(g, g0, [](const std::string& name, const auto& a, const auto& b) {
      CHECK_MESSAGE(a.to_host() == b.to_host(), name);
    });
  }
  // the stacked gradient equals the per-layer gradients stacked
  auto lg = hax::grad([&](const std::vector<block<>>& ls) {
    auto h = x;
    for (auto& l : ls) h = l(h);
    return hax::sum(hax::square(h));
  })(layers);
  auto stacked_lg = stack_t::from_layers(lg);
  hax::tree::zip_leaves(g0, stacked_lg, [](const std::string& name, const auto& a, const auto& b) {
    check_close(a.to_host(), b.to_host(), 1e-12, 1e-12);
    (void)name;
  });
  gradcheck::check_gradient(loss_for(nn::checkpoint_policy::per_layer), st);
}
