// Tests for haliax/random.hpp: the named-array samplers equal jax.random (golden file from
// tests/oracle/gen_random_golden.py) bit for bit, in both threefry counter layouts.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <haliax/random.hpp>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "random_golden_reader.hpp"

namespace {

namespace hr = haliax::random;
namespace g = haliax_test_golden;

inline constexpr struct RX final : haliax::axis<"rx"> {} RX;
inline constexpr struct RY final : haliax::axis<"ry"> {} RY;
inline constexpr struct RZ final : haliax::axis<"rz"> {} RZ;

/// Calls f with the golden shape as sized axes (RX, RY, RZ in order); f returns a host vector.
template <class F>
auto with_shape(const std::vector<std::size_t>& s, F&& f) {
  switch (s.size()) {
    case 0: return f();
    case 1: return f(s[0] * RX);
    case 2: return f(s[0] * RX, s[1] * RY);
    case 3: return f(s[0] * RX, s[1] * RY, s[2] * RZ);
    default: throw std::runtime_error("rank > 3 in golden file");
  }
}

hr::key hkey(const g::record& r) {
  const auto d = g::key_of(r);
  return {d.k0, d.k1};
}

/// Sets the counter layout of a record for the scope of the object.
struct mode_scope {
  bool saved;
  explicit mode_scope(const g::record& r) : saved(hr::threefry_partitionable()) {
    hr::set_threefry_partitionable(r.at("mode") == "p");
  }
  ~mode_scope() { hr::set_threefry_partitionable(saved); }
};

template <class T>
std::vector<std::uint64_t> bit_patterns(const std::vector<T>& v) {
  std::vector<std::uint64_t> out;
  for (T x : v) {
    if constexpr (std::is_same_v<T, float>) out.push_back(haliax::detail::random_dists::bits_from_f32(x));
    else out.push_back(haliax::detail::random_dists::bits_from_f64(x));
  }
  return out;
}

std::vector<std::uint64_t> hex_values(const g::record& r) {
  std::vector<std::uint64_t> out;
  for (const auto& v : r.values) out.push_back(g::parse_hex(v));
  return out;
}

std::vector<std::int64_t> dec_values(const g::record& r) {
  std::vector<std::int64_t> out;
  for (const auto& v : r.values) out.push_back(g::parse_dec(v));
  return out;
}

template <class T>
std::vector<std::int64_t> widen(const std::vector<T>& v) {
  return std::vector<std::int64_t>(v.begin(), v.end());
}

}  // namespace

TEST_CASE("keys: make_key, split and fold_in equal jax.random") {
  hr::key k = hr::make_key(0);
  CHECK(k == hr::key{0u, 0u});
  for (auto* r : g::of("seed")) {
    INFO(r->text());
    const auto mode = r->at("x64") == "1" ? hr::seed_mode::x64 : hr::seed_mode::x32;
    const hr::key got = hr::make_key(static_cast<std::uint64_t>(g::parse_dec(r->at("seed"))), mode);
    CHECK(got == hr::key(static_cast<std::uint32_t>(g::parse_hex(r->values[0])),
                         static_cast<std::uint32_t>(g::parse_hex(r->values[1]))));
  }
  for (auto* r : g::of("fold_in")) {
    INFO(r->text());
    const hr::key got = hr::fold_in(hkey(*r), static_cast<std::uint32_t>(g::parse_udec(r->at("data"))));
    CHECK(got.k0 == g::parse_hex(r->values[0]));
    CHECK(got.k1 == g::parse_hex(r->values[1]));
  }
  std::size_t checked = 0;
  for (auto* r : g::of("split")) {
    INFO(r->text());
    mode_scope ms(*r);
    const auto n = static_cast<std::size_t>(g::parse_udec(r->at("n")));
    const auto keys = hr::split(hkey(*r), n);
    REQUIRE(keys.size() == n);
    for (std::size_t i = 0; i < n; ++i) {
      CHECK(keys[i].k0 == g::parse_hex(r->values[2 * i]));
      CHECK(keys[i].k1 == g::parse_hex(r->values[2 * i + 1]));
    }
    if (n == 2) {
      const auto [a, b] = hr::split(hkey(*r));
      CHECK(a == keys[0]);
      CHECK(b == keys[1]);
    }
    ++checked;
  }
  CHECK(checked >= 24);
}

TEST_CASE("uniform arrays equal jax.random.uniform (float32 and float64)") {
  std::size_t checked = 0;
  for (auto* r : g::of("uniform")) {
    INFO(r->text());
    mode_scope ms(*r);
    const auto shape = g::shape_of(*r);
    std::vector<std::uint64_t> got;
    if (r->at("dtype") == "f32") {
      const float lo = g::hex_f32(r->at("minval")), hi = g::hex_f32(r->at("maxval"));
      got = with_shape(shape, [&](auto... s) { return bit_patterns(hr::uniform(hkey(*r), s..., lo, hi).to_host()); });
      if (lo == 0.0f && hi == 1.0f)  // the defaults
        CHECK(with_shape(shape, [&](auto... s) { return bit_patterns(hr::uniform(hkey(*r), s...).to_host()); }) ==
              got);
    } else {
      const double lo = g::hex_f64(r->at("minval")), hi = g::hex_f64(r->at("maxval"));
      got = with_shape(shape, [&](auto... s) {
        return bit_patterns(hr::uniform<double>(hkey(*r), s..., lo, hi).to_host());
      });
    }
    CHECK(got == hex_values(*r));
    ++checked;
  }
  CHECK(checked >= 8);
}

TEST_CASE("normal arrays equal jax.random.normal") {
  std::size_t checked = 0;
  for (auto* r : g::of("normal")) {
    INFO(r->text());
    mode_scope ms(*r);
    const auto got = with_shape(g::shape_of(*r), [&](auto... s) { return bit_patterns(hr::normal(hkey(*r), s...).to_host()); });
    CHECK(got == hex_values(*r));
    ++checked;
  }
  CHECK(checked >= 3);
}

TEST_CASE("truncated_normal arrays equal jax.random.truncated_normal") {
  std::size_t checked = 0;
  for (auto* r : g::of("truncated_normal")) {
    INFO(r->text());
    mode_scope ms(*r);
    const float lo = g::hex_f32(r->at("lower")), hi = g::hex_f32(r->at("upper"));
    const auto got = with_shape(g::shape_of(*r), [&](auto... s) {
      return bit_patterns(hr::truncated_normal(hkey(*r), s..., lo, hi).to_host());
    });
    CHECK(got == hex_values(*r));
    ++checked;
  }
  CHECK(checked >= 2);
}

TEST_CASE("bernoulli arrays equal jax.random.bernoulli") {
  std::size_t checked = 0;
  for (auto* r : g::of("bernoulli")) {
    INFO(r->text());
    mode_scope ms(*r);
    std::vector<std::int64_t> got;
    if (r->at("dtype") == "f32") {
      const float p = g::hex_f32(r->at("p"));
      got = with_shape(g::shape_of(*r), [&](auto... s) { return widen(hr::bernoulli(hkey(*r), s..., p).to_host()); });
    } else {
      const double p = g::hex_f64(r->at("p"));
      got = with_shape(g::shape_of(*r),
                       [&](auto... s) { return widen(hr::bernoulli<double>(hkey(*r), s..., p).to_host()); });
    }
    CHECK(got == dec_values(*r));
    ++checked;
  }
  CHECK(checked >= 3);
}

TEST_CASE("randint arrays equal jax.random.randint") {
  std::size_t checked = 0;
  for (auto* r : g::of("randint")) {
    INFO(r->text());
    mode_scope ms(*r);
    const std::int64_t lo = g::parse_dec(r->at("minval")), hi = g::parse_dec(r->at("maxval"));
    const auto got = with_shape(g::shape_of(*r), [&](auto... s) { return widen(hr::randint(hkey(*r), s..., lo, hi).to_host()); });
    CHECK(got == dec_values(*r));
    ++checked;
  }
  CHECK(checked >= 8);
}

TEST_CASE("categorical along a named axis equals jax.random.categorical") {
  std::size_t checked = 0;
  for (auto* r : g::of("categorical")) {
    INFO(r->text());
    mode_scope ms(*r);
    const auto shape = g::shape_of(*r);
    REQUIRE(shape.size() == 2);
    std::vector<float> host;
    for (const auto& h : g::split_on(r->at("logits"), ',')) host.push_back(g::hex_f32(h));
    const auto logits = haliax::from_host<float>(host, shape[0] * RX, shape[1] * RY);
    const int axis = static_cast<int>(g::parse_dec(r->at("axis")));
    std::vector<std::int64_t> got;
    if (axis == -1 || axis == 1) {
      auto ids = hr::categorical(hkey(*r), logits, RY);
      static_assert(std::is_same_v<decltype(ids), haliax::named_array<std::int32_t, haliax::axes<RX>>>);
      got = widen(ids.to_host());
    } else {
      auto ids = hr::categorical(hkey(*r), logits, RX);
      static_assert(std::is_same_v<decltype(ids), haliax::named_array<std::int32_t, haliax::axes<RY>>>);
      got = widen(ids.to_host());
    }
    CHECK(got == dec_values(*r));
    ++checked;
  }
  CHECK(checked >= 7);
}

TEST_CASE("permutation equals jax.random.permutation") {
  std::size_t checked = 0;
  for (auto* r : g::of("permutation")) {
    INFO(r->text());
    mode_scope ms(*r);
    const auto n = static_cast<std::int64_t>(g::parse_udec(r->at("n")));
    auto p = hr::permutation(hkey(*r), n * RX);
    static_assert(std::is_same_v<decltype(p), haliax::named_array<std::int32_t, haliax::axes<RX>>>);
    CHECK(widen(p.to_host()) == dec_values(*r));
    ++checked;
  }
  CHECK(checked >= 8);
}

TEST_CASE("sampler result types, shapes and axis order") {
  const auto k = hr::make_key(1);
  auto u = hr::uniform(k, 3 * RX, 4 * RY);
  static_assert(std::is_same_v<decltype(u), haliax::named_array<float, haliax::axes<RX, RY>>>);
  CHECK(u.shape_string() == "{rx=3, ry=4}");
  auto z = hr::normal(k, 2 * RZ);
  static_assert(std::is_same_v<decltype(z), haliax::named_array<float, haliax::axes<RZ>>>);
  auto b = hr::bernoulli(k, 5 * RX, 0.25f);
  static_assert(std::is_same_v<decltype(b), haliax::named_array<bool, haliax::axes<RX>>>);
  auto i = hr::randint(k, 2 * RY, 3 * RX, 0, 10);
  static_assert(std::is_same_v<decltype(i), haliax::named_array<std::int32_t, haliax::axes<RY, RX>>>);
  auto d = hr::uniform<double>(k, 4 * RX);
  static_assert(std::is_same_v<decltype(d), haliax::named_array<double, haliax::axes<RX>>>);
  auto s = hr::normal(k);  // rank 0: jax.random.normal(k, ())
  static_assert(decltype(s)::rank == 0);
  CHECK(s.item() == hr::normal(k, 1 * RX).to_host()[0]);
  // The same key and sizes in a different axis order give the same flat stream (JAX shape = given order).
  CHECK(hr::uniform(k, 4 * RY, 3 * RX).to_host() == u.to_host());
  for (float v : hr::uniform(k, 1000 * RX, -2.0f, 3.0f).to_host()) {
    CHECK_UNARY(v >= -2.0f);
    CHECK_UNARY(v < 3.0f);
  }
  for (int v : i.to_host()) {
    CHECK(v >= 0);
    CHECK(v < 10);
  }
  auto perm = hr::permutation(k, 50 * RX).to_host();
  std::sort(perm.begin(), perm.end());
  for (int j = 0; j < 50; ++j) CHECK(perm[j] == j);
}

TEST_CASE("the partitionable setting switches the counter layout") {
  const auto k = hr::make_key(0);
  REQUIRE(hr::threefry_partitionable());  // JAX's default
  const auto a = hr::split(k, 2);
  hr::set_threefry_partitionable(false);
  const auto b = hr::split(k, 2);
  const auto ub = hr::uniform(k, 7 * RX).to_host();
  hr::set_threefry_partitionable(true);
  CHECK(a[0] != b[0]);
  CHECK(b[0] == hr::key{4146024105u, 967050713u});  // the well-known legacy split of PRNGKey(0)
  CHECK(hr::uniform(k, 7 * RX).to_host() != ub);
  std::set<std::pair<std::uint32_t, std::uint32_t>> seen;
  for (const auto& s : hr::split(k, 16)) seen.insert({s.k0, s.k1});
  CHECK(seen.size() == 16);
  CHECK(hr::fold_in(k, 1) != hr::fold_in(k, 2));
}
