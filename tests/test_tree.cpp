// Tests for haliax/tree.hpp: reflected modules, dotted names, maps and zips.
#include <doctest/doctest.h>

#include <haliax/tree.hpp>

#include "test_axes.hpp"

using namespace test_axes;
namespace hax = haliax;
using hax::axes;
using hax::named_array;

namespace {
struct linear {
  BOOST_HANA_DEFINE_STRUCT(linear, (named_array<float, axes<Embed, Mlp>>, weight),
                           (std::optional<named_array<float, axes<Mlp>>>, bias));
};
struct block {
  BOOST_HANA_DEFINE_STRUCT(block, (linear, up), (named_array<float, axes<Embed>>, norm_weight), (int, layer_index));
};
struct model {
  BOOST_HANA_DEFINE_STRUCT(model, (named_array<float, axes<Vocab, Embed>>, wte), (std::vector<block>, h));
};

model make_model(bool with_bias) {
  model m;
  m.wte = random_array(1, 5 * Vocab, 4 * Embed);
  for (int i = 0; i < 2; ++i) {
    block b;
    b.up.weight = random_array(10 + i, 4 * Embed, 3 * Mlp);
    if (with_bias && i == 0) b.up.bias = hax::zeros<float>(3 * Mlp);
    b.norm_weight = hax::ones<float>(4 * Embed);
    b.layer_index = i;
    m.h.push_back(b);
  }
  return m;
}
}  // namespace

TEST_CASE("leaves are visited in declaration order with dotted names") {
  auto m = make_model(true);
  CHECK(hax::tree::leaf_names(m) == std::vector<std::string>{"wte", "h.0.up.weight", "h.0.up.bias", "h.0.norm_weight",
                                                             "h.1.up.weight", "h.1.norm_weight"});
  CHECK(hax::tree::parameter_count(m) == 5 * 4 + 2 * (4 * 3 + 4) + 3);
  std::vector<std::string> prefixed;
  hax::tree::for_each_leaf(
      m, [&](const std::string& name, const auto&) { prefixed.push_back(name); }, "model");
  CHECK(prefixed.front() == "model.wte");
  CHECK(prefixed.back() == "model.h.1.norm_weight");
}

TEST_CASE("map returns a module of the same type with every leaf transformed") {
  auto m = make_model(false);
  auto half = hax::tree::map(m, [](const std::string&, const auto& x) { return x * 0.5f; });
  static_assert(std::is_same_v<decltype(half), model>);
  auto a = m.h[1].up.weight.to_host(), b = half.h[1].up.weight.to_host();
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(b[i] == a[i] * 0.5f);
  CHECK(half.h[1].layer_index == 1);       // non-array fields are kept
  CHECK(m.h[1].up.weight.to_host() == a);  // the input is unchanged
}

TEST_CASE("zip_leaves pairs matching leaves and rejects different structures") {
  auto p = make_model(true);
  auto g = hax::tree::map(p, [](const std::string&, const auto& x) { return hax::ones_like(x); });
  std::int64_t total = 0;
  hax::tree::zip_leaves(p, g, [&](const std::string& name, const auto& a, const auto& b) {
    CHECK(a.sizes() == b.sizes());
    total += hax::sum(b).item();
  });
  CHECK(total == hax::tree::parameter_count(p));
  auto no_bias = make_model(false);
  CHECK_THROWS_WITH_AS(hax::tree::zip_leaves(p, no_bias, [](const std::string&, const auto&, const auto&) {}),
                       doctest::Contains("'h.0.up.bias' is present in one module but not the other"), hax::shape_error);
}
