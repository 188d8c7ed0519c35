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
// The element loops are compiled once into levanter_core (src/optim/rules.cpp) for the baseline instruction set, so
// every program computes the same bits. They read host memory: a build whose arrays live on a GPU refuses these
// optimizers when they are made (AdamW has device kernels; the others wait for theirs).
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
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
};

/// One chunk of one leaf: the parameters, the gradient and the rule's state buffers at the same elements.
struct rule_chunk {
  float* p;
  const float* g;
  float* s[4];
  int64_t n;
  bool decay;
  float leaf_mean;  ///< rule_def::leaf_loop's sum over the whole leaf divided by its size (0 without one)
};

/// A rule's element loop: updates p and the state over the chunk and returns the sum of the squares of the change
/// made to p (float squares added in double, in element order).
using element_loop = double (*)(const rule_step&, const rule_chunk&);

/// An optimizer as a rule (see the file comment). `constants` fills the rule's part of the step.
struct rule_def {
  std::string_view type;                 ///< optimizer.type
  std::vector<std::string> buffers;      ///< state buffer names, as opt_state.h5 holds them (at most 4)
  element_loop loop = nullptr;
  std::function<void(rule_step&)> constants;  ///< a pure function of the step's fields (may run twice)
  std::optional<double> max_grad_norm;   ///< clip_by_global_norm before the rule (unset or 0: none)
  bool clip_at_zero = false;             ///< max_grad_norm 0 clips to zero (upstream tests `is not None`)
  /// Optional: per chunk, the sum of squares of what the rule clips by its own global norm (MARS); the engine puts
  /// the norm over every chunk (and rank) in rule_step::rule_norm before `constants` runs.
  element_loop norm_loop = nullptr;
  /// Optional: per chunk, a sum the rule needs over each whole leaf (Cautious's agreeing elements); it runs first
  /// and updates the state, and `loop` sees the leaf's mean in rule_chunk::leaf_mean and leaves the state alone.
  element_loop leaf_loop = nullptr;
};

namespace detail {
void check_rule_placement(std::string_view type);  // src/optim/rules.cpp: refuses arrays in device memory
}

/// A rule run over a parameter tree of type `M`, wherever its state lies. opt_state.h5 holds the buffers by name
/// (`<buffer>.<path>`) and `count` (updates seen).
template <class M>
class rule_optimizer final : public placed_optimizer<M> {
 public:
  rule_optimizer(rule_def rule, const OptimizerConfig& cfg, std::int64_t num_train_steps, const M& params,
                 distributed::communicator* comm = nullptr, bool sharded = false)
      : placed_optimizer<M>(params, comm, sharded), rule_(std::move(rule)), wd_(cfg.weight_decay),
        schedule_(make_lr_schedule(cfg, num_train_steps)) {
    detail::check_rule_placement(rule_.type);
    if (rule_.buffers.size() > 4) throw std::logic_error("rule_optimizer: at most 4 state buffers");
    trees_.resize(rule_.buffers.size());
    flats_.resize(rule_.buffers.size());
    for (std::size_t i = 0; i < rule_.buffers.size(); ++i)
      this->allocate(params, trees_[i], flats_[i], "levanter::optim::rule_state");
    const auto mask = weight_decay_mask(cfg, params);
    std::size_t i = 0;
    for_each_leaf_info(params, [&](const leaf_info&, const auto&) {
      decay_.push_back(cfg.weight_decay > 0 && (!mask || (*mask)[i]));
      ++i;
    });
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
  void save_scalars(checkpoint::snapshot& s) const override { s.add_scalar("count", count_); }
  void load_scalars(const checkpoint::reader& r) override { count_ = r.scalar<std::int64_t>("count"); }

  // The update over `leaves` (whole: p and g attached; sharded: this rank's chunks, from p_flat/g_flat when given,
  // else from the leaves).
  update_stats run(std::vector<layout::leaf_ref>& leaves, float* p_flat, const float* g_flat, double /*loss*/) {
    const auto* sh = this->sh();
    const auto* ts = this->ts();
    if (ts && ts->split.size() != leaves.size())
      throw std::invalid_argument("levanter::optim: the tensor split does not match the parameters");
    const auto chunks = layout::make_chunks(leaves);
    std::size_t c_lo = 0, c_hi = chunks.size();
    if (sh) {
      while (c_lo < chunks.size() && chunks[c_lo].flat < sh->lo()) ++c_lo;
      c_hi = c_lo;
      while (c_hi < chunks.size() && chunks[c_hi].flat < sh->hi()) ++c_hi;
    }
    const std::int64_t lo = sh ? sh->lo() : 0;
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
      return c;
    };
    auto all_chunks = [&](std::vector<double> part) {
      return sh ? distributed::allgather_doubles(*sh->comm, part) : part;
    };
    auto total_of = [&](const std::vector<double>& sq) {
      double rep = 0, spl = 0;
      for (std::size_t i = 0; i < sq.size(); ++i) (ts && ts->split[chunks[i].leaf] ? spl : rep) += sq[i];
      if (!ts) return rep;
      return rep + distributed::allreduce_sum(*ts->group, spl);
    };
    const std::size_t mine = c_hi - c_lo;
    if (!sh) leaf_ptrs_ = state_leaf_pointers();

    update_stats stats;
    const auto gsq = all_chunks(layout::per_chunk(mine, [&](std::int64_t i) {
      const auto c = at(c_lo + static_cast<std::size_t>(i));
      double s = 0;
      for (std::int64_t k = 0; k < c.n; ++k) s += static_cast<double>(c.g[k]) * c.g[k];
      return s;
    }));
    stats.grad_norm = std::sqrt(total_of(gsq));
    stats.learning_rate = schedule_(count_);
    ++count_;

    rule_step st;
    st.lr = static_cast<float>(stats.learning_rate);
    st.neg_lr = static_cast<float>(-stats.learning_rate);
    st.wd = static_cast<float>(wd_);
    st.t = count_;
    const bool clip_on = rule_.max_grad_norm && (*rule_.max_grad_norm != 0.0 || rule_.clip_at_zero);
    st.clip = clip_on && !(static_cast<float>(stats.grad_norm) < static_cast<float>(*rule_.max_grad_norm));
    st.clip_num = clip_on ? static_cast<float>(*rule_.max_grad_norm) : 1.0f;
    st.clip_den = static_cast<float>(stats.grad_norm);
    if (rule_.constants) rule_.constants(st);
    if (rule_.norm_loop) {
      const auto nsq = all_chunks(layout::per_chunk(mine, [&](std::int64_t i) {
        return rule_.norm_loop(st, at(c_lo + static_cast<std::size_t>(i)));
      }));
      st.rule_norm = std::sqrt(total_of(nsq));
      if (rule_.constants) rule_.constants(st);  // again, now with the norm
    }
    std::vector<float> leaf_mean(leaves.size(), 0.0f);
    if (rule_.leaf_loop) {
      // per leaf: the chunks' sums in chunk order (a split leaf's over the model group), over the leaf's size
      const auto part = all_chunks(layout::per_chunk(mine, [&](std::int64_t i) {
        return rule_.leaf_loop(st, at(c_lo + static_cast<std::size_t>(i)));
      }));
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
    const auto usq = all_chunks(layout::per_chunk(mine, [&](std::int64_t i) {
      auto c = at(c_lo + static_cast<std::size_t>(i));
      c.leaf_mean = leaf_mean[chunks[c_lo + static_cast<std::size_t>(i)].leaf];
      return rule_.loop(st, c);
    }));
    stats.update_norm = std::sqrt(total_of(usq));
    return stats;
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
  double wd_;
  lr_schedule schedule_;
  std::vector<M> trees_;
  std::vector<distributed::device_copy::flat> flats_;
  std::vector<char> decay_;
  std::int64_t count_ = 0;
  std::vector<std::vector<float*>> leaf_ptrs_;
};

}  // namespace levanter::optim
