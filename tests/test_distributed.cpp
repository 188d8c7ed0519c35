// Tests for levanter/distributed: the tree-order float collectives, tree reductions, the plan from the trainer's
// axis mappings, ZeRO-1 and FSDP AdamW against the unsharded update, FSDP's just-in-time layers and tensor
// parallelism against one process. Run by ctest on one process (the local backend)
// and under `mpirun -n 3` (an odd rank count, so ranges are uneven), where every check runs on every rank.
#include <doctest/doctest.h>

#include <boost/hana/define_struct.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <haliax/haliax.hpp>
#include <levanter/config/types.hpp>
#include <levanter/config/yaml.hpp>
#include <levanter/distributed/comm.hpp>
#include <levanter/distributed/fsdp.hpp>
#include <levanter/distributed/plan.hpp>
#include <levanter/distributed/tensor_parallel.hpp>
#include <levanter/distributed/tree_comm.hpp>
#include <levanter/models/gpt2.hpp>
#include <levanter/optim/optimizer.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "host_io.hpp"

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
    std::vector<float> v(static_cast<std::size_t>(x.element_count()));
    for (auto& e : v) e = n(g);
    host_io::write_elements(x, v);
  });
  return m;
}

template <class M>
bool same_bits_any(const M& a, const M& b) {
  bool same = true;
  std::vector<std::vector<float>> va;  // host copies: the leaves may be device memory
  hax::tree::for_each_leaf(a, [&](const std::string&, const auto& x) { va.push_back(x.to_host()); });
  std::size_t k = 0;
  hax::tree::for_each_leaf(b, [&](const std::string&, const auto& x) {
    same = same && k < va.size() && x.element_count() == static_cast<std::int64_t>(va[k].size()) &&
           std::memcmp(x.to_host().data(), va[k].data(), va[k].size() * 4) == 0;
    ++k;
  });
  return same && k == va.size();
}

bool same_bits(const model& a, const model& b) { return same_bits_any(a, b); }

// A tree's elements flattened in tree order.
std::vector<float> flat_of(const model& m) {
  std::vector<float> out(static_cast<std::size_t>(dist::flat_size(m)));
  dist::copy_flat_range(const_cast<model&>(m), out.data(), 0, static_cast<std::int64_t>(out.size()), true);
  return out;
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
    // FSDP: the same optimizer on this rank's flat range of the parameters and gradients only.
    auto p_ranged_init = make_model(7);
    opt::adamw_optimizer<model> ranged(cfg, 20, p_ranged_init, &w, true);
    std::vector<float> p_range;
    std::int64_t r_lo = 0, r_hi = 0;
    if (w.size() > 1) {
      const auto& b = *ranged.shard_bounds();
      r_lo = b[w.rank()], r_hi = b[w.rank() + 1];
      std::vector<float> flat(static_cast<std::size_t>(b.back()));
      dist::copy_flat_range(p_ranged_init, flat.data(), 0, b.back(), true);
      p_range.assign(flat.begin() + r_lo, flat.begin() + r_hi);
    }
    for (int step = 0; step < 6; ++step) {
      const auto g = make_model(1000 + static_cast<unsigned>(step));  // the same reduced gradient on every rank
      const double loss = step == 4 ? 50.0 : 3.0 - 0.1 * step;       // step 4 trips skip_bad_steps
      const auto a = full.update(p_full, g, loss);
      const auto b = sharded.update(p_shard, g, loss);
      CHECK(a.grad_norm == b.grad_norm);
      CHECK(a.update_norm == b.update_norm);
      CHECK(a.skipped == b.skipped);
      REQUIRE(same_bits(p_full, p_shard));
      if (w.size() > 1) {
        const std::int64_t total = dist::flat_size(g);
        std::vector<float> gf(static_cast<std::size_t>(total)), pf(gf.size());
        dist::copy_flat_range(const_cast<model&>(g), gf.data(), 0, total, true);
        const auto c = ranged.update_range(p_range.data(), gf.data() + r_lo, loss);
        CHECK(c.grad_norm == a.grad_norm);
        CHECK(c.update_norm == a.update_norm);
        dist::copy_flat_range(p_full, pf.data(), 0, total, true);
        REQUIRE(std::memcmp(p_range.data(), pf.data() + r_lo, static_cast<std::size_t>(r_hi - r_lo) * 4) == 0);
      }
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

TEST_CASE("ZeRO-1 and FSDP: every rule optimizer and its model average equal the unsharded ones bit for bit") {
  auto& w = world();
  // muon and scion orthogonalise the stacked mlp weight, whose layers straddle the ranks' ranges (gathered first)
  // (the last two: update clipping, whose norms are taken over every rank's chunks, per Stacked layer or in all)
  for (std::string type : {"lion", "adopt", "rmsprop", "cautious", "mars", "muon", "scion", "mini", "soap", "kron",
                           "muon, update_rms_clipping: 0.5", "lion, clip_update_norm: {rolling_interval_length: 2}",
                           "sophia-h, update_interval: 2, gamma: 1.0"}) {
    CAPTURE(type);
    levanter::config::source_map sources;
    const bool sophia = type.rfind("sophia-h", 0) == 0;  // no max_grad_norm upstream; Hessian products every 2 steps
    const auto node = levanter::config::load_yaml_string(
        "{type: " + type + ", learning_rate: 0.01, warmup: 0" + (sophia ? "" : ", max_grad_norm: 0.05") + "}", "test",
        sources);
    const auto choice = levanter::config::decode<levanter::OptimizerChoice>(node, "optimizer", sources);
    auto p_full = make_model(7), p_shard = make_model(7), p_ranged_init = make_model(7);
    auto full = opt::make_optimizer(choice, 20, p_full);
    auto sharded = opt::make_optimizer(choice, 20, p_shard, &w, true);
    auto ranged = opt::make_optimizer(choice, 20, p_ranged_init, &w, true);
    opt::model_averaging avg;  // trainer.model_averaging: the average is placed like the state
    avg.beta = 0.75;
    full->set_model_averaging(avg, p_full);
    sharded->set_model_averaging(avg, p_shard);
    ranged->set_model_averaging(avg, p_ranged_init);
    CHECK((sharded->shard_bounds() != nullptr) == (w.size() > 1));
    std::vector<float> p_range;
    std::int64_t r_lo = 0, r_hi = 0;
    if (w.size() > 1) {
      const auto& b = *ranged->shard_bounds();
      r_lo = b[w.rank()], r_hi = b[w.rank() + 1];
      std::vector<float> flat(static_cast<std::size_t>(b.back()));
      dist::copy_flat_range(p_ranged_init, flat.data(), 0, b.back(), true);
      p_range.assign(flat.begin() + r_lo, flat.begin() + r_hi);
    }
    int probes = 0;
    for (int step = 0; step < 5; ++step) {
      const auto g = make_model(1000 + static_cast<unsigned>(step));
      if (full->hessian_probe()) {  // a stand-in for v * Hv, the same on every rank; the ranged one gets its range
        REQUIRE(sharded->hessian_probe());
        auto d = make_model(2000 + static_cast<unsigned>(step));
        const std::int64_t total = dist::flat_size(d);
        std::vector<float> df(static_cast<std::size_t>(total));
        dist::copy_flat_range(d, df.data(), 0, total, true);
        full->set_hessian_product(df, 0);
        sharded->set_hessian_product(df, 0);
        if (w.size() > 1)
          ranged->set_hessian_product(std::vector<float>(df.begin() + r_lo, df.begin() + r_hi), r_lo);
        ++probes;
      }
      const auto a = full->update(p_full, g, 1.0);
      const auto b = sharded->update(p_shard, g, 1.0);
      CHECK(a.grad_norm == b.grad_norm);
      CHECK(a.update_norm == b.update_norm);
      REQUIRE(same_bits(p_full, p_shard));
      if (w.size() > 1) {
        const std::int64_t total = dist::flat_size(g);
        std::vector<float> gf(static_cast<std::size_t>(total)), pf(gf.size());
        dist::copy_flat_range(const_cast<model&>(g), gf.data(), 0, total, true);
        const auto c = ranged->update_range(p_range.data(), gf.data() + r_lo, 1.0);
        CHECK(c.update_norm == a.update_norm);
        dist::copy_flat_range(p_full, pf.data(), 0, total, true);
        REQUIRE(std::memcmp(p_range.data(), pf.data() + r_lo, static_cast<std::size_t>(r_hi - r_lo) * 4) == 0);
      }
    }
    CHECK(probes == (sophia ? 2 : 0));
    std::vector<std::vector<float>> fs, ss;
    full->for_each_state_tree([&](const std::string&, const model& t) { fs.push_back(flat_of(t)); }, p_full);
    sharded->for_each_state_tree([&](const std::string&, const model& t) { ss.push_back(flat_of(t)); }, p_shard);
    REQUIRE(fs.size() == ss.size());
    for (std::size_t i = 0; i < fs.size(); ++i) CHECK(std::memcmp(fs[i].data(), ss[i].data(), fs[i].size() * 4) == 0);
    const auto fa = flat_of(full->averaged_model(p_full)), sa = flat_of(sharded->averaged_model(p_shard));
    CHECK(std::memcmp(fa.data(), sa.data(), fa.size() * 4) == 0);
    if (w.size() > 1) {
      const auto ra = flat_of(ranged->averaged_model(p_full));  // the shapes of the whole model
      CHECK(std::memcmp(fa.data(), ra.data(), fa.size() * 4) == 0);
    }
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
  refused(c, 2, "trainer.model_axis_size: 2 needs trainer.tensor_parallel_axes");
  refused(c, 3, "trainer.model_axis_size: 2 does not divide the 3 ranks");
  c.tensor_parallel_axes = std::vector<std::string>{"hidden"};
  p = dist::make_plan(c, 4, axes);  // 2 data groups x 2 model ranks
  CHECK(p.mesh.data == 2);
  CHECK(p.mesh.model == 2);
  CHECK(p.local_batch(0) == 6);
  CHECK(p.shard_parameters);  // FSDP over the data ranks
  CHECK(p.model_axes == std::vector<std::string>{"hidden"});
  p = dist::make_plan(c, 2, axes);  // one data rank: nothing to shard
  CHECK_FALSE(p.shard_optimizer);
  c.tensor_parallel_axes = std::vector<std::string>{"mlp"};
  refused(c, 2, "trainer.tensor_parallel_axes: 'mlp' is not an axis of the model's parameters");
  c = {};
  c.train_batch_size = levanter::config::IntSchedule(12);
  c.shard_parameters = false;
  p = dist::make_plan(c, 2, axes);
  CHECK(p.shard_optimizer);
  CHECK_FALSE(p.shard_parameters);  // ZeRO-1
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

namespace {

levanter::Gpt2Config tiny_gpt2() {
  levanter::Gpt2Config c;
  c.seq_len = 8;
  c.hidden_dim = 16;
  c.num_heads = 2;
  c.num_layers = 3;
  return c;
}

}  // namespace

TEST_CASE("FSDP: layers gathered just in time give the data-parallel loss and gradients, bit for bit") {
  using levanter::gpt2::LMHeadModel;
  auto& w = world();
  const auto cfg = tiny_gpt2();
  const auto m = LMHeadModel::init(cfg, 11, hax::random::make_key(3));  // the same on every rank
  // This rank's batch.
  std::mt19937 g(static_cast<unsigned>(17 + w.rank()));
  std::vector<std::int32_t> t(16);
  for (auto& x : t) x = static_cast<std::int32_t>(g() % 11);
  const auto tokens = hax::from_host<std::int32_t>(t, 2 * levanter::Batch, 8 * levanter::Pos);
  const auto ex = levanter::lm_example::causal(tokens, 10);
  const std::int64_t total = dist::flat_size(m);
  // Even ranges that cut through leaves and layers (not AdamW's chunks: the tiny model is one chunk).
  const auto bounds = dist::even_bounds(total, w.size());
  const std::int64_t lo = bounds[w.rank()], hi = bounds[w.rank() + 1];
  for (auto policy : {hax::nn::checkpoint_policy::none, hax::nn::checkpoint_policy::per_layer,
                      hax::nn::checkpoint_policy::nested}) {
    CAPTURE(static_cast<int>(policy));
    levanter::forward_options fo;
    fo.checkpointing = policy;
    auto loss_fn = [&](const LMHeadModel& p) { return levanter::compute_next_token_loss(p, cfg, ex, 0.0, fo); };
    // Data parallel: the whole model on every rank, gradients summed over the ranks (tree order).
    auto [l1, g1] = hax::value_and_grad(loss_fn)(m);
    std::vector<float> buf;
    dist::reduce_tree(w, g1, buf);
    std::vector<float> want(static_cast<std::size_t>(total));
    dist::copy_flat_range(g1, want.data(), 0, total, true);
    // FSDP.
    dist::fsdp_params<LMHeadModel> fs(w, bounds, m);
    CHECK(fs.params().extent(0) == static_cast<std::size_t>(hi - lo));
    CHECK_FALSE(fs.skeleton().embeddings.token_embeddings.weight.valid());
    const auto sent0 = w.bytes_sent();
    auto step = fs.step_model();
    CHECK_FALSE(step.transformer.blocks.stacked.attn.c_attn.weight.valid());  // layers come from the ranks
    CHECK(step.transformer.blocks.num_layers() == 3);
    auto [l2, g2] = hax::value_and_grad(loss_fn)(step);
    fs.reduce_rest(g2);
    // Bytes sent (docs/distributed.md): this rank's part of every parameter to each other rank once for the
    // step, of every layer once more per forward and once more per recomputation; every element of the
    // reduce-scatters it does not keep.
    std::int64_t own_rest = 0, own_stacked = 0;
    for (const auto& l : fs.leaves()) {
      const std::int64_t own = std::max<std::int64_t>(0, std::min(hi, l.offset + l.count) - std::max(lo, l.offset));
      (l.stacked ? own_stacked : own_rest) += own;
    }
    const std::int64_t passes = policy == hax::nn::checkpoint_policy::none ? 1 : 2;
    const std::uint64_t expect_bytes =
        w.size() == 1 ? 0
                      : static_cast<std::uint64_t>(4 * (w.size() - 1) * (own_rest + passes * own_stacked) +
                                                   4 * (total - (hi - lo)));
    CHECK(w.bytes_sent() - sent0 == expect_bytes);
    CHECK(l1.item() == l2.item());
    const auto got = haliax::detail::host_copy(fs.grads());
    REQUIRE(std::memcmp(got.data(), want.data() + lo, static_cast<std::size_t>(hi - lo) * 4) == 0);
    // The summed gradient whole again, and the parameters.
    CHECK(same_bits_any(fs.whole_grads(), g1));
    CHECK(same_bits_any(fs.whole(), m));
    // Without a gradient the sourced layers give the same forward.
    const auto plain = levanter::compute_next_token_loss(m, cfg, ex, 0.0, levanter::forward_options{});
    const auto sourced = levanter::compute_next_token_loss(step, cfg, ex, 0.0, levanter::forward_options{});
    CHECK(plain.item() == sourced.item());
  }
}

TEST_CASE("tensor parallelism: one process's loss, gradients and AdamW update from the ranks' slices") {
  using levanter::gpt2::LMHeadModel;
  auto& w = world();
  const int T = w.size();
  levanter::Gpt2Config cfg;
  cfg.seq_len = 8;
  cfg.hidden_dim = 24;
  cfg.num_heads = 12;  // 12 heads and 96 mlp units divide over 1, 2, 3 and 4 ranks
  cfg.num_layers = 2;
  const auto m = LMHeadModel::init(cfg, 11, hax::random::make_key(5));
  std::mt19937 g(29);  // the same batch on every rank: a model group computes one batch together
  std::vector<std::int32_t> t(16);
  for (auto& x : t) x = static_cast<std::int32_t>(g() % 11);
  const auto ex = levanter::lm_example::causal(hax::from_host<std::int32_t>(t, 2 * levanter::Batch, 8 * levanter::Pos), 10);
  levanter::forward_options fo;
  fo.checkpointing = hax::nn::checkpoint_policy::per_layer;
  auto loss_fn = [&](const LMHeadModel& p) { return levanter::compute_next_token_loss(p, cfg, ex, 0.0, fo); };
  auto [l1, g1] = hax::value_and_grad(loss_fn)(m);

  const std::vector<std::string> split{"heads", "mlp"};
  const auto dims = dist::split_dims(m, split);
  const auto local = dist::slice_model(m, dims, w.rank(), T);
  CHECK(local.transformer.blocks.stacked.attn.c_attn.weight.size(levanter::Heads) == 12 / T);
  CHECK(same_bits_any(dist::assemble_model(local, dims, w), m));  // slices join back to the model
  hax::nn::tensor_parallel tp{split, [&](float* x, std::int64_t n) { dist::allreduce_sum(w, x, n); }};
  std::optional<LMHeadModel> g2;
  float l2 = 0;
  const auto sent0 = w.bytes_sent();
  {
    hax::nn::tensor_parallel_scope scope(tp);
    auto [l, gl] = hax::value_and_grad(loss_fn)(local);
    l2 = l.item();
    g2.emplace(std::move(gl));
  }
  // Bytes (docs/distributed.md): per layer, the two row-parallel outputs summed in forward and again in the
  // recomputation, and the two column-parallel inputs' gradients in backward: 6 all-reduces of {batch, position,
  // embed}, each sending what the reduce-scatter does not keep and this rank's range to every other rank.
  {
    const std::int64_t n = 2 * 8 * 24;
    const auto b = dist::even_bounds(n, T, 16);
    const std::int64_t mine = b[w.rank() + 1] - b[w.rank()];
    const std::int64_t per = T == 1 ? 0 : 4 * (n - mine) + 4 * mine * (T - 1);
    CHECK(w.bytes_sent() - sent0 == static_cast<std::uint64_t>(6 * cfg.num_layers * per));
  }
  CHECK(l2 == doctest::Approx(l1.item()).epsilon(1e-6));
  const auto losses = dist::allgather_doubles(w, {static_cast<double>(l2)});  // the group computes one loss
  for (double x : losses) CHECK(x == static_cast<double>(l2));
  const auto g_whole = dist::assemble_model(*g2, dims, w);
  // Every gradient within float rounding of one process's (relative to the leaf's largest entry).
  std::vector<std::vector<float>> want;
  hax::tree::for_each_leaf(g1, [&](const std::string&, const auto& x) { want.push_back(x.to_host()); });
  std::size_t k = 0;
  hax::tree::for_each_leaf(g_whole, [&](const std::string& name, const auto& x) {
    CAPTURE(name);
    const auto got = x.to_host();
    REQUIRE(got.size() == want[k].size());
    float scale = 1e-30f;
    for (float v : want[k]) scale = std::max(scale, std::abs(v));
    for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(std::abs(got[i] - want[k][i]) <= 1e-5f * scale);
    ++k;
  });

  // AdamW on the slices with the group's norms: one process's update (clipping active).
  levanter::AdamConfig acfg;
  acfg.learning_rate = 1e-2;
  acfg.weight_decay = 0.1;
  acfg.warmup = 0.0;
  acfg.max_grad_norm = 1e-3;
  auto p_full = hax::tree::map(m, [](const std::string&, const auto& x) { return x * 1.0f; });
  auto p_local = hax::tree::map(local, [](const std::string&, const auto& x) { return x * 1.0f; });
  opt::adamw_optimizer<LMHeadModel> full(acfg, 20, p_full);
  opt::adamw_optimizer<LMHeadModel> sliced(acfg, 20, p_local);
  opt::tensor_parallel_codec<LMHeadModel> c;
  c.group = &w;
  for (int d : dims) c.split.push_back(d >= 0 ? 1 : 0);
  c.to_global = [&](const LMHeadModel& l) { return dist::assemble_model(l, dims, w); };
  c.to_local = [&](const LMHeadModel& x) { return dist::slice_model(x, dims, w.rank(), T); };
  c.local_zeros = [&](const LMHeadModel& x) { return dist::local_zeros(x, dims, T); };
  sliced.set_tensor_parallel(c);
  // Muon, Scion, Adam-mini, SOAP and Kron work on whole matrices: refused with tensor parallelism, naming the remedy.
  for (const char* type : {"muon", "scion", "mini", "soap", "kron"}) {
    CAPTURE(type);
    levanter::config::source_map sources;
    const auto node = levanter::config::load_yaml_string(std::string("{type: ") + type + "}", "test", sources);
    auto o = opt::make_optimizer(levanter::config::decode<levanter::OptimizerChoice>(node, "optimizer", sources), 20,
                                 p_local);
    CHECK_THROWS_WITH_AS(o->set_tensor_parallel(c), doctest::Contains("model_axis_size: 1"), std::invalid_argument);
  }
  const auto g_local = dist::slice_model(g1, dims, w.rank(), T);
  const auto a = full.update(p_full, g1, 3.0);
  const auto b = sliced.update(p_local, g_local, 3.0);
  CHECK(b.grad_norm == doctest::Approx(a.grad_norm).epsilon(1e-9));
  CHECK(b.update_norm == doctest::Approx(a.update_norm).epsilon(1e-6));
  const auto p_joined = dist::assemble_model(p_local, dims, w);
  std::vector<std::vector<float>> pw;
  hax::tree::for_each_leaf(p_full, [&](const std::string&, const auto& x) { pw.push_back(x.to_host()); });
  k = 0;
  hax::tree::for_each_leaf(p_joined, [&](const std::string& name, const auto& x) {
    CAPTURE(name);
    const auto got = x.to_host();
    for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(std::abs(got[i] - pw[k][i]) <= 1e-6f * (1.0f + std::abs(pw[k][i])));
    ++k;
  });
  // The moments the optimizer shows (checkpoints, trainer.watch) are whole trees, one process's.
  std::vector<LMHeadModel> sf, ss;
  auto copy = [](const LMHeadModel& x) { return hax::tree::map(x, [](const std::string&, const auto& y) { return y * 1.0f; }); };
  full.for_each_state_tree([&](const std::string&, const LMHeadModel& x) { sf.push_back(copy(x)); }, p_full);
  sliced.for_each_state_tree([&](const std::string&, const LMHeadModel& x) { ss.push_back(copy(x)); }, p_full);
  REQUIRE(ss.size() == 2);
  std::vector<std::vector<float>> mw;
  hax::tree::for_each_leaf(sf[0], [&](const std::string&, const auto& x) { mw.push_back(x.to_host()); });
  k = 0;
  hax::tree::for_each_leaf(ss[0], [&](const std::string& name, const auto& x) {
    CAPTURE(name);
    const auto got = x.to_host();
    REQUIRE(got.size() == mw[k].size());
    for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(std::abs(got[i] - mw[k][i]) <= 1e-6f * (1e-6f + std::abs(mw[k][i])));
    ++k;
  });
}
