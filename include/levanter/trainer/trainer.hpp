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

  /// Trains `state` from state.step to trainer.num_train_steps, taking batches from `batches`.
  train_result train(train_state<M>& state, const batch_fn& batches) {
    const auto& t = cfg_;
    auto log = run_.logger();
    const std::int64_t start_step = state.step;
    // trainer.mp's compute dtype: bfloat16 products for the steps and the hooks (evaluation) when this machine runs
    // them (haliax/precision.hpp); parameters, gradients and optimizer state stay f32.
    haliax::matmul_precision_scope precision(matmul_precision_of(cfg_));
    train_result res;
    res.run_dir = run_.dir().string();
    res.parameters = haliax::tree::parameter_count(state.model);
    res.start_step = start_step;
    res.resumed_from = resumed_from_;
    res.steps = start_step;
    if (start_step >= t.num_train_steps && resumed_from_)
      log("the checkpoint is already at step " + std::to_string(start_step) + " of " +
          std::to_string(t.num_train_steps) + "; nothing to train");

    const bool root = comm_.rank() == 0;
    const int ranks = comm_.size();
    const int T = plan_.mesh.model;
    distributed::communicator& data = *data_;  // the ranks that split the batch (all of them without TP)
    const int drank = data.rank();
    auto sent = [&] {
      return comm_.bytes_sent() + (data_owned_ ? data_owned_->bytes_sent() : 0) +
             (model_group_ ? model_group_->bytes_sent() : 0);
    };
    // Rank 0 writes the checkpoints (parameters are whole on every rank; a sharded optimizer gathers its state).
    std::optional<checkpoint::checkpointer> ckpt;
    if (root) ckpt.emplace(ck_policy_, checkpoint::checkpointer::clock_fn{}, log);
    if (ckpt && resumed_from_) ckpt->resumed_at(start_step);
    const auto* grad_bounds = state.optimizer->shard_bounds();
    std::vector<float> comm_buf;  // the flat gradient buffer of the reductions, kept between steps
    // FSDP: this rank keeps only its range of the parameters; state.model holds none of them between steps and is
    // made whole (every rank taking part) only when a checkpoint, a hook or trainer.watch needs it.
    // Tensor parallelism: state.model holds this rank's slices during steps, the whole model when made whole.
    std::optional<distributed::fsdp_params<M>> fs;
    std::optional<M> local_keep;  // TP without FSDP: the slices, while state.model is whole
    bool whole = true;            // state.model holds the whole model
    std::vector<int> dims;
    if (T > 1) {
      dims = split_dims(state.model);
      state.model = slice(state.model, dims);
      whole = false;
    }
    if (plan_.shard_parameters) {
      if (!grad_bounds)
        throw config::config_error("trainer.fsdp_axis: sharding the parameters needs the optimizer made by "
                                   "Trainer::make_optimizer (sharded over the ranks)");
      fs.emplace(data, *grad_bounds, state.model);
      state.model = fs->skeleton();
      whole = false;
      const std::int64_t all = res.parameters;  // the whole model's (with TP, fs holds one slice of it)
      std::int64_t most = 0;  // the largest share (AdamW's chunks make them uneven)
      for (std::size_t q = 0; q + 1 < fs->bounds().size(); ++q)
        most = std::max(most, fs->bounds()[q + 1] - fs->bounds()[q]);
      char line[256];
      std::snprintf(line, sizeof line,
                    "FSDP: each rank keeps at most %lld of the %lld parameters between steps: %.2f MiB of parameters "
                    "and AdamW moments (one process: %.2f MiB, %.1f%%)",
                    static_cast<long long>(most), static_cast<long long>(all), double(most) * 12 / 1048576.0,
                    double(all) * 12 / 1048576.0, 100.0 * double(most) / double(all));
      log(line);
    }
    // Every rank takes part in make_whole (collectives over the data and model groups).
    auto make_whole = [&] {
      if (whole) return;
      M w = fs ? fs->whole() : state.model;
      if (T > 1) {
        if (!fs) local_keep = std::move(state.model);
        w = distributed::assemble_model(w, dims, *model_group_);
      }
      state.model = std::move(w);
      whole = true;
    };
    auto release = [&] {
      if (!whole || (!fs && T == 1)) return;
      if (fs) {
        state.model = fs->skeleton();
      } else {
        state.model = std::move(*local_keep);
        local_keep.reset();
      }
      whole = false;
    };
    // A tree of this rank's (sliced) gradients, whole for trainer.watch.
    auto global = [&](M g) { return T > 1 ? distributed::assemble_model(g, dims, *model_group_) : g; };
    auto state_files = [&](std::int64_t step) {
      return checkpoint::train_state_files(state.model, state.optimizer.get(), step, state.training_key,
                                           data_offset_at(t.train_batch_size, step), run_.resolved_yaml());
    };

    throughput_meter meter;
    meter.flops_per_token = opts_.flops_per_token;
    meter.hardware_flops_per_token = opts_.flops_per_token + opts_.recompute_flops_per_token;
    meter.peak_flops = peak_flops_;
    const watch::options watch_opts{t.watch.include_norms, t.watch.include_per_parameter_norms,
                                    t.watch.include_histograms, t.watch.split_scan_layers};
    auto watching = [&](const char* target) {
      const auto& w = t.watch.watch_targets.items;
      return std::find(w.begin(), w.end(), target) != w.end();
    };
    tracker& trk = run_.tracker();
    profiler prof;
    const std::int64_t prof_first = std::max<std::int64_t>(t.profiler_start_step, start_step);
    const std::int64_t prof_end = std::min<std::int64_t>(prof_first + t.profiler_num_steps, t.num_train_steps);
    double prof_seconds = 0;
    double hook_seconds = 0;  // the previous step's hooks (eval, checkpoint, exports), logged with this step
    const auto t_start = std::chrono::steady_clock::now();
    const std::int64_t print_every = std::max<std::int64_t>(1, std::min<std::int64_t>(10, t.num_train_steps / 20));
    step_info<M> info;
    std::vector<std::int64_t> last_run(hooks_.size(), -1);  // the step index each hook last ran at

    for (std::int64_t step = start_step; step < t.num_train_steps; ++step) {
      if (t.profiler && step == prof_first) prof.start();
      const auto t0 = std::chrono::steady_clock::now();
      double loading_seconds = 0;
      const std::int64_t B = t.train_batch_size.at(step);
      const std::int64_t local = plan_.local_batch(step);  // this rank's examples: [offset + rank * local, + local)
      const std::int64_t mb = plan_.micro_batch(step);
      const std::int64_t micro = local / mb;
      const std::int64_t offset = data_offset_at(t.train_batch_size, step) + drank * local;
      // Tensor parallelism: the Linear layers sum over the model group while this step's gradients are taken.
      std::optional<haliax::nn::tensor_parallel_scope> tp_scope;
      if (T > 1) tp_scope.emplace(tp_ctx_);
      const auto step_sent0 = sent();  // comm/gradient_bytes: everything sent from here to the summed gradient
      const auto step_key = haliax::random::fold_in(state.training_key, static_cast<std::uint32_t>(step));

      // One micro-batch (the k-th of this rank's): its examples, its dropout key (by the micro-batch's index in the
      // global batch, whichever rank computes it), the loss and the gradient of `model`.
      auto micro_batch = [&](const M& model, std::int64_t k) -> std::pair<M, double> {
        const auto tl = std::chrono::steady_clock::now();
        std::optional<lm_example> ex;
        {
          haliax::detail::profile::region r([] { return std::string("trainer: load batch"); }, 0.0);
          ex.emplace(batches(offset + k * mb, mb));  // waits only if the cache has not reached these examples
        }
        loading_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - tl).count();
        forward_options fo;
        fo.inference = false;
        fo.key = haliax::random::fold_in(step_key, static_cast<std::uint32_t>(drank * micro + k));
        fo.checkpointing = opts_.checkpointing;
        auto [loss, g] = haliax::value_and_grad([&](const M& p) { return loss_(p, *ex, fo); })(model);
        return {std::move(g), loss.item()};
      };
      // ---- forward and backward over the micro-batches (gradient accumulation) ----
      // The micro-batches' gradients and losses are added along distributed::tree_order's tree (left half + right
      // half), computed left to right with at most log2(micro) partial sums alive. With a power-of-two rank count
      // every rank's block of micro-batches is a subtree of the tree one process would use over all of them, and
      // the sum over ranks continues it: the gradients do not depend on the rank count.
      std::function<std::pair<M, double>(std::int64_t, std::int64_t)> accumulate =
          [&](std::int64_t first, std::int64_t n) -> std::pair<M, double> {
        if (n > 1) {
          auto left = accumulate(first, n / 2);
          auto right = accumulate(first + n / 2, n - n / 2);
          haliax::tree::zip_leaves(left.first, right.first,
                                   [](const std::string&, auto& acc, auto& x) { acc = acc + x; });
          return {std::move(left.first), left.second + right.second};
        }
        return micro_batch(state.model, first);
      };
      std::optional<M> grads;
      double loss_sum = 0;
      const bool watch_now = t.watch.enabled() && step % t.watch.interval == 0;
      if (fs) {
        // FSDP: one model per step whose layers are gathered as the forward (and the recomputation in backward)
        // reaches them; every layer's gradient is reduce-scattered into this rank's range as soon as it is
        // complete, the rest of the parameters' after each micro-batch. Micro-batches add left to right.
        fs->zero_grads();
        {
          M step_model = fs->step_model();
          for (std::int64_t k = 0; k < micro; ++k) {
            auto [g, loss] = micro_batch(step_model, k);
            fs->reduce_rest(g);
            loss_sum += loss;
          }
        }
        loss_sum = distributed::allreduce_sum(data, loss_sum);
        const std::int64_t parts = micro * data.size();
        if (parts > 1)
          fs->scale_grads(1.0f / float(parts));
        reduce_bytes_ = sent() - step_sent0;
        if (watch_now) {
          if (watching("grads")) grads.emplace(global(fs->whole_grads()));
          make_whole();
        }
      } else {
        auto [summed, sum] = accumulate(0, micro);
        grads.emplace(std::move(summed));
        loss_sum = sum;
      }
      // ---- the sum over ranks (tree order): whole, or only this rank's range for a sharded optimizer (unless the
      // gradients are to be watched) ----
      tp_scope.reset();
      if (ranks > 1 && !fs) {
        haliax::detail::profile::region r([] { return std::string("trainer: reduce gradients"); }, 0.0);
        distributed::reduce_tree(data, *grads, comm_buf, watch_now && watching("grads") ? nullptr : grad_bounds);
        loss_sum = distributed::allreduce_sum(data, loss_sum);
        reduce_bytes_ = sent() - step_sent0;
      }
      const std::int64_t parts = micro * data.size();
      if (parts > 1 && !fs)
        *grads =
            haliax::tree::map(*grads, [s = 1.0f / float(parts)](const std::string&, const auto& x) { return x * s; });
      const double loss = loss_sum / double(parts);
      check_finite(loss, "train/loss", step, t.crash_on_nan, t.crash_on_inf);

      // ---- the update, with what trainer.watch asks to see around it (as upstream, gradients and parameters as
      // the step found them; updates and optimizer state after it) ----
      json watched = json::object();
      std::optional<M> before;  // for the `updates` target: the parameters before the update
      std::optional<M> global_grads;  // tensor parallelism: the whole gradient tree for trainer.watch
      if (watch_now && !fs && T > 1) {
        if (watching("grads")) global_grads.emplace(global(*grads));
        make_whole();
      }
      if (watch_now) {
        haliax::detail::profile::region r([] { return std::string("trainer: watch"); }, 0.0);
        haliax::no_grad_guard ng;
        const M* wg = global_grads ? &*global_grads : fs ? (grads ? &*grads : nullptr) : &*grads;
        if (watching("grads") && wg) watch::summarize("grad", *wg, watch_opts, watched, &trk, step);
        if (watching("params")) watch::summarize("params", state.model, watch_opts, watched, &trk, step);
        if (watching("updates"))
          before = haliax::tree::map(state.model, [](const std::string&, const auto& x) { return x * 1.0f; });
      }
      optim::update_stats stats;
      {
        haliax::detail::profile::region r([] { return std::string("optimizer update"); }, 0.0);
        const auto sent0 = sent();
        release();
        if (fs) {
          stats = state.optimizer->update_range(fs->params().data(), fs->grads().data(), loss);
        } else {
          stats = state.optimizer->update(state.model, *grads, loss);
        }
        update_bytes_ = sent() - sent0;
      }
      grads.reset();
      global_grads.reset();
      state.step = step + 1;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (watch_now) {
        haliax::detail::profile::region r([] { return std::string("trainer: watch"); }, 0.0);
        haliax::no_grad_guard ng;
        if (before || watching("opt_state")) make_whole();
        if (before) {
          haliax::tree::zip_leaves(*before, state.model,
                                   [](const std::string&, auto& b, const auto& p) { b = p - b; });
          watch::summarize("updates", *before, watch_opts, watched, &trk, step);
          before.reset();
        }
        if (watching("opt_state"))
          state.optimizer->for_each_state_tree([&](const std::string& name, const M& tree) {
            watch::summarize("opt_state/" + name, tree, watch_opts, watched, &trk, step);
          }, state.model);
      }
      const auto t_hooks = std::chrono::steady_clock::now();

      // ---- metrics and progress (upstream's log_step_info and progress bar) ----
      if (step == start_step) res.first_loss = loss;
      res.final_loss = loss;
      res.steps = step + 1;
      json metrics = {{"train/loss", loss},
                      {"global_step", step},
                      {"optim/learning_rate", stats.learning_rate},
                      {"optim/grad_norm", stats.grad_norm},
                      {"run_progress", double(step) / double(t.num_train_steps)}};
      if (stats.skipped) metrics["optim/skipped_step"] = 1;
      const json perf = meter.on_step(B * opts_.tokens_per_example, B, secs);
      for (const auto& el : perf.items()) metrics[el.key()] = el.value();
      metrics["throughput/loading_time"] = loading_seconds;
      metrics["throughput/hook_time"] = hook_seconds;
      if (ranks > 1) {
        metrics["comm/gradient_bytes"] = reduce_bytes_;
        metrics["comm/optimizer_bytes"] = update_bytes_;
      }
      for (const auto& el : watched.items()) metrics[el.key()] = el.value();
      {
        haliax::detail::profile::region r([] { return std::string("trainer: log metrics"); }, 0.0);
        trk.log(metrics, step);
      }
      if ((step + 1) % print_every == 0 || step == 0 || step + 1 == t.num_train_steps) {
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
        const double eta = elapsed / double(step + 1 - start_step) * double(t.num_train_steps - step - 1);
        run_.say(progress_line(step + 1, t.num_train_steps, loss, stats.learning_rate,
                               metrics["throughput/tokens_per_second"].template get<double>(),
                               metrics["throughput/mfu"].template get<double>(), eta));
      }

      // ---- checkpoint (the last step is always saved), then the hooks ----
      const bool last = step + 1 == t.num_train_steps;
      if (ranks == 1) {
        ckpt->on_step(step + 1, [&] { return state_files(step + 1); }, last);
      } else {
        // Rank 0 decides (the policy is time-based) and says so; a sharded optimizer's state is gathered from
        // every rank while rank 0 builds its snapshot.
        bool saving = false;
        if (root) {
          ckpt->on_step(step + 1, [&] {
            saving = true;
            distributed::broadcast_flag(comm_, true);
            make_whole();
            return state_files(step + 1);
          }, last);
          if (!saving) distributed::broadcast_flag(comm_, false);
        } else if (distributed::broadcast_flag(comm_, false) && (grad_bounds || T > 1)) {
          make_whole();
          checkpoint::snapshot unused;
          state.optimizer->save_state(unused, state.model);
        }
      }
      bool hook_due = false;
      for (const auto& h : hooks_) hook_due = hook_due || (h.every > 0 && step % h.every == 0);
      if (hook_due && (fs || T > 1)) make_whole();
      std::optional<M> averaged;  // the model average, whole, for the hooks (every rank takes part)
      if (hook_due && state.optimizer->averages()) averaged.emplace(state.optimizer->averaged_model(state.model));
      info = step_info<M>{step,          step + 1,        t.num_train_steps, loss, stats.learning_rate, secs,
                          B * opts_.tokens_per_example, &state.model,      &state};
      info.eval_model = averaged ? &*averaged : &state.model;
      for (std::size_t h = 0; h < hooks_.size(); ++h)
        if (hooks_[h].every > 0 && step % hooks_[h].every == 0) {
          if (root || hooks_[h].all_ranks) hooks_[h].fn(info);
          last_run[h] = step;
        }
      release();
      const auto t_end = std::chrono::steady_clock::now();
      hook_seconds = std::chrono::duration<double>(t_end - t_hooks).count();
      if (prof.running()) {
        prof_seconds += std::chrono::duration<double>(t_end - t0).count();
        if (step + 1 == prof_end) {
          prof.stop();
          if (root) prof.write(run_.dir(), prof_first, prof_end - prof_first, prof_seconds);
          log("profile of steps " + std::to_string(prof_first) + ".." + std::to_string(prof_end - 1) + " in " +
              (run_.dir() / "profile.txt").string());
        }
      }
    }
    if (prof.running()) prof.stop();

    // Upstream forces every hook once more after the last step (final evaluation, final export). The caller gets
    // the whole model back.
    make_whole();
    if (res.steps == start_step) {  // nothing trained (the checkpoint was already at the end)
      info = step_info<M>{state.step - 1, state.step, t.num_train_steps, std::nan(""),
                          state.optimizer->next_learning_rate(), 0.0, 0, &state.model, &state};
    }
    std::optional<M> averaged;
    if (state.optimizer->averages()) averaged.emplace(state.optimizer->averaged_model(state.model));
    info.model = &state.model;
    info.state = &state;
    info.eval_model = averaged ? &*averaged : &state.model;
    for (std::size_t h = 0; h < hooks_.size(); ++h)
      if (hooks_[h].at_end && last_run[h] != info.step && (root || hooks_[h].all_ranks)) hooks_[h].fn(info);
    if (ckpt) ckpt->wait();
    // No rank leaves before the last checkpoint is committed (a rank that failed has ended the job).
    comm_.barrier();
    if (res.steps > start_step)  // the last step is always saved
      res.last_checkpoint = (ck_policy_.base_path / ("step-" + std::to_string(res.steps))).string();
    else if (resumed_from_)
      res.last_checkpoint = resumed_from_;
    res.tokens = meter.total_tokens;
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    return res;
  }

 private:
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

  // The axis names of M's parameters (static per leaf type, so a default-constructed M answers).
  static std::set<std::string> model_axes() {
    std::set<std::string> names;
    const M m{};
    haliax::tree::for_each_leaf(m, [&](const std::string&, const auto& leaf) {
      for (const auto& n : leaf.axis_names()) names.insert(std::string(n));
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
