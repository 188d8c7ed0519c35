// Gradients of dot (ops/dot.hpp): outer products, full contractions, repeated operands, and the backward dots
// of the usual layouts checked to need no copies. (The other dot gradient tests are in test_grad_dot.cpp.)
#include "grad_layout_helpers.hpp"

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
