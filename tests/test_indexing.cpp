// Tests for haliax/ops/indexing.hpp against naive host references on random data. The references locate
// elements by axis *name* (a map name -> index), sharing no index arithmetic with the kernels under test.
#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <string>

#include "host_tensor.hpp"
#include "test_axes.hpp"

using namespace test_axes;
namespace hax = haliax;
using hax::axes;

namespace {

inline constexpr struct Layer final : hax::axis<"layer"> {
} Layer;
inline constexpr struct K final : hax::axis<"k"> {
} K;


/// Random int32 indices in [lo, hi).
template <class... S>
auto random_indices(unsigned seed, std::int32_t lo, std::int32_t hi, S... s) {
  std::size_t n = (static_cast<std::size_t>(s.size) * ... * std::size_t{1});
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int32_t> dist(lo, hi - 1);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = dist(gen);
  return hax::from_host<std::int32_t>(v, s...);
}

index_map with(index_map m, const std::string& name, std::int64_t v) {
  m[name] = v;
  return m;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Compile-time contracts: what must not compile.

using XYZ = hax::named_array<float, axes<X, Y, Z>>;
using IXW = hax::named_array<std::int32_t, axes<X, W>>;
template <class T>
struct type_tag {};
// Whether the expression compiles, with `x` an XYZ array and `ix` an int32 {x, w} array (made dependent, so
// that a failed constraint is a `false`, not an error).
#define COMPILES(...)                                           \
  ([]<class XYZ_, class IXW_>(type_tag<XYZ_>, type_tag<IXW_>) { \
    return requires(XYZ_ x, IXW_ ix) { __VA_ARGS__; };          \
  }(type_tag<XYZ>{}, type_tag<IXW>{}))

static_assert(COMPILES(hax::index(x, Y, 1)));
static_assert(!COMPILES(hax::index(x, W, 1)), "index on a missing axis");
static_assert(!COMPILES(hax::index(x, W, hax::dslice{0, 1})), "dslice on a missing axis");
static_assert(!COMPILES(hax::slice(x, W, 0, 1)), "slice on a missing axis");
static_assert(COMPILES(hax::slice(x, Y, W, 0, 1)));
static_assert(COMPILES(hax::slice(x, Y, Y, 0, 1)), "renaming to itself is allowed");
static_assert(!COMPILES(hax::slice(x, Y, Z, 0, 1)), "slice renamed to an existing axis");
static_assert(!COMPILES(hax::slice(x, Y, 0, 2 * Z)), "slice renamed to an existing axis (sized form)");
static_assert(COMPILES(hax::take(x, Y, ix)));
static_assert(!COMPILES(hax::take(x, W, ix)), "take along a missing axis");
static_assert(!COMPILES(hax::take(x, Y, x)), "float indices");
static_assert(COMPILES(hax::updated_slice(x, Y, 0, x)));
static_assert(!COMPILES(hax::updated_slice(x, W, 0, x)), "updated_slice at a missing axis");
static_assert(!COMPILES(hax::updated_slice(x, Y, 0, hax::named_array<float, axes<Y, W>>{})),
              "an update with an axis the array lacks");
static_assert(!COMPILES(hax::updated_slice(x, hax::starts(Y, 0, W, 1), x)), "starts naming a missing axis");
static_assert(!COMPILES(hax::starts(Y, x.rank, Y, 1)), "an axis twice in starts");
static_assert(COMPILES(hax::starts(Y, x.rank, Z, 1)));
static_assert(!COMPILES(hax::starts(Y, x.rank, Z)), "starts without a value");

// ---------------------------------------------------------------------------------------------------------
// index

TEST_CASE("index drops the axis, on every axis of a rank-3 array") {
  auto x = random_array(1, 3 * X, 4 * Y, 5 * Z);
  auto hx = host(x);
  for (std::int64_t i : {0, 2}) {
    auto a = hax::index(x, X, i);
    static_assert(std::is_same_v<decltype(a)::axes_type, axes<Y, Z>>);
    check_against(a, [&](const index_map& m) { return hx.at(with(m, "x", i)); });
    auto b = hax::index(x, Y, i);
    static_assert(std::is_same_v<decltype(b)::axes_type, axes<X, Z>>);
    check_against(b, [&](const index_map& m) { return hx.at(with(m, "y", i)); });
    auto c = hax::index(x, Z, i);
    static_assert(std::is_same_v<decltype(c)::axes_type, axes<X, Y>>);
    check_against(c, [&](const index_map& m) { return hx.at(with(m, "z", i)); });
  }
}

TEST_CASE("index: negative indices count from the end, and out of range throws naming the axis") {
  auto x = random_array(2, 3 * X, 4 * Y);
  auto hx = host(x);
  check_against(hax::index(x, Y, -1), [&](const index_map& m) { return hx.at(with(m, "y", 3)); });
  check_against(hax::index(x, Y, -4), [&](const index_map& m) { return hx.at(with(m, "y", 0)); });
  CHECK_THROWS_WITH_AS(hax::index(x, Y, 4),
                       doctest::Contains("haliax::index: index 4 is out of range for axis 'y' of size 4 in {x=3, y=4}"),
                       hax::shape_error);
  CHECK_THROWS_WITH_AS(hax::index(x, X, -4), doctest::Contains("index -4 is out of range for axis 'x' of size 3"),
                       hax::shape_error);
}

TEST_CASE("index on the leading axis shares the buffer, and down to rank 0") {
  auto x = random_array(3, 3 * Layer, 4 * Embed);
  auto l = hax::index(x, Layer, 2);
  CHECK(l.data() == x.data() + 8);
  auto e = hax::index(l, Embed, 1);
  static_assert(std::is_same_v<decltype(e)::axes_type, axes<>>);
  CHECK(e.item() == x.to_host()[9]);
  // Contiguous after size-1 leading axes too.
  auto y = random_array(4, 1 * X, 5 * Y, 2 * Z);
  CHECK(hax::index(y, Y, 3).data() == y.data() + 6);
  CHECK(hax::index(y, Z, 1).data() != y.data() + 1);
}

TEST_CASE("index with a dslice keeps the axis, and outside positions read zero") {
  auto x = random_array(5, 3 * X, 10 * Pos, 2 * Z);
  auto hx = host(x);
  auto in = hax::index(x, Pos, hax::dslice{4, 3});
  static_assert(std::is_same_v<decltype(in), decltype(x)>);
  CHECK(in.shape_string() == "{x=3, position=3, z=2}");
  check_against(in, [&](const index_map& m) { return hx.at(with(m, "position", 4 + m.at("position"))); });
  auto blk = hax::index(x, Pos, hax::dblock(1, 4));
  check_against(blk, [&](const index_map& m) { return hx.at(with(m, "position", 4 + m.at("position"))); });
  for (auto d : {hax::dslice{8, 5}, hax::dslice{-2, 4}, hax::dslice{-3, 16}, hax::dslice{12, 2}}) {
    auto r = hax::index(x, Pos, d);
    CHECK(r.size(Pos) == d.length);
    check_against(r, [&](const index_map& m) {
      auto p = d.start + m.at("position");
      return (p < 0 || p >= 10) ? 0.0 : hx.at(with(m, "position", p));
    });
  }
  CHECK_THROWS_AS(hax::index(x, Pos, hax::dslice{0, -1}), hax::shape_error);
}

// ---------------------------------------------------------------------------------------------------------
// slice

TEST_CASE("slice keeps the axis, clamps the start like lax.dynamic_slice") {
  auto x = random_array(6, 2 * Batch, 12 * Pos, 3 * Embed);
  auto hx = host(x);
  for (auto [start, len, eff] : std::vector<std::array<std::int64_t, 3>>{
           {0, 12, 0}, {3, 4, 3}, {10, 4, 8}, {-5, 3, 0}, {11, 0, 11}, {0, 1, 0}}) {
    auto s = hax::slice(x, Pos, start, len);
    CHECK(s.size(Pos) == len);
    // eff = eff: clang before 16 cannot capture a structured binding
    check_against(s, [&, eff = eff](const index_map& m) { return hx.at(with(m, "position", eff + m.at("position"))); });
  }
  CHECK_THROWS_WITH_AS(hax::slice(x, Pos, 0, 13),
                       doctest::Contains("length 13 does not fit axis 'position' of size 12 in "
                                         "{batch=2, position=12, embed=3}"),
                       hax::shape_error);
}

TEST_CASE("slice with a renamed axis") {
  auto x = random_array(7, 12 * Pos, 3 * Embed);
  auto hx = host(x);
  auto k = hax::slice(x, Pos, KPos, 2, 5);
  static_assert(std::is_same_v<decltype(k)::axes_type, axes<KPos, Embed>>);
  CHECK(k.data() == x.data() + 6);  // leading axis: a view
  check_against(k, [&](const index_map& m) {
    return hx.at({{"position", 2 + m.at("key_position")}, {"embed", m.at("embed")}});
  });
  auto k2 = hax::slice(x, Pos, 7, 5 * KPos);
  static_assert(std::is_same_v<decltype(k2), decltype(k)>);
  check_against(k2, [&](const index_map& m) {
    return hx.at({{"position", 7 + m.at("key_position")}, {"embed", m.at("embed")}});
  });
  auto e = hax::slice(x, Embed, Head, 1, 2);
  static_assert(std::is_same_v<decltype(e)::axes_type, axes<Pos, Head>>);
  check_against(e, [&](const index_map& m) {
    return hx.at({{"position", m.at("position")}, {"embed", 1 + m.at("head")}});
  });
}

// ---------------------------------------------------------------------------------------------------------
// take

TEST_CASE("take: embedding lookup with a 2-D index") {
  auto table = random_array(8, 11 * Vocab, 4 * Embed);
  auto ids = random_indices(9, 0, 11, 3 * Batch, 5 * Pos);
  auto e = hax::take(table, Vocab, ids);
  static_assert(std::is_same_v<decltype(e)::axes_type, axes<Batch, Pos, Embed>>);
  auto ht = host(table), hi = host(ids);
  check_against(e, [&](const index_map& m) {
    auto v = static_cast<std::int64_t>(hi.at(m));
    return ht.at({{"vocab", v}, {"embed", m.at("embed")}});
  });
  // Through `index` with an index array.
  CHECK(hax::index(table, Vocab, ids).to_host() == e.to_host());
}

TEST_CASE("take along a middle axis splices the index axes in place") {
  auto x = random_array(10, 2 * X, 7 * Y, 3 * Z);
  auto idx = random_indices(11, 0, 7, 4 * Pos, 5 * K);
  auto r = hax::take(x, Y, idx);
  static_assert(std::is_same_v<decltype(r)::axes_type, axes<X, Pos, K, Z>>);
  auto hx = host(x), hi = host(idx);
  check_against(r, [&](const index_map& m) {
    return hx.at({{"x", m.at("x")}, {"y", static_cast<std::int64_t>(hi.at(m))}, {"z", m.at("z")}});
  });
}

TEST_CASE("take: batched gather over axes shared with the index") {
  // Picking the target's logit per (batch, position): the shared axes are matched, Vocab disappears.
  auto logits = random_array(12, 2 * Batch, 3 * Pos, 9 * Vocab);
  auto targets = random_indices(13, 0, 9, 3 * Pos, 2 * Batch);  // different order on purpose
  auto p = hax::take(logits, Vocab, targets);
  static_assert(std::is_same_v<decltype(p)::axes_type, axes<Batch, Pos>>);
  auto hl = host(logits), ht = host(targets);
  check_against(p, [&](const index_map& m) { return hl.at(with(m, "vocab", static_cast<std::int64_t>(ht.at(m)))); });

  // A shared axis plus a fresh one: x {batch, vocab, embed}, idx {batch, k} -> {batch, k, embed}.
  auto x = random_array(14, 2 * Batch, 6 * Vocab, 3 * Embed);
  auto idx = random_indices(15, 0, 6, 2 * Batch, 4 * K);
  auto g = hax::take(x, Vocab, idx);
  static_assert(std::is_same_v<decltype(g)::axes_type, axes<Batch, K, Embed>>);
  auto hx = host(x), hi = host(idx);
  check_against(g, [&](const index_map& m) {
    return hx.at({{"batch", m.at("batch")}, {"vocab", static_cast<std::int64_t>(hi.at(m))}, {"embed", m.at("embed")}});
  });

  auto bad = random_indices(16, 0, 6, 3 * Batch, 4 * K);
  CHECK_THROWS_WITH_AS(hax::take(x, Vocab, bad),
                       doctest::Contains("haliax::take: axis 'batch' has size 2 in {batch=2, vocab=6, embed=3} but 3 "
                                         "in the indices {batch=3, k=4}"),
                       hax::shape_error);
}

TEST_CASE("take with an index over the taken axis itself permutes along it") {
  auto x = random_array(17, 5 * X, 3 * Y);
  auto perm = hax::from_host<std::int32_t>({4, 0, 3, 1, 2, 2}, 6 * X);
  auto r = hax::take(x, X, perm);
  static_assert(std::is_same_v<decltype(r)::axes_type, axes<X, Y>>);
  CHECK(r.shape_string() == "{x=6, y=3}");
  auto hx = host(x), hp = host(perm);
  check_against(r, [&](const index_map& m) { return hx.at(with(m, "x", static_cast<std::int64_t>(hp.at(m)))); });
}

TEST_CASE("take: out-of-range indices clamp by default, or read the fill value") {
  auto x = hax::from_host<float>({10, 11, 12, 13}, 4 * Vocab);
  auto idx = hax::from_host<std::int32_t>({-3, 0, 3, 4, 100}, 5 * Pos);
  CHECK(hax::take(x, Vocab, idx).to_host() == std::vector<float>{10, 10, 13, 13, 13});
  CHECK(hax::take(x, Vocab, idx, hax::gather_mode::fill, -1.0f).to_host() == std::vector<float>{-1, 10, 13, -1, -1});
  CHECK(hax::take(x, Vocab, idx, hax::gather_mode::fill).to_host() == std::vector<float>{0, 10, 13, 0, 0});
  // An integer index is `index`.
  CHECK(hax::take(x, Vocab, 2).item() == 12.0f);
  auto one = hax::from_host<std::int32_t>({2}, 1 * Pos);
  CHECK(hax::take(x, Vocab, one).to_host() == std::vector<float>{12});
}

TEST_CASE("take on int32 and bf16 data") {
  auto xi = hax::from_host<std::int32_t>({1, 2, 3, 4, 5, 6}, 3 * Vocab, 2 * Embed);
  auto idx = hax::from_host<std::int32_t>({2, 0}, 2 * Pos);
  CHECK(hax::take(xi, Vocab, idx).to_host() == std::vector<std::int32_t>{5, 6, 1, 2});
  auto xb = hax::astype<hax::bf16>(hax::from_host<float>({1.5f, 2.5f, 3.5f}, 3 * Vocab));
  auto r = hax::take(xb, Vocab, idx);
  auto h = r.to_host();
  CHECK(float(h[0]) == 3.5f);
  CHECK(float(h[1]) == 1.5f);
}

// ---------------------------------------------------------------------------------------------------------
// updated_slice

TEST_CASE("updated_slice along one axis, clamping the start like dynamic_update_slice") {
  auto x = random_array(18, 3 * Batch, 10 * Pos, 4 * Embed);
  auto u = random_array(19, 4 * Embed, 3 * Pos, 3 * Batch);  // a different order
  auto hx = host(x), hu = host(u);
  for (auto [start, eff] : std::vector<std::array<std::int64_t, 2>>{{0, 0}, {4, 4}, {7, 7}, {9, 7}, {-2, 0}}) {
    auto r = hax::updated_slice(x, Pos, start, u);
    static_assert(std::is_same_v<decltype(r), decltype(x)>);
    check_against(r, [&, eff = eff](const index_map& m) {  // eff = eff: clang before 16 cannot capture a binding
      auto p = m.at("position");
      return (p >= eff && p < eff + 3) ? hu.at(with(m, "position", p - eff)) : hx.at(m);
    });
  }
  CHECK(x.to_host() == hax::copy(x).to_host());  // the input is not modified
  auto big = hax::zeros<float>(3 * Batch, 11 * Pos, 4 * Embed);
  CHECK_THROWS_WITH_AS(hax::updated_slice(x, Pos, 0, big),
                       doctest::Contains("update {batch=3, position=11, embed=4} does not fit into "
                                         "{batch=3, position=10, embed=4}"),
                       hax::shape_error);
}

TEST_CASE("updated_slice on several axes, with an update lacking axes") {
  auto cache = random_array(20, 4 * Layer, 6 * Pos, 2 * Head, 3 * Embed);
  auto kv = random_array(21, 3 * Embed, 2 * Head);  // one (layer, position) entry
  auto r = hax::updated_slice(cache, hax::starts(Layer, 2, Pos, 5), kv);
  auto hc = host(cache), hk = host(kv);
  check_against(
      r, [&](const index_map& m) { return (m.at("layer") == 2 && m.at("position") == 5) ? hk.at(m) : hc.at(m); });
  // A block smaller on two axes.
  auto blk = random_array(22, 2 * Pos, 2 * Embed, 4 * Layer, 2 * Head);
  auto s = hax::updated_slice(cache, hax::starts(Embed, 1, Pos, 3), blk);
  auto hb = host(blk);
  check_against(s, [&](const index_map& m) {
    auto p = m.at("position"), e = m.at("embed");
    if (p >= 3 && p < 5 && e >= 1 && e < 3) return hb.at(with(with(m, "position", p - 3), "embed", e - 1));
    return hc.at(m);
  });
  // Axes not named start at 0 (and starts clamp per axis).
  auto z = hax::updated_slice(cache, hax::starts(Pos, 100), kv);
  check_against(
      z, [&](const index_map& m) { return (m.at("layer") == 0 && m.at("position") == 5) ? hk.at(m) : hc.at(m); });
}
