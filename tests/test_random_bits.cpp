// Bit-exact checks of the threefry / jax.random port against golden values
// produced by tests/oracle/gen_random_golden.py, plus property tests.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "haliax/detail/random_dists.hpp"
#include "haliax/detail/threefry.hpp"
#include "random_golden_reader.hpp"

namespace {

namespace tf = haliax::detail::threefry;
namespace rd = haliax::detail::random_dists;
namespace g = haliax_test_golden;

std::uint32_t f32_bits(float f) { return rd::bits_from_f32(f); }
std::uint64_t f64_bits(double f) { return rd::bits_from_f64(f); }

// Counts compared values so a silently empty golden file cannot pass.
std::size_t check_count(const std::vector<const g::record*>& recs) {
  std::size_t n = 0;
  for (auto* r : recs) n += r->values.size();
  return n;
}

}  // namespace

TEST_CASE("golden file is present and from the expected generator") {
  const auto metas = g::of("meta");
  REQUIRE(metas.size() == 1);
  CHECK(metas[0]->at("default_threefry_partitionable") == "1");
  MESSAGE("golden values from jax " << metas[0]->at("jax") << ", jaxlib " << metas[0]->at("jaxlib"));
  CHECK(g::all().size() > 100);
}

TEST_CASE("threefry: PRNGKey from seeds") {
  const auto recs = g::of("seed");
  REQUIRE(recs.size() >= 10);
  for (auto* r : recs) {
    INFO(r->text());
    const auto seed = static_cast<std::uint64_t>(g::parse_dec(r->at("seed")));
    const auto mode = r->at("x64") == "1" ? tf::seed_mode::x64 : tf::seed_mode::x32;
    const tf::key_data k = tf::prng_key(seed, mode);
    CHECK(k.k0 == g::parse_hex(r->values.at(0)));
    CHECK(k.k1 == g::parse_hex(r->values.at(1)));
  }
}

TEST_CASE("threefry: fold_in") {
  const auto recs = g::of("fold_in");
  REQUIRE(!recs.empty());
  for (auto* r : recs) {
    INFO(r->text());
    const auto data = static_cast<std::uint32_t>(g::parse_udec(r->at("data")));
    const tf::key_data k = tf::fold_in(g::key_of(*r), data);
    CHECK(k.k0 == g::parse_hex(r->values.at(0)));
    CHECK(k.k1 == g::parse_hex(r->values.at(1)));
  }
}

TEST_CASE("threefry: split (both counter modes)") {
  const auto recs = g::of("split");
  REQUIRE(recs.size() >= 12);
  for (auto* r : recs) {
    INFO(r->text());
    const auto n = static_cast<std::size_t>(g::parse_udec(r->at("n")));
    const auto keys = tf::split(g::key_of(*r), n, g::mode_of(*r));
    REQUIRE(r->values.size() == 2 * n);
    for (std::size_t i = 0; i < n; ++i) {
      CHECK(keys[i].k0 == g::parse_hex(r->values[2 * i]));
      CHECK(keys[i].k1 == g::parse_hex(r->values[2 * i + 1]));
    }
  }
}

TEST_CASE("threefry: random_bits for 8/16/32/64-bit widths (both counter modes)") {
  const auto recs = g::of("bits");
  REQUIRE(check_count(recs) > 2000);
  std::set<unsigned> widths;
  for (auto* r : recs) {
    INFO(r->text());
    const auto width = static_cast<unsigned>(g::parse_udec(r->at("width")));
    widths.insert(width);
    const std::size_t n = g::count_of(g::shape_of(*r));
    REQUIRE(r->values.size() == n);
    const auto bits = tf::random_bits(g::key_of(*r), n, width, g::mode_of(*r));
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += bits[i] != g::parse_hex(r->values[i]);
    CHECK(bad == 0);
  }
  CHECK(widths == std::set<unsigned>{8, 16, 32, 64});
}

TEST_CASE("random: uniform float32 / float64") {
  const auto recs = g::of("uniform");
  REQUIRE(check_count(recs) > 300);
  for (auto* r : recs) {
    INFO(r->text());
    const tf::key_data key = g::key_of(*r);
    const auto mode = g::mode_of(*r);
    const std::size_t n = g::count_of(g::shape_of(*r));
    REQUIRE(r->values.size() == n);
    std::size_t bad = 0;
    if (r->at("dtype") == "f32") {
      const float lo = g::hex_f32(r->at("minval")), hi = g::hex_f32(r->at("maxval"));
      for (std::size_t i = 0; i < n; ++i)
        bad += f32_bits(rd::uniform_f32(tf::bits32_at(key, i, n, mode), lo, hi)) !=
               g::parse_hex(r->values[i]);
    } else {
      const double lo = g::hex_f64(r->at("minval")), hi = g::hex_f64(r->at("maxval"));
      for (std::size_t i = 0; i < n; ++i)
        bad += f64_bits(rd::uniform_f64(tf::bits64_at(key, i, n, mode), lo, hi)) !=
               g::parse_hex(r->values[i]);
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("random: normal float32") {
  const auto recs = g::of("normal");
  REQUIRE(check_count(recs) > 300);
  for (auto* r : recs) {
    INFO(r->text());
    const tf::key_data key = g::key_of(*r);
    const auto mode = g::mode_of(*r);
    const std::size_t n = g::count_of(g::shape_of(*r));
    REQUIRE(r->values.size() == n);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i)
      bad += f32_bits(rd::normal_f32(tf::bits32_at(key, i, n, mode))) != g::parse_hex(r->values[i]);
    CHECK(bad == 0);
  }
}

TEST_CASE("random: bernoulli") {
  const auto recs = g::of("bernoulli");
  REQUIRE(!recs.empty());
  for (auto* r : recs) {
    INFO(r->text());
    const tf::key_data key = g::key_of(*r);
    const auto mode = g::mode_of(*r);
    const std::size_t n = g::count_of(g::shape_of(*r));
    REQUIRE(r->values.size() == n);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const bool v = r->at("dtype") == "f32"
                         ? rd::bernoulli_f32(tf::bits32_at(key, i, n, mode), g::hex_f32(r->at("p")))
                         : rd::bernoulli_f64(tf::bits64_at(key, i, n, mode), g::hex_f64(r->at("p")));
      bad += (v ? 1 : 0) != g::parse_dec(r->values[i]);
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("random: randint int32") {
  const auto recs = g::of("randint");
  REQUIRE(recs.size() >= 5);
  for (auto* r : recs) {
    INFO(r->text());
    const tf::key_data key = g::key_of(*r);
    const auto mode = g::mode_of(*r);
    const std::size_t n = g::count_of(g::shape_of(*r));
    REQUIRE(r->values.size() == n);
    const auto p = rd::make_randint_params(g::parse_dec(r->at("minval")), g::parse_dec(r->at("maxval")));
    const tf::key_data k_hi = tf::split_at(key, 0, 2, mode), k_lo = tf::split_at(key, 1, 2, mode);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::int32_t v =
          rd::randint_i32(tf::bits32_at(k_hi, i, n, mode), tf::bits32_at(k_lo, i, n, mode), p);
      bad += v != g::parse_dec(r->values[i]);
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("random: truncated_normal float32") {
  const auto recs = g::of("truncated_normal");
  REQUIRE(recs.size() >= 2);
  for (auto* r : recs) {
    INFO(r->text());
    const tf::key_data key = g::key_of(*r);
    const auto mode = g::mode_of(*r);
    const std::size_t n = g::count_of(g::shape_of(*r));
    REQUIRE(r->values.size() == n);
    const auto p = rd::make_truncated_normal_params(g::hex_f32(r->at("lower")), g::hex_f32(r->at("upper")));
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i)
      bad += f32_bits(rd::truncated_normal_f32(tf::bits32_at(key, i, n, mode), p)) !=
             g::parse_hex(r->values[i]);
    CHECK(bad == 0);
  }
}

TEST_CASE("random: categorical (gumbel-max)") {
  const auto recs = g::of("categorical");
  REQUIRE(recs.size() >= 6);
  for (auto* r : recs) {
    INFO(r->text());
    const auto shape = g::shape_of(*r);
    std::vector<float> logits;
    for (const auto& h : g::split_on(r->at("logits"), ',')) logits.push_back(g::hex_f32(h));
    REQUIRE(logits.size() == g::count_of(shape));
    const int axis = static_cast<int>(g::parse_dec(r->at("axis")));
    const auto got = rd::categorical_f32(g::key_of(*r), logits.data(), shape, axis, g::mode_of(*r));
    REQUIRE(got.size() == r->values.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == g::parse_dec(r->values[i]));
  }
}

TEST_CASE("random: permutation") {
  const auto recs = g::of("permutation");
  REQUIRE(recs.size() >= 4);
  bool saw_two_rounds = false;
  for (auto* r : recs) {
    INFO(r->text());
    const auto n = static_cast<std::size_t>(g::parse_udec(r->at("n")));
    saw_two_rounds |= rd::permutation_rounds(n) >= 2;
    const auto got = rd::permutation(g::key_of(*r), n, g::mode_of(*r));
    REQUIRE(got.size() == r->values.size());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += got[i] != g::parse_dec(r->values[i]);
    CHECK(bad == 0);
  }
  CHECK(saw_two_rounds);
}

// Every float32 uniform mantissa (2^23 values) through each transform, hashed
// the same way as the generator: proves the XLA log / log1p / erf / erfinv
// expansions are bit-exact over their whole input domain.
TEST_CASE("random: exhaustive float32 transforms over all 2^23 mantissas") {
  const auto recs = g::of("exhaustive");
  REQUIRE(recs.size() >= 6);
  for (auto* r : recs) {
    INFO(r->text());
    const std::string name = r->at("name");
    const auto n = static_cast<std::uint32_t>(g::parse_udec(r->at("n")));
    rd::truncated_normal_params tp{};
    float lo = 0.0f, hi = 1.0f;
    if (name == "truncated_normal_f32")
      tp = rd::make_truncated_normal_params(g::hex_f32(r->at("lower")), g::hex_f32(r->at("upper")));
    if (name == "uniform_f32" && r->has("minval")) {
      lo = g::hex_f32(r->at("minval"));
      hi = g::hex_f32(r->at("maxval"));
    }
    std::uint64_t h = 0;
    for (std::uint32_t i = 0; i < n; ++i) {
      const std::uint32_t bits = i << 9;
      float v = 0.0f;
      if (name == "uniform_f32") v = rd::uniform_f32(bits, lo, hi);
      else if (name == "normal_f32") v = rd::normal_f32(bits);
      else if (name == "gumbel_f32") v = rd::gumbel_f32(bits);
      else if (name == "truncated_normal_f32") v = rd::truncated_normal_f32(bits, tp);
      else FAIL("unknown exhaustive record " << name);
      h += g::splitmix64((static_cast<std::uint64_t>(i) << 32) | f32_bits(v));
    }
    CHECK(h == g::parse_hex(r->values.at(0)));
  }
}

// ---------------------------------------------------------------------------
// Properties (independent of the golden file).

TEST_CASE("threefry properties: split keys differ and depend on the mode") {
  for (auto mode : {tf::counter_mode::partitionable, tf::counter_mode::original}) {
    const tf::key_data k = tf::prng_key(0);
    const auto ks = tf::split(k, 8, mode);
    std::set<std::pair<std::uint32_t, std::uint32_t>> seen;
    for (const auto& s : ks) {
      CHECK(s != k);
      seen.insert({s.k0, s.k1});
    }
    CHECK(seen.size() == ks.size());
  }
  // Known JAX values: PRNGKey(0) split in the legacy (non-partitionable) layout.
  const auto legacy = tf::split(tf::prng_key(0), 2, tf::counter_mode::original);
  CHECK(legacy[0] == tf::key_data{4146024105u, 967050713u});
  CHECK(legacy[1] == tf::key_data{2718843009u, 1272950319u});
  // Partitionable split(key, n)[i] does not depend on n; the legacy one does.
  const auto a = tf::split(tf::prng_key(3), 2), b = tf::split(tf::prng_key(3), 5);
  CHECK(a[1] == b[1]);
}

TEST_CASE("threefry properties: fold_in differs per data and per key") {
  std::set<std::pair<std::uint32_t, std::uint32_t>> seen;
  const tf::key_data k = tf::prng_key(42);
  for (std::uint32_t d = 0; d < 256; ++d) {
    const auto f = tf::fold_in(k, d);
    seen.insert({f.k0, f.k1});
  }
  CHECK(seen.size() == 256);
  CHECK(tf::fold_in(tf::prng_key(1), 5) != tf::fold_in(tf::prng_key(2), 5));
}

TEST_CASE("threefry properties: x32 seeds wrap, x64 seeds keep the high word") {
  CHECK(tf::prng_key((1ull << 32) + 5) == tf::key_data{0u, 5u});
  CHECK(tf::prng_key((1ull << 32) + 5, tf::seed_mode::x64) == tf::key_data{1u, 5u});
  CHECK(tf::prng_key(static_cast<std::uint64_t>(-1), tf::seed_mode::x64) ==
        tf::key_data{0xFFFFFFFFu, 0xFFFFFFFFu});
}

TEST_CASE("threefry properties: partitionable bits are a prefix-stable stream") {
  const tf::key_data k = tf::prng_key(7);
  const auto small = tf::random_bits(k, 10), big = tf::random_bits(k, 1000);
  CHECK(std::equal(small.begin(), small.end(), big.begin()));
  std::set<std::uint64_t> uniq(big.begin(), big.end());
  CHECK(uniq.size() > 990);
  // bits are roughly balanced
  std::size_t ones = 0;
  for (auto b : big) ones += static_cast<std::size_t>(__builtin_popcountll(b));
  CHECK(ones > 15000);
  CHECK(ones < 17000);
}

TEST_CASE("random properties: uniform stays within min (inclusive) and max (exclusive)") {
  const tf::key_data k = tf::prng_key(11);
  const std::size_t n = 20000;
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = rd::uniform_f32(tf::bits32_at(k, i, n), -3.0f, 5.0f);
    CHECK_UNARY(v >= -3.0f);
    CHECK_UNARY(v < 5.0f);
    sum += v;
  }
  CHECK(std::abs(sum / n - 1.0) < 0.1);
  // extreme bit patterns
  CHECK(rd::uniform_f32(0u, 2.0f, 3.0f) == 2.0f);
  CHECK(rd::uniform_f32(0xFFFFFFFFu, 0.0f, 1.0f) < 1.0f);
}

TEST_CASE("random properties: normal moments, randint range, bernoulli rate") {
  const tf::key_data k = tf::prng_key(5);
  const std::size_t n = 50000;
  double m1 = 0, m2 = 0;
  std::size_t hits = 0;
  const auto rp = rd::make_randint_params(-5, 17);
  std::vector<int> counts(22, 0);
  for (std::size_t i = 0; i < n; ++i) {
    const float z = rd::normal_f32(tf::bits32_at(k, i, n));
    REQUIRE(std::isfinite(z));
    m1 += z;
    m2 += double(z) * z;
    hits += rd::bernoulli_f32(tf::bits32_at(tf::fold_in(k, 1), i, n), 0.3f);
    const int v = rd::randint_i32(tf::bits32_at(k, i, n), tf::bits32_at(tf::fold_in(k, 2), i, n), rp);
    REQUIRE(v >= -5);
    REQUIRE(v < 17);
    counts[v + 5]++;
  }
  CHECK(std::abs(m1 / n) < 0.03);
  CHECK(std::abs(m2 / n - 1.0) < 0.03);
  CHECK(std::abs(double(hits) / n - 0.3) < 0.01);
  for (int c : counts) CHECK(c > 0);
  // empty range returns minval
  const auto empty = rd::make_randint_params(9, 3);
  CHECK(rd::randint_i32(123u, 456u, empty) == 9);
}

TEST_CASE("random properties: truncated normal stays strictly inside (lower, upper)") {
  const auto p = rd::make_truncated_normal_params(-2.0f, 1.0f);
  for (std::uint32_t i = 0; i < (1u << 23); i += 97) {
    const float v = rd::truncated_normal_f32(i << 9, p);
    CHECK_UNARY(v > -2.0f);
    CHECK_UNARY(v < 1.0f);
  }
  CHECK(rd::truncated_normal_f32(0u, p) > -2.0f);
  CHECK(rd::truncated_normal_f32(0xFFFFFFFFu, p) < 1.0f);
}

TEST_CASE("random properties: permutation is a permutation") {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{17},
                        std::size_t{1000}, std::size_t{3000}}) {
    auto p = rd::permutation(tf::prng_key(n), n);
    REQUIRE(p.size() == n);
    std::vector<std::int32_t> sorted = p;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < n; ++i) CHECK(sorted[i] == static_cast<std::int32_t>(i));
  }
  CHECK(rd::permutation_rounds(1) == 0);
  CHECK(rd::permutation_rounds(100) == 1);
  CHECK(rd::permutation_rounds(3000) == 2);
}

TEST_CASE("random properties: categorical follows the logits") {
  // One overwhelming logit wins every draw.
  std::vector<float> logits(5 * 6, 0.0f);
  for (int b = 0; b < 5; ++b) logits[b * 6 + (b % 6)] = 60.0f;
  const auto got = rd::categorical_f32(tf::prng_key(3), logits.data(), {5, 6}, -1);
  for (int b = 0; b < 5; ++b) CHECK(got[b] == b % 6);
}
