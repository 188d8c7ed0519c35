// Tests for levanter/distributed: the tree-order float collectives, tree reductions, the plan from the trainer's
// axis mappings, and ZeRO-1 AdamW against the unsharded update. Run by ctest on one process (the local backend)
// and under `mpirun -n 3` (an odd rank count, so ranges are uneven), where every check runs on every rank.
#include <doctest/doctest.h>

#include <boost/hana/define_struct.hpp>
#include <cstdlib>
#include <haliax/haliax.hpp>
#include <levanter/config/types.hpp>
#include <levanter/config/yaml.hpp>
#include <levanter/distributed/comm.hpp>
#include <levanter/distributed/plan.hpp>
#include <levanter/distributed/tree_comm.hpp>
#include <levanter/optim/optimizer.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace hax = haliax;
namespace nn = haliax::nn;
namespace dist = levanter::distributed;
namespace opt = levanter::optim;
using hax::axes;

namespace {

inline constexpr struct Vocab final : haliax::axis<"vocab"> {} Vocab;
inline constexpr struct Embed final : haliax::axis<"embed"> {} Embed;
inline constexpr struct Hidden final : haliax::axis<"hidden"> {} Hidden;
inline constexpr struct Layers final : haliax::axis<"layers"> {} Layers;

template <class Pre = axes<>>
struct block {
  static constexpr std::string_view class_name = "Block";
  BOOST_HANA_DEFINE_STRUCT(block, (nn::Linear<axes<Embed>, axes<Hidden>, Pre>, mlp), (nn::LayerNorm<Embed, Pre>, ln));
};
struct model {
  static constexpr std::string_view class_name = "Model";
  BOOST_HANA_DEFINE_STRUCT(model, (nn::Embedding<Vocab, Embed>, embeddings), (nn::Stacked<Layers, block>, blocks));
};

// Every rank of the job (MPI under mpirun, else one). MPI ends at exit, after every test ran on every rank.
dist::communicator& world() {
  static const bool started = [] {
    dist::init_world(nullptr, nullptr);
    std::atexit([] { dist::finalize_world(); });
    return true;
  }();
  (void)started;
  return dist::world();
}

// Values whose float sums depend on the order they are added in.
float value(int rank, std::int64_t i) {
  std::mt19937 g(static_cast<unsigned>(rank * 7919 + i));
  return std::uniform_real_distribution<float>(-1.0f, 1.0f)(g) * (rank % 2 ? 1e-3f : 1e3f);
}

// A model with 3 Stacked layers and an embedding large enough for several AdamW chunks, random values.
model make_model(unsigned seed) {
  model m;
  m.embeddings.weight = hax::zeros<float>(300 * Vocab, 256 * Embed);  // 76,800 elements: 3 chunks
  m.blocks.stacked.mlp.weight = hax::zeros<float>(3 * Layers, 256 * Embed, 40 * Hidden);
  m.blocks.stacked.mlp.bias = hax::zeros<float>(3 * Layers, 40 * Hidden);
  m.blocks.stacked.ln.weight = hax::zeros<float>(3 * Layers, 256 * Embed);
  m.blocks.stacked.ln.bias = hax::zeros<float>(3 * Layers, 256 * Embed);
  m.blocks.stacked.ln.eps = 1e-5;
  std::mt19937 g(seed);
  std::normal_distribution<float> n(0.0f, 0.02f);
  hax::tree::for_each_leaf(m, [&](const std::string&, auto& x) {
    for (std::int64_t i = 0; i < x.element_count(); ++i) x.data()[i] = n(g);
  });
  return m;
}

bool same_bits(const model& a, const model& b) {
  bool same = true;
  std::vector<const float*> pa;
  std::vector<std::int64_t> na;
  hax::tree::for_each_leaf(a, [&](const std::string&, const auto& x) {
    pa.push_back(x.data());
    na.push_back(x.element_count());
  });
  std::size_t k = 0;
  hax::tree::for_each_leaf(b, [&](const std::string&, const auto& x) {
    same = same && x.element_count() == na[k] && std::memcmp(x.data(), pa[k], static_cast<std::size_t>(na[k]) * 4) == 0;
    ++k;
  });
  return same;
}

}  // namespace

TEST_CASE("even_bounds splits a range into aligned near-equal parts") {
  const auto b = dist::even_bounds(1000, 3, 16);
  REQUIRE(b.size() == 4);
  CHECK(b[0] == 0);
  CHECK(b[3] == 1000);
  for (int r = 1; r < 3; ++r) {
    CHECK(b[static_cast<std::size_t>(r)] % 16 == 0);
    CHECK(b[static_cast<std::size_t>(r)] >= b[static_cast<std::size_t>(r) - 1]);
  }
  CHECK(dist::even_bounds(10, 4) == std::vector<std::int64_t>{0, 2, 5, 7, 10});
  CHECK(dist::even_bounds(0, 2) == std::vector<std::int64_t>{0, 0, 0});
}

TEST_CASE("tree_order adds halves: blocks of n / 2^k terms are subtrees") {
  std::vector<std::string> t{"a", "b", "c", "d", "e"};
  dist::tree_order(5, [&](int into, int from) { t[into] = "(" + t[into] + "+" + t[from] + ")"; });
  CHECK(t[0] == "((a+b)+(c+(d+e)))");
  // 8 terms as 2 blocks of 4, each summed alone, then the two sums: the same expression as all 8 at once
  std::vector<std::string> all{"0", "1", "2", "3", "4", "5", "6", "7"};
  dist::tree_order(8, [&](int into, int from) { all[into] = "(" + all[into] + "+" + all[from] + ")"; });
  std::vector<std::string> lo{"0", "1", "2", "3"}, hi{"4", "5", "6", "7"};
  dist::tree_order(4, [&](int into, int from) { lo[into] = "(" + lo[into] + "+" + lo[from] + ")"; });
  dist::tree_order(4, [&](int into, int from) { hi[into] = "(" + hi[into] + "+" + hi[from] + ")"; });
  CHECK(all[0] == "(" + lo[0] + "+" + hi[0] + ")");
}

TEST_CASE("reduce-scatter, all-gather and all-reduce add in tree order, bit for bit") {
  auto& w = world();
  const int n = w.size(), me = w.rank();
  const std::int64_t len = 1001;
  std::vector<float> data(len);
  for (std::int64_t i = 0; i < len; ++i) data[static_cast<std::size_t>(i)] = value(me, i);
  // What every rank expects: the ranks' values added along tree_order (x0 + x1 on 2 ranks, x0 + (x1 + x2) on 3).
  std::vector<float> expect(len);
  for (std::int64_t i = 0; i < len; ++i) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (int q = 0; q < n; ++q) x[static_cast<std::size_t>(q)] = value(q, i);
    dist::tree_order(n, [&](int into, int from) { x[into] += x[from]; });
    expect[static_cast<std::size_t>(i)] = x[0];
  }
  const auto bounds = dist::even_bounds(len, n, 16);
  auto rs = data;
  dist::reduce_scatter_sum(w, rs.data(), bounds);
  for (std::int64_t i = bounds[me]; i < bounds[me + 1]; ++i) REQUIRE(rs[i] == expect[i]);
  for (std::int64_t i = 0; i < len; ++i)
    if (i < bounds[me] || i >= bounds[me + 1]) REQUIRE(rs[i] == data[i]);  // the rest untouched
  dist::allgather_ranges(w, rs.data(), bounds);
  CHECK(rs == expect);
  auto ar = data;
  dist::allreduce_sum(w, ar.data(), len);
  CHECK(ar == expect);

  std::vector<double> dx(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q) dx[static_cast<std::size_t>(q)] = 0.1 * (q + 1);
  dist::tree_order(n, [&](int into, int from) { dx[into] += dx[from]; });
  const double dexp = dx[0];
  CHECK(dist::allreduce_sum(w, 0.1 * (me + 1)) == dexp);
  std::vector<double> mine(static_cast<std::size_t>(me + 1), double(me));
  const auto all = dist::allgather_doubles(w, mine);
  CHECK(all.size() == static_cast<std::size_t>(n * (n + 1) / 2));
  std::size_t k = 0;
  for (int q = 0; q < n; ++q)
    for (int j = 0; j <= q; ++j) CHECK(all[k++] == double(q));
  CHECK(dist::broadcast_string(w, me == 0 ? "run-id-from-rank-0" : "other") == "run-id-from-rank-0");
  CHECK(dist::broadcast_flag(w, me == 0) == true);
}

TEST_CASE("reduce_tree sums a parameter tree over the ranks, whole or in this rank's range") {
  auto& w = world();
  auto mine = make_model(100 + static_cast<unsigned>(w.rank()));
  std::vector<model> parts;
  for (int q = 0; q < w.size(); ++q) parts.push_back(make_model(100 + static_cast<unsigned>(q)));
  dist::tree_order(w.size(), [&](int into, int from) {
    hax::tree::zip_leaves(parts[static_cast<std::size_t>(into)], parts[static_cast<std::size_t>(from)],
                          [](const std::string&, auto& a, const auto& b) { a = a + b; });
  });
  model& expect = parts[0];
  auto whole = make_model(100 + static_cast<unsigned>(w.rank()));
  std::vector<float> buf;
  dist::reduce_tree(w, whole, buf);
  CHECK(same_bits(whole, expect));
  CHECK(dist::same_on_all_ranks(w, whole));

  const auto bounds = opt::adamw::shard_bounds(mine, w.size());
  dist::reduce_tree(w, mine, buf, &bounds);
  std::vector<float> got(static_cast<std::size_t>(bounds.back())), want(got.size());
  dist::copy_flat_range(mine, got.data(), 0, bounds.back(), true);
  dist::copy_flat_range(expect, want.data(), 0, bounds.back(), true);
  for (std::int64_t i = bounds[w.rank()]; i < bounds[w.rank() + 1]; ++i) REQUIRE(got[i] == want[i]);
}

TEST_CASE("ZeRO-1 AdamW equals the unsharded update bit for bit, with every clipping option") {
  auto& w = world();
  struct variant {
    const char* name;
    void (*set)(levanter::AdamConfig&);
  };
  const variant variants[] = {
      {"plain", [](levanter::AdamConfig&) {}},
      {"max_grad_norm clipping", [](levanter::AdamConfig& c) { c.max_grad_norm = 1e-3; }},
      {"update_rms_clipping", [](levanter::AdamConfig& c) { c.update_rms_clipping = 0.5; }},
      {"clip_update_norm", [](levanter::AdamConfig& c) {
         c.clip_update_norm = levanter::ClipUpdateNormConfig{};
         c.clip_update_norm->rolling_interval_length = 3;
       }},
      {"skip_bad_steps and nesterov", [](levanter::AdamConfig& c) {
         c.skip_bad_steps = std::int64_t{4};
         c.nesterov = true;
       }},
  };
  for (const auto& v : variants) {
    CAPTURE(v.name);
    levanter::AdamConfig cfg;
    cfg.learning_rate = 1e-2;
    cfg.weight_decay = 0.1;
    cfg.warmup = 0.0;
    v.set(cfg);
    auto p_full = make_model(7), p_shard = make_model(7);
    opt::adamw_optimizer<model> full(cfg, 20, p_full);
    opt::adamw_optimizer<model> sharded(cfg, 20, p_shard, &w, true);
    CHECK((sharded.shard_bounds() != nullptr) == (w.size() > 1));
    for (int step = 0; step < 6; ++step) {
      const auto g = make_model(1000 + static_cast<unsigned>(step));  // the same reduced gradient on every rank
      const double loss = step == 4 ? 50.0 : 3.0 - 0.1 * step;       // step 4 trips skip_bad_steps
      const auto a = full.update(p_full, g, loss);
      const auto b = sharded.update(p_shard, g, loss);
      CHECK(a.grad_norm == b.grad_norm);
      CHECK(a.update_norm == b.update_norm);
      CHECK(a.skipped == b.skipped);
      REQUIRE(same_bits(p_full, p_shard));
    }
    // The gathered state is the unsharded state (what a checkpoint holds and trainer.watch sees).
    std::vector<model> full_state, sharded_state;
    auto copy = [](const model& m) {
      return hax::tree::map(m, [](const std::string&, const auto& x) { return x * 1.0f; });
    };
    full.for_each_state_tree([&](const std::string&, const model& t) { full_state.push_back(copy(t)); }, p_full);
    sharded.for_each_state_tree([&](const std::string&, const model& t) { sharded_state.push_back(copy(t)); },
                                p_shard);
    REQUIRE(full_state.size() == 2);
    REQUIRE(sharded_state.size() == 2);
    CHECK(same_bits(full_state[0], sharded_state[0]));
    CHECK(same_bits(full_state[1], sharded_state[1]));
  }
}

TEST_CASE("the plan follows the trainer's axis mappings and refuses what it cannot do") {
  levanter::TrainerConfig t;
  t.train_batch_size = levanter::config::IntSchedule(12);
  const std::set<std::string> axes{"embed", "vocab", "hidden", "layers"};
  auto p = dist::make_plan(t, 3, axes);
  CHECK(p.mesh.data == 3);
  CHECK(p.shard_optimizer);  // upstream's default fsdp_axis: embed
  CHECK(p.local_batch(0) == 4);
  t.fsdp_axis = levanter::config::StringOrList{};
  p = dist::make_plan(t, 3, axes);
  CHECK_FALSE(p.shard_optimizer);
  CHECK_FALSE(dist::make_plan(levanter::TrainerConfig{}, 1, axes).shard_optimizer);  // one rank: nothing to shard
  t.per_device_parallelism = 2;
  p = dist::make_plan(t, 3, axes);
  CHECK(p.micro_batch(0) == 2);

  auto refused = [&](levanter::TrainerConfig c, int world, const std::string& expect) {
    CAPTURE(expect);
    try {
      dist::make_plan(c, world, axes);
      FAIL("accepted");
    } catch (const levanter::config::config_error& e) {
      CHECK(std::string(e.what()).find(expect) != std::string::npos);
    }
  };
  levanter::TrainerConfig c;
  c.train_batch_size = levanter::config::IntSchedule(12);
  c.fsdp_axis = levanter::config::StringOrList{"embd"};
  refused(c, 2, "trainer.fsdp_axis: 'embd' is not an axis of the model's parameters (they have: embed, hidden");
  c = {};
  c.train_batch_size = levanter::config::IntSchedule(12);
  refused(c, 5, "trainer.train_batch_size: 12 (from step 0) does not divide over 5 ranks");
  c.model_axis_size = 2;
  refused(c, 2, "tensor parallelism is not implemented");
  c = {};
  c.train_batch_size = levanter::config::IntSchedule(12);
  c.per_device_parallelism = 5;
  refused(c, 2, "trainer.per_device_parallelism: 5 does not divide the 6 examples");
  c = {};
  c.train_batch_size = levanter::config::IntSchedule(12);
  c.axis_resources["embed"] = levanter::config::StringOrList{"data"};
  refused(c, 2, "only the batch axis can be split over data");
  c.axis_resources["embed"] = levanter::config::StringOrList{"gpu"};
  refused(c, 2, "'gpu' is not a mesh axis");
}
