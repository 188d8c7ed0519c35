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

TEST_CASE("grad of dot: outer product, full contraction, repeated use") {
  auto a = random_array<double>(11, 3 * X);
  auto b = random_array<double>(12, 4 * Y);
  gradcheck::check_output_gradient([](const auto& m) { return hax::dot(m.a, m.b); }, make_pair_of(a, b));
  auto c = random_array<double>(13, 3 * X, 2 * Z);
  gradcheck::check_gradient([](const auto& m) { return hax::dot(m.a, m.b, X, Z); },
                            make_pair_of(c, random_array<double>(14, 2 * Z, 3 * X)));
  // the same array as both operands (x.x over X, batched over Y), and a result used twice
  auto x = random_array<double>(15, 3 * X, 4 * Y);
  gradcheck::check_output_gradient([](const auto& v) { return hax::dot(v, v, X); }, x);
  auto w = random_array<double>(16, 4 * Y, 2 * Z);
  gradcheck::check_gradient(
      [&](const auto& v) {
        auto h = hax::dot(v, w, Y);                          // {x, z}
        auto s = hax::dot(h, h, Z);                          // {x}, h used twice
        return hax::sum(hax::dot(s, hax::dot(v, v, Y), X));  // v used three times
      },
      x);
}

TEST_CASE("grad of dot: the backward dots of usual layouts need no operand or output copies") {
  using hax::detail::dot_copies;
  // x {batch, embed} . w {embed, mlp} -> g {batch, mlp}. da = g . w over mlp; dw = x . g over batch.
  static_assert(dot_copies<Ls<Batch, Embed>, Ls<Batch, Mlp>, Ls<Embed, Mlp>, Ls<Mlp>> == 0);
  static_assert(dot_copies<Ls<Embed, Mlp>, Ls<Batch, Embed>, Ls<Batch, Mlp>, Ls<Batch>> == 0);
  // transposed weights w {mlp, embed}: dw comes out as {mlp, embed} by swapping the operands
  static_assert(dot_copies<Ls<Mlp, Embed>, Ls<Batch, Mlp>, Ls<Batch, Embed>, Ls<Batch>> == 0);
  // batched q {batch, head, pos, embed} . k {batch, head, kpos, embed} -> s {batch, head, pos, kpos}
  using Q = Ls<Batch, Head, Pos, Embed>;
  using Kl = Ls<Batch, Head, KPos, Embed>;
  using S = Ls<Batch, Head, Pos, KPos>;
  static_assert(dot_copies<Q, S, Kl, Ls<KPos>> == 0);
  static_assert(dot_copies<Kl, S, Q, Ls<Pos>> == 0);
  // and the backward of p {batch, head, pos, kpos} . v {batch, head, kpos, embed} -> {batch, head, pos, embed}
  using V = Ls<Batch, Head, KPos, Embed>;
  using O = Ls<Batch, Head, Pos, Embed>;
  static_assert(dot_copies<S, O, V, Ls<Embed>> == 0);
  static_assert(dot_copies<V, S, O, Ls<Pos>> == 0);
  // numerically, in float, against double
  auto x = random_array<double>(17, 6 * Batch, 8 * Embed);
  auto w = random_array<double>(18, 8 * Embed, 5 * Mlp);
  auto gd = hax::grad([](const auto& m) {
    auto y = hax::dot(m.a, m.b, Embed);
    return hax::sum(y * y);
  })(make_pair_of(x, w));
  auto xf = hax::astype<float>(x);
  auto wf = hax::astype<float>(w);
  auto gf = hax::grad([&](const auto& v) {
    auto y = hax::dot(v, wf, Embed);
    return hax::sum(y * y);
  })(xf);
  check_close(gf.to_host(), gd.a.to_host(), 1e-4, 1e-5);
}
