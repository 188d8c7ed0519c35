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
#include <haliax/tree.hpp>
#include <levanter/checkpoint/train_state.hpp>
#include <levanter/distributed/comm.hpp>
#include <levanter/distributed/plan.hpp>
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
        ck_policy_(checkpoint::policy_from_config(cfg.checkpointer, run.id())), peak_flops_(measure_gemm_peak()) {
    plan_.trainer = &cfg_;
  }

  /// How the run is laid over the ranks.
  const distributed::plan& plan() const { return plan_; }
  distributed::communicator& comm() { return comm_; }

  /// The optimizer `choice` asks for, sharded over the ranks when the plan says so (ZeRO-1).
  std::unique_ptr<optim::optimizer<M>> make_optimizer(const OptimizerChoice& choice, const M& params) {
    return optim::make_optimizer(choice, cfg_.num_train_steps, params, &comm_, plan_.shard_optimizer);
  }

  const TrainerConfig& config() const { return cfg_; }
  run_context& run() { return run_; }
  /// Where this run's checkpoints go (`<base_path>/<run id>` unless append_run_id_to_base_path is false).
  const std::filesystem::path& checkpoint_path() const { return ck_policy_.base_path; }
  /// The GEMM rate measured on this machine when the Trainer was made: the denominator of MFU.
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
    // Rank 0 writes the checkpoints (parameters are whole on every rank; a sharded optimizer gathers its state).
    std::optional<checkpoint::checkpointer> ckpt;
    if (root) ckpt.emplace(ck_policy_, checkpoint::checkpointer::clock_fn{}, log);
    if (ckpt && resumed_from_) ckpt->resumed_at(start_step);
    const auto* grad_bounds = state.optimizer->shard_bounds();
    std::vector<float> comm_buf;  // the flat gradient buffer of the reductions, kept between steps
    auto state_files = [&](std::int64_t step) {
      return checkpoint::train_state_files(state.model, state.optimizer.get(), step, state.training_key,
                                           data_offset_at(t.train_batch_size, step), run_.resolved_yaml());
    };

    throughput_meter meter;
    meter.flops_per_token = opts_.flops_per_token;
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
      const std::int64_t offset = data_offset_at(t.train_batch_size, step) + comm_.rank() * local;
      const auto step_key = haliax::random::fold_in(state.training_key, static_cast<std::uint32_t>(step));

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
        const auto tl = std::chrono::steady_clock::now();
        std::optional<lm_example> ex;
        {
          haliax::detail::profile::region r([] { return std::string("trainer: load batch"); }, 0.0);
          ex.emplace(batches(offset + first * mb, mb));  // waits only if the cache has not reached these examples
        }
        loading_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - tl).count();
        forward_options fo;
        fo.inference = false;
        // dropout keys by the micro-batch's index in the global batch, whichever rank computes it
        fo.key = haliax::random::fold_in(step_key, static_cast<std::uint32_t>(comm_.rank() * micro + first));
        fo.checkpointing = opts_.checkpointing;
        auto [loss, g] = haliax::value_and_grad([&](const M& p) { return loss_(p, *ex, fo); })(state.model);
        return {std::move(g), loss.item()};
      };
      auto [summed, loss_sum] = accumulate(0, micro);
      std::optional<M> grads(std::move(summed));
      const bool watch_now = t.watch.enabled() && step % t.watch.interval == 0;
      // ---- the sum over ranks (tree order): whole, or only this rank's range for a sharded optimizer (unless the
      // gradients are to be watched) ----
      if (ranks > 1) {
        haliax::detail::profile::region r([] { return std::string("trainer: reduce gradients"); }, 0.0);
        const auto sent0 = comm_.bytes_sent();
        distributed::reduce_tree(comm_, *grads, comm_buf, watch_now && watching("grads") ? nullptr : grad_bounds);
        loss_sum = distributed::allreduce_sum(comm_, loss_sum);
        reduce_bytes_ = comm_.bytes_sent() - sent0;
      }
      const std::int64_t parts = micro * ranks;
      if (parts > 1)
        *grads =
            haliax::tree::map(*grads, [s = 1.0f / float(parts)](const std::string&, const auto& x) { return x * s; });
      const double loss = loss_sum / double(parts);
      check_finite(loss, "train/loss", step, t.crash_on_nan, t.crash_on_inf);

      // ---- the update, with what trainer.watch asks to see around it (as upstream, gradients and parameters as
      // the step found them; updates and optimizer state after it) ----
      json watched = json::object();
      std::optional<M> before;  // for the `updates` target: the parameters before the update
      if (watch_now) {
        haliax::detail::profile::region r([] { return std::string("trainer: watch"); }, 0.0);
        haliax::no_grad_guard ng;
        if (watching("grads")) watch::summarize("grad", *grads, watch_opts, watched, &trk, step);
        if (watching("params")) watch::summarize("params", state.model, watch_opts, watched, &trk, step);
        if (watching("updates"))
          before = haliax::tree::map(state.model, [](const std::string&, const auto& x) { return x * 1.0f; });
      }
      optim::update_stats stats;
      {
        haliax::detail::profile::region r([] { return std::string("optimizer update"); }, 0.0);
        const auto sent0 = comm_.bytes_sent();
        stats = state.optimizer->update(state.model, *grads, loss);
        update_bytes_ = comm_.bytes_sent() - sent0;
      }
      state.step = step + 1;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (watch_now) {
        haliax::detail::profile::region r([] { return std::string("trainer: watch"); }, 0.0);
        haliax::no_grad_guard ng;
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
            return state_files(step + 1);
          }, last);
          if (!saving) distributed::broadcast_flag(comm_, false);
        } else if (distributed::broadcast_flag(comm_, false) && grad_bounds) {
          checkpoint::snapshot unused;
          state.optimizer->save_state(unused, state.model);
        }
      }
      info = step_info<M>{step,          step + 1,        t.num_train_steps, loss, stats.learning_rate, secs,
                          B * opts_.tokens_per_example, &state.model,      &state};
      for (std::size_t h = 0; h < hooks_.size(); ++h)
        if (hooks_[h].every > 0 && step % hooks_[h].every == 0) {
          if (root || hooks_[h].all_ranks) hooks_[h].fn(info);
          last_run[h] = step;
        }
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

    // Upstream forces every hook once more after the last step (final evaluation, final export).
    if (res.steps == start_step) {  // nothing trained (the checkpoint was already at the end)
      info = step_info<M>{state.step - 1, state.step, t.num_train_steps, std::nan(""),
                          state.optimizer->next_learning_rate(), 0.0, 0, &state.model, &state};
    }
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
  // The axis names of M's parameters (static per leaf type, so a default-constructed M answers).
  static std::set<std::string> model_axes() {
    std::set<std::string> names;
    const M m{};
    haliax::tree::for_each_leaf(m, [&](const std::string&, const auto& leaf) {
      for (const auto& n : leaf.axis_names()) names.insert(std::string(n));
    });
    return names;
  }

  TrainerConfig cfg_;
  run_context& run_;
  loss_fn loss_;
  trainer_options opts_;
  distributed::communicator& comm_;
  distributed::plan plan_;
  std::uint64_t reduce_bytes_ = 0, update_bytes_ = 0;  // bytes this rank sent in the last step's collectives
  checkpoint::policy ck_policy_;
  double peak_flops_ = 0;
  std::vector<hook<M>> hooks_;
  std::optional<std::string> resumed_from_;
};

}  // namespace levanter
