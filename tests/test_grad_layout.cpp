// Gradients of the layout ops (ops/layout.hpp), checked against central finite differences in double
// (gradcheck.hpp), plus exact checks where the JAX behaviour is specific (parts of split that are not used).
#include "grad_layout_helpers.hpp"

// ---------------------------------------------------------------------------------------------------------
// rearrange / rename / flatten / unflatten

TEST_CASE("grad of rearrange: full permutations and partial orders") {
  auto x = random_array<double>(20, 2 * X, 3 * Y, 4 * Z);
  gradcheck::check_output_gradient([](const auto& v) { return hax::rearrange<axes<Z, X, Y>>(v); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::rearrange<axes<Y, Z, X>>(v); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::rearrange(v, Z, ellipsis); }, x);
  // unchanged order: the same handle comes back and still carries the gradient
  gradcheck::check_output_gradient([](const auto& v) { return hax::rearrange<axes<X, ellipsis>>(v) * v; }, x);
}

TEST_CASE("grad of rename: one and several (simultaneous) renames share the buffer") {
  auto x = random_array<double>(21, 2 * X, 3 * Y);
  auto w = random_array<double>(22, 2 * X, 3 * Z);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::rename(v, Y, Z) * w; }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::rename(v, X, Y, Y, X); }, x);
  // a renamed view used with its source
  auto sq = random_array<double>(23, 3 * X, 3 * Y);
  gradcheck::check_output_gradient(
      [](const auto& v) { return v * hax::rearrange<axes<X, Y>>(hax::rename(v, X, Y, Y, X)); }, sq);
}

TEST_CASE("grad of flatten_axes and unflatten_axis") {
  auto x = random_array<double>(24, 2 * Batch, 3 * Head, 4 * Pos);
  // adjacent and in order: a view
  gradcheck::check_output_gradient([](const auto& v) { return hax::flatten_axes<axes<Head, Pos>>(v, Flat); }, x);
  // not adjacent, in another order: permuted
  gradcheck::check_output_gradient([](const auto& v) { return hax::flatten_axes<axes<Pos, Batch>>(v, Flat); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::flatten_axes(v, axes<Head, Batch>{}, Flat); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::flatten_axes<axes<Batch, Pos>>(v, 8 * Flat); }, x);
  auto e = random_array<double>(25, 2 * Batch, 12 * Embed);
  gradcheck::check_output_gradient([](const auto& v) { return hax::unflatten_axis(v, Embed, 3 * Head, 4 * Pos); }, e);
  // a round trip through both, with the view multiplied by its source
  gradcheck::check_output_gradient(
      [](const auto& v) {
        return hax::flatten_axes<axes<Head, Pos>>(hax::unflatten_axis(v, Embed, 3 * Head, 4 * Pos), Embed) * v;
      },
      e);
}

// ---------------------------------------------------------------------------------------------------------
// split / unbind

TEST_CASE("grad of split into new axes: all parts, and only some") {
  auto x = random_array<double>(30, 2 * Pos, 8 * Embed, 3 * Batch);
  auto wa = random_array<double>(31, 2 * Pos, 3 * A, 3 * Batch);
  auto wc = random_array<double>(32, 2 * Pos, 4 * C, 3 * Batch);
  gradcheck::check_gradient(
      [&](const auto& v) {
        auto [a, b, c] = hax::split(v, Embed, 3 * A, 1 * B, 4 * C);
        return hax::sum(a * wa) + hax::sum(b * b) + hax::sum(c * wc);
      },
      x);
  // only the last piece is used: the others get zeros
  gradcheck::check_output_gradient(
      [](const auto& v) {
        [[maybe_unused]] auto [a, b, c] = hax::split(v, Embed, 3 * A, 1 * B, 4 * C);
        return c;
      },
      x);
  auto g = hax::grad([&](const auto& v) {
    [[maybe_unused]] auto [a, b, c] = hax::split(v, Embed, 3 * A, 1 * B, 4 * C);
    return hax::sum(c * wc);
  })(x);
  auto hg = g.to_host();
  auto hw = wc.to_host();
  for (std::int64_t p = 0; p < 2; ++p)
    for (std::int64_t e = 0; e < 8; ++e)
      for (std::int64_t bt = 0; bt < 3; ++bt) {
        double want = e < 4 ? 0.0 : hw[static_cast<std::size_t>((p * 4 + (e - 4)) * 3 + bt)];
        CHECK(hg[static_cast<std::size_t>((p * 8 + e) * 3 + bt)] == want);
      }
  // along the leading axis (the pieces are views of x)
  auto y = random_array<double>(33, 5 * X, 3 * Y);
  gradcheck::check_output_gradient(
      [](const auto& v) {
        [[maybe_unused]] auto [a, b] = hax::split(v, X, 2 * A, 3 * B);
        return hax::rename(b, B, A) * 2.0;
      },
      y);
  // no piece used: a zero gradient
  auto z = hax::grad([](const auto& v) {
    [[maybe_unused]] auto [a, b] = hax::split(v, X, 2 * A, 3 * B);
    return hax::sum(v);
  })(y);
  for (double e : z.to_host()) CHECK(e == 1.0);
}

TEST_CASE("grad of split by sizes keeps the axis name") {
  auto x = random_array<double>(34, 3 * Batch, 9 * Embed);
  gradcheck::check_gradient(
      [](const auto& v) {
        auto parts = hax::split(v, Embed, {4, 0, 2, 3});
        return hax::sum(parts[0] * parts[0]) + hax::sum(parts[3] * parts[3] * parts[3]);
      },
      x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::split(v, Batch, {1, 2})[1]; }, x);
}

TEST_CASE("grad of unbind along a middle and the leading axis") {
  auto x = random_array<double>(35, 2 * X, 4 * Y, 3 * Z);
  gradcheck::check_gradient(
      [](const auto& v) {
        auto ys = hax::unbind(v, Y);
        return hax::sum(ys[0] * ys[3]) + hax::sum(ys[3]);  // y = 1, 2 unused; y = 3 used twice
      },
      x);
  gradcheck::check_gradient(
      [](const auto& v) {
        auto xs = hax::unbind(v, X);
        return hax::sum(xs[1] * xs[1] * xs[0]);
      },
      x);
  // layers stacked on the leading axis, unbound and applied in turn (the scan-over-layers pattern)
  auto w = random_array<double>(36, 3 * Layers, 4 * Embed, 4 * Mlp);
  auto h0 = random_array<double>(37, 2 * Batch, 4 * Embed);
  gradcheck::check_gradient(
      [&](const auto& ws) {
        auto layers = hax::unbind(ws, Layers);
        auto h = h0;
        for (const auto& l : layers) h = hax::rename(hax::dot(h, l, Embed), Mlp, Embed);
        return hax::sum(h * h);
      },
      w);
}

// ---------------------------------------------------------------------------------------------------------
// concatenate / stack / roll

TEST_CASE("grad of concatenate: operands with different axis orders, and a vector") {
  auto a = random_array<double>(40, 2 * Batch, 3 * Pos, 2 * Embed);
  auto b = random_array<double>(41, 2 * Embed, 2 * Pos, 2 * Batch);
  auto c = random_array<double>(42, 1 * Pos, 2 * Batch, 2 * Embed);
  gradcheck::check_output_gradient(
      [](const auto& m) { return hax::concatenate(Pos, m.a, m.b, m.c); },
      triple_of<axes<Batch, Pos, Embed>, axes<Embed, Pos, Batch>, axes<Pos, Batch, Embed>>{a, b, c});
  // along the leading axis, with a constant operand and the same operand twice
  gradcheck::check_output_gradient([&](const auto& v) { return hax::concatenate(Batch, v, a, v); }, a);
  // a vector of arrays, some constant, one repeated
  auto x = random_array<double>(43, 2 * X, 3 * Y);
  auto k = random_array<double>(44, 2 * X, 4 * Y);
  gradcheck::check_output_gradient(
      [&](const auto& v) {
        std::vector<named_array<double, axes<X, Y>>> parts{v, k, hax::roll(v, 1, Y), v};
        return hax::concatenate(Y, parts);
      },
      x);
}

TEST_CASE("grad of stack: a vector and a pack with different orders") {
  auto x = random_array<double>(45, 2 * X, 3 * Y);
  auto k = random_array<double>(46, 2 * X, 3 * Y);
  gradcheck::check_output_gradient(
      [&](const auto& v) {
        std::vector<named_array<double, axes<X, Y>>> parts{v, k, v * v};
        return hax::stack(Layers, parts);
      },
      x);
  auto yt = random_array<double>(47, 3 * Y, 2 * X);
  gradcheck::check_output_gradient([](const auto& m) { return hax::stack(Layers, m.a, m.b, m.a); },
                                   make_pair_of(x, yt));
}

TEST_CASE("grad of roll, positive, negative and large shifts") {
  auto x = random_array<double>(48, 2 * X, 5 * Y, 3 * Z);
  for (std::int64_t shift : {0, 1, -2, 7, -11}) {
    gradcheck::check_output_gradient([&](const auto& v) { return hax::roll(v, shift, Y); }, x);
  }
  gradcheck::check_output_gradient([&](const auto& v) { return hax::roll(v, 1, X) * v; }, x);
}

// ---------------------------------------------------------------------------------------------------------
// index / slice
