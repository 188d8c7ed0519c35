// Tests for haliax/ops/layout.hpp against naive host references on random data. The references work by axis
// *name*: every output element is located by a map name -> index and read from the input the same way, so
// they share no index arithmetic with the kernels under test.
#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <string>

#include "host_tensor.hpp"
#include "test_axes.hpp"

using namespace test_axes;
namespace hax = haliax;
using hax::axes;
using hax::ellipsis;

namespace {

inline constexpr struct Flat final : hax::axis<"flat"> {
} Flat;
inline constexpr struct A final : hax::axis<"a"> {
} A;
inline constexpr struct B final : hax::axis<"b"> {
} B;
inline constexpr struct C final : hax::axis<"c"> {
} C;
inline constexpr struct One final : hax::axis<"one"> {
} One;
inline constexpr struct Layers final : hax::axis<"layers"> {
} Layers;


template <class Order, class T, class Axes>
void check_rearrange(const hax::named_array<T, Axes>& x) {
  auto r = hax::rearrange<Order>(x);
  static_assert(std::is_same_v<typename decltype(r)::axes_type, Order>);
  auto hx = host(x);
  check_against(r, [&](const index_map& idx) { return hx.at(idx); });
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Compile-time contracts: what must not compile.

using XYZ = hax::named_array<float, axes<X, Y, Z>>;
using XY = hax::named_array<float, axes<X, Y>>;
template <class T>
struct type_tag {};
// Whether the expression compiles, with `x` an XYZ array and `xy` an XY array (made dependent, so that a
// failed constraint is a `false`, not an error).
#define COMPILES(...)                                         \
  ([]<class XYZ_, class XY_>(type_tag<XYZ_>, type_tag<XY_>) { \
    return requires(XYZ_ x, XY_ xy) { __VA_ARGS__; };         \
  }(type_tag<XYZ>{}, type_tag<XY>{}))
template <class Order>
concept can_rearrange = requires(XYZ x) {
  hax::rearrange<Order>(x);
};
static_assert(can_rearrange<axes<Z, X, Y>>);
static_assert(can_rearrange<axes<Z, ellipsis>>);
static_assert(can_rearrange<axes<ellipsis>>);
static_assert(!can_rearrange<axes<Z, X>>, "not a permutation: missing an axis");
static_assert(!can_rearrange<axes<Z, X, Y, W>>, "not a permutation: an extra axis");
static_assert(!can_rearrange<axes<W, ellipsis>>, "partial order naming an axis the array lacks");
// An order that lists an axis (or the ellipsis) twice is not even an axis list: `axes<...>` requires distinct names.
template <auto... A>
concept axes_formable = requires {
  typename axes<A...>;
};
static_assert(!axes_formable<X, ellipsis, X>, "an axis listed twice");
static_assert(!axes_formable<X, ellipsis, Y, ellipsis>, "two ellipses");
static_assert(!COMPILES(hax::rearrange(x, Y, X)));
static_assert(COMPILES(hax::rearrange(x, Y, X, Z)));

static_assert(COMPILES(hax::rename(x, X, W)));
static_assert(!COMPILES(hax::rename(x, X, Y)), "rename to an existing axis");
static_assert(!COMPILES(hax::rename(x, W, A)), "rename of a missing axis");
static_assert(COMPILES(hax::rename(x, X, Y, Y, X)), "a simultaneous swap is a valid renaming");
static_assert(!COMPILES(hax::rename(x, X, W, Y, W)), "two axes renamed to the same name");
static_assert(!COMPILES(hax::rename(x, X, W, Y)), "an odd number of rename arguments");

static_assert(COMPILES(hax::flatten_axes<axes<X, Z>>(x, Flat)));
static_assert(COMPILES(hax::flatten_axes<axes<X, Z>>(x, X)), "the new axis may reuse a merged name");
static_assert(!COMPILES(hax::flatten_axes<axes<X, Z>>(x, Y)), "new axis collides with a kept axis");
static_assert(!COMPILES(hax::flatten_axes<axes<X, W>>(x, Flat)), "flattening a missing axis");
static_assert(!COMPILES(hax::flatten_axes<axes<>>(x, Flat)), "flattening nothing");
static_assert(!COMPILES(hax::unflatten_axis(x, W, 2 * A, 3 * B)), "unflattening a missing axis");
static_assert(!COMPILES(hax::unflatten_axis(x, X, 2 * Y, 3 * B)), "new axis collides with a kept one");
static_assert(!COMPILES(hax::unflatten_axis(x, X, 2 * A, 3 * A)), "a new axis twice");

static_assert(!COMPILES(hax::split(x, W, 2 * A, 3 * B)), "splitting a missing axis");
static_assert(!COMPILES(hax::split(x, X, 2 * A, 3 * Y)), "a piece named like another axis");
static_assert(!COMPILES(hax::unbind(x, W)));
static_assert(!COMPILES(hax::roll(x, 1, W)));
static_assert(!COMPILES(hax::concatenate(X, x, xy)), "concatenating arrays with different axis sets");
static_assert(!COMPILES(hax::concatenate(W, x, x)), "concatenating along a missing axis");
static_assert(!COMPILES(hax::stack(X, x, x)), "stacking along an existing axis");
static_assert(!COMPILES(hax::stack(W, x, xy)));

// ---------------------------------------------------------------------------------------------------------
// rearrange

TEST_CASE("rearrange: every permutation of a rank-3 array") {
  auto x = random_array(1, 2 * X, 3 * Y, 5 * Z);
  check_rearrange<axes<X, Y, Z>>(x);
  check_rearrange<axes<X, Z, Y>>(x);
  check_rearrange<axes<Y, X, Z>>(x);
  check_rearrange<axes<Y, Z, X>>(x);
  check_rearrange<axes<Z, X, Y>>(x);
  check_rearrange<axes<Z, Y, X>>(x);
}

TEST_CASE("rearrange: every permutation of a rank-4 array") {
  auto x = random_array(2, 2 * W, 3 * X, 4 * Y, 5 * Z);
#define P4(a, b, c, d) check_rearrange<axes<a, b, c, d>>(x);
  P4(W, X, Y, Z)
  P4(W, X, Z, Y) P4(W, Y, X, Z) P4(W, Y, Z, X) P4(W, Z, X, Y) P4(W, Z, Y, X) P4(X, W, Y, Z) P4(X, W, Z, Y)
      P4(X, Y, W, Z) P4(X, Y, Z, W) P4(X, Z, W, Y) P4(X, Z, Y, W) P4(Y, W, X, Z) P4(Y, W, Z, X) P4(Y, X, W, Z)
          P4(Y, X, Z, W) P4(Y, Z, W, X) P4(Y, Z, X, W) P4(Z, W, X, Y) P4(Z, W, Y, X) P4(Z, X, W, Y) P4(Z, X, Y, W)
              P4(Z, Y, W, X) P4(Z, Y, X, W)
#undef P4
}

TEST_CASE("rearrange: large transposes") {
  auto x = random_array(3, 37 * X, 4100 * Y);  // inner extent above the 4096 chunk of the loop engine
  check_rearrange<axes<Y, X>>(x);
  auto y = random_array(4, 3 * Batch, 67 * Pos, 129 * Embed);
  check_rearrange<axes<Embed, Batch, Pos>>(y);
  auto z = random_array(5, 9 * W, 10 * X, 11 * Y, 12 * Z);  // every extent large enough for the tiled path
  check_rearrange<axes<Z, Y, X, W>>(z);
  check_rearrange<axes<X, Z, W, Y>>(z);
  check_rearrange<axes<Z, W, X, Y>>(z);
  check_rearrange<axes<W, Z, Y, X>>(z);
}

TEST_CASE("rearrange: partial orders with an ellipsis keep the rest in order") {
  auto x = random_array(5, 2 * Pos, 3 * Embed, 4 * Head, 5 * Batch);
  auto a = hax::rearrange<axes<Batch, ellipsis, Embed>>(x);
  static_assert(std::is_same_v<decltype(a), hax::named_array<float, axes<Batch, Pos, Head, Embed>>>);
  check_rearrange<axes<Batch, Pos, Head, Embed>>(x);
  auto b = hax::rearrange<axes<ellipsis, Pos>>(x);
  static_assert(std::is_same_v<decltype(b)::axes_type, axes<Embed, Head, Batch, Pos>>);
  auto c = hax::rearrange<axes<Head, Batch, ellipsis>>(x);
  static_assert(std::is_same_v<decltype(c)::axes_type, axes<Head, Batch, Pos, Embed>>);
  auto hx = host(x);
  auto same = [&](const index_map& idx) { return hx.at(idx); };
  check_against(a, same);
  check_against(b, same);
  check_against(c, same);
  // The value forms.
  auto d = hax::rearrange(x, Batch, ellipsis, Embed);
  static_assert(std::is_same_v<decltype(d), decltype(a)>);
  check_against(d, same);
  auto e = hax::rearrange(x, axes<Embed, ellipsis>{});
  static_assert(std::is_same_v<decltype(e)::axes_type, axes<Embed, Pos, Head, Batch>>);
  check_against(e, same);
}

TEST_CASE("rearrange: an unchanged order returns the same buffer") {
  auto x = random_array(6, 2 * X, 3 * Y);
  CHECK(hax::rearrange<axes<X, Y>>(x).data() == x.data());
  CHECK(hax::rearrange<axes<ellipsis>>(x).data() == x.data());
  CHECK(hax::rearrange<axes<X, ellipsis>>(x).data() == x.data());
  CHECK(hax::rearrange<axes<Y, X>>(x).data() != x.data());
}

TEST_CASE("rearrange: other element types and rank 0/1") {
  std::vector<std::int32_t> iv(24);
  for (int i = 0; i < 24; ++i) iv[i] = i * 7 - 11;
  auto xi = hax::from_host<std::int32_t>(iv, 2 * X, 3 * Y, 4 * Z);
  check_rearrange<axes<Z, X, Y>>(xi);
  std::vector<bool> bv(24);
  for (int i = 0; i < 24; ++i) bv[i] = (i * 5) % 3 == 0;
  auto xb = hax::from_host(bv, 2 * X, 3 * Y, 4 * Z);
  check_rearrange<axes<Y, Z, X>>(xb);
  auto xh = hax::astype<hax::bf16>(random_array(7, 3 * X, 5 * Y));
  check_rearrange<axes<Y, X>>(xh);
  auto s = hax::scalar(3.5f);
  CHECK(hax::rearrange<axes<>>(s).item() == 3.5f);
  auto one = hax::from_host<float>({1.0f, 2.0f}, 1 * X, 2 * Y);
  CHECK(hax::rearrange<axes<Y, X>>(one).to_host() == std::vector<float>{1.0f, 2.0f});
  auto empty = hax::zeros<float>(0 * X, 3 * Y);
  CHECK(hax::rearrange<axes<Y, X>>(empty).sizes() == std::array<std::int64_t, 2>{3, 0});
}

// ---------------------------------------------------------------------------------------------------------
// rename

TEST_CASE("rename shares the buffer and relabels") {
  auto x = random_array(8, 2 * Batch, 3 * Pos, 4 * Embed);
  auto k = hax::rename(x, Pos, KPos);
  static_assert(std::is_same_v<decltype(k), hax::named_array<float, axes<Batch, KPos, Embed>>>);
  CHECK(k.data() == x.data());
  CHECK(k.shape_string() == "{batch=2, key_position=3, embed=4}");
  CHECK(k.to_host() == x.to_host());
  auto same = hax::rename(x, Pos, Pos);
  static_assert(std::is_same_v<decltype(same), decltype(x)>);
}

TEST_CASE("rename with several pairs is simultaneous") {
  auto x = random_array(9, 2 * X, 3 * Y, 4 * Z);
  auto s = hax::rename(x, X, Y, Y, X);
  static_assert(std::is_same_v<decltype(s)::axes_type, axes<Y, X, Z>>);
  CHECK(s.shape_string() == "{y=2, x=3, z=4}");
  auto t = hax::rename(x, X, A, Z, C);
  static_assert(std::is_same_v<decltype(t)::axes_type, axes<A, Y, C>>);
  CHECK(t.data() == x.data());
}

// ---------------------------------------------------------------------------------------------------------
// flatten_axes / unflatten_axis

TEST_CASE("flatten_axes of adjacent axes in order shares the buffer") {
  auto x = random_array(11, 2 * Batch, 3 * Head, 4 * Mlp);
  auto f = hax::flatten_axes<axes<Head, Mlp>>(x, Embed);
  static_assert(std::is_same_v<decltype(f)::axes_type, axes<Batch, Embed>>);
  CHECK(f.data() == x.data());
  CHECK(f.shape_string() == "{batch=2, embed=12}");
  CHECK(f.to_host() == x.to_host());
}

TEST_CASE("flatten_axes of non-adjacent axes in a different order") {
  auto x = random_array(12, 2 * X, 3 * Y, 4 * Z, 5 * W);
  auto hx = host(x);
  // Z and X merged: the new axis sits where X (the first of them in x's order) was; index = z * 2 + x.
  auto f = hax::flatten_axes<axes<Z, X>>(x, Flat);
  static_assert(std::is_same_v<decltype(f)::axes_type, axes<Flat, Y, W>>);
  CHECK(f.sizes() == std::array<std::int64_t, 3>{8, 3, 5});
  check_against(f, [&](const index_map& i) {
    auto fl = i.at("flat");
    return hx.at({{"x", fl % 2}, {"z", fl / 2}, {"y", i.at("y")}, {"w", i.at("w")}});
  });
  // Three axes, one in the middle kept.
  auto g = hax::flatten_axes(x, axes<Y, W, X>{}, Flat);
  static_assert(std::is_same_v<decltype(g)::axes_type, axes<Flat, Z>>);
  check_against(g, [&](const index_map& i) {
    auto fl = i.at("flat");
    return hx.at({{"y", fl / 10}, {"w", (fl / 2) % 5}, {"x", fl % 2}, {"z", i.at("z")}});
  });
  // The new axis takes the first old axis's place even when it is not the first listed.
  auto h = hax::flatten_axes<axes<W, Y>>(x, Flat);
  static_assert(std::is_same_v<decltype(h)::axes_type, axes<X, Flat, Z>>);
  check_against(h, [&](const index_map& i) {
    auto fl = i.at("flat");
    return hx.at({{"w", fl / 3}, {"y", fl % 3}, {"x", i.at("x")}, {"z", i.at("z")}});
  });
}

TEST_CASE("flatten_axes with a sized new axis checks the size") {
  auto x = random_array(13, 2 * X, 3 * Y, 4 * Z);
  CHECK(hax::flatten_axes<axes<Y, Z>>(x, 12 * Flat).sizes() == std::array<std::int64_t, 2>{2, 12});
  CHECK_THROWS_WITH_AS((hax::flatten_axes<axes<Y, Z>>(x, 10 * Flat)),
                       doctest::Contains("'flat' was given size 10 but the flattened axes of {x=2, y=3, z=4} hold 12"),
                       hax::shape_error);
}

TEST_CASE("unflatten_axis splits in place without copying") {
  auto x = random_array(14, 2 * Batch, 12 * Embed, 3 * Pos);
  auto u = hax::unflatten_axis(x, Embed, 4 * Head, 3 * Mlp);
  static_assert(std::is_same_v<decltype(u)::axes_type, axes<Batch, Head, Mlp, Pos>>);
  CHECK(u.data() == x.data());
  auto hx = host(x);
  check_against(u, [&](const index_map& i) {
    return hx.at({{"batch", i.at("batch")}, {"embed", i.at("head") * 3 + i.at("mlp")}, {"position", i.at("position")}});
  });
  // Round trip.
  auto back = hax::flatten_axes<axes<Head, Mlp>>(u, Embed);
  static_assert(std::is_same_v<decltype(back), decltype(x)>);
  CHECK(back.to_host() == x.to_host());
  CHECK_THROWS_WITH_AS(hax::unflatten_axis(x, Embed, 5 * Head, 3 * Mlp),
                       doctest::Contains("axis 'embed' of {batch=2, embed=12, position=3} has size 12 but "
                                         "{head=5, mlp=3} hold 15"),
                       hax::shape_error);
}

TEST_CASE("unflatten_axis with no new axes drops a size-1 axis") {
  auto x = random_array(15, 3 * X, 1 * One, 2 * Y);
  auto s = hax::unflatten_axis(x, One);
  static_assert(std::is_same_v<decltype(s)::axes_type, axes<X, Y>>);
  CHECK(s.to_host() == x.to_host());
  auto y = random_array(16, 3 * X, 2 * One);
  CHECK_THROWS_AS(hax::unflatten_axis(y, One), hax::shape_error);
}

// ---------------------------------------------------------------------------------------------------------
// split / unbind

TEST_CASE("split into new sized axes along a middle axis") {
  auto x = random_array(17, 2 * Batch, 8 * Embed, 3 * Pos);
  auto [a, b, c] = hax::split(x, Embed, 3 * A, 1 * B, 4 * C);
  static_assert(std::is_same_v<decltype(a)::axes_type, axes<Batch, A, Pos>>);
  static_assert(std::is_same_v<decltype(c)::axes_type, axes<Batch, C, Pos>>);
  auto hx = host(x);
  auto from = [&](std::int64_t off, const char* name) {
    return [&hx, off, name](const index_map& i) {
      return hx.at({{"batch", i.at("batch")}, {"embed", off + i.at(name)}, {"position", i.at("position")}});
    };
  };
  check_against(a, from(0, "a"));
  check_against(b, from(3, "b"));
  check_against(c, from(4, "c"));
  CHECK_THROWS_WITH_AS(hax::split(x, Embed, 3 * A, 4 * B),
                       doctest::Contains("pieces {a=3, b=4} add up to 7 but axis 'embed' has size 8 in "
                                         "{batch=2, embed=8, position=3}"),
                       hax::shape_error);
}

TEST_CASE("split along the leading axis shares the buffer") {
  auto x = random_array(18, 5 * X, 3 * Y);
  auto [a, b] = hax::split(x, X, 2 * A, 3 * B);
  CHECK(a.data() == x.data());
  CHECK(b.data() == x.data() + 6);
  auto hx = x.to_host();
  CHECK(b.to_host() == std::vector<float>(hx.begin() + 6, hx.end()));
}

TEST_CASE("split by sizes keeps the axis name") {
  auto x = random_array(19, 3 * Pos, 9 * Embed);
  auto parts = hax::split(x, Embed, {3, 3, 3});
  REQUIRE(parts.size() == 3);
  auto hx = host(x);
  for (int p = 0; p < 3; ++p) {
    CHECK(parts[p].shape_string() == "{position=3, embed=3}");
    check_against(parts[p], [&](const index_map& i) {
      return hx.at({{"position", i.at("position")}, {"embed", 3 * p + i.at("embed")}});
    });
  }
  auto uneven = hax::split(x, Pos, {0, 2, 1});
  CHECK(uneven[0].element_count() == 0);
  CHECK(uneven[1].data() == x.data());
  CHECK(uneven[2].data() == x.data() + 18);
  CHECK_THROWS_WITH_AS(hax::split(x, Embed, {4, 4}),
                       doctest::Contains("sizes [4, 4] add up to 8 but axis 'embed' has size 9"), hax::shape_error);
}

TEST_CASE("unbind along a middle and the leading axis") {
  auto x = random_array(20, 2 * X, 3 * Y, 4 * Z);
  auto hx = host(x);
  auto ys = hax::unbind(x, Y);
  static_assert(std::is_same_v<decltype(ys)::value_type::axes_type, axes<X, Z>>);
  REQUIRE(ys.size() == 3);
  for (int y = 0; y < 3; ++y)
    check_against(ys[y], [&](const index_map& i) { return hx.at({{"x", i.at("x")}, {"y", y}, {"z", i.at("z")}}); });
  auto xs = hax::unbind(x, X);
  REQUIRE(xs.size() == 2);
  CHECK(xs[1].data() == x.data() + 12);
  check_against(xs[1], [&](const index_map& i) { return hx.at({{"x", 1}, {"y", i.at("y")}, {"z", i.at("z")}}); });
}

// ---------------------------------------------------------------------------------------------------------
// concatenate / stack

TEST_CASE("concatenate operands with different axis orders") {
  auto a = random_array(21, 2 * Batch, 3 * Pos, 4 * Embed);
  auto b = random_array(22, 4 * Embed, 5 * Pos, 2 * Batch);
  auto c = random_array(23, 1 * Pos, 2 * Batch, 4 * Embed);
  auto r = hax::concatenate(Pos, a, b, c);
  static_assert(std::is_same_v<decltype(r), decltype(a)>);
  CHECK(r.shape_string() == "{batch=2, position=9, embed=4}");
  auto ha = host(a), hb = host(b), hc = host(c);
  check_against(r, [&](const index_map& i) {
    auto p = i.at("position");
    index_map j = i;
    if (p < 3) return ha.at(j);
    if (p < 8) {
      j["position"] = p - 3;
      return hb.at(j);
    }
    j["position"] = p - 8;
    return hc.at(j);
  });
  // Along the leading and the last axis.
  auto r0 = hax::concatenate(Batch, a, hax::rearrange<axes<Pos, Batch, Embed>>(a));
  CHECK(r0.shape_string() == "{batch=4, position=3, embed=4}");
  check_against(r0, [&](const index_map& i) {
    index_map j = i;
    j["batch"] = i.at("batch") % 2;
    return ha.at(j);
  });
  auto r2 = hax::concatenate(Embed, a);
  CHECK(r2.to_host() == a.to_host());
}

TEST_CASE("concatenate a vector of arrays") {
  std::vector<hax::named_array<float, axes<X, Y>>> parts;
  for (int i = 0; i < 4; ++i) parts.push_back(random_array(30 + i, 3 * X, (i + 1) * Y));
  auto r = hax::concatenate(Y, parts);
  CHECK(r.shape_string() == "{x=3, y=10}");
  std::vector<host_tensor> hp;
  for (auto& p : parts) hp.push_back(host(p));
  check_against(r, [&](const index_map& i) {
    std::int64_t y = i.at("y");
    for (int p = 0;; ++p) {
      if (y < p + 1) return hp[p].at({{"x", i.at("x")}, {"y", y}});
      y -= p + 1;
    }
  });
  CHECK_THROWS_AS(hax::concatenate(Y, std::vector<hax::named_array<float, axes<X, Y>>>{}), hax::shape_error);
}

TEST_CASE("concatenate checks the other axes by name") {
  auto a = hax::zeros<float>(2 * X, 3 * Y);
  auto b = hax::zeros<float>(4 * Y, 5 * X);
  CHECK_THROWS_WITH_AS(hax::concatenate(X, a, b),
                       doctest::Contains("haliax::concatenate: axis 'y' has size 3 in {x=2, y=3} but 4 in {y=4, x=5}"),
                       hax::shape_error);
  std::vector<hax::named_array<float, axes<X, Y>>> v{a, hax::zeros<float>(3 * X, 4 * Y)};
  CHECK_THROWS_WITH_AS(hax::concatenate(Y, v),
                       doctest::Contains("axis 'x' has size 2 in {x=2, y=3} but 3 in {x=3, y=4}"), hax::shape_error);
}

TEST_CASE("stack a vector and a pack with different orders") {
  std::vector<hax::named_array<float, axes<X, Y>>> v;
  for (int i = 0; i < 3; ++i) v.push_back(random_array(40 + i, 2 * X, 5 * Y));
  auto s = hax::stack(Layers, v);
  static_assert(std::is_same_v<decltype(s)::axes_type, axes<Layers, X, Y>>);
  CHECK(s.shape_string() == "{layers=3, x=2, y=5}");
  std::vector<host_tensor> hv;
  for (auto& e : v) hv.push_back(host(e));
  check_against(s, [&](const index_map& i) { return hv[i.at("layers")].at(i); });

  auto a = random_array(50, 2 * X, 5 * Y);
  auto b = random_array(51, 5 * Y, 2 * X);
  auto t = hax::stack(Layers, a, b);
  static_assert(std::is_same_v<decltype(t)::axes_type, axes<Layers, X, Y>>);
  auto ha = host(a), hb = host(b);
  check_against(t, [&](const index_map& i) { return i.at("layers") == 0 ? ha.at(i) : hb.at(i); });

  auto c = hax::zeros<float>(5 * Y, 3 * X);
  CHECK_THROWS_WITH_AS(hax::stack(Layers, a, c),
                       doctest::Contains("haliax::stack: axis 'x' has size 2 in {x=2, y=5} but 3 in {y=5, x=3}"),
                       hax::shape_error);
  v.push_back(hax::zeros<float>(2 * X, 4 * Y));
  CHECK_THROWS_WITH_AS(hax::stack(Layers, v),
                       doctest::Contains("axis 'y' has size 5 in {x=2, y=5} but 4 in {x=2, y=4}"), hax::shape_error);
}

// ---------------------------------------------------------------------------------------------------------
// roll

TEST_CASE("roll follows numpy, including negative and large shifts") {
  auto x = hax::from_host<float>({0, 1, 2, 3, 4}, 5 * Pos);
  CHECK(hax::roll(x, 1, Pos).to_host() == std::vector<float>{4, 0, 1, 2, 3});
  CHECK(hax::roll(x, -1, Pos).to_host() == std::vector<float>{1, 2, 3, 4, 0});
  CHECK(hax::roll(x, 0, Pos).to_host() == x.to_host());
  CHECK(hax::roll(x, 12, Pos).to_host() == std::vector<float>{3, 4, 0, 1, 2});
  CHECK(hax::roll(x, -13, Pos).to_host() == std::vector<float>{3, 4, 0, 1, 2});

  auto y = random_array(60, 2 * X, 7 * Y, 3 * Z);
  auto hy = host(y);
  for (std::int64_t shift : {-9, -2, 3, 7}) {
    auto r = hax::roll(y, shift, Y);
    check_against(r, [&](const index_map& i) {
      index_map j = i;
      j["y"] = (((i.at("y") - shift) % 7) + 7) % 7;
      return hy.at(j);
    });
  }
  auto z = hax::roll(y, 1, Z);
  check_against(z, [&](const index_map& i) {
    index_map j = i;
    j["z"] = (i.at("z") + 2) % 3;
    return hy.at(j);
  });
}
