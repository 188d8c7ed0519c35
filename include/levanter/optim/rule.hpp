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
  const float* aux = nullptr;  ///< rule_def::probe's answer at these elements on the steps that asked, else null
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
  /// Optional (Sophia-H): the key of the Hessian probe the update applied as step `t` needs, or nullopt. The caller
  /// (the Trainer) then computes v ⊙ (H v) for v = hessian_probe_direction(key) at the parameters before the update
  /// and hands it over with optimizer::set_hessian_product; the loop reads it in rule_chunk::aux.
  std::function<std::optional<hvp_probe>(std::int64_t t, const std::vector<std::pair<std::string, std::int64_t>>& words)>
      probe;
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

/// The model-independent half of every rule optimizer, compiled once (src/optim/rule_engine.cpp): the rule, its
/// schedules and per-leaf facts, the scalars it checkpoints, and the update over the flat state. rule_optimizer<M>
/// adds what depends on the parameter tree: the state buffers' placement and the leaf pointers.
class rule_engine {
 public:
  /// `descs` and `decay_mask` in tree order (the mask: weight_decay_mask's, nullopt when every leaf decays).
  rule_engine(rule_def rule, const OptimizerConfig& cfg, std::int64_t num_train_steps, std::vector<leaf_desc> descs,
              const std::optional<std::vector<bool>>& decay_mask);

  const rule_def& rule() const { return rule_; }
  /// rule_def::probe for the next applied update.
  std::optional<hvp_probe> probe() const { return rule_.probe ? rule_.probe(applied_ + 1, words_) : std::nullopt; }
  double next_learning_rate() const { return schedule_(count_); }

  /// Where the state buffers lie for one update: sharded (`sh` set), `state[b][0]` is buffer b's first element of
  /// this rank's range; replicated, `state[b][l]` is buffer b's leaf l.
  struct placement {
    const shard* sh = nullptr;
    const tensor_split* ts = nullptr;
    std::vector<std::vector<float*>> state;
    const float* aux = nullptr;  ///< rule_chunk::aux's source: flat offset f is aux[f - aux_lo]
    std::int64_t aux_lo = 0;
  };
  /// The update over `leaves` (whole: p and g attached; sharded: this rank's chunks, from p_flat/g_flat when given,
  /// else from the leaves).
  update_stats run(std::vector<layout::leaf_ref>& leaves, float* p_flat, const float* g_flat, double loss,
                   const placement& where);

  // `count`: updates seen (the schedule's step); with skip_bad_steps also `applied` (the rule's own count, which a
  // skipped step leaves alone) and the skip history; the rule's words, the update-norm history and the leaf arrays.
  void save_scalars(checkpoint::snapshot& s) const;
  void load_scalars(const checkpoint::reader& r);
  void check_tensor_parallel() const;

 private:
  void prepare(const std::vector<layout::leaf_ref>& leaves, const std::vector<layout::chunk>& chunks,
               std::size_t c_lo, std::size_t mine, const std::vector<rule_step>& st, const shard* sh,
               const std::function<rule_chunk(std::size_t)>& at);

  rule_def rule_;
  lr_schedule schedule_;                 // optimizer.learning_rate's (what stats and the tracker report)
  std::vector<lr_schedule> schedules_;   // per group
  std::vector<double> wd_;               // per group
  std::vector<std::size_t> group_;       // per leaf
  std::vector<leaf_desc> descs_;         // per leaf
  bool has_leaf_work_ = false;
  std::vector<char> decay_;
  std::int64_t count_ = 0;    // updates seen, skipped ones included: the schedule's step
  std::int64_t applied_ = 0;  // updates applied: the rule's t
  std::optional<SkipStepConfig> skip_;
  rolling_window skip_losses_, skip_grad_norms_;
  std::vector<float> scratch_;
  std::optional<double> rms_clip_;                  // update_rms_clipping
  std::optional<ClipUpdateNormConfig> clip_norm_;   // clip_update_norm
  rolling_window update_norms_;                     // its history (unclipped norms of applied steps)
  std::vector<float> record_;                       // the recorded directions (this rank's range)
  std::vector<leaf_arrays> leaf_state_;                            // per leaf (rule_group::leaf_state)
  std::vector<std::pair<std::string, std::int64_t>> words_;       // rule_def::words
};

/// A rule run over a parameter tree of type `M`, wherever its state lies. opt_state.h5 holds the buffers by name
/// (`<buffer>.<path>`) and `count` (updates seen).
template <class M>
class rule_optimizer final : public placed_optimizer<M> {
 public:
  rule_optimizer(rule_def rule, const OptimizerConfig& cfg, std::int64_t num_train_steps, const M& params,
                 distributed::communicator* comm = nullptr, bool sharded = false)
      : placed_optimizer<M>(params, comm, sharded),
        engine_(std::move(rule), cfg, num_train_steps, leaf_descs(params), weight_decay_mask(cfg, params)) {
    const auto& names = engine_.rule().buffers;
    trees_.resize(names.size());
    flats_.resize(names.size());
    for (std::size_t i = 0; i < names.size(); ++i)
      this->allocate(params, trees_[i], flats_[i], "levanter::optim::rule_state");
  }

  std::string_view type_name() const override { return engine_.rule().type; }
  double next_learning_rate() const override { return engine_.next_learning_rate(); }
  std::optional<hvp_probe> hessian_probe() const override { return engine_.probe(); }
  void set_hessian_product(std::vector<float> d, std::int64_t lo) override {
    hvp_ = std::move(d);
    hvp_lo_ = lo;
  }

  update_stats update(M& params, const M& grads, double loss) override {
    auto leaves = layout::param_leaves(params);
    std::vector<const float*> g;
    haliax::tree::for_each_leaf(grads, [&](const std::string& name, const auto& leaf) {
      if (g.size() >= leaves.size() || leaf.element_count() != leaves[g.size()].n)
        throw haliax::shape_error("levanter::optim::" + std::string(type_name()) + ": gradient leaf '" + name +
                                  "' does not match the parameter of the same position");
      g.push_back(leaf.data());
    });
    if (g.size() != leaves.size())
      throw haliax::shape_error("levanter::optim::" + std::string(type_name()) + ": the gradient has fewer leaves");
    for (std::size_t i = 0; i < leaves.size(); ++i) leaves[i].g = g[i];
    this->average_begin(&params, nullptr);
    const auto stats = engine_.run(leaves, nullptr, nullptr, loss, where(leaves));
    hvp_.clear();
    if (this->shard_) layout::gather_params(leaves, *this->shard_);
    this->average_end(&params, nullptr);
    return stats;
  }
  update_stats update_range(float* params, const float* grads, double loss) override {
    if (!this->shard_) return optimizer<M>::update_range(params, grads, loss);
    auto leaves = this->shapes_;
    this->average_begin(nullptr, params);
    const auto stats = engine_.run(leaves, params, grads, loss, where(leaves));
    hvp_.clear();
    this->average_end(nullptr, params);
    return stats;
  }

 private:
  std::vector<state_buffer<M>> buffers() override {
    std::vector<state_buffer<M>> b;
    for (std::size_t i = 0; i < trees_.size(); ++i) b.push_back({engine_.rule().buffers[i], &trees_[i], &flats_[i]});
    return b;
  }
  void save_scalars(checkpoint::snapshot& s) const override { engine_.save_scalars(s); }
  void load_scalars(const checkpoint::reader& r) override { engine_.load_scalars(r); }
  void check_tensor_parallel() const override { engine_.check_tensor_parallel(); }

  // The state's pointers, and the Hessian product when the update needs one (it must cover what the update
  // touches: this rank's range of the flat parameters when sharded, else all of them).
  rule_engine::placement where(const std::vector<layout::leaf_ref>& leaves) {
    rule_engine::placement at;
    if (engine_.probe()) {
      std::int64_t lo = 0, hi = 0;
      if (this->sh()) {
        lo = this->sh()->lo();
        hi = this->sh()->hi();
      } else {
        for (const auto& l : leaves) hi += l.n;
      }
      if (hvp_.empty() || hvp_lo_ > lo || hvp_lo_ + static_cast<std::int64_t>(hvp_.size()) < hi)
        throw std::logic_error("optimizer '" + std::string(type_name()) +
                               "': this update re-estimates the Hessian and needs set_hessian_product first (the "
                               "Trainer does it; see levanter/optim/hessian.hpp)");
      at.aux = hvp_.data();
      at.aux_lo = hvp_lo_;
    }
    at.sh = this->sh();
    at.ts = this->ts();
    at.state.resize(trees_.size());
    for (std::size_t b = 0; b < trees_.size(); ++b) {
      if (at.sh)
        at.state[b].push_back(flats_[b].data());
      else
        haliax::tree::for_each_leaf(trees_[b], [&](const std::string&, auto& leaf) { at.state[b].push_back(leaf.data()); });
    }
    return at;
  }

  rule_engine engine_;
  std::vector<float> hvp_;  // set_hessian_product's d (cleared by the update that uses it)
  std::int64_t hvp_lo_ = 0;
  std::vector<M> trees_;
  std::vector<distributed::device_copy::flat> flats_;
};

}  // namespace levanter::optim
