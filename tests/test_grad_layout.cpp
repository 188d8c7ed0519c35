// Gradients of dot (ops/dot.hpp), the layout ops (ops/layout.hpp) and the indexing ops (ops/indexing.hpp),
// checked against central finite differences in double (gradcheck.hpp), plus exact checks where the JAX
// behaviour is specific (clipped / filled gather indices, parts of split that are not used).
#include <doctest/doctest.h>

#include <haliax/autodiff.hpp>
#include <haliax/haliax.hpp>
#include <vector>

#include "gradcheck.hpp"
#include "test_axes.hpp"

using namespace test_axes;
namespace hax = haliax;
using hax::axes;
using hax::ellipsis;
using hax::named_array;

namespace {

inline constexpr struct A final : hax::axis<"a"> {
} A;
inline constexpr struct B final : hax::axis<"b"> {
} B;
inline constexpr struct C final : hax::axis<"c"> {
} C;
inline constexpr struct Flat final : hax::axis<"flat"> {
} Flat;
inline constexpr struct Layers final : hax::axis<"layers"> {
} Layers;
inline constexpr struct K final : hax::axis<"k"> {
} K;

template <class AxA, class AxB>
struct pair_of {
  BOOST_HANA_DEFINE_STRUCT(pair_of, (named_array<double, AxA>, a), (named_array<double, AxB>, b));
};
template <class AxA, class AxB>
pair_of<AxA, AxB> make_pair_of(named_array<double, AxA> a, named_array<double, AxB> b) {
  return {std::move(a), std::move(b)};
}

template <class AxA, class AxB, class AxC>
struct triple_of {
  BOOST_HANA_DEFINE_STRUCT(triple_of, (named_array<double, AxA>, a), (named_array<double, AxB>, b),
                           (named_array<double, AxC>, c));
};

/// Random int32 indices in [lo, hi).
template <class... S>
auto random_indices(unsigned seed, std::int32_t lo, std::int32_t hi, S... s) {
  std::size_t n = (static_cast<std::size_t>(s.size) * ... * std::size_t{1});
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int32_t> dist(lo, hi - 1);
  std::vector<std::int32_t> v(n);
  for (auto& e : v) e = dist(gen);
  return hax::from_host<std::int32_t>(v, s...);
}

/// The type list of the axes named (what the dot layout computations work on).
template <auto... Ax>
using Ls = hax::detail::to_list<axes<Ax...>>;

}  // namespace

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

TEST_CASE("grad of index with an integer drops the axis") {
  auto x = random_array<double>(50, 2 * X, 4 * Y, 3 * Z);
  gradcheck::check_output_gradient([](const auto& v) { return hax::index(v, Y, 2); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::index(v, Z, -1); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::index(v, X, 1); }, x);  // a view
  gradcheck::check_output_gradient([](const auto& v) { return hax::take(v, Y, 0) * hax::index(v, Y, 0); }, x);
}

TEST_CASE("grad of index with a dslice: inside, and partly outside the axis") {
  auto x = random_array<double>(51, 2 * X, 6 * Y, 3 * Z);
  for (auto d : std::vector<hax::dslice>{{1, 3}, {0, 6}, {4, 4}, {-2, 3}, {-3, 10}, {7, 2}, {2, 0}})
    gradcheck::check_output_gradient([&](const auto& v) { return hax::index(v, Y, d); }, x);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::index(v, X, hax::dblock(1, 1)); }, x);
}

TEST_CASE("grad of slice: clamped starts, renamed axes") {
  auto x = random_array<double>(52, 3 * Batch, 8 * Pos, 2 * Embed);
  for (std::int64_t start : {0, 3, 5, 7, -4})
    gradcheck::check_output_gradient([&](const auto& v) { return hax::slice(v, Pos, start, 3); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::slice(v, Pos, KPos, 2, 4); }, x);
  gradcheck::check_output_gradient([](const auto& v) { return hax::slice(v, Batch, 1, 2 * KPos); }, x);
  // overlapping slices of the same array
  gradcheck::check_output_gradient([](const auto& v) { return hax::slice(v, Pos, 0, 5) * hax::slice(v, Pos, 3, 5); },
                                   x);
}

// ---------------------------------------------------------------------------------------------------------
// take

TEST_CASE("grad of take: embedding lookup with repeated indices accumulates") {
  auto table = random_array<double>(60, 5 * Vocab, 3 * Embed);
  auto ids = hax::from_host<std::int32_t>({1, 3, 1, 1, 0, 3, 4, 1}, 2 * Batch, 4 * Pos);
  gradcheck::check_output_gradient([&](const auto& t) { return hax::take(t, Vocab, ids); }, table);
  gradcheck::check_output_gradient([&](const auto& t) { return hax::index(t, Vocab, ids); }, table);
  // exact: the gradient of sum(take(t, ids) * w) is, for each vocab row, the sum of w over the ids naming it
  auto w = random_array<double>(61, 2 * Batch, 4 * Pos, 3 * Embed);
  auto g = hax::grad([&](const auto& t) { return hax::sum(hax::take(t, Vocab, ids) * w); })(table);
  auto hw = w.to_host();
  auto hi = ids.to_host();
  std::vector<double> want(15, 0.0);
  for (std::size_t i = 0; i < hi.size(); ++i)
    for (std::size_t e = 0; e < 3; ++e) want[static_cast<std::size_t>(hi[i]) * 3 + e] += hw[i * 3 + e];
  check_close(g.to_host(), want, 1e-14, 1e-14);
}

TEST_CASE("grad of take along a middle axis, over the taken axis itself, batched") {
  auto x = random_array<double>(62, 2 * X, 5 * Y, 3 * Z);
  auto idx = random_indices(63, 0, 5, 4 * Pos, 3 * K);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::take(v, Y, idx); }, x);
  auto perm = hax::from_host<std::int32_t>({4, 0, 3, 1, 2, 2, 0}, 7 * Y);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::take(v, Y, perm); }, x);
  // batched: the shared axes come before the taken one, in another order in the index
  auto logits = random_array<double>(64, 2 * Batch, 3 * Pos, 6 * Vocab);
  auto targets = random_indices(65, 0, 6, 3 * Pos, 2 * Batch);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::take(v, Vocab, targets); }, logits);
  // a shared axis plus fresh ones
  auto e = random_array<double>(66, 2 * Batch, 6 * Vocab, 3 * Embed);
  auto bi = random_indices(67, 0, 6, 2 * Batch, 4 * K);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::take(v, Vocab, bi); }, e);
  // shared axes after the taken one: the index varies along x's contiguous dims
  auto t = random_array<double>(68, 6 * Vocab, 2 * Batch, 3 * Pos);
  auto ti = random_indices(69, 0, 6, 3 * Pos, 2 * K, 2 * Batch);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::take(v, Vocab, ti); }, t);
  // and a rank-0 index
  auto s = hax::from_host<std::int32_t>({2}, 1 * K);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::take(v, Vocab, hax::index(s, K, 0)); }, t);
}

TEST_CASE("grad of take: clipped indices accumulate into the clamped position, filled ones are dropped") {
  auto x = random_array<double>(70, 4 * Vocab, 2 * Embed);
  auto idx = hax::from_host<std::int32_t>({-3, 0, 3, 4, 100, 2}, 6 * Pos);
  auto w = random_array<double>(71, 6 * Pos, 2 * Embed);
  auto hw = w.to_host();
  auto row = [&](std::size_t p, std::size_t e) { return hw[p * 2 + e]; };
  auto gc = hax::grad([&](const auto& v) { return hax::sum(hax::take(v, Vocab, idx) * w); })(x).to_host();
  auto gf =
      hax::grad([&](const auto& v) { return hax::sum(hax::take(v, Vocab, idx, hax::gather_mode::fill, -1.0) * w); })(x)
          .to_host();
  for (std::size_t e = 0; e < 2; ++e) {
    CHECK(gc[0 * 2 + e] == doctest::Approx(row(0, e) + row(1, e)).epsilon(1e-14));
    CHECK(gc[1 * 2 + e] == 0.0);
    CHECK(gc[2 * 2 + e] == doctest::Approx(row(5, e)).epsilon(1e-14));
    CHECK(gc[3 * 2 + e] == doctest::Approx(row(2, e) + row(3, e) + row(4, e)).epsilon(1e-14));
    CHECK(gf[0 * 2 + e] == doctest::Approx(row(1, e)).epsilon(1e-14));
    CHECK(gf[1 * 2 + e] == 0.0);
    CHECK(gf[2 * 2 + e] == doctest::Approx(row(5, e)).epsilon(1e-14));
    CHECK(gf[3 * 2 + e] == doctest::Approx(row(2, e)).epsilon(1e-14));
  }
  gradcheck::check_output_gradient([&](const auto& v) { return hax::take(v, Vocab, idx); }, x);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::take(v, Vocab, idx, hax::gather_mode::fill); }, x);
  // batched, with out-of-range indices along the contiguous dims
  auto t = random_array<double>(72, 5 * Vocab, 3 * Batch);
  auto ti = random_indices(73, -2, 8, 3 * Batch, 4 * K);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::take(v, Vocab, ti); }, t);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::take(v, Vocab, ti, hax::gather_mode::fill); }, t);
}

TEST_CASE("grad of take is repeatable and independent of the haliax thread count") {
  auto table = random_array<double>(74, 50 * Vocab, 300 * Embed);
  auto ids = random_indices(75, 0, 50, 8 * Batch, 64 * Pos);  // many repeats per row
  auto w = random_array<double>(76, 8 * Batch, 64 * Pos, 300 * Embed);
  auto f = [&](const auto& t) { return hax::sum(hax::take(t, Vocab, ids) * w); };
  const int saved = hax::num_threads();
  auto g1 = hax::grad(f)(table).to_host();
  hax::set_num_threads(1);
  auto g2 = hax::grad(f)(table).to_host();
  hax::set_num_threads(saved);
  auto g3 = hax::grad(f)(table).to_host();
  CHECK(g1 == g2);
  CHECK(g1 == g3);
}

// ---------------------------------------------------------------------------------------------------------
// updated_slice

TEST_CASE("grad of updated_slice along one axis: x outside the region, the update inside") {
  auto x = random_array<double>(80, 3 * Batch, 7 * Pos, 2 * Embed);
  auto u = random_array<double>(81, 2 * Embed, 3 * Pos, 3 * Batch);  // another order
  for (std::int64_t start : {0, 2, 4, 6, -1}) {
    gradcheck::check_output_gradient([&](const auto& m) { return hax::updated_slice(m.a, Pos, start, m.b); },
                                     make_pair_of(x, u));
  }
  // only one side tracked
  gradcheck::check_output_gradient([&](const auto& v) { return hax::updated_slice(v, Pos, 1, u); }, x);
  gradcheck::check_output_gradient([&](const auto& v) { return hax::updated_slice(x, Pos, 1, v); }, u);
}

TEST_CASE("grad of updated_slice on several axes, with an update lacking axes") {
  auto cache = random_array<double>(82, 3 * Layers, 4 * Pos, 2 * Head, 3 * Embed);
  auto kv = random_array<double>(83, 3 * Embed, 2 * Head);
  gradcheck::check_output_gradient(
      [](const auto& m) { return hax::updated_slice(m.a, hax::starts(Layers, 2, Pos, 1), m.b); },
      make_pair_of(cache, kv));
  auto blk = random_array<double>(84, 2 * Pos, 2 * Embed, 3 * Layers, 1 * Head);
  gradcheck::check_output_gradient(
      [](const auto& m) { return hax::updated_slice(m.a, hax::starts(Embed, 1, Pos, 3, Head, 1), m.b); },
      make_pair_of(cache, blk));
  // the update used elsewhere too, and x updated twice
  gradcheck::check_output_gradient(
      [](const auto& m) {
        auto once = hax::updated_slice(m.a, hax::starts(Layers, 0, Pos, 0), m.b);
        return hax::updated_slice(once, hax::starts(Layers, 1, Pos, 2), m.b * m.b);
      },
      make_pair_of(cache, kv));
}

// ---------------------------------------------------------------------------------------------------------
// float and bf16 instantiations

TEST_CASE("float and bf16 gradients through the layout and indexing ops match double") {
  auto xd = random_array<double>(90, 4 * Vocab, 6 * Embed);
  auto ids = hax::from_host<std::int32_t>({3, 1, 3, 0, 2}, 5 * Pos);
  auto chain = [&](const auto& t) {
    using T = typename std::remove_cvref_t<decltype(t)>::value_type;
    auto e = hax::take(t, Vocab, ids);                 // {pos, embed}
    auto [a, b] = hax::split(e, Embed, 2 * A, 4 * B);  // views / copies
    auto c =
        hax::concatenate(Pos, hax::rename(a, A, Embed), hax::index(hax::rename(b, B, Embed), Embed, hax::dslice{1, 2}));
    auto s = hax::stack(Layers, c, hax::roll(c, 1, Pos));    // {layers, pos, embed}
    auto f = hax::flatten_axes<axes<Layers, Pos>>(s, Flat);  // {flat, embed}
    auto u = hax::updated_slice(f, Flat, 3, hax::slice(f, Flat, 0, 2));
    auto r = hax::rearrange<axes<Embed, Flat>>(u);
    return hax::sum(hax::dot(r, r, Flat) * hax::astype<T>(hax::ones<float>(2 * Embed)));
  };
  gradcheck::check_gradient(chain, xd);
  auto gd = hax::grad(chain)(xd).to_host();
  auto gf = hax::grad(chain)(hax::astype<float>(xd)).to_host();
  check_close(gf, gd, 1e-4, 1e-5);
  auto gb = hax::grad(chain)(hax::astype<hax::bf16>(xd)).to_host();
  std::vector<float> gbf(gb.begin(), gb.end());
  check_close(gbf, gd, 5e-2, 5e-2);
}
