// levanter/optim/placement.hpp: what the Trainer needs of an optimizer (`optimizer<M>`), and `placed_optimizer<M>`,
// the base every optimizer is written on: it places the state buffers shaped like the parameters (replicated,
// sharded over the data ranks, sliced under tensor parallelism) and writes, reads and shows them as whole trees.
// The optimizers themselves: optim/optimizer.hpp (AdamW, make_optimizer) and optim/rule.hpp (the others).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <levanter/checkpoint/h5.hpp>
#include <levanter/optim/layout.hpp>

namespace levanter::optim {

/// Tensor parallelism as an optimizer sees it: its state is shaped like this rank's slices of the parameters;
/// checkpoints and trainer.watch see whole trees (levanter/distributed/tensor_parallel.hpp).
template <class M>
struct tensor_parallel_codec {
  distributed::communicator* group = nullptr;  ///< the model group
  std::vector<char> split;                     ///< per leaf in tree order: sliced over the group
  std::function<M(const M& local)> to_global;  ///< collective over `group`
  std::function<M(const M& global)> to_local;
  std::function<M(const M& global)> local_zeros;
};

/// trainer.model_averaging as the optimizer keeps it (upstream optim/model_averaging.py): after every update,
/// average <- a * params + b * average, the average starting from the parameters before the first update.
struct model_averaging {
  enum class kind { ema, ema_decay_sqrt } type = kind::ema;
  double beta = 0.999;
  std::int64_t switch_step = 100000, decay_steps = 100000;
};

/// A Hessian-vector product an optimizer asks for before its next update (Sophia-H's Hutchinson estimate): the
/// key of the probe direction v = hessian_probe_direction(key), upstream's tree_gaussian_like.
struct hvp_probe {
  std::uint32_t k0 = 0, k1 = 0;
};

/// An optimizer with its state, for parameter trees of type `M`.
template <class M>
class optimizer {
 public:
  virtual ~optimizer() = default;
  /// The `optimizer.type` it was built from.
  virtual std::string_view type_name() const = 0;
  /// One step: `params` updated in place from `grads`; `loss` is for optimizers that look at it (skip_bad_steps).
  virtual update_stats update(M& params, const M& grads, double loss) = 0;
  /// The learning rate of the next update (for messages).
  virtual double next_learning_rate() const = 0;
  /// Adds the state to the snapshot that becomes `opt_state.h5` (`params` gives the shapes). A sharded optimizer
  /// gathers its state to rank 0, which alone adds it: every rank must call this.
  virtual void save_state(checkpoint::snapshot& s, const M& params) const = 0;
  /// Loads the state written by save_state (whatever the rank count that wrote it); returns the leaves kept at
  /// their initial values (allow_partial). Throws checkpoint::error when the file does not match.
  virtual std::vector<std::string> load_state(const checkpoint::reader& r, bool allow_partial, const M& params) = 0;
  /// Each piece of state shaped like the parameters, by name (`mu`, `nu`): what `trainer.watch` calls opt_state.
  /// A sharded optimizer gathers it (every rank must call this).
  virtual void for_each_state_tree(const std::function<void(const std::string&, const M&)>& f,
                                   const M& params) const = 0;
  /// When the state is sharded over ranks (ZeRO-1): the ranges of the flattened parameters each rank updates;
  /// `update` then needs the reduced gradient only in this rank's range. Null when every rank updates everything.
  virtual const std::vector<std::int64_t>* shard_bounds() const { return nullptr; }
  /// FSDP: the parameters and the summed gradient exist only as this rank's range of shard_bounds() (flat, in
  /// tree order); updates `params` in place. Only sharded optimizers have it.
  virtual update_stats update_range(float* /*params*/, const float* /*grads*/, double /*loss*/) {
    throw std::logic_error("optimizer '" + std::string(type_name()) +
                           "' cannot update parameters sharded over ranks (FSDP)");
  }
  /// Tensor parallelism: from now on the parameters given to `update` are this rank's slices (the state was made
  /// for them); save_state / load_state / for_each_state_tree take and give whole trees (collective over the
  /// group). Throws std::invalid_argument naming a setting that cannot work split.
  virtual void set_tensor_parallel(tensor_parallel_codec<M>) {
    throw std::logic_error("optimizer '" + std::string(type_name()) + "' does not support tensor parallelism");
  }
  /// Keeps an average of the parameters, placed like the state (`params`: as `update` will see them); checkpoints
  /// hold it as `model_averaging.model.<path>`. Call before the first update (and before set_tensor_parallel's
  /// codec is needed: after it).
  virtual void set_model_averaging(const model_averaging&, const M& /*params*/) {
    throw std::logic_error("optimizer '" + std::string(type_name()) + "' cannot keep a model average");
  }
  virtual bool averages() const { return false; }
  /// Second-order optimizers (Sophia-H): the probe the next update needs, or nullopt (every other optimizer). The
  /// caller computes d = v ⊙ (H v) of the step's loss at the parameters before the update, for v the probe's
  /// direction, and passes it to set_hessian_product before calling update / update_range.
  virtual std::optional<hvp_probe> hessian_probe() const { return std::nullopt; }
  /// d over the flattened parameters [lo, lo + d.size()) in tree order: the whole model, or this rank's range of
  /// shard_bounds() under FSDP (what update_range sees). Used by the next update only.
  virtual void set_hessian_product(std::vector<float> /*d*/, std::int64_t /*lo*/) {
    throw std::logic_error("optimizer '" + std::string(type_name()) + "' does not use Hessian-vector products");
  }
  /// The average as a whole tree shaped like `params` (the whole model); collective like for_each_state_tree.
  virtual M averaged_model(const M& params) const {
    throw std::logic_error("optimizer '" + std::string(type_name()) + "' keeps no model average");
  }
};

namespace detail {
inline void add_window(checkpoint::snapshot& s, const std::string& name, const rolling_window& w) {
  s.add_vector(name + ".values", w.values);
  std::vector<std::uint8_t> valid(w.valid.begin(), w.valid.end());
  s.add_vector(name + ".valid", valid);
  s.add_scalar(name + ".index", static_cast<std::int64_t>(w.index));
  s.add_scalar(name + ".count", static_cast<std::int64_t>(w.count));
}
inline void read_window(const checkpoint::reader& r, const std::string& name, rolling_window& w) {
  auto values = r.vector<float>(name + ".values");
  if (values.size() != w.values.size())
    throw checkpoint::error("'" + name + "' in '" + r.path() + "' holds " + std::to_string(values.size()) +
                            " entries but the optimizer config asks for " + std::to_string(w.values.size()) +
                            " (was skip_bad_steps or clip_update_norm changed?)");
  w.values = std::move(values);
  const auto valid = r.vector<std::uint8_t>(name + ".valid");
  w.valid.assign(valid.begin(), valid.end());
  w.index = r.scalar<std::int64_t>(name + ".index");
  w.count = r.scalar<std::int64_t>(name + ".count");
}
}  // namespace detail

/// One piece of an optimizer's state shaped like the parameters (`mu`, `nu`, a momentum): a whole tree when every
/// rank updates everything, or this rank's range of the flattened parameters (ZeRO-1, FSDP).
template <class M>
struct state_buffer {
  std::string name;
  M* tree;
  distributed::device_copy::flat* flat;
};

/// What every optimizer shares: where its state lies. A subclass names its buffers shaped like the parameters and
/// its scalars; this class places the buffers (replicated, sharded over the data ranks, sliced under tensor
/// parallelism), and writes, reads and shows them as whole trees whatever the placement: checkpoints hold the same
/// `opt_state.h5` for every rank count. An optimizer written on it gets ZeRO-1, FSDP and tensor parallelism without
/// code of its own (docs/architecture.md, "Adding an optimizer").
template <class M>
class placed_optimizer : public optimizer<M> {
 public:
  void set_tensor_parallel(tensor_parallel_codec<M> c) override {
    check_tensor_parallel();
    if (c.split.size() != leaf_count_)
      throw std::invalid_argument("set_tensor_parallel: the split does not match the parameters");
    split_ = optim::tensor_split{c.group, c.split};
    tp_ = std::move(c);
  }
  void save_state(checkpoint::snapshot& s, const M& params) const override {
    auto bufs = const_cast<placed_optimizer*>(this)->saved_buffers();
    if (tp_) {
      // every rank of the job takes part; the trees are whole
      for (auto& b : bufs) s.add_tree(b.name, global_state(*b.flat, *b.tree, params));
    } else if (shard_) {
      std::vector<std::optional<M>> whole;
      for (auto& b : bufs) whole.push_back(gather(*b.flat, params));
      if (shard_->comm->rank() != 0) return;
      for (std::size_t i = 0; i < bufs.size(); ++i) s.add_tree(bufs[i].name, *whole[i]);
    } else {
      for (auto& b : bufs) s.add_tree(b.name, *b.tree);
    }
    save_scalars(s);
    if (avg_) {
      s.add_scalar("model_averaging.tot_weight", avg_tot_);
      s.add_scalar("model_averaging.steps", avg_steps_);
    }
  }
  std::vector<std::string> load_state(const checkpoint::reader& r, bool allow_partial, const M& params) override {
    std::vector<std::string> missing;
    auto add = [&](const std::vector<std::string>& m) { missing.insert(missing.end(), m.begin(), m.end()); };
    for (auto& b : saved_buffers()) {
      if (!tp_ && !shard_) {
        add(r.read_tree(b.name, *b.tree, allow_partial));
        continue;
      }
      // The file holds whole trees (whatever the rank count that wrote them): keep this rank's slices, and its range
      // of them when sharded.
      M whole = layout::zeros_like(params);
      add(r.read_tree(b.name, whole, allow_partial));
      M mine = tp_ ? tp_->to_local(whole) : std::move(whole);
      if (shard_)
        slice(mine, *b.flat);
      else
        *b.tree = std::move(mine);
    }
    load_scalars(r);
    if (avg_) {
      avg_tot_ = r.scalar<double>("model_averaging.tot_weight");
      avg_steps_ = r.scalar<std::int64_t>("model_averaging.steps");
      avg_ready_ = true;
    }
    return missing;
  }
  void set_model_averaging(const model_averaging& m, const M& params) override {
    if (!haliax::detail::host_memory)
      throw std::invalid_argument("trainer.model_averaging: the average is kept on the host, and this build keeps the "
                                  "parameters in device memory; remove trainer.model_averaging");
    avg_ = m;
    allocate(params, avg_tree_, avg_flat_, "levanter::optim::model_average");
  }
  bool averages() const override { return avg_.has_value(); }
  M averaged_model(const M& params) const override {
    if (!avg_) return optimizer<M>::averaged_model(params);
    if (!avg_ready_)  // no update yet: the average is the model
      return haliax::tree::map(params, [](const std::string&, const auto& x) { return x * 1.0f; });
    if (tp_) return global_state(avg_flat_, avg_tree_, params);
    if (shard_) return *gather(avg_flat_, params, true);
    return haliax::tree::map(avg_tree_, [](const std::string&, const auto& x) { return x * 1.0f; });
  }
  void for_each_state_tree(const std::function<void(const std::string&, const M&)>& f,
                           const M& params) const override {
    for (auto& b : const_cast<placed_optimizer*>(this)->buffers()) {
      if (tp_)
        f(b.name, global_state(*b.flat, *b.tree, params));
      else if (shard_)
        f(b.name, *gather(*b.flat, params, true));  // every rank takes part in the gathers
      else
        f(b.name, *b.tree);
    }
  }
  const std::vector<std::int64_t>* shard_bounds() const override { return shard_ ? &shard_->bounds : nullptr; }

 protected:
  /// With `comm` of more than one rank and `sharded`, the state is split over the ranks (ZeRO-1, FSDP).
  placed_optimizer(const M& params, distributed::communicator* comm, bool sharded) {
    shapes_ = layout::param_leaves(const_cast<M&>(params));
    for (auto& l : shapes_) l.p = nullptr;
    leaf_count_ = shapes_.size();
    if (comm && sharded && comm->size() > 1) shard_ = optim::shard{comm, layout::shard_bounds(params, comm->size())};
  }
  /// The state shaped like the parameters, in the order the checkpoint holds them.
  virtual std::vector<state_buffer<M>> buffers() = 0;
  virtual void save_scalars(checkpoint::snapshot& s) const = 0;
  virtual void load_scalars(const checkpoint::reader& r) = 0;
  /// Throws std::invalid_argument naming a setting that cannot work with tensor parallelism.
  virtual void check_tensor_parallel() const {}

  const optim::shard* sh() const { return shard_ ? &*shard_ : nullptr; }

  /// Model averaging, for update() (whole parameters, `tree`) and update_range() (this rank's range, `flat`): before
  /// an update, the first time, the average becomes the parameters; after it, the average takes its step.
  void average_begin(const M* tree, const float* flat) {
    if (!avg_ || avg_ready_) return;
    for_my_elements(tree, flat, [](float* a, const float* p, std::int64_t n) { std::copy(p, p + n, a); });
    avg_ready_ = true;
  }
  void average_end(const M* tree, const float* flat) {
    if (!avg_) return;
    float a, b;
    if (avg_->type == model_averaging::kind::ema) {
      // optax.incremental_update(new, old, 1 - beta): (1 - beta) * new + (1 - (1 - beta)) * old
      a = static_cast<float>(1.0 - avg_->beta);
      b = static_cast<float>(1.0 - (1.0 - avg_->beta));
    } else {
      const double step = static_cast<double>(avg_steps_);
      const double w = step < static_cast<double>(avg_->switch_step)
                           ? 1.0 - avg_->beta
                           : 1.0 - std::sqrt(std::clamp((step - static_cast<double>(avg_->switch_step)) /
                                                            static_cast<double>(avg_->decay_steps),
                                                        0.0, 1.0));
      avg_tot_ += w;
      const double alpha = avg_tot_ == 0 ? 0.0 : w / avg_tot_;
      a = static_cast<float>(alpha);
      b = static_cast<float>(1.0 - alpha);
    }
    ++avg_steps_;
    for_my_elements(tree, flat, [a, b](float* avg, const float* p, std::int64_t n) {
      for (std::int64_t i = 0; i < n; ++i) avg[i] = a * p[i] + b * avg[i];
    });
  }
  const optim::tensor_split* ts() const { return tp_ ? &split_ : nullptr; }
  /// A fresh buffer for this placement: a tree of zeros shaped like `params`, or this rank's range (zeroed).
  void allocate(const M& params, M& tree, distributed::device_copy::flat& flat, const char* label) const {
    if (shard_)
      flat = distributed::device_copy::flat(std::string(label), static_cast<std::size_t>(shard_->hi() - shard_->lo()));
    else
      tree = layout::zeros_like(params);
  }

  std::optional<optim::shard> shard_;
  std::vector<layout::leaf_ref> shapes_;  // the leaves' sizes, paths and layer slices (no pointers)
  std::size_t leaf_count_ = 0;
  std::optional<tensor_parallel_codec<M>> tp_;
  optim::tensor_split split_;

 private:
  // The saved buffers: the optimizer's, then the model average.
  std::vector<state_buffer<M>> saved_buffers() {
    auto b = buffers();
    if (avg_) b.push_back({"model_averaging.model", &avg_tree_, &avg_flat_});
    return b;
  }
  // f(average, params, n) over the elements this rank keeps of the average: every leaf (replicated), or this rank's
  // range, read from the whole `tree` (ZeRO-1) or the range `flat` (FSDP).
  template <class F>
  void for_my_elements(const M* tree, const float* flat, F&& f) {
    if (!shard_) {
      haliax::tree::zip_leaves(avg_tree_, const_cast<M&>(*tree), [&](const std::string&, auto& a, const auto& p) {
        f(a.data(), p.data(), a.element_count());
      });
      return;
    }
    const std::int64_t lo = shard_->lo(), hi = shard_->hi();
    if (flat) {
      f(avg_flat_.data(), flat, hi - lo);
      return;
    }
    std::int64_t off = 0;
    haliax::tree::for_each_leaf(*tree, [&](const std::string&, const auto& leaf) {
      const std::int64_t n = leaf.element_count(), b = std::max(lo, off), e = std::min(hi, off + n);
      if (b < e) f(avg_flat_.data() + (b - lo), leaf.data() + (b - off), e - b);
      off += n;
    });
  }

  std::optional<model_averaging> avg_;
  M avg_tree_;
  distributed::device_copy::flat avg_flat_;
  double avg_tot_ = 0;
  std::int64_t avg_steps_ = 0;
  bool avg_ready_ = false;

  // Tensor parallelism: a buffer as a whole tree (collective over the data ranks when sharded, then the group).
  M global_state(const distributed::device_copy::flat& flat, const M& tree, const M& params) const {
    if (!shard_) return tp_->to_global(tree);
    return tp_->to_global(*gather(flat, tp_->local_zeros(params), true));
  }

  // This rank's range of `tree` (flattened in tree order) into `out` (both in the arrays' memory space).
  void slice(const M& tree, const distributed::device_copy::flat& out) const {
    const std::int64_t lo = shard_->lo(), hi = shard_->hi();
    std::int64_t off = 0;
    haliax::tree::for_each_leaf(tree, [&](const std::string&, const auto& leaf) {
      const std::int64_t n = leaf.element_count(), b = std::max(lo, off), e = std::min(hi, off + n);
      if (b < e) distributed::device_copy::copy(leaf.data() + (b - off), out.data() + (b - lo), e - b);
      off += n;
    });
  }
  // The whole buffer, as a tree shaped like `params`, on rank 0 (everywhere with `all`); null elsewhere.
  std::optional<M> gather(const distributed::device_copy::flat& shard, const M& params, bool all = false) const {
    auto& c = *shard_->comm;
    const auto& b = shard_->bounds;
    std::vector<std::size_t> counts(b.size() - 1), displs(b.size() - 1);
    for (std::size_t q = 0; q + 1 < b.size(); ++q) {
      counts[q] = static_cast<std::size_t>(b[q + 1] - b[q]) * 4;
      displs[q] = static_cast<std::size_t>(b[q]) * 4;
    }
    const bool receive = all || c.rank() == 0;
    std::vector<float> mine(shard.extent(0));  // the collective's host buffers
    distributed::device_copy::to_host(shard.data(), mine.data(), static_cast<std::int64_t>(mine.size()));
    std::vector<float> flat(receive ? static_cast<std::size_t>(b.back()) : 0);
    if (all)
      c.allgatherv(mine.data(), flat.data(), counts, displs);
    else
      c.gatherv(mine.data(), flat.data(), counts, displs, 0);
    if (!receive) return std::nullopt;
    M tree = layout::zeros_like(params);
    std::int64_t off = 0;
    haliax::tree::for_each_leaf(tree, [&](const std::string&, auto& leaf) {
      haliax::with_host_elements(leaf, 0, leaf.element_count(), haliax::host_access::write,
                                 [&](float* x) { std::copy(flat.data() + off, flat.data() + off + leaf.element_count(), x); });
      off += leaf.element_count();
    });
    return tree;
  }
};

}  // namespace levanter::optim
