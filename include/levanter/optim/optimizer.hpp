// levanter/optim/optimizer.hpp: what the Trainer needs of an optimizer, whatever its kind: one update of the
// parameters from their gradients, and its state as a checkpoint stores it. `make_optimizer` turns the
// `optimizer:` choice (optim/config.hpp) into one; each kind keeps its own state (upstream's optax state).
//
//   auto opt = levanter::optim::make_optimizer(cfg.optimizer, cfg.trainer.num_train_steps, model);
//   auto stats = opt->update(model, grads, loss);        // model updated in place
//   opt->save_state(snapshot);                           // opt_state.h5
//
// Adding an optimizer: its config to OptimizerChoice, a class implementing `optimizer<M>`, and a branch in
// make_optimizer (docs/architecture.md, "Adding an optimizer").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <levanter/checkpoint/h5.hpp>
#include <levanter/optim/adamw.hpp>
#include <levanter/optim/config.hpp>

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

/// `optimizer: {type: adam}`: AdamW (optim/adamw.hpp) and its state. opt_state.h5 holds `mu.<path>`, `nu.<path>`,
/// `count`, `adam_count` and the skip/clip history windows.
template <class M>
class adamw_optimizer final : public optimizer<M> {
 public:
  /// With `comm` of more than one rank and `sharded`, the moments are split over the ranks (ZeRO-1).
  adamw_optimizer(const AdamConfig& cfg, std::int64_t num_train_steps, const M& params,
                  distributed::communicator* comm = nullptr, bool sharded = false)
      : opt_(cfg, num_train_steps) {
    if (comm && sharded && comm->size() > 1) {
      shard_ = optim::shard{comm, adamw::shard_bounds(params, comm->size())};
      shapes_ = optim::detail::adamw::param_leaves(const_cast<M&>(params));
      for (auto& l : shapes_) l.p = nullptr;
    }
    state_ = opt_.init(params, shard_ ? &*shard_ : nullptr);
  }

  std::string_view type_name() const override { return AdamConfig::type_name; }
  update_stats update(M& params, const M& grads, double loss) override {
    return opt_.update(params, grads, state_, loss, shard_ ? &*shard_ : nullptr, tp_ ? &split_ : nullptr);
  }
  double next_learning_rate() const override { return opt_.schedule()(state_.count); }
  void set_tensor_parallel(tensor_parallel_codec<M> c) override {
    if (opt_.config().update_rms_clipping)
      throw std::invalid_argument("optimizer.update_rms_clipping: not supported with tensor parallelism "
                                  "(trainer.model_axis_size > 1); unset it");
    if (c.split.size() != state_.decay_mask.size())
      throw std::invalid_argument("set_tensor_parallel: the split does not match the parameters");
    split_ = optim::tensor_split{c.group, c.split};
    tp_ = std::move(c);
  }
  void save_state(checkpoint::snapshot& s, const M& params) const override {
    if (tp_) {
      // every rank of the job takes part; the trees are whole
      auto mu = global_state(state_.mu_flat, state_.mu, params), nu = global_state(state_.nu_flat, state_.nu, params);
      s.add_tree("mu", mu);
      s.add_tree("nu", nu);
    } else if (shard_) {
      auto mu = gather(state_.mu_flat, params), nu = gather(state_.nu_flat, params);
      if (shard_->comm->rank() != 0) return;
      s.add_tree("mu", *mu);
      s.add_tree("nu", *nu);
    } else {
      s.add_tree("mu", state_.mu);
      s.add_tree("nu", state_.nu);
    }
    s.add_scalar("count", static_cast<std::int64_t>(state_.count));
    s.add_scalar("adam_count", static_cast<std::int64_t>(state_.adam_count));
    detail::add_window(s, "skip_losses", state_.skip_losses);
    detail::add_window(s, "skip_grad_norms", state_.skip_grad_norms);
    detail::add_window(s, "update_norms", state_.update_norms);
  }
  std::vector<std::string> load_state(const checkpoint::reader& r, bool allow_partial, const M& params) override {
    std::vector<std::string> missing;
    if (tp_) {
      // The file holds whole trees: keep this rank's slices (and its range of them when sharded).
      M mu = adamw::zeros_like(params), nu = adamw::zeros_like(params);
      missing = r.read_tree("mu", mu, allow_partial);
      auto m2 = r.read_tree("nu", nu, allow_partial);
      missing.insert(missing.end(), m2.begin(), m2.end());
      M mu_l = tp_->to_local(mu), nu_l = tp_->to_local(nu);
      if (shard_) {
        slice(mu_l, state_.mu_flat);
        slice(nu_l, state_.nu_flat);
      } else {
        state_.mu = std::move(mu_l);
        state_.nu = std::move(nu_l);
      }
    } else if (shard_) {
      // The file holds the whole state (whatever the rank count that wrote it): keep this rank's range.
      M mu = adamw::zeros_like(params), nu = adamw::zeros_like(params);
      missing = r.read_tree("mu", mu, allow_partial);
      auto m2 = r.read_tree("nu", nu, allow_partial);
      missing.insert(missing.end(), m2.begin(), m2.end());
      slice(mu, state_.mu_flat);
      slice(nu, state_.nu_flat);
    } else {
      missing = r.read_tree("mu", state_.mu, allow_partial);
      auto m2 = r.read_tree("nu", state_.nu, allow_partial);
      missing.insert(missing.end(), m2.begin(), m2.end());
    }
    state_.count = r.scalar<std::int64_t>("count");
    state_.adam_count = r.scalar<std::int64_t>("adam_count");
    detail::read_window(r, "skip_losses", state_.skip_losses);
    detail::read_window(r, "skip_grad_norms", state_.skip_grad_norms);
    detail::read_window(r, "update_norms", state_.update_norms);
    return missing;
  }
  void for_each_state_tree(const std::function<void(const std::string&, const M&)>& f,
                           const M& params) const override {
    if (tp_) {
      f("mu", global_state(state_.mu_flat, state_.mu, params));
      f("nu", global_state(state_.nu_flat, state_.nu, params));
      return;
    }
    if (shard_) {
      // every rank takes part in the gathers; each sees the whole trees
      auto mu = gather(state_.mu_flat, params, true), nu = gather(state_.nu_flat, params, true);
      f("mu", *mu);
      f("nu", *nu);
      return;
    }
    f("mu", state_.mu);
    f("nu", state_.nu);
  }
  const std::vector<std::int64_t>* shard_bounds() const override { return shard_ ? &shard_->bounds : nullptr; }
  update_stats update_range(float* params, const float* grads, double loss) override {
    if (!shard_) return optimizer<M>::update_range(params, grads, loss);
    return opt_.update_range(shapes_, params, grads, state_, loss, *shard_, tp_ ? &split_ : nullptr);
  }

  const adamw& rule() const { return opt_; }
  const adamw_state<M>& state() const { return state_; }

 private:
  // Tensor parallelism: a moment as a whole tree (collective over the data ranks when sharded, then the group).
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
  // The whole state vector, as a tree shaped like `params`, on rank 0 (everywhere with `all`); null elsewhere.
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
    M tree = adamw::zeros_like(params);
    std::int64_t off = 0;
    haliax::tree::for_each_leaf(tree, [&](const std::string&, auto& leaf) {
      haliax::with_host_elements(leaf, 0, leaf.element_count(), haliax::host_access::write,
                                 [&](float* x) { std::copy(flat.data() + off, flat.data() + off + leaf.element_count(), x); });
      off += leaf.element_count();
    });
    return tree;
  }

  adamw opt_;
  std::optional<optim::shard> shard_;
  std::vector<optim::detail::adamw::leaf_ref> shapes_;  // sharded: the leaves' sizes, paths and layer slices
  std::optional<tensor_parallel_codec<M>> tp_;
  optim::tensor_split split_;
  adamw_state<M> state_;
};

/// The optimizer the `optimizer:` section asks for, with fresh state shaped like `params`. Throws
/// std::invalid_argument naming the key for settings the optimizer refuses.
/// With `comm` and `sharded`, the state is split over the ranks (ZeRO-1).
template <class M>
std::unique_ptr<optimizer<M>> make_optimizer(const OptimizerChoice& choice, std::int64_t num_train_steps,
                                             const M& params, distributed::communicator* comm = nullptr,
                                             bool sharded = false) {
  if (const auto* adam = choice.get_if<AdamConfig>())
    return std::make_unique<adamw_optimizer<M>>(*adam, num_train_steps, params, comm, sharded);
  throw std::invalid_argument("optimizer.type '" + std::string(choice.type_name()) + "' is not supported");
}

}  // namespace levanter::optim
