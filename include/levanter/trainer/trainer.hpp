// levanter/trainer/trainer.hpp: the Trainer (upstream `levanter.trainer.Trainer`), generic over the model: it owns
// the train state, resumes it from checkpoints, runs the step (value_and_grad over micro-batches, gradient
// accumulation, the optimizer update), logs metrics and progress, watches norms, profiles, checkpoints, and runs
// hooks (evaluation, exports, a program's own) every N steps.
//
//   levanter::run_context run(cfg.trainer, resolved_yaml, std::cout, "train_lm");
//   levanter::Trainer<M> trainer(cfg.trainer, run, loss, {flops_per_token, seq_len, policy});
//   auto state = trainer.initial_state(M::init(mc, vocab, model_key), make_optimizer(...), training_key);
//   trainer.add_hook(cfg.trainer.steps_per_eval, [&](const levanter::step_info<M>& info) { evaluate(...); });
//   auto result = trainer.train(state, [&](std::int64_t first, std::int64_t count) { return batch(first, count); });
//
// Steps and hooks follow upstream: `state.step` counts the updates applied; after each update a hook sees
// `info.step`, the index of the step just taken (state.step - 1), and runs when `info.step % every == 0`; after the
// last step every hook with `at_end` runs once more unless it just ran. Checkpoints are named by state.step
// (`step-N` holds N updates). Every batch is a pure function of (config, seed, step), so a resumed run computes
// exactly what an uninterrupted one does.
//
// Over several ranks (mpirun; levanter/distributed/plan.hpp, docs/distributed.md) each rank computes its slice of
// every global batch, the gradients are summed over the ranks in a fixed tree order, and the optimizer runs on every rank
// (data parallel) or on each rank's share of the state (ZeRO-1, when the optimizer came from `make_optimizer` of
// this Trainer). Rank 0 alone writes checkpoints, logs and metrics, and runs the hooks (unless a hook asks for
// every rank); decisions that depend on time (a time-based checkpoint) are taken on rank 0 and broadcast.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

#include <haliax/autodiff.hpp>
#include <haliax/detail/profile.hpp>
#include <haliax/nn/tensor_parallel.hpp>
#include <haliax/tree.hpp>
#include <levanter/checkpoint/train_state.hpp>
#include <levanter/distributed/comm.hpp>
#include <levanter/distributed/fsdp.hpp>
#include <levanter/distributed/plan.hpp>
#include <levanter/distributed/tensor_parallel.hpp>
#include <levanter/distributed/tree_comm.hpp>
#include <levanter/models/lm.hpp>
#include <levanter/optim/optimizer.hpp>
#include <levanter/profiler.hpp>
#include <levanter/trainer/config.hpp>
#include <levanter/trainer/layout.hpp>
#include <levanter/trainer/run.hpp>
#include <levanter/watch.hpp>

namespace levanter {

/// What a step transforms (upstream TrainerState): the number of updates applied, the model, the optimizer with
/// its state, and the training PRNG key (dropout keys are folded from it by step and micro-batch).
template <class M>
struct train_state {
  std::int64_t step = 0;
  M model;
  std::unique_ptr<optim::optimizer<M>> optimizer;
  haliax::random::key training_key{};
};

/// What a hook sees after a step (upstream StepInfo).
template <class M>
struct step_info {
  std::int64_t step = 0;       ///< the index of the step just taken (upstream `info.step`: state.step - 1)
  std::int64_t next_step = 0;  ///< updates applied so far (state.step)
  std::int64_t num_train_steps = 0;
  double loss = 0;
  double learning_rate = 0;
  double step_seconds = 0;
  std::int64_t tokens = 0;
  const M* model = nullptr;
  const train_state<M>* state = nullptr;
  /// What evaluation and exports use (upstream `eval_model`): the trainer.model_averaging average when there is one,
  /// else `model`.
  const M* eval_model = nullptr;
};

/// A hook: runs after the steps whose index is a multiple of `every` (0 or less: never during training), and,
/// with `at_end`, once after the last step.
template <class M>
struct hook {
  std::int64_t every = 1;
  std::function<void(const step_info<M>&)> fn;
  bool at_end = true;
  /// Run on every rank (for hooks that communicate); by default only rank 0 runs it.
  bool all_ranks = false;
};

/// Everything a finished run reports.
struct train_result {
  std::string run_dir;
  std::int64_t steps = 0;  ///< updates applied at the end
  double first_loss = 0, final_loss = 0;
  std::int64_t tokens = 0;
  double seconds = 0;
  std::int64_t parameters = 0;
  std::int64_t start_step = 0;                 ///< the step training began at (the resumed checkpoint's, or 0)
  std::optional<std::string> resumed_from;     ///< the checkpoint directory loaded, when resuming
  std::optional<std::string> last_checkpoint;  ///< the last checkpoint committed by this run
  std::optional<double> eval_loss;             ///< the last evaluation's eval/loss (set by the program)
};

/// What the Trainer needs to know of the model beyond its type.
struct trainer_options {
  double flops_per_token = 0;          ///< training FLOPs per token (3x forward), for MFU
  std::int64_t tokens_per_example = 0;  ///< sequence length
  haliax::nn::checkpoint_policy checkpointing = haliax::nn::checkpoint_policy::none;
  /// The step's matrix products (one forward pass): the measured peak that MFU divides by is the GEMM rate on them.
  std::vector<matmul_shape> gemm_shapes = {};
  /// FLOPs per token that gradient checkpointing adds by recomputing forwards (for HFU; 0 without checkpointing).
  double recompute_flops_per_token = 0;
};

template <class M>
class Trainer {
 public:
  /// The loss of a model on a batch (a scalar); the trainer takes its value and gradient.
  using loss_fn = std::function<scalar(const M&, const lm_example&, const forward_options&)>;
  /// The examples [first, first + count) of the global order (a pure function of config, seed and index).
  using batch_fn = std::function<lm_example(std::int64_t first, std::int64_t count)>;

  /// The ranks are `comm`'s (world(): one process, or every rank of an mpirun job). Throws config::config_error
  /// when the trainer's axis mapping cannot be laid over them (distributed/plan.hpp).
  Trainer(const TrainerConfig& cfg, run_context& run, loss_fn loss, trainer_options o,
          distributed::communicator& comm = distributed::world())
      : cfg_(cfg), run_(run), loss_(std::move(loss)), opts_(o), comm_(comm),
        plan_(distributed::make_plan(cfg_, comm.size(), model_axes())),
        ck_policy_(checkpoint::policy_from_config(cfg.checkpointer, run.id())) {
    plan_.trainer = &cfg_;
    // The GEMM rate on the model's products at this rank's micro-batch, in the step's precision, added over the
    // ranks (each measured with its share of the machine): the job's peak, which MFU divides by.
    peak_flops_ = distributed::allreduce_sum(
        comm_, measure_gemm_peak(opts_.gemm_shapes, plan_.micro_batch(0) * opts_.tokens_per_example,
                                 matmul_precision_of(cfg)));
    data_ = &comm_;
    if (plan_.mesh.model > 1) {
      // Ranks r = d * T + t: model groups are T consecutive ranks (same d), data groups the ranks with the same t.
      const int T = plan_.mesh.model;
      tp_rank_ = comm.rank() % T;
      model_group_ = comm.split(comm.rank() / T, tp_rank_);
      data_owned_ = comm.split(tp_rank_, comm.rank() / T);
      data_ = data_owned_.get();
      tp_ctx_.split_axes = plan_.model_axes;
      tp_ctx_.allreduce = [g = model_group_.get()](float* x, std::int64_t n) { distributed::allreduce_sum(*g, x, n); };
    }
  }

  /// How the run is laid over the ranks.
  const distributed::plan& plan() const { return plan_; }
  distributed::communicator& comm() { return comm_; }

  /// The optimizer `choice` asks for, sharded over the data ranks when the plan says so (ZeRO-1, FSDP), and for
  /// this rank's slices of the parameters under tensor parallelism (`params` is the whole model).
  std::unique_ptr<optim::optimizer<M>> make_optimizer(const OptimizerChoice& choice, const M& params) {
    if (plan_.mesh.model == 1) {
      auto opt = optim::make_optimizer(choice, cfg_.num_train_steps, params, data_, plan_.shard_optimizer);
      if (cfg_.model_averaging) opt->set_model_averaging(averaging(), params);
      return opt;
    }
    const auto dims = split_dims(params);
    const int T = plan_.mesh.model, t = tp_rank_;
    auto opt = optim::make_optimizer(choice, cfg_.num_train_steps, slice(params, dims), data_, plan_.shard_optimizer);
    optim::tensor_parallel_codec<M> c;
    c.group = model_group_.get();
    for (int d : dims) c.split.push_back(d >= 0 ? 1 : 0);
    c.to_global = [g = model_group_.get(), dims](const M& l) { return distributed::assemble_model(l, dims, *g); };
    c.to_local = [dims, t, T](const M& w) { return distributed::slice_model(w, dims, t, T); };
    c.local_zeros = [dims, T](const M& w) { return distributed::local_zeros(w, dims, T); };
    opt->set_tensor_parallel(std::move(c));
    if (cfg_.model_averaging) opt->set_model_averaging(averaging(), slice(params, dims));
    return opt;
  }

  const TrainerConfig& config() const { return cfg_; }
  run_context& run() { return run_; }
  /// Where this run's checkpoints go (`<base_path>/<run id>` unless append_run_id_to_base_path is false).
  const std::filesystem::path& checkpoint_path() const { return ck_policy_.base_path; }
  /// The GEMM rate measured when the Trainer was made (`measure_gemm_peak` on the model's products, every rank's
  /// added), in the precision trainer.mp computes in (the bfloat16 GEMM's rate under p=f32,c=bfloat16 where it
  /// runs): the denominator of MFU.
  double peak_flops() const { return peak_flops_; }

  void add_hook(hook<M> h) { hooks_.push_back(std::move(h)); }
  void add_hook(std::int64_t every, std::function<void(const step_info<M>&)> fn, bool at_end = true) {
    hooks_.push_back(hook<M>{every, std::move(fn), at_end});
  }

  /// The state to train from (upstream `Trainer.initial_state`): the newest loadable checkpoint under
  /// trainer.load_checkpoint_path or this run's checkpoint path (unless load_checkpoint is false), else the newest
  /// of trainer.initialize_from (another run, its step included), else step 0 with the given model and optimizer.
  /// Throws checkpoint::error when checkpoints exist but none loads, or when load_checkpoint is true and there is
  /// none.
  train_state<M> initial_state(M model, std::unique_ptr<optim::optimizer<M>> opt, haliax::random::key training_key) {
    namespace fs = std::filesystem;
    train_state<M> st{0, std::move(model), std::move(opt), training_key};
    auto log = run_.logger();
    auto load_full = [&](const checkpoint::checkpoint_info& c) {
      auto loaded = checkpoint::load_train_state(c, st.model, st.optimizer.get(), cfg_.allow_partial_checkpoint);
      if (!loaded.had_opt_state)
        throw checkpoint::error("'" + c.path.string() + "' holds no optimizer state (a model-only checkpoint: use "
                                "initialize_from_checkpoint_path to start a run from it)");
      for (const auto& m : loaded.missing) log("checkpoint lacks '" + m + "'; keeping its initial value");
      st.step = loaded.step;
      if (loaded.training_key) st.training_key = *loaded.training_key;
      resumed_from_ = c.path.string();
    };
    auto outcome = checkpoint::resume_outcome::none_found;
    if (cfg_.load_checkpoint.value_or(true)) {
      const fs::path where = cfg_.load_checkpoint_path ? fs::path(*cfg_.load_checkpoint_path) : ck_policy_.base_path;
      outcome = checkpoint::resume_newest(where, load_full, log);
      if (outcome == checkpoint::resume_outcome::none_found) {
        if (cfg_.load_checkpoint.value_or(false))
          throw checkpoint::error("trainer.load_checkpoint is true but there is no checkpoint under '" +
                                  where.string() +
                                  "' (check trainer.load_checkpoint_path / trainer.checkpointer.base_path and "
                                  "trainer.id)");
        if (!cfg_.initialize_from) log("no checkpoint under " + where.string() + "; starting at step 0");
      }
    }
    if (outcome == checkpoint::resume_outcome::none_found && cfg_.initialize_from) {
      outcome = checkpoint::resume_newest(*cfg_.initialize_from, load_full, log);
      if (outcome == checkpoint::resume_outcome::none_found)
        throw checkpoint::error("trainer.initialize_from: there is no checkpoint under '" + *cfg_.initialize_from +
                                "'");
    }
    if (resumed_from_) log("resumed from " + *resumed_from_ + " at step " + std::to_string(st.step));
    return st;
  }

  /// The checkpoint initial_state loaded, if any.
  const std::optional<std::string>& resumed_from() const { return resumed_from_; }

  /// Trains `state` from state.step to trainer.num_train_steps, taking batches from `batches`; when the data ends
  /// (`examples`: how many there are, as train_lm's `epoch` or a mixture's stop_strategy make it finite), at the
  /// last step whose batch it fills, as upstream's loader ends a finite dataset. One step is one
  /// function of (state, batch) (`step_loop::take_step`); around it run the default hooks, in upstream's order
  /// (`_add_default_hooks`): metrics and progress, the checkpointer (rank 0 deciding, every rank taking part), then
  /// the program's hooks; trainer.watch and the profiler wrap the steps they are asked for.
  train_result train(train_state<M>& state, const batch_fn& batches,
                     std::optional<std::int64_t> examples = std::nullopt) {
    // trainer.mp's compute dtype: bfloat16 products for the steps and the hooks (evaluation) when this machine runs
    // them (haliax/precision.hpp); parameters, gradients and optimizer state stay f32.
    haliax::matmul_precision_scope precision(matmul_precision_of(cfg_));
    const std::int64_t end =
        examples ? steps_within(cfg_.train_batch_size, *examples, cfg_.num_train_steps) : cfg_.num_train_steps;
    if (end < cfg_.num_train_steps) {
      const std::int64_t used = data_offset_at(cfg_.train_batch_size, end);
      run_.logger()("the training data ends after " + std::to_string(*examples) + " examples: training stops after step " +
                    std::to_string(end) + " of trainer.num_train_steps " + std::to_string(cfg_.num_train_steps) +
                    (used < *examples ? " (the last " + std::to_string(*examples - used) +
                                            " examples do not fill a batch and are left out)"
                                      : std::string()));
    }
    step_loop loop(*this, state, batches, end);
    for (std::int64_t step = state.step; step < end; ++step) {
      loop.profile_begin(step);
      const auto out = loop.take_step(step);
      const auto t_hooks = std::chrono::steady_clock::now();
      loop.log_metrics(step, out);
      loop.checkpoint(step);
      loop.run_hooks(step, out);
      loop.profile_end(step, out, t_hooks);
      // the next step repeats this one's shapes: keep what it used, give back what it left idle (haliax/core.hpp)
      haliax::buffer_cache_step_boundary();
    }
    return loop.finish();
  }

 private:
  /// What one step produced.
  struct step_output {
    double loss = 0;
    optim::update_stats stats;
    std::chrono::steady_clock::time_point started;
    double seconds = 0;          ///< the step, from its first batch to the update done
    double loading_seconds = 0;  ///< of which waiting for batches
    std::int64_t batch_size = 0;
    json watched = json::object();  ///< trainer.watch's metrics
    /// A mixture of experts' auxiliary losses (weighted, summed over layers), averaged over the global batch's
    /// micro-batches as the loss is (upstream train/load_balancing_loss and train/router_z_loss)
    std::optional<double> load_balancing, router_z;
    /// Per layer: the routing entropy -sum_e l_e log(l_e + 1e-6) of the expert loads l (each expert's share of the
    /// routed rows), and the loads, averaged over the micro-batches as the losses are (upstream
    /// moe/layer{i}/routing_entropy and moe/layer{i}/expert{j}_load)
    std::vector<double> routing_entropy;
    std::vector<std::vector<double>> expert_loads;
  };

  /// One call of train(): the parameters' layout, the checkpointer, the meters and what the hooks last did.
  class step_loop {
   public:
    step_loop(Trainer& tr, train_state<M>& state, const batch_fn& batches, std::int64_t end)
        : tr_(tr), t_(tr.cfg_), state_(state), batches_(batches), log_(tr.run_.logger()), start_(state.step), end_(end),
          root_(tr.comm_.rank() == 0), ranks_(tr.comm_.size()), T_(tr.plan_.mesh.model),
          layout_(state.model, tr.plan_, *tr.data_, tr.model_group_.get(),
                  T_ > 1 ? tr.split_dims(state.model) : std::vector<int>{},
                  [&tr](const M& m) { return tr.slice(m, tr.split_dims(m)); }, state.optimizer->shard_bounds(),
                  tr.comm_.size()),
          trk_(tr.run_.tracker()),
          watch_opts_{t_.watch.include_norms, t_.watch.include_per_parameter_norms, t_.watch.include_histograms,
                      t_.watch.split_scan_layers},
          last_run_(tr.hooks_.size(), -1) {
      res_.run_dir = tr.run_.dir().string();
      res_.parameters = whole_parameters_;
      res_.start_step = start_;
      res_.resumed_from = tr.resumed_from_;
      res_.steps = start_;
      if (start_ >= end_ && tr.resumed_from_)
        log_("the checkpoint is already at step " + std::to_string(start_) + " of " + std::to_string(end_) +
             (end_ < t_.num_train_steps ? " (where the training data ends)" : "") + "; nothing to train");
      // Rank 0 writes the checkpoints (a sharded optimizer gathers its state for it).
      if (root_) ckpt_.emplace(tr.ck_policy_, checkpoint::checkpointer::clock_fn{}, log_);
      if (ckpt_ && tr.resumed_from_) ckpt_->resumed_at(start_);
      if (layout_.fsdp()) log_(layout_.describe(whole_parameters_));
      meter_.flops_per_token = tr.opts_.flops_per_token;
      meter_.hardware_flops_per_token = tr.opts_.flops_per_token + tr.opts_.recompute_flops_per_token;
      meter_.peak_flops = tr.peak_flops_;
      prof_first_ = std::max<std::int64_t>(t_.profiler_start_step, start_);
      prof_end_ = std::min<std::int64_t>(prof_first_ + t_.profiler_num_steps, end_);
      print_every_ = std::max<std::int64_t>(1, std::min<std::int64_t>(10, t_.num_train_steps / 20));
    }

    /// The step: this rank's micro-batches forward and backward, the gradients summed over the data ranks, the
    /// optimizer update; trainer.watch's summaries around the update when this step is watched (as upstream,
    /// gradients and parameters as the step found them, updates and optimizer state after it).
    step_output take_step(std::int64_t step) {
      step_output out;
      bool collect_aux = false, has_aux = false;
      double aux_lbl = 0, aux_rzl = 0;
      std::vector<double> aux_entropy;
      std::vector<std::vector<double>> aux_loads;
      const auto t0 = out.started = std::chrono::steady_clock::now();
      out.batch_size = t_.train_batch_size.at(step);
      const std::int64_t local = tr_.plan_.local_batch(step);  // this rank's examples: [offset + rank * local, + local)
      const std::int64_t mb = tr_.plan_.micro_batch(step);
      const std::int64_t micro = local / mb;
      const int drank = tr_.data_->rank();
      const std::int64_t offset = data_offset_at(t_.train_batch_size, step) + drank * local;
      const auto step_sent0 = sent();  // comm/gradient_bytes: everything sent from here to the summed gradient
      const auto step_key = haliax::random::fold_in(state_.training_key, static_cast<std::uint32_t>(step));
      // One micro-batch (the k-th of this rank's): its examples, its dropout key (by the micro-batch's index in the
      // global batch, whichever rank computes it), the loss and the gradient of `model`.
      auto micro_batch = [&](const M& model, std::int64_t k) -> std::pair<M, double> {
        const auto tl = std::chrono::steady_clock::now();
        std::optional<lm_example> ex;
        {
          haliax::detail::profile::region r([] { return std::string("trainer: load batch"); }, 0.0);
          ex.emplace(batches_(offset + k * mb, mb));  // waits only if the cache has not reached these examples
        }
        out.loading_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - tl).count();
        forward_options fo;
        fo.inference = false;
        fo.key = haliax::random::fold_in(step_key, static_cast<std::uint32_t>(drank * micro + k));
        fo.checkpointing = tr_.opts_.checkpointing;
        fo.aux = std::make_shared<lm_aux>();
        auto [loss, g] = haliax::value_and_grad([&](const M& p) { return tr_.loss_(p, *ex, fo); })(model);
        if (collect_aux && !fo.aux->load_balancing.empty()) {  // micro-batches in order on every rank
          has_aux = true;
          for (std::size_t i = 0; i < fo.aux->load_balancing.size(); ++i) {
            aux_lbl += fo.aux->load_balancing[i];
            aux_rzl += fo.aux->router_z[i];
          }
          const auto& loads = fo.aux->expert_loads;
          aux_entropy.resize(loads.size(), 0.0);
          aux_loads.resize(loads.size());
          for (std::size_t i = 0; i < loads.size(); ++i) {
            aux_loads[i].resize(loads[i].size(), 0.0);
            for (std::size_t e = 0; e < loads[i].size(); ++e) {
              aux_loads[i][e] += loads[i][e];
              aux_entropy[i] -= loads[i][e] * std::log(loads[i][e] + 1e-6);
            }
          }
        }
        return {std::move(g), loss.item()};
      };
      const bool watch_now = t_.watch.enabled() && step % t_.watch.interval == 0;
      std::optional<M> grads;
      collect_aux = true;
      double loss_sum = 0;
      {
        // Tensor parallelism: the Linear layers sum over the model group while this step's gradients are taken.
        std::optional<haliax::nn::tensor_parallel_scope> tp_scope;
        if (T_ > 1) tp_scope.emplace(tr_.tp_ctx_);
        std::tie(grads, loss_sum) = layout_.gradients(micro, micro_batch);
      }
      out.loss = layout_.reduce(grads, loss_sum, micro, watch_now && watching("grads"));
      collect_aux = false;  // not the Hessian products' forward passes
      if (has_aux) {
        const double parts = double(micro) * double(tr_.data_->size());
        if (tr_.data_->size() > 1) {
          aux_lbl = distributed::allreduce_sum(*tr_.data_, aux_lbl);
          aux_rzl = distributed::allreduce_sum(*tr_.data_, aux_rzl);
        }
        out.load_balancing = aux_lbl / parts;
        out.router_z = aux_rzl / parts;
        // the per-layer metrics: one gather, summed in rank order
        std::vector<double> flat(aux_entropy);
        for (const auto& l : aux_loads) flat.insert(flat.end(), l.begin(), l.end());
        if (tr_.data_->size() > 1) {
          const auto all = distributed::allgather_doubles(*tr_.data_, flat);
          if (all.size() != flat.size() * static_cast<std::size_t>(tr_.data_->size()))
            throw std::runtime_error("trainer: the ranks routed to different numbers of experts or layers");
          std::fill(flat.begin(), flat.end(), 0.0);
          for (std::size_t at = 0; at < all.size(); ++at) flat[at % flat.size()] += all[at];
        }
        std::size_t at = 0;
        for (auto& h : aux_entropy) h = flat[at++] / parts;
        for (auto& l : aux_loads)
          for (auto& x : l) x = flat[at++] / parts;
        out.routing_entropy = std::move(aux_entropy);
        out.expert_loads = std::move(aux_loads);
      }
      tr_.reduce_bytes_ = sent() - step_sent0;
      check_finite(out.loss, "train/loss", step, t_.crash_on_nan, t_.crash_on_inf);

      if (const auto probe = state_.optimizer->hessian_probe()) {  // Sophia-H, every update_interval steps
        haliax::detail::profile::region r([] { return std::string("optimizer: Hessian-vector product"); }, 0.0);
        auto [d, lo] = layout_.hessian_product(*probe, micro, micro_batch);
        state_.optimizer->set_hessian_product(std::move(d), lo);
      }
      std::optional<M> before;  // for the `updates` target: the parameters before the update
      if (watch_now) watch_before(step, grads, out.watched, before);
      {
        haliax::detail::profile::region r([] { return std::string("optimizer update"); }, 0.0);
        const auto sent0 = sent();
        out.stats = layout_.update(*state_.optimizer, grads, out.loss);
        tr_.update_bytes_ = sent() - sent0;
      }
      grads.reset();
      state_.step = step + 1;
      out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (watch_now) watch_after(step, before, out.watched);
      return out;
    }

    /// Default hook: the step's metrics to the tracker and, every few steps, the progress line (upstream's
    /// log_step_info and progress bar).
    void log_metrics(std::int64_t step, const step_output& out) {
      if (step == start_) res_.first_loss = out.loss;
      res_.final_loss = out.loss;
      res_.steps = step + 1;
      json metrics = {{"train/loss", out.loss},
                      {"global_step", step},
                      {"optim/learning_rate", out.stats.learning_rate},
                      {"optim/grad_norm", out.stats.grad_norm},
                      {"run_progress", double(step) / double(t_.num_train_steps)}};
      if (out.stats.skipped) metrics["optim/skipped_step"] = 1;
      if (out.load_balancing) metrics["train/load_balancing_loss"] = *out.load_balancing;
      if (out.router_z) metrics["train/router_z_loss"] = *out.router_z;
      for (std::size_t i = 0; i < out.routing_entropy.size(); ++i) {
        const std::string layer = "moe/layer" + std::to_string(i) + "/";
        metrics[layer + "routing_entropy"] = out.routing_entropy[i];
        for (std::size_t e = 0; e < out.expert_loads[i].size(); ++e)
          metrics[layer + "expert" + std::to_string(e) + "_load"] = out.expert_loads[i][e];
      }
      const std::int64_t tokens = out.batch_size * tr_.opts_.tokens_per_example;
      const json perf = meter_.on_step(tokens, out.batch_size, out.seconds);
      for (const auto& el : perf.items()) metrics[el.key()] = el.value();
      metrics["throughput/loading_time"] = out.loading_seconds;
      metrics["throughput/hook_time"] = hook_seconds_;
      if (ranks_ > 1) {
        metrics["comm/gradient_bytes"] = tr_.reduce_bytes_;
        metrics["comm/optimizer_bytes"] = tr_.update_bytes_;
      }
      for (const auto& el : out.watched.items()) metrics[el.key()] = el.value();
      {
        haliax::detail::profile::region r([] { return std::string("trainer: log metrics"); }, 0.0);
        trk_.log(metrics, step);
      }
      if ((step + 1) % print_every_ == 0 || step == 0 || step + 1 == end_) {
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start_).count();
        const double eta = elapsed / double(step + 1 - start_) * double(end_ - step - 1);
        tr_.run_.say(progress_line(step + 1, t_.num_train_steps, out.loss, out.stats.learning_rate,
                                   metrics["throughput/tokens_per_second"].template get<double>(),
                                   metrics["throughput/mfu"].template get<double>(), eta));
      }
    }

    /// Default hook: the checkpointer's policy (the last step is always saved). Over several ranks rank 0 decides
    /// (the policy is time-based) and broadcasts it; every rank takes part in gathering the whole model and a
    /// sharded or sliced optimizer's state while rank 0 builds its snapshot.
    void checkpoint(std::int64_t step) {
      const bool last = step + 1 == end_;
      if (ranks_ == 1) {
        ckpt_->on_step(step + 1, [&] { return state_files(step + 1); }, last);
        return;
      }
      bool saving = false;
      if (root_) {
        ckpt_->on_step(step + 1, [&] {
          saving = true;
          distributed::broadcast_flag(tr_.comm_, true);
          layout_.whole();
          return state_files(step + 1);
        }, last);
        if (!saving) distributed::broadcast_flag(tr_.comm_, false);
      } else if (distributed::broadcast_flag(tr_.comm_, false) && layout_.split()) {
        checkpoint::snapshot unused;
        state_.optimizer->save_state(unused, layout_.whole());
      }
    }

    /// The program's hooks due after this step (on rank 0 unless a hook runs on every rank), with the whole model
    /// and the model average when there is one (upstream's eval_model).
    void run_hooks(std::int64_t step, const step_output& out) {
      bool due = false;
      for (const auto& h : tr_.hooks_) due = due || (h.every > 0 && step % h.every == 0);
      if (due) {
        const M& whole = layout_.whole();
        std::optional<M> averaged;  // every rank takes part
        if (state_.optimizer->averages()) averaged.emplace(state_.optimizer->averaged_model(whole));
        info_ = step_info<M>{step,     step + 1,         t_.num_train_steps, out.loss, out.stats.learning_rate,
                             out.seconds, out.batch_size * tr_.opts_.tokens_per_example, &whole, &state_};
        info_.eval_model = averaged ? &*averaged : &whole;
        for (std::size_t h = 0; h < tr_.hooks_.size(); ++h)
          if (tr_.hooks_[h].every > 0 && step % tr_.hooks_[h].every == 0) {
            if (root_ || tr_.hooks_[h].all_ranks) tr_.hooks_[h].fn(info_);
            last_run_[h] = step;
          }
      } else {
        info_ = step_info<M>{step,     step + 1,         t_.num_train_steps, out.loss, out.stats.learning_rate,
                             out.seconds, out.batch_size * tr_.opts_.tokens_per_example, &state_.model, &state_};
      }
      layout_.release();
    }

    /// Default hook: trainer.profiler over [profiler_start_step, + profiler_num_steps).
    void profile_begin(std::int64_t step) {
      if (t_.profiler && step == prof_first_) prof_.start();
    }
    void profile_end(std::int64_t step, const step_output& out, std::chrono::steady_clock::time_point t_hooks) {
      const auto t_end = std::chrono::steady_clock::now();
      hook_seconds_ = std::chrono::duration<double>(t_end - t_hooks).count();
      if (!prof_.running()) return;
      prof_seconds_ += std::chrono::duration<double>(t_end - out.started).count();
      if (step + 1 == prof_end_) {
        prof_.stop();
        if (root_) prof_.write(tr_.run_.dir(), prof_first_, prof_end_ - prof_first_, prof_seconds_);
        log_("profile of steps " + std::to_string(prof_first_) + ".." + std::to_string(prof_end_ - 1) + " in " +
             (tr_.run_.dir() / "profile.txt").string());
      }
    }

    /// After the last step: every `at_end` hook that did not just run (upstream forces them once more: the final
    /// evaluation and export), the last checkpoint committed on every rank, and the whole model left in state.model
    /// for the caller.
    train_result finish() {
      if (prof_.running()) prof_.stop();
      const M& whole = layout_.whole();
      if (res_.steps == start_)  // nothing trained (the checkpoint was already at the end)
        info_ = step_info<M>{state_.step - 1, state_.step, t_.num_train_steps, std::nan(""),
                             state_.optimizer->next_learning_rate(), 0.0, 0, &whole, &state_};
      std::optional<M> averaged;
      if (state_.optimizer->averages()) averaged.emplace(state_.optimizer->averaged_model(whole));
      info_.model = &whole;
      info_.state = &state_;
      info_.eval_model = averaged ? &*averaged : &whole;
      for (std::size_t h = 0; h < tr_.hooks_.size(); ++h)
        if (tr_.hooks_[h].at_end && last_run_[h] != info_.step && (root_ || tr_.hooks_[h].all_ranks))
          tr_.hooks_[h].fn(info_);
      if (ckpt_) ckpt_->wait();
      tr_.comm_.barrier();  // no rank leaves before the last checkpoint is committed (a failed rank ended the job)
      if (res_.steps > start_)  // the last step is always saved
        res_.last_checkpoint = (tr_.ck_policy_.base_path / ("step-" + std::to_string(res_.steps))).string();
      else if (tr_.resumed_from_)
        res_.last_checkpoint = tr_.resumed_from_;
      res_.tokens = meter_.total_tokens;
      res_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start_).count();
      return res_;
    }

   private:
    std::uint64_t sent() const {
      return tr_.comm_.bytes_sent() + (tr_.data_owned_ ? tr_.data_owned_->bytes_sent() : 0) +
             (tr_.model_group_ ? tr_.model_group_->bytes_sent() : 0);
    }
    bool watching(const char* target) const {
      const auto& w = t_.watch.watch_targets.items;
      return std::find(w.begin(), w.end(), target) != w.end();
    }
    std::vector<checkpoint::named_file> state_files(std::int64_t step) {
      return checkpoint::train_state_files(state_.model, state_.optimizer.get(), step, state_.training_key,
                                           data_offset_at(t_.train_batch_size, step), tr_.run_.resolved_yaml());
    }
    // trainer.watch before the update: the gradients and the parameters as the step found them (whole).
    void watch_before(std::int64_t step, const std::optional<M>& grads, json& watched, std::optional<M>& before) {
      std::optional<M> whole_grads;  // gathered from the ranges or slices
      if (watching("grads") && (layout_.fsdp() || T_ > 1)) whole_grads.emplace(layout_.watched_grads(grads));
      const M& model = layout_.whole();
      haliax::detail::profile::region r([] { return std::string("trainer: watch"); }, 0.0);
      haliax::no_grad_guard ng;
      const M* wg = whole_grads ? &*whole_grads : grads ? &*grads : nullptr;
      if (watching("grads") && wg) watch::summarize("grad", *wg, watch_opts_, watched, &trk_, step);
      if (watching("params")) watch::summarize("params", model, watch_opts_, watched, &trk_, step);
      if (watching("updates"))
        before = haliax::tree::map(model, [](const std::string&, const auto& x) { return x * 1.0f; });
    }
    // trainer.watch after it: the update (parameters after minus before) and the optimizer state.
    void watch_after(std::int64_t step, std::optional<M>& before, json& watched) {
      haliax::detail::profile::region r([] { return std::string("trainer: watch"); }, 0.0);
      haliax::no_grad_guard ng;
      if (!before && !watching("opt_state")) return;
      M& model = layout_.whole();
      if (before) {
        haliax::tree::zip_leaves(*before, model, [](const std::string&, auto& b, const auto& p) { b = p - b; });
        watch::summarize("updates", *before, watch_opts_, watched, &trk_, step);
        before.reset();
      }
      if (watching("opt_state"))
        state_.optimizer->for_each_state_tree([&](const std::string& name, const M& tree) {
          watch::summarize("opt_state/" + name, tree, watch_opts_, watched, &trk_, step);
        }, model);
    }

    Trainer& tr_;
    const TrainerConfig& t_;
    train_state<M>& state_;
    const batch_fn& batches_;
    std::function<void(const std::string&)> log_;
    const std::int64_t start_;
    const std::int64_t end_;  // the step the run stops at: num_train_steps, or where the data ends
    const bool root_;
    const int ranks_, T_;
    std::int64_t whole_parameters_ = haliax::tree::parameter_count(state_.model);  // before the layout slices it
    trainer::param_layout<M> layout_;
    tracker& trk_;
    const watch::options watch_opts_;
    std::vector<std::int64_t> last_run_;  // the step index each hook last ran at
    train_result res_;
    std::optional<checkpoint::checkpointer> ckpt_;
    throughput_meter meter_;
    profiler prof_;
    std::int64_t prof_first_ = 0, prof_end_ = 0, print_every_ = 1;
    double prof_seconds_ = 0;
    double hook_seconds_ = 0;  // the previous step's hooks (eval, checkpoint, exports), logged with this step
    step_info<M> info_;
    const std::chrono::steady_clock::time_point t_start_ = std::chrono::steady_clock::now();
  };

  // trainer.model_averaging as the optimizer keeps it.
  optim::model_averaging averaging() const {
    optim::model_averaging m;
    if (const auto* e = cfg_.model_averaging->template get_if<EmaModelAveragingConfig>()) {
      m.beta = e->beta;
    } else if (const auto* d = cfg_.model_averaging->template get_if<EmaDecaySqrtConfig>()) {
      m.type = optim::model_averaging::kind::ema_decay_sqrt;
      m.beta = d->beta;
      m.switch_step = d->switch_step;
      m.decay_steps = d->decay_steps;
    }
    return m;
  }

  // The axis names M's parameters can have (from the leaf types, optional ones included: a Llama's MLP or a
  // Mixtral's experts).
  static std::set<std::string> model_axes() {
    std::set<std::string> names;
    haliax::tree::for_each_leaf_type<M>([&](const auto& axis_names) {
      for (const auto& n : axis_names) names.insert(std::string(n));
    });
    return names;
  }

  // Tensor parallelism: per leaf the split axis (or -1); this rank's slices.
  std::vector<int> split_dims(const M& m) const {
    try {
      return distributed::split_dims(m, plan_.model_axes);
    } catch (const distributed::split_error& e) {
      throw config::config_error(std::string("trainer.tensor_parallel_axes: ") + e.what());
    }
  }
  M slice(const M& m, const std::vector<int>& dims) const {
    try {
      return distributed::slice_model(m, dims, tp_rank_, plan_.mesh.model);
    } catch (const distributed::split_error& e) {
      throw config::config_error(std::string("trainer.model_axis_size: ") + e.what());
    }
  }

  TrainerConfig cfg_;
  run_context& run_;
  loss_fn loss_;
  trainer_options opts_;
  distributed::communicator& comm_;
  distributed::plan plan_;
  // Tensor parallelism (plan_.mesh.model > 1): this rank's group of model ranks, the group of ranks that split the
  // batch with it (data_: comm_ itself without TP), its index in the model group, and the sums Linear layers do.
  std::unique_ptr<distributed::communicator> model_group_, data_owned_;
  distributed::communicator* data_ = nullptr;
  int tp_rank_ = 0;
  haliax::nn::tensor_parallel tp_ctx_;
  std::uint64_t reduce_bytes_ = 0, update_bytes_ = 0;  // bytes this rank sent in the last step's collectives
  checkpoint::policy ck_policy_;
  double peak_flops_ = 0;
  std::vector<hook<M>> hooks_;
  std::optional<std::string> resumed_from_;
};

}  // namespace levanter
