// Gradients of the indexing ops (ops/indexing.hpp), checked against central finite differences in double
// (gradcheck.hpp), plus exact checks where the JAX behaviour is specific (clipped / filled gather indices).
#include <bit>
#include <random>

#include "grad_layout_helpers.hpp"

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

TEST_CASE("grad of take from a large table: each row's contributions added in token order, bitwise a serial loop") {
  // A table gather (an embedding) sorts the tokens by row (a stable radix sort: 70000 rows need three 8-bit
  // passes, 3000 tokens twelve 256-key chunks) and adds each row's gradient rows in token order; the result must
  // be bitwise the serial loop's, clipped indices going to the clamped row and filled ones nowhere.
  constexpr std::int32_t rows = 70000;
  constexpr std::size_t E = 5, P = 3000;
  auto table = random_array<float>(80, rows * Vocab, 5 * Embed);
  std::mt19937 gen(81);
  std::uniform_int_distribution<std::int32_t> pick(0, 40);
  std::vector<std::int32_t> ids(P);
  for (auto& id : ids) {
    const auto r = pick(gen);  // repeats, both ends of the table, out-of-range indices on both sides
    id = r < 10 ? r : r < 20 ? rows - 1 - r : r == 20 ? -5 : r == 21 ? rows + 7 : r * 1733 % rows;
  }
  auto idx = hax::from_host<std::int32_t>(ids, 3 * Batch, 1000 * Pos);
  auto w = random_array<float>(82, 3 * Batch, 1000 * Pos, 5 * Embed) * 100.0f;
  auto hw = w.to_host();
  for (const auto mode : {hax::gather_mode::clip, hax::gather_mode::fill}) {
    auto g = hax::grad([&](const auto& t) { return hax::sum(hax::take(t, Vocab, idx, mode) * w); })(table).to_host();
    std::vector<float> want(static_cast<std::size_t>(rows) * E, 0.0f);
    for (std::size_t f = 0; f < P; ++f) {
      std::int64_t j = ids[f];
      if (j < 0 || j >= rows) {
        if (mode == hax::gather_mode::fill) continue;
        j = j < 0 ? 0 : rows - 1;
      }
      for (std::size_t e = 0; e < E; ++e) want[static_cast<std::size_t>(j) * E + e] += hw[f * E + e];
    }
    REQUIRE(g.size() == want.size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < g.size(); ++i) differ += std::bit_cast<std::uint32_t>(g[i]) != std::bit_cast<std::uint32_t>(want[i]);
    CHECK(differ == 0);
  }
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
