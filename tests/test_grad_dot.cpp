// Gradients of dot (ops/dot.hpp), checked against central finite differences in double (gradcheck.hpp),
// and the backward dots of the usual layouts checked to need no copies.
#include "grad_layout_helpers.hpp"

// ---------------------------------------------------------------------------------------------------------
// dot

TEST_CASE("grad of dot: matrix times matrix in all four layouts, both operands") {
  auto x = random_array<double>(1, 3 * Batch, 4 * Embed);
  auto xt = random_array<double>(2, 4 * Embed, 3 * Batch);
  auto w = random_array<double>(3, 4 * Embed, 5 * Mlp);
  auto wt = random_array<double>(4, 5 * Mlp, 4 * Embed);
  auto f = [](const auto& m) { return hax::dot(m.a, m.b, Embed); };
  gradcheck::check_output_gradient(f, make_pair_of(x, w));
  gradcheck::check_output_gradient(f, make_pair_of(xt, w));
  gradcheck::check_output_gradient(f, make_pair_of(x, wt));
  gradcheck::check_output_gradient(f, make_pair_of(xt, wt));
  // one operand constant
  gradcheck::check_output_gradient([&](const auto& v) { return hax::dot(v, w, Embed); }, x);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::dot(xt, v, Embed); }, wt);
}

TEST_CASE("grad of dot: batch axes, several contracted axes, output orders") {
  // q {batch, head, pos, embed} . k {kpos, batch, embed, head}: batch over {batch, head}, contract embed.
  auto q = random_array<double>(5, 2 * Batch, 3 * Head, 4 * Pos, 3 * Embed);
  auto k = random_array<double>(6, 5 * KPos, 2 * Batch, 3 * Embed, 3 * Head);
  gradcheck::check_output_gradient([](const auto& m) { return hax::dot(m.a, m.b, Embed); }, make_pair_of(q, k));
  // the same with an explicit output order and an ellipsis
  gradcheck::check_output_gradient([](const auto& m) { return hax::dot<axes<KPos, ellipsis, Head>>(m.a, m.b, Embed); },
                                   make_pair_of(q, k));
  // two contracted axes, in different orders in the operands, plus a batch axis, full output order
  auto a = random_array<double>(7, 3 * X, 2 * Batch, 4 * Y, 2 * Z);
  auto b = random_array<double>(8, 2 * Z, 3 * W, 2 * Batch, 3 * X);
  gradcheck::check_output_gradient([](const auto& m) { return hax::dot<axes<W, Batch, Y>>(m.a, m.b, X, Z); },
                                   make_pair_of(a, b));
  gradcheck::check_output_gradient([](const auto& m) { return hax::dot(m.a, m.b, Z, X); }, make_pair_of(a, b));
  // contracting a batch-like shared axis together with the others: every shared axis contracted
  auto c = random_array<double>(9, 2 * Batch, 3 * X);
  auto d = random_array<double>(10, 3 * X, 2 * Batch, 4 * Y);
  gradcheck::check_output_gradient([](const auto& m) { return hax::dot(m.a, m.b, X, Batch); }, make_pair_of(c, d));
}
