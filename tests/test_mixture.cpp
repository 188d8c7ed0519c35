// Tests for levanter/data/mixture.hpp: upstream MixtureDataset's (dataset, index) for every global index, block
// counts and block ids against tests/golden/data_order/mixtures.json (written by
// tests/oracle/gen_data_order_golden.py with upstream Levanter's MixtureDataset, PermutationDataset and
// EraShufflingDataset), staged weights, component shuffles keyed as LMMixtureDatasetConfig.train_set does,
// errors, and the pure-function property.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <levanter/data/mixture.hpp>
#include <levanter/data/permutation.hpp>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef HALIAX_GOLDEN_DIR
#define HALIAX_GOLDEN_DIR "tests/golden"
#endif

namespace {

namespace ld = levanter::data;
namespace hr = haliax::random;
using ojson = nlohmann::ordered_json;

ojson load_mixtures() {
  const std::string path = std::string(HALIAX_GOLDEN_DIR) + "/data_order/mixtures.json";
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  return ojson::parse(in);
}

std::vector<std::pair<std::string, double>> weights_of(const ojson& w) {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& [name, v] : w.items()) out.emplace_back(name, v.get<double>());
  return out;
}

struct built {
  std::vector<std::string> names;
  ld::mixture_index mix;
  std::vector<ld::example_order> orders;  // per configured dataset (identity when the case has no shuffle)
};

built build(const ojson& c) {
  std::vector<std::string> names = c.at("names").get<std::vector<std::string>>();
  std::vector<std::int64_t> lengths;
  for (const auto& n : names) lengths.push_back(c.at("lengths").at(n).get<std::int64_t>());
  std::vector<ld::mixture_stage> stages;
  const std::int64_t block = c.at("block_size").get<std::int64_t>();
  if (c.at("weights").is_array()) {
    for (const auto& s : c.at("weights")) stages.push_back({s.at(0).get<std::int64_t>(), weights_of(s.at(1))});
    stages = ld::mixture_stages_from_steps(stages, c.at("batch_size").get<std::int64_t>(), block);
  } else {
    stages.push_back({0, weights_of(c.at("weights"))});
  }
  // train_lm passes the data key; the cases use PRNGKey(seed) as that key.
  const hr::key data_key = hr::make_key(c.at("seed").get<std::uint32_t>());
  const auto count_used = [&] {
    std::size_t used = 0;
    for (const auto& n : names) {
      bool any = false;
      for (const auto& st : stages)
        for (const auto& [wn, w] : st.weights) any = any || (wn == n && w > 0);
      used += any;
    }
    return used;
  }();
  const auto keys = ld::make_mixture_keys(data_key, count_used);
  ld::mixture_index mix(names, stages, block, keys.mix, lengths);
  REQUIRE(mix.datasets_in_use().size() == count_used);
  std::vector<ld::example_order> orders;
  for (std::size_t i = 0; i < names.size(); ++i) orders.push_back(ld::example_order::identity(lengths[i]));
  if (c.contains("shuffle")) {
    const auto kind = ld::parse_permutation_kind(c.at("perm_type").get<std::string>());
    const auto setting = c.at("shuffle").is_boolean() ? ld::shuffle_setting::full()
                                                      : ld::shuffle_setting::eras(c.at("shuffle").get<std::int64_t>());
    const auto& used = mix.datasets_in_use();
    for (std::size_t u = 0; u < used.size(); ++u)
      orders[used[u]] = ld::make_example_order(setting, kind, lengths[used[u]], keys.component[u]);
  }
  return {names, std::move(mix), std::move(orders)};
}

}  // namespace

TEST_CASE("mixture outputs equal upstream MixtureDataset") {
  const auto g = load_mixtures();
  int cases = 0;
  long values = 0;
  for (const auto& c : g.at("cases")) {
    const std::string case_name = c.at("name").get<std::string>();
    INFO("case " << case_name);
    auto b = build(c);
    const auto used_names = c.at("used").get<std::vector<std::string>>();
    REQUIRE(used_names.size() == b.mix.datasets_in_use().size());
    for (std::size_t u = 0; u < used_names.size(); ++u) CHECK(b.names[b.mix.datasets_in_use()[u]] == used_names[u]);

    const auto& ds = c.at("dataset");
    const auto& idx = c.at("index");
    const auto count = c.at("count").get<std::int64_t>();
    REQUIRE(static_cast<std::int64_t>(ds.size()) == count);
    int mismatches = 0;
    for (std::int64_t i = 0; i < count; ++i) {
      const auto [d, k] = b.mix(i);
      const std::string expected_name = used_names.at(ds.at(i).get<std::size_t>());
      const auto underlying = b.orders[d](static_cast<std::uint64_t>(k));
      if (b.names[d] != expected_name || underlying != idx.at(i).get<std::uint64_t>()) {
        if (++mismatches <= 5)
          FAIL_CHECK("index " << i << ": got (" << b.names[d] << ", " << underlying << "), upstream (" << expected_name
                              << ", " << idx.at(i).get<std::uint64_t>() << ")");
      }
      ++values;
    }
    CHECK(mismatches == 0);

    // Per-stage block counts, read at each stage's first block.
    const auto& offsets = c.at("stages_offsets");
    const auto& counts = c.at("counts_per_stage");
    REQUIRE(offsets.size() == counts.size());
    const std::int64_t block = c.at("block_size").get<std::int64_t>();
    for (std::size_t s = 0; s < offsets.size(); ++s) {
      const auto got = b.mix.block_counts(offsets.at(s).get<std::int64_t>() / block);
      std::int64_t total = 0;
      for (std::size_t u = 0; u < used_names.size(); ++u) {
        CHECK(got[b.mix.datasets_in_use()[u]] == counts.at(s).at(u).get<std::int64_t>());
        total += got[b.mix.datasets_in_use()[u]];
      }
      CHECK(total == block);
    }
    const auto ids = b.mix.block_ids(0);
    const auto& first = c.at("first_block_ids");
    REQUIRE(ids->size() == first.size());
    for (std::size_t i = 0; i < first.size(); ++i) CHECK((*ids)[i] == first.at(i).get<std::int32_t>());
    ++cases;
  }
  CHECK(cases == 10);
  CHECK(values > 20000);
}

TEST_CASE("mixture block counts follow upstream rounding") {
  const auto k = hr::make_key(0);
  // 1/3 each of 100: 33, 33, 33 and the remainder 1 to the first largest.
  ld::mixture_index thirds({"x", "y", "z"}, {{0, {{"x", 1}, {"y", 1}, {"z", 1}}}}, 100, k, {10, 10, 10});
  CHECK(thirds.block_counts(0) == std::vector<std::int64_t>{34, 33, 33});
  // Truncation, not rounding: 0.5·7 = 3.5 → 3, 0.3·7 = 2.1 → 2, 0.2·7 = 1.4 → 1; remainder 1 to the largest.
  ld::mixture_index m({"a", "b", "c"}, {{0, {{"a", 5}, {"b", 3}, {"c", 2}}}}, 7, k, {5, 5, 5});
  CHECK(m.block_counts(0) == std::vector<std::int64_t>{4, 2, 1});
  CHECK(m.block_counts(1000) == std::vector<std::int64_t>{4, 2, 1});
  // A zero-weight dataset is dropped; a tiny weight with no example per block gives a warning.
  ld::mixture_index z({"a", "b", "c"}, {{0, {{"a", 0.995}, {"b", 0.0}, {"c", 0.005}}}}, 100, k, {5, 0, 5});
  CHECK(z.datasets_in_use() == std::vector<std::size_t>{0, 2});
  CHECK(z.block_counts(0) == std::vector<std::int64_t>{100, 0, 0});
  REQUIRE(z.warnings().size() == 1);
  CHECK(z.warnings()[0].find("'c'") != std::string::npos);
  // Every block holds exactly its counts.
  for (std::int64_t blk = 0; blk < 20; ++blk) {
    std::vector<std::int64_t> seen(3, 0);
    for (std::int64_t i = 0; i < 7; ++i) ++seen[m(blk * 7 + i).first];
    CHECK(seen == m.block_counts(blk));
  }
}

TEST_CASE("staged weights: steps become example offsets, datasets continue across stages") {
  const auto stages = ld::mixture_stages_from_steps(
      {{0, {{"a", 1.0}}}, {4, {{"a", 1.0}, {"b", 1.0}}}, {12, {{"b", 1.0}}}}, /*batch_size=*/8, /*block_size=*/16);
  REQUIRE(stages.size() == 3);
  CHECK(stages[0].start == 0);
  CHECK(stages[1].start == 32);
  CHECK(stages[2].start == 96);
  ld::mixture_index m({"a", "b"}, stages, 16, hr::make_key(3), {1000, 1000});
  // Stage 0: 32 examples of a; stage 1: 64 examples, 8 + 8 per block; a resumes at 32, b starts at 0.
  std::vector<std::int64_t> a_seen, b_seen;
  for (std::int64_t i = 0; i < 96; ++i) {
    const auto [d, k] = m(i);
    (d == 0 ? a_seen : b_seen).push_back(k);
  }
  std::sort(a_seen.begin(), a_seen.end());
  std::sort(b_seen.begin(), b_seen.end());
  REQUIRE(a_seen.size() == 64);
  REQUIRE(b_seen.size() == 32);
  for (std::size_t i = 0; i < a_seen.size(); ++i) CHECK(a_seen[i] == static_cast<std::int64_t>(i));
  for (std::size_t i = 0; i < b_seen.size(); ++i) CHECK(b_seen[i] == static_cast<std::int64_t>(i));
  // Stage 2: only b, continuing at 32.
  std::vector<std::int64_t> later;
  for (std::int64_t i = 96; i < 112; ++i) {
    const auto [d, k] = m(i);
    CHECK(d == 1);
    later.push_back(k);
  }
  std::sort(later.begin(), later.end());
  for (std::size_t i = 0; i < later.size(); ++i) CHECK(later[i] == 32 + static_cast<std::int64_t>(i));
}

TEST_CASE("restart wraps finite datasets modulo their length") {
  ld::mixture_index m({"a"}, {{0, {{"a", 1.0}}}}, 16, hr::make_key(0), {5});
  std::vector<int> seen(5, 0);
  for (std::int64_t i = 0; i < 160; ++i) {
    const auto [d, k] = m(i);
    CHECK(d == 0);
    REQUIRE(k < 5);
    ++seen[static_cast<std::size_t>(k)];
  }
  for (int s : seen) CHECK(s == 32);
}

TEST_CASE("a batch at step N computed fresh equals the one computed after steps 0 to N-1") {
  const std::vector<ld::mixture_stage> stages = {{0, {{"a", 0.6}, {"b", 0.3}, {"c", 0.1}}},
                                                 {1024, {{"a", 0.1}, {"c", 0.9}}}};
  const std::vector<std::int64_t> lengths = {500, 70, 3000};
  const hr::key key = hr::make_key(9);
  const std::int64_t batch = 48, steps = 60;
  ld::mixture_index sequential({"a", "b", "c"}, stages, 64, key, lengths);
  std::vector<std::vector<std::pair<std::size_t, std::int64_t>>> seq;
  for (std::int64_t s = 0; s < steps; ++s) seq.push_back(sequential.batch(s * batch, batch));
  for (const std::int64_t n : {0ll, 1ll, 21ll, 22ll, 59ll}) {
    ld::mixture_index fresh({"a", "b", "c"}, stages, 64, key, lengths);
    CHECK(fresh.batch(n * batch, batch) == seq[static_cast<std::size_t>(n)]);
  }
  // Reading backwards (evicting and refilling the block cache) changes nothing either.
  for (std::int64_t s = steps - 1; s >= 0; --s)
    CHECK(sequential.batch(s * batch, batch) == seq[static_cast<std::size_t>(s)]);
}

TEST_CASE("bad weights and stages throw data_error naming the key") {
  const auto k = hr::make_key(0);
  const auto expect_error = [](auto&& make, const std::string& fragment) {
    try {
      make();
      FAIL_CHECK("no exception; expected one mentioning " << fragment);
    } catch (const ld::data_error& e) {
      CHECK_MESSAGE(std::string(e.what()).find(fragment) != std::string::npos, e.what());
    }
  };
  expect_error(
      [&] {
        ld::mixture_index({"a", "b"}, {{0, {{"a", 1.0}, {"b", -0.5}}}}, 16, k, {5, 5});
      },
      "data.train_weights.b");
  expect_error([&] { ld::mixture_index({"a", "b"}, {{0, {{"a", 0.0}, {"b", 0.0}}}}, 16, k, {5, 5}); }, "sum to 0");
  expect_error(
      [&] {
        ld::mixture_index({"a", "b"}, {{0, {{"a", 1.0}, {"web", 1.0}}}}, 16, k, {5, 5});
      },
      "data.train_weights.web");
  expect_error([&] { ld::mixture_index({"a"}, {{0, {{"a", 1.0}}}}, 65536, k, {5}); }, "data.mixture_block_size");
  expect_error(
      [&] {
        ld::mixture_index({"a", "b"}, {{0, {{"a", 1.0}}}, {8, {{"b", 1.0}}}}, 16, k, {5, 5});
      },
      "data.train_weights[1]");
  expect_error(
      [&] {
        ld::mixture_index({"a", "b"}, {{0, {{"a", 1.0}, {"b", 1.0}}}}, 16, k, {5, 0});
      },
      "data.configs.b");
  expect_error(
      [&] {
        ld::mixture_stages_from_steps({{0, {{"a", 1.0}}}, {3, {{"a", 1.0}}}}, 8, 16);
      },
      "data.train_weights[1]");
  expect_error([&] { ld::mixture_stages_from_steps({{2, {{"a", 1.0}}}}, 8, 16); }, "data.train_weights[0]");
  expect_error([&] { ld::mixture_stages_from_steps({{0, {{"a", 1.0}}}, {-1, {{"a", 1.0}}}}, 8, 16); }, "negative");
  // Zero weight in one stage is fine when another stage uses the dataset; an unused empty dataset is fine.
  CHECK_NOTHROW(ld::mixture_index({"a", "b"}, {{0, {{"a", 1.0}, {"b", 0.0}}}}, 16, k, {5, 0}));
}

TEST_CASE("stop strategies: where each dataset runs out, and the mixture's length, by counting examples") {
  // Three datasets over two stages; 'b' is not drawn in the second stage.
  const std::vector<std::string> names = {"a", "b", "c"};
  const std::vector<ld::mixture_stage> stages = {{0, {{"a", 0.5}, {"b", 0.3}, {"c", 0.2}}},
                                                 {256, {{"a", 0.25}, {"c", 0.75}}}};
  const hr::key key = hr::make_key(17);
  const std::int64_t block = 32, horizon = 4096;
  // Counting: the global index of each dataset's n-th example, read off the (golden-checked) index function.
  const ld::mixture_index endless(names, stages, block, key, {1000, 1000, 1000});
  std::vector<std::vector<std::int64_t>> at(3);  // at[d][n - 1]: where dataset d yields its n-th example
  for (std::int64_t i = 0; i < horizon; ++i) at[endless(i).first].push_back(i);
  // Per block of 32: stage 0 draws a 17 (16 + the remainder), b 9, c 6; stage 1 a 8, c 24. So 'b' is drawn 72 times
  // in stage 0's 8 blocks, then never again.
  REQUIRE(at[1].size() == 72);
  REQUIRE(at[0].size() == 17 * 8 + 8 * 120);
  for (std::size_t d = 0; d < 3; ++d)
    for (const std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{16}, std::size_t{17}, std::size_t{72}}) {
      CAPTURE(d);
      CAPTURE(n);
      CHECK(endless.exhaustion_index(d, static_cast<std::int64_t>(n)) == at[d][n - 1]);
    }
  CHECK_FALSE(endless.exhaustion_index(1, 73).has_value());  // 'b' is never drawn a 73rd time
  CHECK(endless.exhaustion_index(0, 1000) == at[0][999]);      // well into the second stage
  CHECK(endless.exhaustion_index(2, 2000) == at[2][1999]);
  CHECK_FALSE(endless.length().has_value());
  CHECK_THROWS_AS((void)endless.exhaustion_index(0, 0), std::invalid_argument);

  // first_exhausted ends one past the earliest end; all_exhausted one past the latest; restart never.
  const std::vector<std::int64_t> lengths = {300, 40, 900};
  const auto end_of = [&](std::size_t d) { return at[d][static_cast<std::size_t>(lengths[d] - 1)]; };
  ld::mixture_index first(names, stages, block, key, lengths, ld::stop_strategy::first_exhausted);
  ld::mixture_index all(names, stages, block, key, lengths, ld::stop_strategy::all_exhausted);
  REQUIRE(first.length().has_value());
  REQUIRE(all.length().has_value());
  CHECK(*first.length() == std::min({end_of(0), end_of(1), end_of(2)}) + 1);
  CHECK(*all.length() == std::max({end_of(0), end_of(1), end_of(2)}) + 1);
  CHECK(*first.length() == end_of(1) + 1);  // the small 'b' runs out first
  CHECK(*all.length() == end_of(2) + 1);
  // Up to its end a finite mixture is the endless one, modulo each length (all_exhausted wraps those that ran out);
  // past it, a clear error. Under first_exhausted no dataset is drawn more often than it has examples.
  std::vector<std::int64_t> drawn(3, 0);
  for (std::int64_t i = 0; i < *all.length(); ++i) {
    const auto [d, k] = endless(i);
    const auto expect = std::make_pair(d, k % lengths[d]);
    if (i < *first.length()) {
      REQUIRE(first(i) == expect);
      REQUIRE(++drawn[d] <= lengths[d]);
    }
    REQUIRE(all(i) == expect);
  }
  CHECK(drawn[1] == lengths[1]);  // 'b' ends it with its last draw
  CHECK_THROWS_AS((void)first(*first.length()), ld::data_error);
  CHECK_THROWS_AS((void)all(*all.length() + 5), ld::data_error);

  // A dataset that is never used up ('b' longer than what stage 0 draws): first_exhausted ignores it,
  // all_exhausted never ends (upstream: an infinite mixture).
  const std::vector<std::int64_t> long_b = {300, 500, 900};
  ld::mixture_index first_long(names, stages, block, key, long_b, ld::stop_strategy::first_exhausted);
  ld::mixture_index all_long(names, stages, block, key, long_b, ld::stop_strategy::all_exhausted);
  CHECK(first_long.length() == std::min(end_of(0), end_of(2)) + 1);
  CHECK_FALSE(all_long.length().has_value());

  CHECK(ld::parse_stop_strategy("first_exhausted") == ld::stop_strategy::first_exhausted);
  CHECK(std::string(ld::to_string(ld::stop_strategy::all_exhausted)) == "all_exhausted");
  try {
    (void)ld::parse_stop_strategy("first");
    FAIL_CHECK("no exception");
  } catch (const ld::data_error& e) {
    CHECK(std::string(e.what()).find("data.stop_strategy: unknown stop strategy 'first'") != std::string::npos);
  }
}
