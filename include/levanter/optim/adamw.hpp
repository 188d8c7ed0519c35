// levanter/optim/adamw.hpp: AdamW over any reflected parameter tree, as upstream's `AdamConfig.build`
// (src/levanter/optim/config.py) builds it with optax:
//
//   inject_hyperparams(lr = schedule(count))(
//     skip_bad_steps(                                   // optional: SkipStepConfig.wrap
//       chain(clip_by_global_norm(max_grad_norm),       // when max_grad_norm is set and non-zero
//             scale_by_adam(beta1, beta2, epsilon, nesterov),
//             add_decayed_weights(weight_decay [* lr / learning_rate with adamc_weight_decay], mask),
//             scan_aware_clip_by_block_rms(update_rms_clipping),  // optional, per layer for Stacked leaves
//             clip_update_by_historical_norm(...),                // optional: clip_update_norm
//             scale(-lr))))
//
//   levanter::optim::adamw opt(cfg, num_train_steps);
//   auto state = opt.init(model);                               // moments shaped like the model
//   auto stats = opt.update(model, grads, state, loss);         // model updated in place
//   // stats.learning_rate, stats.grad_norm (before clipping), stats.update_norm, stats.skipped
//
// Each leaf is updated in one fused pass over raw float pointers (reads p, g, m, v; writes p, m, v), split in
// fixed chunks run on haliax's thread pool. The element loop is compiled once into levanter_core and picks its
// instruction set at run time, with bitwise the same results on every path (levanter/optim/adamw_kernel.hpp). Norms are summed in double per chunk and then in chunk order, so
// every result is the same whatever the thread count. update_rms_clipping and clip_update_norm need the norm
// of the whole update before any parameter moves: they take a second pass (the first writes m and v and sums
// the update's squares; the second recomputes the update from the new moments and writes p).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <haliax/core.hpp>
#include <haliax/detail/portable.hpp>
#include <haliax/detail/thread_pool.hpp>
#include <haliax/tree.hpp>
#include <levanter/distributed/comm.hpp>
#include <levanter/distributed/device_copy.hpp>
#include <levanter/optim/adamw_kernel.hpp>
#include <levanter/optim/layout.hpp>

#include "config.hpp"
#include "schedule.hpp"
#include "weight_decay.hpp"

namespace levanter::optim {

template <class M>
struct adamw_state {
  M mu;                        ///< first moments, same tree as the parameters (float32)
  M nu;                        ///< second moments
  int64_t count = 0;           ///< updates seen, skipped ones included (inject_hyperparams): the schedule's step
  int64_t adam_count = 0;      ///< updates applied (scale_by_adam's count; a skipped step leaves it unchanged)
  rolling_window skip_losses;  ///< skip_bad_steps history (updated on every step, skipped or not)
  rolling_window skip_grad_norms;
  rolling_window update_norms;   ///< clip_update_norm history (unclipped norms of applied steps)
  std::vector<char> decay_mask;  ///< per leaf in tree order: weight decay applies
  /// Sharded state (ZeRO-1): the moments of this rank's range [flat_lo, flat_lo + size) of the parameters
  /// flattened in tree order, in the arrays' memory space (device memory in a GPU build, where the update
  /// kernels read them); `mu` and `nu` are then empty trees.
  distributed::device_copy::flat mu_flat, nu_flat;
  int64_t flat_lo = 0;
  bool sharded() const { return mu_flat.extent(0) != 0 || flat_lo != 0; }
};

namespace detail::adamw {

using layout::chunk_elems;
using layout::leaf_ref;
using layout::chunk;
using layout::make_chunks;
using layout::param_leaves;
using layout::check_float_leaf;
using layout::per_chunk;

// One pass over elements [b, e) of a leaf: the compiled, ISA-dispatched loop of levanter/optim/adamw_kernel.hpp.
template <pass P>
double dispatch(const consts& c, const leaf_ref& l, int64_t b, int64_t e, float div, float mul, bool nesterov) {
  return run_range(c, P, nesterov, l.decay, l.p + b, l.g + b, l.m + b, l.v + b, e - b, div, mul);
}

}  // namespace detail::adamw

/// AdamW with upstream Levanter's schedule, gradient clipping, weight-decay mask, update clipping and
/// bad-step skipping (see the file comment for the chain). Stateless itself: the state lives in adamw_state.
class adamw {
 public:
  /// Validates `cfg` as upstream's AdamConfig.__post_init__ and builds its schedule for `num_train_steps`.
  adamw(AdamConfig cfg, int64_t num_train_steps) : cfg_(std::move(cfg)) {
    if (cfg_.update_rms_clipping && *cfg_.update_rms_clipping <= 0)
      throw std::invalid_argument("optimizer.update_rms_clipping: must be a positive number or unset");
    if (cfg_.update_rms_clipping && cfg_.clip_update_norm)
      throw std::invalid_argument(
          "optimizer.clip_update_norm: cannot be used together with update_rms_clipping; unset one of them");
    if (cfg_.clip_update_norm && cfg_.clip_update_norm->rolling_interval_length < 1)
      throw std::invalid_argument("optimizer.clip_update_norm.rolling_interval_length: must be at least 1");
    skip_ = skip_steps_of(cfg_);
    schedule_ = make_lr_schedule(cfg_, num_train_steps);
  }

  const AdamConfig& config() const { return cfg_; }
  const lr_schedule& schedule() const { return schedule_; }
  /// The resolved skip_bad_steps configuration (nullopt: no skipping).
  const std::optional<SkipStepConfig>& skip_config() const { return skip_; }

  /// Zero moments shaped like `params`, zero counts, empty histories and the weight-decay mask. With `sh`, only
  /// this rank's range of the moments is kept (flat).
  template <class M>
  adamw_state<M> init(const M& params, const shard* sh = nullptr) const {
    adamw_state<M> st;
    if (sh) {
      st.flat_lo = sh->lo();
      st.mu_flat = distributed::device_copy::flat("levanter::optim::adamw::mu_flat",
                                                  static_cast<std::size_t>(sh->hi() - sh->lo()));  // zeroed
      st.nu_flat = distributed::device_copy::flat("levanter::optim::adamw::nu_flat", st.mu_flat.extent(0));
    } else {
      st.mu = zeros_like(params);
      st.nu = zeros_like(params);
    }
    if (skip_) {
      st.skip_losses = rolling_window::with_capacity(skip_->rolling_interval_length);
      st.skip_grad_norms = rolling_window::with_capacity(skip_->rolling_interval_length);
    }
    if (cfg_.clip_update_norm) st.update_norms = rolling_window::with_capacity(cfg_.clip_update_norm->rolling_interval_length);
    const auto mask = weight_decay_mask(cfg_, params);
    for_each_leaf_info(params, [&](const leaf_info&, const auto&) {
      st.decay_mask.push_back(cfg_.weight_decay > 0 && (!mask || (*mask)[st.decay_mask.size()]));
    });
    return st;
  }

  /// A tree of zeros shaped like `params` (layout::zeros_like).
  template <class M>
  static M zeros_like(const M& params) { return layout::zeros_like(params); }

  /// Rank ranges of the flattened parameters on chunk boundaries (layout::shard_bounds).
  template <class M>
  static std::vector<int64_t> shard_bounds(const M& params, int ranks) { return layout::shard_bounds(params, ranks); }

  /// One optimizer step: `params += update(grads)`, in place; `loss` feeds skip_bad_steps (ignored otherwise).
  /// The learning rate is schedule(state.count); state.count advances on every call, skipped or not (the
  /// inject_hyperparams count sits outside upstream's skip wrapper), while the Adam moments, Adam's bias-correction
  /// count and the clip_update_norm history are left untouched by a skipped step.
  ///
  /// With `sh` (ZeRO-1; `state` initialised with the same shard): `grads` need to hold the reduced gradient only in
  /// this rank's range; this rank updates that range of the parameters, the norms are gathered from every rank,
  /// and the updated parameters are gathered so every rank ends with all of them, as on one rank.
  template <class M>
  update_stats update(M& params, const M& grads, adamw_state<M>& state, double loss,
                      const shard* sh = nullptr, const tensor_split* ts = nullptr) const {
    namespace d = detail::adamw;
    std::vector<d::leaf_ref> leaves = d::param_leaves(params);
    if (state.decay_mask.size() != leaves.size())
      throw std::invalid_argument("levanter::optim::adamw::update: the state was initialised for a different model (" +
                                  std::to_string(state.decay_mask.size()) + " leaves, the parameters have " +
                                  std::to_string(leaves.size()) + ")");
    if ((sh != nullptr) != state.sharded() && !(sh && sh->lo() == sh->hi()))
      throw std::invalid_argument("levanter::optim::adamw::update: the state was initialised " +
                                  std::string(state.sharded() ? "with" : "without") + " a shard");
    auto attach = [&](const M& tree, const char* what, auto setter) {
      std::size_t i = 0;
      haliax::tree::for_each_leaf(tree, [&](const std::string& name, const auto& leaf) {
        if (i >= leaves.size() || leaf.element_count() != leaves[i].n)
          throw haliax::shape_error("levanter::optim::adamw::update: " + std::string(what) + " leaf '" + name +
                                    "' does not match the parameter of the same position");
        setter(leaves[i++], leaf.data());
      });
      if (i != leaves.size())
        throw haliax::shape_error("levanter::optim::adamw::update: " + std::string(what) + " has fewer leaves");
    };
    attach(grads, "gradient", [](d::leaf_ref& l, float* x) { l.g = x; });
    if (!sh) {
      attach(state.mu, "first moment", [](d::leaf_ref& l, float* x) { l.m = x; });
      attach(state.nu, "second moment", [](d::leaf_ref& l, float* x) { l.v = x; });
    }
    const update_stats stats = update_leaves(leaves, state, loss, sh, nullptr, nullptr, ts);
    if (sh) gather_params(leaves, *sh);
    return stats;
  }

  /// FSDP: the parameters and the summed gradient exist only as this rank's range of the flattened tree
  /// (`params`, `grads`: sh.hi() - sh.lo() floats each); `leaves` (param_leaves of the whole model; their pointers
  /// are not used) give the shapes. Updates `params` in place, exactly as `update` updates that range.
  template <class M>
  update_stats update_range(std::vector<detail::adamw::leaf_ref> leaves, float* params, const float* grads,
                            adamw_state<M>& state, double loss, const shard& sh,
                            const tensor_split* ts = nullptr) const {
    if (state.decay_mask.size() != leaves.size() || !state.sharded())
      throw std::invalid_argument("levanter::optim::adamw::update_range: the state was not initialised sharded for "
                                  "this model");
    return update_leaves(leaves, state, loss, &sh, params, grads, ts);
  }

 private:
  // The update over `leaves` (g attached; m, v attached unless sharded). With `p_flat`/`g_flat`, the parameters
  // and gradients are read from this rank's flat range instead of the leaves.
  template <class M>
  update_stats update_leaves(std::vector<detail::adamw::leaf_ref>& leaves, adamw_state<M>& state, double loss,
                             const shard* sh, float* p_flat, const float* g_flat, const tensor_split* ts) const {
    namespace d = detail::adamw;
    if (ts && ts->split.size() != leaves.size())
      throw std::invalid_argument("levanter::optim::adamw::update: the tensor split does not match the parameters");
    if (ts && cfg_.update_rms_clipping)
      throw std::invalid_argument("optimizer.update_rms_clipping: not supported with tensor parallelism "
                                  "(trainer.model_axis_size > 1)");
    for (std::size_t i = 0; i < leaves.size(); ++i) leaves[i].decay = state.decay_mask[i] != 0;

    std::size_t num_slices = 0;
    const std::vector<d::chunk> chunks = d::make_chunks(leaves, &num_slices);
    // The chunks this rank computes: all of them, or those of its range.
    std::size_t c_lo = 0, c_hi = chunks.size();
    if (sh) {
      while (c_lo < chunks.size() && chunks[c_lo].flat < sh->lo()) ++c_lo;
      c_hi = c_lo;
      while (c_hi < chunks.size() && chunks[c_hi].flat < sh->hi()) ++c_hi;
    }
    const std::size_t mine = c_hi - c_lo;
    // One chunk as a leaf_ref and a range: sharded moments live in the flat vectors.
    auto ref = [&](std::size_t ci, int64_t& b, int64_t& e) {
      const auto& ch = chunks[ci];
      d::leaf_ref l = leaves[ch.leaf];
      if (!sh) {
        b = ch.begin, e = ch.end;
        return l;
      }
      if (p_flat) {
        l.p = p_flat + (ch.flat - state.flat_lo);
        l.g = g_flat + (ch.flat - state.flat_lo);
      } else {
        l.p += ch.begin;
        l.g += ch.begin;
      }
      l.m = state.mu_flat.data() + (ch.flat - state.flat_lo);
      l.v = state.nu_flat.data() + (ch.flat - state.flat_lo);
      b = 0, e = ch.end - ch.begin;
      return l;
    };
    // Per-chunk sums of this rank's chunks, then of every chunk in chunk order (gathered from the ranks).
    auto all_chunks = [&](std::vector<double> part) {
      return sh ? distributed::allgather_doubles(*sh->comm, part) : part;
    };
    // The sum of per-chunk squares (every chunk, in chunk order): in chunk order, or with tensor parallelism the
    // whole leaves' plus the split leaves' summed over the model group.
    auto total_of = [&](const std::vector<double>& sq) {
      double rep = 0, spl = 0;
      for (std::size_t i = 0; i < sq.size(); ++i) (ts && ts->split[chunks[i].leaf] ? spl : rep) += sq[i];
      if (!ts) return rep;
      return rep + distributed::allreduce_sum(*ts->group, spl);
    };

    update_stats stats;
    stats.learning_rate = schedule_(state.count);
    const double lr = stats.learning_rate;

    // This rank's chunks for the portable loop (every chunk's pointers in the arrays' memory space).
    auto portable = [&](const d::consts& cs, d::chunk_job job, const std::vector<float>* slice_div, float mul) {
      std::vector<d::chunk_ref> refs;
      refs.reserve(mine);
      for (std::size_t i = 0; i < mine; ++i) {
        int64_t b, e;
        const std::size_t ci = c_lo + i;
        const auto l = ref(ci, b, e);
        refs.push_back({l.p + b, l.g + b, l.m ? l.m + b : nullptr, l.v ? l.v + b : nullptr, e - b, l.decay,
                        slice_div ? (*slice_div)[chunks[ci].slice] : 1.0f, mul});
      }
      return d::run_chunks_portable(cs, job, cfg_.nesterov, refs);
    };
    // The same chunks (one process: every chunk is this rank's) through run_clipped_fused_portable.
    auto portable_fused = [&](const d::consts& cs, bool clip, float max_norm) {
      std::vector<d::chunk_ref> refs;
      refs.reserve(mine);
      for (std::size_t i = 0; i < mine; ++i) {
        int64_t b, e;
        const auto l = ref(c_lo + i, b, e);
        refs.push_back({l.p + b, l.g + b, l.m ? l.m + b : nullptr, l.v ? l.v + b : nullptr, e - b, l.decay, 1.0f, 1.0f});
      }
      return d::run_clipped_fused_portable(cs, cfg_.nesterov, refs, clip, max_norm);
    };
    const bool host = haliax::detail::use_host_kernels(haliax::kernels::family::optimizer);
    const bool clip_on = cfg_.max_grad_norm && *cfg_.max_grad_norm != 0.0;
    const int64_t t_next = state.adam_count + 1;
    // The Adam constants of this step (the clipping decision apart, which needs the gradient norm).
    auto adam_consts = [&] {
      d::consts c{};
      c.clip_num = clip_on ? static_cast<float>(*cfg_.max_grad_norm) : 1.0f;
      c.b1 = static_cast<float>(cfg_.beta1);
      c.omb1 = static_cast<float>(1.0 - cfg_.beta1);
      c.b2 = static_cast<float>(cfg_.beta2);
      c.omb2 = static_cast<float>(1.0 - cfg_.beta2);
      c.eps = static_cast<float>(cfg_.epsilon);
      c.bc1 = static_cast<float>(1.0 - std::pow(cfg_.beta1, static_cast<double>(t_next)));
      c.bc1_next = static_cast<float>(1.0 - std::pow(cfg_.beta1, static_cast<double>(t_next + 1)));
      c.bc2 = static_cast<float>(1.0 - std::pow(cfg_.beta2, static_cast<double>(t_next)));
      c.wd = static_cast<float>(cfg_.adamc_weight_decay ? cfg_.weight_decay * (lr / cfg_.learning_rate)
                                                        : cfg_.weight_decay);
      c.neg_lr = static_cast<float>(-lr);
      return c;
    };

    // The portable loop of one process with the plain update (no step skipping, no update clipping): the gradient
    // norm, the clipping decision and the update in one go on the device, read back once (the norm and the update's
    // chunk sums together) where the general path reads back twice. Bitwise the same (tested).
    if (!host && !sh && !ts && !skip_ && !cfg_.update_rms_clipping && !cfg_.clip_update_norm) {
      const auto sq = portable_fused(adam_consts(), clip_on, clip_on ? static_cast<float>(*cfg_.max_grad_norm) : 0.0f);
      stats.grad_norm = sq.back();
      ++state.count;
      state.adam_count = t_next;
      double usum = 0;
      for (std::size_t i = 0; i + 1 < sq.size(); ++i) usum += sq[i];
      stats.update_norm = std::sqrt(usum);
      return stats;
    }

    const auto gsq = all_chunks(!host ? portable(d::consts{}, d::chunk_job::grad_squares, nullptr, 1.0f)
                                      : d::per_chunk(mine, [&](int64_t i) {
      int64_t b, e;
      const auto l = ref(c_lo + static_cast<std::size_t>(i), b, e);
      return d::grad_squares(l.g + b, e - b);
    }));
    stats.grad_norm = std::sqrt(total_of(gsq));

    if (skip_) stats.skipped = skip_step(*skip_, state.skip_losses, state.skip_grad_norms, loss, stats.grad_norm);
    ++state.count;
    if (stats.skipped) return stats;

    state.adam_count = t_next;
    d::consts c = adam_consts();
    c.clip = clip_on && !(static_cast<float>(stats.grad_norm) < static_cast<float>(*cfg_.max_grad_norm));
    c.clip_den = static_cast<float>(stats.grad_norm);
    const bool nest = cfg_.nesterov;

    double usum = 0;
    if (!cfg_.update_rms_clipping && !cfg_.clip_update_norm) {
      const auto sq = all_chunks(!host ? portable(c, d::chunk_job::fused, nullptr, 1.0f)
                                       : d::per_chunk(mine, [&](int64_t i) {
        int64_t b, e;
        const auto l = ref(c_lo + static_cast<std::size_t>(i), b, e);
        return d::dispatch<d::pass::fused>(c, l, b, e, 1.0f, 1.0f, nest);
      }));
      usum = total_of(sq);
    } else {
      const auto sq = all_chunks(!host ? portable(c, d::chunk_job::moments, nullptr, 1.0f)
                                       : d::per_chunk(mine, [&](int64_t i) {
        int64_t b, e;
        const auto l = ref(c_lo + static_cast<std::size_t>(i), b, e);
        return d::dispatch<d::pass::moments>(c, l, b, e, 1.0f, 1.0f, nest);
      }));
      std::vector<double> slice_sq(num_slices, 0.0);
      std::vector<std::size_t> slice_leaf(num_slices, 0);
      double total = 0;
      for (std::size_t i = 0; i < chunks.size(); ++i) {
        slice_sq[chunks[i].slice] += sq[i], total += sq[i];
        slice_leaf[chunks[i].slice] = chunks[i].leaf;
      }
      if (ts) total = total_of(sq);
      std::vector<float> slice_div(num_slices, 1.0f);
      float mul = 1.0f;
      if (cfg_.update_rms_clipping) {
        // scan_aware_clip_by_block_rms: u / max(1, rms(u) / threshold), per leaf or per Stacked layer.
        for (std::size_t s = 0; s < num_slices; ++s) {
          const auto& l = leaves[slice_leaf[s]];
          const double rms = std::sqrt(slice_sq[s] / static_cast<double>(l.n / l.slices));
          slice_div[s] = std::max(1.0f, static_cast<float>(rms / *cfg_.update_rms_clipping));
        }
      } else {
        // clip_update_by_historical_norm: scale by threshold / norm when the norm exceeds the history's
        // mean + sigma * std; the unclipped norm joins the history.
        const double norm = std::sqrt(total);
        auto& w = state.update_norms;
        const double max_norm = w.ready() ? w.threshold(cfg_.clip_update_norm->sigma_factor)
                                          : std::numeric_limits<double>::infinity();
        if (norm > max_norm) mul = static_cast<float>(max_norm / std::max(norm, 1e-6));
        w.push(norm);
      }
      const auto sq2 = all_chunks(!host ? portable(c, d::chunk_job::apply, &slice_div, mul)
                                        : d::per_chunk(mine, [&](int64_t i) {
        int64_t b, e;
        const std::size_t ci = c_lo + static_cast<std::size_t>(i);
        const auto l = ref(ci, b, e);
        return d::dispatch<d::pass::apply>(c, l, b, e, slice_div[chunks[ci].slice], mul, nest);
      }));
      usum = total_of(sq2);
    }
    stats.update_norm = std::sqrt(usum);
    return stats;
  }
  static void gather_params(const std::vector<detail::adamw::leaf_ref>& leaves, const shard& sh) { layout::gather_params(leaves, sh); }

  AdamConfig cfg_;
  std::optional<SkipStepConfig> skip_;
  lr_schedule schedule_;
};

}  // namespace levanter::optim
