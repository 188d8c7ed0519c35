// levanter/trainer/layout.hpp: where a run's parameters live during training, as the plan lays them over the ranks
// (levanter/distributed/plan.hpp, docs/distributed.md), and the three things that depend on it: the gradients of a
// step (micro-batches accumulated, then summed over the data ranks in tree order), the optimizer update over this
// rank's part, and the whole model for checkpoints, hooks and trainer.watch.
//
//   data parallel, ZeRO-1   every rank holds the whole model
//   FSDP                    this rank's range of the flattened parameters (distributed::fsdp_params); the forward
//                           gathers each layer just in time
//   tensor parallelism      this rank's slices of the split leaves (the model group computes one batch together)
//   both                    a range of the slices
//
// `state.model` (the model the layout is made over) is this rank's part inside a step, and the whole model wherever
// code outside the step sees it: `whole()` (every rank must call it: it gathers) puts the whole model there for
// checkpoints, hooks and trainer.watch until `release()`.
//
//   trainer::param_layout<M> layout(state.model, plan, data, group, dims, slice, opt->shard_bounds(), ranks);
//   auto [grads, loss_sum] = layout.gradients(micro, micro_batch);   // this rank's micro-batches, accumulated
//   double loss = layout.reduce(grads, loss_sum, micro, keep_whole); // over the data ranks, averaged
//   auto stats = layout.update(*opt, grads, loss);
//   const M& whole = layout.whole();  ...  layout.release();
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <haliax/detail/profile.hpp>
#include <haliax/precision.hpp>
#include <haliax/tree.hpp>
#include <levanter/config/validate.hpp>
#include <levanter/distributed/comm.hpp>
#include <levanter/distributed/fsdp.hpp>
#include <levanter/distributed/plan.hpp>
#include <levanter/distributed/tensor_parallel.hpp>
#include <levanter/distributed/tree_comm.hpp>
#include <levanter/optim/hessian.hpp>
#include <levanter/optim/layout.hpp>
#include <levanter/optim/placement.hpp>

namespace levanter::trainer {

template <class M>
class param_layout {
 public:
  /// Lays `model` (whole on entry) out as the plan says. `dims` are the split axes per leaf under tensor parallelism
  /// (empty without), `slice` cuts this rank's slices from a whole model, `grad_bounds` are the sharded optimizer's
  /// ranges (FSDP's ranges; null when the optimizer is not sharded), `job_ranks` every rank of the job.
  param_layout(M& model, const distributed::plan& plan, distributed::communicator& data,
               distributed::communicator* model_group, std::vector<int> dims,
               const std::function<M(const M&)>& slice, const std::vector<std::int64_t>* grad_bounds, int job_ranks)
      : model_(model), data_(data), group_(model_group), T_(plan.mesh.model), dims_(std::move(dims)),
        bounds_(grad_bounds), job_ranks_(job_ranks) {
    // the whole model's leaves (sizes and Stacked slices: the optimizer's chunks) for hessian_product
    for (auto l : optim::layout::param_leaves(model_)) {
      l.p = nullptr;
      shapes_.push_back(std::move(l));
    }
    if (T_ > 1) {
      model_ = slice(model_);
      whole_ = false;
    }
    if (plan.shard_parameters) {
      if (!bounds_)
        throw config::config_error("trainer.fsdp_axis: sharding the parameters needs the optimizer made by "
                                   "Trainer::make_optimizer (sharded over the ranks)");
      fs_.emplace(data_, *bounds_, model_);
      model_ = fs_->skeleton();
      whole_ = false;
    }
  }

  bool fsdp() const { return fs_.has_value(); }

  /// FSDP's memory line for the log (empty without FSDP). `all`: the whole model's parameter count.
  std::string describe(std::int64_t all) const {
    if (!fs_) return {};
    std::int64_t most = 0;  // the largest share (the chunks make them uneven)
    for (std::size_t q = 0; q + 1 < fs_->bounds().size(); ++q)
      most = std::max(most, fs_->bounds()[q + 1] - fs_->bounds()[q]);
    char line[256];
    std::snprintf(line, sizeof line,
                  "FSDP: each rank keeps at most %lld of the %lld parameters between steps: %.2f MiB of parameters "
                  "and AdamW moments (one process: %.2f MiB, %.1f%%)",
                  static_cast<long long>(most), static_cast<long long>(all), double(most) * 12 / 1048576.0,
                  double(all) * 12 / 1048576.0, 100.0 * double(most) / double(all));
    return line;
  }

  /// The gradient of this rank's `micro` micro-batches and the sum of their losses. `micro_batch(model, k)` gives
  /// the k-th one's gradient and loss for the model the forward should see. FSDP: one model per step whose layers
  /// are gathered as the forward (and the recomputation in backward) reaches them, every layer's gradient
  /// reduce-scattered into this rank's range as soon as it is complete, the rest after each micro-batch; the
  /// micro-batches add left to right and no gradient tree is returned. Otherwise the micro-batches' gradients and
  /// losses add along distributed::tree_order's tree (left half + right half), computed left to right with at most
  /// log2(micro) partial sums alive: with a power-of-two rank count every rank's block of micro-batches is a
  /// subtree of the tree one process would use over all of them, and the sum over ranks continues it, so the
  /// gradients do not depend on the rank count.
  template <class MicroBatch>
  std::pair<std::optional<M>, double> gradients(std::int64_t micro, MicroBatch&& micro_batch) {
    if (fs_) {
      double loss_sum = 0;
      fs_->zero_grads();
      M step_model = fs_->step_model();
      for (std::int64_t k = 0; k < micro; ++k) {
        auto [g, loss] = micro_batch(static_cast<const M&>(step_model), k);
        fs_->reduce_rest(g);
        loss_sum += loss;
      }
      return {std::nullopt, loss_sum};
    }
    std::function<std::pair<M, double>(std::int64_t, std::int64_t)> accumulate =
        [&](std::int64_t first, std::int64_t n) -> std::pair<M, double> {
      if (n > 1) {
        auto left = accumulate(first, n / 2);
        auto right = accumulate(first + n / 2, n - n / 2);
        haliax::tree::zip_leaves(left.first, right.first, [](const std::string&, auto& acc, auto& x) { acc = acc + x; });
        return {std::move(left.first), left.second + right.second};
      }
      return micro_batch(static_cast<const M&>(model_), first);
    };
    auto [g, loss_sum] = accumulate(0, micro);
    return {std::move(g), loss_sum};
  }

  /// The sum over the data ranks in tree order (whole, or only this rank's range for a sharded optimizer unless
  /// `whole_grads`), the gradients averaged over every micro-batch of the global batch; returns the mean loss.
  double reduce(std::optional<M>& grads, double loss_sum, std::int64_t micro, bool whole_grads) {
    const std::int64_t parts = micro * data_.size();
    if (fs_) {
      loss_sum = distributed::allreduce_sum(data_, loss_sum);
      if (parts > 1) fs_->scale_grads(1.0f / float(parts));
      return loss_sum / double(parts);
    }
    if (job_ranks_ > 1) {
      haliax::detail::profile::region r([] { return std::string("trainer: reduce gradients"); }, 0.0);
      distributed::reduce_tree(data_, *grads, comm_buf_, whole_grads ? nullptr : bounds_);
      loss_sum = distributed::allreduce_sum(data_, loss_sum);
    }
    if (parts > 1)
      *grads = haliax::tree::map(*grads, [s = 1.0f / float(parts)](const std::string&, const auto& x) { return x * s; });
    return loss_sum / double(parts);
  }

  /// Sophia-H's d = v ⊙ (H v) of the step's loss at the parameters as they are (before the update), for v the
  /// probe's direction, over the part of the flattened parameters this rank updates: its range under ZeRO-1 and
  /// FSDP, else all. H v is the central difference of two gradients taken as gradients() and reduce() take the
  /// step's (levanter/optim/hessian.hpp), in f32 products; the parameters are restored bit for bit. Returns d and
  /// the flat offset of its first element.
  template <class MicroBatch>
  std::pair<std::vector<float>, std::int64_t> hessian_product(const optim::hvp_probe& probe, std::int64_t micro,
                                                              MicroBatch&& micro_batch) {
    if (T_ > 1)
      throw config::config_error("optimizer.type sophia-h: not supported with tensor parallelism "
                                 "(trainer.model_axis_size > 1); use model_axis_size: 1");
    std::int64_t total = 0;
    std::vector<std::int64_t> sizes;
    for (const auto& l : shapes_) {
      sizes.push_back(l.n);
      total += l.n;
    }
    // d over [lo, hi) (what this rank updates); the perturbation over [p_lo, p_hi) (what this rank holds: FSDP's
    // range, else the whole model, perturbed alike on every rank)
    const std::int64_t lo = bounds_ ? (*bounds_)[static_cast<std::size_t>(data_.rank())] : 0;
    const std::int64_t hi = bounds_ ? (*bounds_)[static_cast<std::size_t>(data_.rank()) + 1] : total;
    const std::int64_t p_lo = fs_ ? lo : 0, p_hi = fs_ ? hi : total;
    struct part {
      float* p;
      std::int64_t flat, n;
    };
    // [r_lo, r_hi) of a tree's flattened leaves, or of FSDP's flat range (which starts at lo)
    auto tree_parts = [&](auto& tree, std::int64_t r_lo, std::int64_t r_hi) {
      std::vector<part> out;
      std::int64_t off = 0;
      for (auto& l : optim::layout::param_leaves(tree)) {
        const std::int64_t b = std::max(r_lo, off), e = std::min(r_hi, off + l.n);
        if (b < e) out.push_back({l.p + (b - off), b, e - b});
        off += l.n;
      }
      return out;
    };
    auto params = [&] {
      return fs_ ? std::vector<part>{{const_cast<float*>(fs_->params().data()), lo, hi - lo}}
                 : tree_parts(model_, p_lo, p_hi);
    };
    auto copy_out = [](const std::vector<part>& from, std::int64_t base, float* dst) {
      for (const auto& q : from) std::copy_n(q.p, q.n, dst + (q.flat - base));
    };
    auto copy_in = [](const float* src, std::int64_t base, const std::vector<part>& to) {
      for (const auto& q : to) std::copy_n(src + (q.flat - base), q.n, q.p);
    };
    const auto np = static_cast<std::size_t>(p_hi - p_lo), n = static_cast<std::size_t>(hi - lo);
    std::vector<float> theta(np), v(np), x(np), g_plus(n), g_minus(n);
    copy_out(params(), p_lo, theta.data());
    optim::hessian_probe_direction(probe, sizes, p_lo, p_hi, v.data());
    // ε from the norm of the parameters: squares summed per chunk, in chunk order over every rank (the same bits
    // whatever the rank count)
    const auto chunks = optim::layout::make_chunks(shapes_);
    std::size_t c_lo = 0;
    while (c_lo < chunks.size() && chunks[c_lo].flat < p_lo) ++c_lo;
    std::size_t c_hi = c_lo;
    while (c_hi < chunks.size() && chunks[c_hi].flat < p_hi) ++c_hi;
    auto sq = optim::layout::per_chunk(c_hi - c_lo, [&](std::int64_t i) {
      const auto& ch = chunks[c_lo + static_cast<std::size_t>(i)];
      const float* p = theta.data() + (ch.flat - p_lo);
      double s = 0;
      for (std::int64_t k = 0; k < ch.end - ch.begin; ++k) s += static_cast<double>(p[k]) * p[k];
      return s;
    });
    if (fs_) sq = distributed::allgather_doubles(data_, sq);
    double param_sq = 0;
    for (double s : sq) param_sq += s;
    const double eps = optim::hessian_probe_step(param_sq, total);
    // the gradient at θ + s ε v, reduced as the step's, over [lo, hi) into `out`
    const std::vector<part> fs_grads =
        fs_ ? std::vector<part>{{const_cast<float*>(fs_->grads().data()), lo, hi - lo}} : std::vector<part>{};
    haliax::matmul_precision_scope full(haliax::matmul_precision::f32);
    auto gradient_at = [&](float s, std::vector<float>& out) {
      const float step = static_cast<float>(eps) * s;
      for (std::size_t i = 0; i < np; ++i) x[i] = theta[i] + step * v[i];
      copy_in(x.data(), p_lo, params());
      auto [grads, loss_sum] = gradients(micro, micro_batch);
      reduce(grads, loss_sum, micro, false);
      if (fs_)
        copy_out(fs_grads, lo, out.data());
      else
        copy_out(tree_parts(*grads, lo, hi), lo, out.data());
    };
    // FSDP sums gradients into its own range: the step's gradient waits aside meanwhile
    std::vector<float> step_grads;
    if (fs_) {
      step_grads.resize(n);
      copy_out(fs_grads, lo, step_grads.data());
    }
    gradient_at(1.0f, g_plus);
    gradient_at(-1.0f, g_minus);
    copy_in(theta.data(), p_lo, params());
    if (fs_) copy_in(step_grads.data(), lo, fs_grads);
    std::vector<float> d(n);
    optim::hessian_product(v.data() + (lo - p_lo), g_plus.data(), g_minus.data(), eps, static_cast<std::int64_t>(n),
                           d.data());
    return {std::move(d), lo};
  }

  /// The whole gradient tree for trainer.watch (gathered from the ranges or slices; every rank takes part).
  M watched_grads(const std::optional<M>& grads) {
    M g = fs_ ? fs_->whole_grads() : *grads;
    return T_ > 1 ? distributed::assemble_model(g, dims_, *group_) : g;
  }

  /// The optimizer update of this rank's part: its range (FSDP) or the parameters it holds.
  optim::update_stats update(optim::optimizer<M>& opt, const std::optional<M>& grads, double loss) {
    release();
    if (fs_) return opt.update_range(fs_->params().data(), fs_->grads().data(), loss);
    return opt.update(model_, *grads, loss);
  }

  /// The whole model in `state.model` until release() (every rank takes part: it gathers over the data and model
  /// groups).
  M& whole() {
    if (whole_) return model_;
    M w = fs_ ? fs_->whole() : model_;
    if (T_ > 1) {
      if (!fs_) local_keep_ = std::move(model_);
      w = distributed::assemble_model(w, dims_, *group_);
    }
    model_ = std::move(w);
    whole_ = true;
    return model_;
  }
  /// Back to this rank's part (a no-op when the layout is whole anyway).
  void release() {
    if (!whole_ || (!fs_ && T_ == 1)) return;
    if (fs_) {
      model_ = fs_->skeleton();
    } else {
      model_ = std::move(*local_keep_);
      local_keep_.reset();
    }
    whole_ = false;
  }

  /// Whether an optimizer that is sharded or sliced must take part when rank 0 saves its state.
  bool split() const { return bounds_ || T_ > 1; }

 private:
  M& model_;
  distributed::communicator& data_;
  distributed::communicator* group_;
  int T_;
  std::vector<int> dims_;
  const std::vector<std::int64_t>* bounds_;
  std::optional<distributed::fsdp_params<M>> fs_;
  std::optional<M> local_keep_;  // tensor parallelism without FSDP: the slices, while model_ is whole
  bool whole_ = true;
  std::vector<float> comm_buf_;  // the flat gradient buffer of the reductions, kept between steps
  int job_ranks_;
  std::vector<optim::layout::leaf_ref> shapes_;  // the whole model's leaves, without pointers
};

}  // namespace levanter::trainer
