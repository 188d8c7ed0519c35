// Golden gradients from upstream Haliax/JAX (tests/oracle/gen_grad_golden.py, float64): a small composite
// model (standardize, affine, dot, gelu, log_softmax, one_hot, tanh, max, exp, means) must give the same loss
// and the same gradient for every parameter.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <haliax/haliax.hpp>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "test_axes.hpp"

using namespace test_axes;
namespace hax = haliax;
using hax::axes;
using hax::named_array;

namespace {
std::map<std::string, std::vector<double>> read_golden() {
  std::ifstream in(std::string(HALIAX_GOLDEN_DIR) + "/grad_golden.txt");
  REQUIRE_MESSAGE(in.good(), "cannot open tests/golden/grad_golden.txt (run tests/oracle/gen_grad_golden.py)");
  std::map<std::string, std::vector<double>> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string name, colon;
    std::size_t n = 0;
    ls >> name >> n >> colon;
    std::vector<double> v(n);
    for (auto& x : v) ls >> x;
    out[name] = v;
  }
  return out;
}

/// The oracle's deterministic inputs: 0.8 * sin(0.7 * i + seed) in row-major order.
template <class... S>
auto det(double seed, S... s) {
  std::size_t n = (static_cast<std::size_t>(s.size) * ... * std::size_t{1});
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 0.8 * std::sin(0.7 * static_cast<double>(i) + seed);
  return hax::from_host<double>(v, s...);
}

struct params {
  BOOST_HANA_DEFINE_STRUCT(params, (named_array<double, axes<Embed>>, ln_w), (named_array<double, axes<Embed>>, ln_b),
                           (named_array<double, axes<Embed, Mlp>>, w1), (named_array<double, axes<Mlp>>, b1),
                           (named_array<double, axes<Mlp, Vocab>>, w2));
};
}  // namespace

TEST_CASE("loss and gradients of a composite model match upstream Haliax on JAX") {
  auto golden = read_golden();
  params p{hax::add(det(1.0, 4 * Embed), 1.0), det(2.0, 4 * Embed), det(3.0, 4 * Embed, 5 * Mlp), det(4.0, 5 * Mlp),
           det(5.0, 5 * Mlp, 6 * Vocab)};
  auto x = det(6.0, 3 * Batch, 2 * Pos, 4 * Embed);
  std::vector<std::int32_t> t(6);
  for (int i = 0; i < 6; ++i) t[i] = i % 6;
  auto targets = hax::from_host<std::int32_t>(t, 3 * Batch, 2 * Pos);

  auto loss_fn = [&](const params& q) {
    auto h = hax::nn::standardize(x, Embed, 1e-5) * q.ln_w + q.ln_b;
    auto h1 = hax::dot(h, q.w1, Embed) + q.b1;
    auto h2 = hax::nn::gelu(h1, true);
    auto logits = hax::dot(h2, q.w2, Mlp);
    auto logp = hax::nn::log_softmax(logits, Vocab);
    auto nll = -hax::sum(logp * hax::nn::one_hot<double>(targets, 6 * Vocab), Vocab);
    auto reg = hax::mean(hax::square(hax::tanh(h2))) * 0.1;
    auto big = hax::max(logits, Vocab);
    return hax::mean(nll) + reg + hax::sum(hax::exp(big - 1.0)) * 0.01;
  };
  auto [loss, g] = hax::value_and_grad(loss_fn)(p);
  CHECK(loss.item() == doctest::Approx(golden.at("loss")[0]).epsilon(1e-12));
  check_close(g.ln_w.to_host(), golden.at("grad.ln_w"), 1e-9, 1e-12);
  check_close(g.ln_b.to_host(), golden.at("grad.ln_b"), 1e-9, 1e-12);
  check_close(g.w1.to_host(), golden.at("grad.w1"), 1e-9, 1e-12);
  check_close(g.b1.to_host(), golden.at("grad.b1"), 1e-9, 1e-12);
  check_close(g.w2.to_host(), golden.at("grad.w2"), 1e-9, 1e-12);
}
