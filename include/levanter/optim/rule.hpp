// levanter/optim/rule.hpp: an optimizer written as a rule over the flat state, and the one engine that runs every
// such rule. A rule names its state buffers (each shaped like the parameters), fills the constants of one step from
// its config, the learning rate and the step count, and gives an element loop over one chunk; the engine does the
// rest as for AdamW: the global gradient norm (per chunk, then in chunk order), clip_by_global_norm, the schedule,
// the weight-decay mask, the update norm, and, through placed_optimizer, where the state lies (replicated, ZeRO-1,
// FSDP, tensor parallelism) and how checkpoints and trainer.watch see it.
//
//   struct lion_rule { ... };                       // optim/rules/*.cpp: constants and the element loop
//   auto opt = levanter::optim::make_optimizer(choice, num_train_steps, model);   // a rule_optimizer<M>
//
// The element loops are compiled into levanter_core (src/optim/rules.cpp) for the baseline instruction set and for
// AVX2 without FMA, so every program computes the same bits. They read host memory: a build whose arrays live on a
// GPU refuses these optimizers when they are made (AdamW has device kernels; the others wait for theirs).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <levanter/optim/layout.hpp>
#include <levanter/optim/placement.hpp>
#include <levanter/optim/schedule.hpp>
#include <levanter/optim/weight_decay.hpp>

namespace levanter::optim {

/// The constants of one update, as the optax chain computes them (float, as optax does).
struct rule_step {
  float neg_lr = 0;      ///< -schedule(count)
  float lr = 0;          ///< schedule(count)
  float wd = 0;          ///< weight decay (add_decayed_weights), for leaves the mask decays
  bool clip = false;     ///< clip_by_global_norm triggered: g * clip_num / clip_den... as optax, (g / norm) * max
  float clip_num = 1, clip_den = 1;
  int64_t t = 0;         ///< updates applied, this one included (1 at the first)
  double rule_norm = 0;  ///< the global norm of the rule's own clipping target (rule_def::norm_loop)
  float k[12] = {};      ///< the rule's own constants (betas, epsilons, bias corrections)
  std::uint64_t w[4] = {};  ///< what rule_def::begin decided for this step (Kron: the probe key, the flags)
  std::size_t leaves = 0;   ///< the number of leaves of the parameter tree
};

/// One chunk of one leaf: the parameters, the gradient and the rule's state buffers at the same elements.
struct rule_chunk {
  float* p;
  const float* g;
  float* s[4];
  int64_t n;
  bool decay;
  float leaf_mean;  ///< rule_group::leaf_loop's sum over the whole leaf divided by its size (0 without one)
  float* x;         ///< the group's scratch at these elements (rule_group::prep and leaf work), else null
};

/// A rule's element loop: updates p and the state over the chunk and returns the sum of the squares of the change
/// made to p (float squares added in double, in element order).
using element_loop = double (*)(const rule_step&, const rule_chunk&);

/// What a rule knows of one parameter leaf: its path, its shape as stored, and, for a Linear's weight, the
/// matrices it holds (`layers` of `rows` x `cols`, row-major as stored: rows are the outputs when out_first).
struct leaf_desc {
  std::string path;
  std::vector<int64_t> sizes;
  int stacked_depth = 0;
  bool linear_weight = false;
  bool out_first = false;
  int64_t layers = 1, rows = 0, cols = 0;
  int64_t fan_in = 0, fan_out = 0;  ///< the product of the In axes' and of the Out axes' sizes
};

/// Work on one whole leaf of a group's scratch (after `prep` filled it): Muon's Newton–Schulz, Adam-mini's means.
using leaf_work = std::function<void(const rule_step&, const leaf_desc&, float* x)>;

/// State a rule keeps per leaf in shapes of its own (SOAP's eigenbases, Kron's preconditioners): named float arrays,
/// whole on every rank, saved in opt_state.h5 as `<name>.<leaf path>`.
struct leaf_arrays {
  std::vector<std::pair<std::string, std::vector<float>>> arrays;
  std::vector<float>& add(std::string name, std::vector<float> values) {
    arrays.emplace_back(std::move(name), std::move(values));
    return arrays.back().second;
  }
  std::vector<float>& at(std::string_view name) {
    for (auto& [n, v] : arrays)
      if (n == name) return v;
    throw std::logic_error("leaf_arrays: no array '" + std::string(name) + "'");
  }
};

/// Work on one whole leaf with state of its own: reads the scratch the group's `prep` filled (the whole leaf, every
/// rank), updates `state` and leaves the leaf's update direction in the scratch. Under ZeRO-1 and FSDP every rank
/// runs it on every leaf of the group, so that the state stays the same everywhere (the cost of one process's
/// update on each rank, and the state replicated: stated in docs/optimizer.md).
using stateful_leaf_work =
    std::function<void(const rule_step&, const leaf_desc&, std::size_t leaf, float* x, leaf_arrays& state)>;

/// The leaves one chain of a rule updates (upstream's multi_transform groups: Muon's "muon" and "adamw"). Each group
/// has its own clipping (over its own leaves), schedule, weight decay and constants.
struct rule_group {
  std::string name;
  element_loop loop = nullptr;
  std::function<void(rule_step&)> constants;  ///< a pure function of the step's fields (may run twice)
  std::optional<double> max_grad_norm;        ///< clip_by_global_norm over the group's leaves (unset or 0: none)
  bool clip_at_zero = false;                  ///< max_grad_norm 0 clips to zero (upstream tests `is not None`)
  /// Optional: per chunk, the sum of squares of what the rule clips by its own global norm (MARS); the engine puts
  /// the norm over the group's chunks (and ranks) in rule_step::rule_norm before `constants` runs again.
  element_loop norm_loop = nullptr;
  /// Optional: per chunk, a sum the rule needs over each whole leaf (Cautious's agreeing elements); it runs first
  /// and updates the state, and `loop` sees the leaf's mean in rule_chunk::leaf_mean and leaves the state alone.
  element_loop leaf_loop = nullptr;
  /// Optional: per chunk, fills the scratch rule_chunk::x (and updates the state); then `leaf` runs on each whole
  /// leaf of the scratch (gathered from every rank under ZeRO-1/FSDP) before `loop` reads it.
  element_loop prep = nullptr;
  leaf_work leaf;
  std::optional<double> peak_lr;       ///< the group's own schedule peak (Muon's adam_lr); unset: learning_rate
  double lr_factor = 1.0;              ///< the group's lr as a multiple of the schedule's (Scion's signum)
  std::optional<double> weight_decay;  ///< the group's own weight decay; unset: the config's
  /// Optional, with `prep`: per-leaf state of the rule's own shapes, made once per leaf, and the work that uses it.
  std::function<leaf_arrays(const leaf_desc&)> leaf_state;
  stateful_leaf_work leaf_with_state;
};

/// An optimizer as a rule (see the file comment).
struct rule_def {
  std::string_view type;             ///< optimizer.type
  std::vector<std::string> buffers;  ///< state buffer names, as opt_state.h5 holds them (at most 4), every leaf
  std::vector<rule_group> groups;    ///< one, or several with `label`
  std::function<std::size_t(const leaf_desc&)> label;  ///< the group of each leaf (unset: group 0)
  /// Optional: whole-rule integer state (saved as scalars `<name>`), with its initial values.
  std::vector<std::pair<std::string, std::int64_t>> words;
  /// Optional: once per applied step, before any leaf work, on every rank alike: updates `words` and fills
  /// rule_step::w for every group (t is the step's rule_step::t).
  std::function<void(std::int64_t t, std::vector<std::pair<std::string, std::int64_t>>& words, std::uint64_t* w)>
      begin;
};

namespace detail {
void check_rule_placement(std::string_view type);  // src/optim/rules.cpp: refuses arrays in device memory
// update_rms_clipping and clip_update_norm (src/optim/rules.cpp): the rule's loop first records its direction u into
// rule_chunk::x as -u (run with p pointing there, no decay and lr 1); then
//   finish_recorded: x := u + wd p where the leaf decays; returns the sum of x^2;
//   apply_recorded:  p := p + ((x / k[0]) * k[1]) * neg_lr; returns the sum of the steps' squares.
double finish_recorded(const rule_step& st, const rule_chunk& c);
double apply_recorded(const rule_step& st, const rule_chunk& c);
/// The rule loops' instruction set (src/optim/rules.cpp): AVX2 where the CPU has it, unless LEVANTER_ISA=baseline.
/// set_rule_loops_avx2 switches it (for tests and comparisons; both give the same bits) and returns the old setting.
bool rule_loops_avx2();
bool set_rule_loops_avx2(bool on);
}  // namespace detail

/// The leaves of `params` as rules see them, in tree order.
template <class M>
std::vector<leaf_desc> leaf_descs(const M& params) {
  std::vector<leaf_desc> out;
  for_each_leaf_info(params, [&](const leaf_info& info, const auto& p) {
    leaf_desc d;
    d.path = info.path;
    d.sizes.assign(p.sizes().begin(), p.sizes().end());
    d.stacked_depth = info.stacked_depth;
    if (info.linear) {
      const int rank = static_cast<int>(d.sizes.size());
      const int pre = rank - info.linear->in_axes - info.linear->out_axes;
      const int first = info.linear->out_first ? info.linear->out_axes : info.linear->in_axes;
      d.linear_weight = pre >= 0;
      d.out_first = info.linear->out_first;
      int64_t lead = 1, a = 1, b = 1;
      for (int k = 0; k < rank; ++k) (k < pre ? lead : k < pre + first ? a : b) *= d.sizes[static_cast<std::size_t>(k)];
      d.layers = lead;
      d.rows = a;
      d.cols = b;
      d.fan_out = d.out_first ? a : b;
      d.fan_in = d.out_first ? b : a;
    }
    out.push_back(std::move(d));
  });
  return out;
}

/// A rule run over a parameter tree of type `M`, wherever its state lies. opt_state.h5 holds the buffers by name
/// (`<buffer>.<path>`) and `count` (updates seen).
template <class M>
class rule_optimizer final : public placed_optimizer<M> {
 public:
  rule_optimizer(rule_def rule, const OptimizerConfig& cfg, std::int64_t num_train_steps, const M& params,
                 distributed::communicator* comm = nullptr, bool sharded = false)
      : placed_optimizer<M>(params, comm, sharded), rule_(std::move(rule)),
        schedule_(make_lr_schedule(cfg, num_train_steps)), skip_(skip_steps_of(cfg)) {
    detail::check_rule_placement(rule_.type);
    if (skip_) {
      skip_losses_ = rolling_window::with_capacity(skip_->rolling_interval_length);
      skip_grad_norms_ = rolling_window::with_capacity(skip_->rolling_interval_length);
    }
    if (cfg.update_rms_clipping && *cfg.update_rms_clipping <= 0)
      throw std::invalid_argument("optimizer.update_rms_clipping: must be a positive number or unset");
    if (cfg.update_rms_clipping && cfg.clip_update_norm)
      throw std::invalid_argument(
          "optimizer.clip_update_norm: cannot be used together with update_rms_clipping; unset one of them");
    if (cfg.clip_update_norm && cfg.clip_update_norm->rolling_interval_length < 1)
      throw std::invalid_argument("optimizer.clip_update_norm.rolling_interval_length: must be at least 1");
    rms_clip_ = cfg.update_rms_clipping;
    clip_norm_ = cfg.clip_update_norm;
    if (clip_norm_) update_norms_ = rolling_window::with_capacity(clip_norm_->rolling_interval_length);
    if (rule_.buffers.size() > 4) throw std::logic_error("rule_optimizer: at most 4 state buffers");
    if (rule_.groups.empty()) throw std::logic_error("rule_optimizer: a rule needs a group");
    trees_.resize(rule_.buffers.size());
    flats_.resize(rule_.buffers.size());
    for (std::size_t i = 0; i < rule_.buffers.size(); ++i)
      this->allocate(params, trees_[i], flats_[i], "levanter::optim::rule_state");
    descs_ = leaf_descs(params);
    for (const auto& d : descs_) {
      const std::size_t g = rule_.label ? rule_.label(d) : 0;
      if (g >= rule_.groups.size()) throw std::logic_error("rule_optimizer: a label names no group");
      group_.push_back(g);
    }
    for (std::size_t i = 0; i < descs_.size(); ++i) {
      const auto& g = rule_.groups[group_[i]];
      leaf_state_.push_back(g.leaf_state ? g.leaf_state(descs_[i]) : leaf_arrays{});
    }
    words_ = rule_.words;
    for (const auto& g : rule_.groups) {
      wd_.push_back(g.weight_decay.value_or(cfg.weight_decay));
      if (g.peak_lr) {
        OptimizerConfig own = cfg;
        own.learning_rate = *g.peak_lr;
        schedules_.push_back(make_lr_schedule(own, num_train_steps));
      } else {
        schedules_.push_back(schedule_);
      }
      has_leaf_work_ = has_leaf_work_ || static_cast<bool>(g.leaf) || static_cast<bool>(g.leaf_with_state);
    }
    const auto mask = weight_decay_mask(cfg, params);
    for (std::size_t i = 0; i < descs_.size(); ++i) decay_.push_back(wd_[group_[i]] > 0 && (!mask || (*mask)[i]));
  }

  std::string_view type_name() const override { return rule_.type; }
  double next_learning_rate() const override { return schedule_(count_); }

  update_stats update(M& params, const M& grads, double loss) override {
    auto leaves = layout::param_leaves(params);
    std::vector<const float*> g;
    haliax::tree::for_each_leaf(grads, [&](const std::string& name, const auto& leaf) {
      if (g.size() >= leaves.size() || leaf.element_count() != leaves[g.size()].n)
        throw haliax::shape_error("levanter::optim::" + std::string(rule_.type) + ": gradient leaf '" + name +
                                  "' does not match the parameter of the same position");
      g.push_back(leaf.data());
    });
    if (g.size() != leaves.size())
      throw haliax::shape_error("levanter::optim::" + std::string(rule_.type) + ": the gradient has fewer leaves");
    for (std::size_t i = 0; i < leaves.size(); ++i) leaves[i].g = g[i];
    this->average_begin(&params, nullptr);
    const auto stats = run(leaves, nullptr, nullptr, loss);
    if (this->shard_) layout::gather_params(leaves, *this->shard_);
    this->average_end(&params, nullptr);
    return stats;
  }
  update_stats update_range(float* params, const float* grads, double loss) override {
    if (!this->shard_) return optimizer<M>::update_range(params, grads, loss);
    auto leaves = this->shapes_;
    this->average_begin(nullptr, params);
    const auto stats = run(leaves, params, grads, loss);
    this->average_end(nullptr, params);
    return stats;
  }

 private:
  std::vector<state_buffer<M>> buffers() override {
    std::vector<state_buffer<M>> b;
    for (std::size_t i = 0; i < rule_.buffers.size(); ++i) b.push_back({rule_.buffers[i], &trees_[i], &flats_[i]});
    return b;
  }
  // `count`: updates seen (the schedule's step); with skip_bad_steps also `applied` (the rule's own count, which a
  // skipped step leaves alone) and the skip history.
  void save_scalars(checkpoint::snapshot& s) const override {
    s.add_scalar("count", count_);
    for (const auto& [name, v] : words_) s.add_scalar(name, v);
    if (clip_norm_) detail::add_window(s, "update_norms", update_norms_);
    for (std::size_t l = 0; l < leaf_state_.size(); ++l)
      for (const auto& [name, v] : leaf_state_[l].arrays) s.add_vector(name + "." + descs_[l].path, v);
    if (!skip_) return;
    s.add_scalar("applied", applied_);
    detail::add_window(s, "skip_losses", skip_losses_);
    detail::add_window(s, "skip_grad_norms", skip_grad_norms_);
  }
  void load_scalars(const checkpoint::reader& r) override {
    count_ = r.scalar<std::int64_t>("count");
    applied_ = count_;
    for (auto& [name, v] : words_) v = r.scalar<std::int64_t>(name);
    if (clip_norm_) detail::read_window(r, "update_norms", update_norms_);
    for (std::size_t l = 0; l < leaf_state_.size(); ++l)
      for (auto& [name, v] : leaf_state_[l].arrays) {
        const std::string key = name + "." + descs_[l].path;
        auto got = r.vector<float>(key);
        if (got.size() != v.size())
          throw checkpoint::error("'" + key + "' holds " + std::to_string(got.size()) + " values but optimizer '" +
                                  std::string(rule_.type) + "' needs " + std::to_string(v.size()) +
                                  " for this model: the checkpoint was written for another model or optimizer "
                                  "config");
        v = std::move(got);
      }
    if (!skip_) return;
    applied_ = r.scalar<std::int64_t>("applied");
    detail::read_window(r, "skip_losses", skip_losses_);
    detail::read_window(r, "skip_grad_norms", skip_grad_norms_);
  }
  void check_tensor_parallel() const override {
    if (rms_clip_)
      throw std::invalid_argument("optimizer.update_rms_clipping: not supported with tensor parallelism "
                                  "(trainer.model_axis_size > 1); use clip_update_norm or max_grad_norm");
    if (has_leaf_work_)
      throw std::invalid_argument("optimizer.type '" + std::string(rule_.type) +
                                  "': not supported with tensor parallelism (trainer.model_axis_size > 1): its update "
                                  "needs each matrix whole on one rank; use model_axis_size: 1 (FSDP and ZeRO-1 work)");
  }

  // The update over `leaves` (whole: p and g attached; sharded: this rank's chunks, from p_flat/g_flat when given,
  // else from the leaves).
  update_stats run(std::vector<layout::leaf_ref>& leaves, float* p_flat, const float* g_flat, double loss) {
    const auto* sh = this->sh();
    const auto* ts = this->ts();
    if (ts && ts->split.size() != leaves.size())
      throw std::invalid_argument("levanter::optim: the tensor split does not match the parameters");
    std::size_t num_slices = 0;
    const auto chunks = layout::make_chunks(leaves, &num_slices);
    std::size_t c_lo = 0, c_hi = chunks.size();
    if (sh) {
      while (c_lo < chunks.size() && chunks[c_lo].flat < sh->lo()) ++c_lo;
      c_hi = c_lo;
      while (c_hi < chunks.size() && chunks[c_hi].flat < sh->hi()) ++c_hi;
    }
    const std::int64_t lo = sh ? sh->lo() : 0;
    const std::size_t ng = rule_.groups.size();
    auto group_of = [&](std::size_t ci) { return group_[chunks[ci].leaf]; };
    // One chunk's pointers: sharded state lives in the flat buffers at the chunk's offset in this rank's range.
    auto at = [&](std::size_t ci) {
      const auto& ch = chunks[ci];
      const auto& l = leaves[ch.leaf];
      rule_chunk c{};
      c.n = ch.end - ch.begin;
      c.decay = decay_[ch.leaf] != 0;
      if (p_flat) {
        c.p = p_flat + (ch.flat - lo);
        c.g = g_flat + (ch.flat - lo);
      } else {
        c.p = l.p + ch.begin;
        c.g = l.g + ch.begin;
      }
      for (std::size_t b = 0; b < rule_.buffers.size(); ++b)
        c.s[b] = sh ? flats_[b].data() + (ch.flat - lo) : trees_leaf(b, ch.leaf) + ch.begin;
      c.x = scratch_.empty() ? nullptr : scratch_.data() + ch.flat;
      return c;
    };
    auto all_chunks = [&](std::vector<double> part) {
      return sh ? distributed::allgather_doubles(*sh->comm, part) : part;
    };
    // Per group: the chunks' values summed in chunk order (a split leaf's over the model group).
    auto totals = [&](const std::vector<double>& sq) {
      std::vector<double> rep(ng, 0.0), spl(ng, 0.0);
      for (std::size_t i = 0; i < sq.size(); ++i) (ts && ts->split[chunks[i].leaf] ? spl : rep)[group_of(i)] += sq[i];
      if (ts)
        for (std::size_t g = 0; g < ng; ++g) rep[g] += distributed::allreduce_sum(*ts->group, spl[g]);
      return rep;
    };
    auto sum_of = [](const std::vector<double>& v) {
      double s = 0;
      for (double x : v) s += x;
      return s;
    };
    // Runs `f(group, chunk)` for this rank's chunks whose group has `has`, in parallel; values in chunk order.
    const std::size_t mine = c_hi - c_lo;
    auto each_chunk = [&](auto has, auto&& f) {
      return all_chunks(layout::per_chunk(mine, [&](std::int64_t i) -> double {
        const std::size_t ci = c_lo + static_cast<std::size_t>(i);
        const auto& grp = rule_.groups[group_of(ci)];
        return has(grp) ? f(grp, ci) : 0.0;
      }));
    };
    if (!sh) leaf_ptrs_ = state_leaf_pointers();

    update_stats stats;
    const auto gsq = totals(each_chunk([](const rule_group&) { return true; }, [&](const rule_group&, std::size_t ci) {
      const auto c = at(ci);
      double s = 0;
      for (std::int64_t k = 0; k < c.n; ++k) s += static_cast<double>(c.g[k]) * c.g[k];
      return s;
    }));
    stats.grad_norm = std::sqrt(ng == 1 ? gsq[0] : sum_of(gsq));
    stats.learning_rate = schedule_(count_);
    if (skip_) stats.skipped = skip_step(*skip_, skip_losses_, skip_grad_norms_, loss, stats.grad_norm);
    if (stats.skipped) {  // the schedule advances; the parameters, the state and the rule's count do not
      ++count_;
      return stats;
    }

    std::vector<rule_step> st(ng);
    for (std::size_t gi = 0; gi < ng; ++gi) {
      const auto& grp = rule_.groups[gi];
      auto& s = st[gi];
      const double lr = schedules_[gi](count_);
      s.lr = static_cast<float>(lr) * static_cast<float>(grp.lr_factor);
      s.neg_lr = -s.lr;
      s.wd = static_cast<float>(wd_[gi]);
      s.t = applied_ + 1;
      s.leaves = leaves.size();
      const double norm = std::sqrt(gsq[gi]);
      const bool clip_on = grp.max_grad_norm && (*grp.max_grad_norm != 0.0 || grp.clip_at_zero);
      s.clip = clip_on && !(static_cast<float>(norm) < static_cast<float>(*grp.max_grad_norm));
      s.clip_num = clip_on ? static_cast<float>(*grp.max_grad_norm) : 1.0f;
      s.clip_den = static_cast<float>(norm);
      if (grp.constants) grp.constants(s);
    }
    ++count_;
    ++applied_;
    if (rule_.begin) {
      std::uint64_t w[4] = {};
      rule_.begin(applied_, words_, w);
      for (auto& s : st) std::copy(std::begin(w), std::end(w), s.w);
    }
    auto has_norm = [](const rule_group& g) { return g.norm_loop != nullptr; };
    if (std::any_of(rule_.groups.begin(), rule_.groups.end(), has_norm)) {
      const auto nsq = totals(each_chunk(has_norm, [&](const rule_group& g, std::size_t ci) {
        return g.norm_loop(st[group_of(ci)], at(ci));
      }));
      for (std::size_t gi = 0; gi < ng; ++gi)
        if (has_norm(rule_.groups[gi])) {
          st[gi].rule_norm = std::sqrt(nsq[gi]);
          if (rule_.groups[gi].constants) rule_.groups[gi].constants(st[gi]);  // again, now with the norm
        }
    }
    std::vector<float> leaf_mean(leaves.size(), 0.0f);
    auto has_leaf_loop = [](const rule_group& g) { return g.leaf_loop != nullptr; };
    if (std::any_of(rule_.groups.begin(), rule_.groups.end(), has_leaf_loop)) {
      // per leaf: the chunks' sums in chunk order (a split leaf's over the model group), over the leaf's size
      const auto part = each_chunk(has_leaf_loop, [&](const rule_group& g, std::size_t ci) {
        return g.leaf_loop(st[group_of(ci)], at(ci));
      });
      std::vector<double> sum(leaves.size(), 0.0), size(leaves.size(), 0.0);
      for (std::size_t i = 0; i < part.size(); ++i) sum[chunks[i].leaf] += part[i];
      for (std::size_t l = 0; l < leaves.size(); ++l) size[l] = static_cast<double>(leaves[l].n);
      if (ts)
        for (std::size_t l = 0; l < leaves.size(); ++l)
          if (ts->split[l]) {
            sum[l] = distributed::allreduce_sum(*ts->group, sum[l]);
            size[l] = distributed::allreduce_sum(*ts->group, size[l]);
          }
      for (std::size_t l = 0; l < leaves.size(); ++l)
        leaf_mean[l] = static_cast<float>(sum[l]) / static_cast<float>(size[l]);
    }
    if (has_leaf_work_) prepare(leaves, chunks, c_lo, mine, st, at);
    auto every = [](const rule_group&) { return true; };
    if (!rms_clip_ && !clip_norm_) {
      const auto usq = totals(each_chunk(every, [&](const rule_group& g, std::size_t ci) {
        auto c = at(ci);
        c.leaf_mean = leaf_mean[chunks[ci].leaf];
        return g.loop(st[group_of(ci)], c);
      }));
      stats.update_norm = std::sqrt(sum_of(usq));
      return stats;
    }
    // Clipping the update (upstream's AdamW chain: after add_decayed_weights, before the learning rate): the loop
    // records its direction, the decay is added, the norms are taken (per slice: a Stacked leaf's layer), then the
    // clipped step is applied.
    const std::int64_t range = sh ? sh->hi() - sh->lo() : [&] {
      std::int64_t t = 0;
      for (const auto& l : leaves) t += l.n;
      return t;
    }();
    record_.assign(static_cast<std::size_t>(range), 0.0f);
    auto rec = [&](std::size_t ci) { return record_.data() + (chunks[ci].flat - lo); };
    each_chunk(every, [&](const rule_group& g, std::size_t ci) {
      auto c = at(ci);
      c.leaf_mean = leaf_mean[chunks[ci].leaf];
      c.p = rec(ci);
      c.decay = false;
      rule_step s = st[group_of(ci)];
      s.wd = 0;
      s.neg_lr = -1;
      g.loop(s, c);
      return 0.0;
    });
    const auto sq = each_chunk(every, [&](const rule_group&, std::size_t ci) {
      auto c = at(ci);
      c.x = rec(ci);
      return detail::finish_recorded(st[group_of(ci)], c);
    });
    std::vector<float> slice_div(num_slices, 1.0f);
    float mul = 1.0f;
    if (rms_clip_) {
      // scan_aware_clip_by_block_rms: u / max(1, rms(u) / threshold), per leaf or per Stacked layer
      std::vector<double> slice_sq(num_slices, 0.0);
      std::vector<std::size_t> slice_leaf(num_slices, 0);
      for (std::size_t i = 0; i < chunks.size(); ++i) {
        slice_sq[chunks[i].slice] += sq[i];
        slice_leaf[chunks[i].slice] = chunks[i].leaf;
      }
      for (std::size_t k = 0; k < num_slices; ++k) {
        const auto& l = leaves[slice_leaf[k]];
        const double rms = std::sqrt(slice_sq[k] / static_cast<double>(l.n / l.slices));
        slice_div[k] = std::max(1.0f, static_cast<float>(rms / *rms_clip_));
      }
    } else {
      // clip_update_by_historical_norm: scale by threshold / norm when the norm exceeds the history's
      // mean + sigma * std; the unclipped norm joins the history
      const double norm = std::sqrt(sum_of(totals(sq)));
      const double max_norm = update_norms_.ready() ? update_norms_.threshold(clip_norm_->sigma_factor)
                                                    : std::numeric_limits<double>::infinity();
      if (norm > max_norm) mul = static_cast<float>(max_norm / std::max(norm, 1e-6));
      update_norms_.push(norm);
    }
    const auto usq = totals(each_chunk(every, [&](const rule_group&, std::size_t ci) {
      auto c = at(ci);
      c.x = rec(ci);
      rule_step s = st[group_of(ci)];
      s.k[0] = slice_div[chunks[ci].slice];
      s.k[1] = mul;
      return detail::apply_recorded(s, c);
    }));
    stats.update_norm = std::sqrt(sum_of(usq));
    return stats;
  }

  // The groups' `prep` over this rank's chunks into the scratch (the whole model's size, at flat offsets), the
  // scratch gathered from every rank when the state is split, then each group's leaf work on every whole leaf that
  // this rank updates part of (a leaf that straddles two ranks is computed by both, identically).
  template <class At>
  void prepare(const std::vector<layout::leaf_ref>& leaves, const std::vector<layout::chunk>& chunks,
               std::size_t c_lo, std::size_t mine, const std::vector<rule_step>& st, At&& at) {
    const auto* sh = this->sh();
    std::int64_t total = 0;
    for (const auto& l : leaves) total += l.n;
    if (static_cast<std::int64_t>(scratch_.size()) != total) scratch_.assign(static_cast<std::size_t>(total), 0.0f);
    layout::per_chunk(mine, [&](std::int64_t i) -> double {
      const std::size_t ci = c_lo + static_cast<std::size_t>(i);
      const std::size_t gi = group_[chunks[ci].leaf];
      const auto& g = rule_.groups[gi];
      return g.prep ? g.prep(st[gi], at(ci)) : 0.0;
    });
    if (sh && sh->comm->size() > 1) distributed::allgather_ranges(*sh->comm, scratch_.data(), sh->bounds);
    const std::int64_t lo = sh ? sh->lo() : 0, hi = sh ? sh->hi() : total;
    std::int64_t off = 0;
    for (std::size_t l = 0; l < leaves.size(); ++l) {
      const auto& g = rule_.groups[group_[l]];
      if (g.leaf && off < hi && off + leaves[l].n > lo) g.leaf(st[group_[l]], descs_[l], scratch_.data() + off);
      if (g.leaf_with_state) g.leaf_with_state(st[group_[l]], descs_[l], l, scratch_.data() + off, leaf_state_[l]);
      off += leaves[l].n;
    }
  }

  // Replicated state: per buffer, per leaf, the first element.
  std::vector<std::vector<float*>> state_leaf_pointers() {
    std::vector<std::vector<float*>> out(trees_.size());
    for (std::size_t b = 0; b < trees_.size(); ++b)
      haliax::tree::for_each_leaf(trees_[b], [&](const std::string&, auto& leaf) { out[b].push_back(leaf.data()); });
    return out;
  }
  float* trees_leaf(std::size_t b, std::size_t leaf) const { return leaf_ptrs_[b][leaf]; }

  rule_def rule_;
  lr_schedule schedule_;                 // optimizer.learning_rate's (what stats and the tracker report)
  std::vector<lr_schedule> schedules_;   // per group
  std::vector<double> wd_;               // per group
  std::vector<std::size_t> group_;       // per leaf
  std::vector<leaf_desc> descs_;         // per leaf
  bool has_leaf_work_ = false;
  std::vector<M> trees_;
  std::vector<distributed::device_copy::flat> flats_;
  std::vector<char> decay_;
  std::int64_t count_ = 0;    // updates seen, skipped ones included: the schedule's step
  std::int64_t applied_ = 0;  // updates applied: the rule's t
  std::optional<SkipStepConfig> skip_;
  rolling_window skip_losses_, skip_grad_norms_;
  std::vector<std::vector<float*>> leaf_ptrs_;
  std::vector<float> scratch_;
  std::optional<double> rms_clip_;                  // update_rms_clipping
  std::optional<ClipUpdateNormConfig> clip_norm_;   // clip_update_norm
  rolling_window update_norms_;                     // its history (unclipped norms of applied steps)
  std::vector<float> record_;                       // the recorded directions (this rank's range)
  std::vector<leaf_arrays> leaf_state_;                            // per leaf (rule_group::leaf_state)
  std::vector<std::pair<std::string, std::int64_t>> words_;       // rule_def::words
};

}  // namespace levanter::optim
