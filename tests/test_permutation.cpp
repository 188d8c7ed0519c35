// Tests for levanter/data/permutation.hpp: NumPy's PCG64 and Generator.integers, jax.random.randint seeds,
// upstream's LcgPermutation / FeistelPermutation, PermutationDataset and EraShufflingDataset orders, against
// tests/golden/data_order/ (written by tests/oracle/gen_data_order_golden.py from NumPy, JAX and upstream
// Levanter themselves), and the permutation property for many lengths.
#include <doctest/doctest.h>

#include <cstdint>
#include <fstream>
#include <levanter/data/permutation.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#ifndef HALIAX_GOLDEN_DIR
#define HALIAX_GOLDEN_DIR "tests/golden"
#endif

namespace {

namespace ld = levanter::data;
namespace hr = haliax::random;

nlohmann::ordered_json load_golden(const std::string& name) {
  const std::string path = std::string(HALIAX_GOLDEN_DIR) + "/data_order/" + name;
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  return nlohmann::ordered_json::parse(in);
}

hr::key key_of(const nlohmann::ordered_json& words) {
  return hr::key(words.at(0).get<std::uint32_t>(), words.at(1).get<std::uint32_t>());
}

ld::permutation_kind kind_of(const nlohmann::ordered_json& j) {
  return ld::parse_permutation_kind(j.get<std::string>());
}

void check_is_permutation(const ld::permutation& p) {
  const std::uint64_t n = p.size();
  std::vector<char> seen(n, 0);
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t j = p(i);
    REQUIRE(j < n);
    REQUIRE_MESSAGE(!seen[j], "value " << j << " appears twice for length " << n);
    seen[j] = 1;
  }
}

}  // namespace

TEST_CASE("numpy PCG64 raw outputs equal NumPy") {
  const auto g = load_golden("numpy_jax.json");
  int checked = 0;
  for (const auto& c : g.at("pcg64_raw")) {
    ld::numpy_pcg64 rng(c.at("seed").get<std::uint64_t>());
    for (const auto& v : c.at("values")) {
      CHECK(rng.next64() == v.get<std::uint64_t>());
      ++checked;
    }
  }
  CHECK(checked == 36);
}

TEST_CASE("numpy Generator.integers int64 sequences equal NumPy") {
  const auto g = load_golden("numpy_jax.json");
  int checked = 0;
  for (const auto& c : g.at("integers")) {
    ld::numpy_pcg64 rng(c.at("seed").get<std::uint64_t>());
    for (const auto& d : c.at("draws")) {
      const auto lo = d.at(0).get<std::int64_t>(), hi = d.at(1).get<std::int64_t>();
      CHECK_MESSAGE(rng.integers(lo, hi) == d.at(2).get<std::int64_t>(),
                    "seed " << c.at("seed") << " [" << lo << ", " << hi << ")");
      ++checked;
    }
  }
  CHECK(checked == 108);
}

TEST_CASE("numpy Generator.integers uint64 arrays equal NumPy") {
  const auto g = load_golden("numpy_jax.json");
  int checked = 0;
  for (const auto& c : g.at("integers_u64")) {
    ld::numpy_pcg64 rng(c.at("seed").get<std::uint64_t>());
    const unsigned bits = c.at("bits").get<unsigned>();
    for (const auto& v : c.at("values")) {
      CHECK_MESSAGE(rng.integers_u64(0, std::uint64_t{1} << bits) == v.get<std::uint64_t>(), "bits " << bits);
      ++checked;
    }
    CHECK(rng.integers(0, 1000) == c.at("after").get<std::int64_t>());
  }
  CHECK(checked == 7 * 16);
}

TEST_CASE("jax.random.randint scalar seed equals JAX") {
  const auto g = load_golden("numpy_jax.json");
  REQUIRE(g.at("meta").at("threefry_partitionable").get<bool>() == hr::threefry_partitionable());
  int checked = 0;
  for (const auto& c : g.at("randint")) {
    CHECK(ld::jax_randint_scalar(key_of(c.at("key")), 0, std::int64_t{1} << 30) == c.at("value").get<std::int32_t>());
    ++checked;
  }
  CHECK(checked == 16);
}

TEST_CASE("LcgPermutation and FeistelPermutation equal upstream") {
  const auto g = load_golden("permutations.json");
  int cases = 0, values = 0;
  for (const auto& c : g.at("cases")) {
    const auto kind = kind_of(c.at("kind"));
    const auto length = c.at("length").get<std::uint64_t>();
    const auto p = ld::permutation::make(kind, length, key_of(c.at("key")));
    INFO(c.at("kind").get<std::string>() << " length " << length << " key " << c.at("key_name").get<std::string>());
    if (kind == ld::permutation_kind::linear) {
      CHECK(p.a() == c.at("a").get<std::int64_t>());
      CHECK(p.b() == c.at("b").get<std::int64_t>());
    }
    if (c.contains("image")) {
      const auto& image = c.at("image");
      REQUIRE(image.size() == length);
      for (std::uint64_t i = 0; i < length; ++i) {
        CHECK(p(i) == image.at(i).get<std::uint64_t>());
        ++values;
      }
    } else {
      const auto& idx = c.at("indices");
      const auto& val = c.at("values");
      for (std::size_t k = 0; k < idx.size(); ++k) {
        CHECK(p(idx.at(k).get<std::uint64_t>()) == val.at(k).get<std::uint64_t>());
        ++values;
      }
    }
    ++cases;
  }
  CHECK(cases == 2 * 27 * 3);
  CHECK(values > 8000);
}

TEST_CASE("permutations are bijections for many lengths") {
  for (const auto kind : {ld::permutation_kind::linear, ld::permutation_kind::feistel})
    for (const std::uint64_t n : {1ull, 2ull, 3ull, 4ull, 5ull, 6ull, 7ull, 9ull, 15ull, 16ull, 33ull, 100ull, 255ull,
                                  256ull, 257ull, 1000ull, 4099ull, 65536ull, 100003ull})
      for (const std::uint32_t seed : {0u, 1u, 77u}) {
        INFO(ld::to_string(kind) << " length " << n << " seed " << seed);
        check_is_permutation(ld::permutation::make(kind, n, hr::make_key(seed)));
      }
}

TEST_CASE("permutation out-of-range index throws") {
  for (const auto kind : {ld::permutation_kind::linear, ld::permutation_kind::feistel}) {
    const auto p = ld::permutation::make(kind, 10, hr::make_key(0));
    CHECK_NOTHROW(p(9));
    CHECK_THROWS_AS(p(10), std::out_of_range);
    CHECK_THROWS_AS(p(~0ull), std::out_of_range);
  }
  const auto empty = ld::permutation::make(ld::permutation_kind::feistel, 0, hr::make_key(0));
  CHECK_THROWS_AS(empty(0), std::out_of_range);
  CHECK_THROWS_AS(ld::permutation::make(ld::permutation_kind::linear, 0, hr::make_key(0)), std::invalid_argument);
}

TEST_CASE("permutation_type parsing names the key") {
  CHECK(ld::parse_permutation_kind("feistel") == ld::permutation_kind::feistel);
  CHECK(ld::parse_permutation_kind("linear") == ld::permutation_kind::linear);
  try {
    ld::parse_permutation_kind("random");
    FAIL("no exception");
  } catch (const ld::data_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("data.permutation_type") != std::string::npos);
    CHECK(msg.find("'random'") != std::string::npos);
  }
}

TEST_CASE("full and era shuffles equal upstream PermutationDataset and EraShufflingDataset") {
  const auto g = load_golden("shuffles.json");
  int cases = 0;
  for (const auto& c : g.at("cases")) {
    const auto kind = kind_of(c.at("kind"));
    const auto n = c.at("length").get<std::uint64_t>();
    const auto setting = c.at("shuffle").is_boolean() ? ld::shuffle_setting::full()
                                                      : ld::shuffle_setting::eras(c.at("shuffle").get<std::int64_t>());
    const auto order = ld::make_example_order(setting, kind, n, key_of(c.at("key")));
    INFO(c.at("kind").get<std::string>() << " length " << n << " shuffle " << c.at("shuffle").dump());
    const auto& expected = c.at("order");
    REQUIRE(expected.size() == n);
    std::vector<char> seen(n, 0);
    for (std::uint64_t i = 0; i < n; ++i) {
      const auto j = order(i);
      CHECK(j == expected.at(i).get<std::uint64_t>());
      REQUIRE(j < n);
      CHECK(!seen[j]);
      seen[j] = 1;
    }
    CHECK_THROWS_AS(order(n), std::out_of_range);
    ++cases;
  }
  CHECK(cases == 24);
}

TEST_CASE("era shuffle keeps every index in its era and covers it") {
  for (const auto kind : {ld::permutation_kind::linear, ld::permutation_kind::feistel})
    for (const std::uint64_t n : {1ull, 50ull, 1000ull, 1001ull})
      for (const std::uint64_t era : {1ull, 7ull, 64ull, 1000ull, 5000ull}) {
        const auto order = ld::example_order::eras(kind, era, n, hr::make_key(11));
        std::vector<char> seen(n, 0);
        for (std::uint64_t i = 0; i < n; ++i) {
          const auto j = order(i);
          REQUIRE(j / era == i / era);
          REQUIRE(!seen[j]);
          seen[j] = 1;
        }
      }
  const auto none =
      ld::make_example_order(ld::shuffle_setting::eras(0), ld::permutation_kind::linear, 5, hr::make_key(0));
  for (std::uint64_t i = 0; i < 5; ++i) CHECK(none(i) == i);
}
