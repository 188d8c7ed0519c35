// trainer/config.hpp: checks of the `trainer:` section (with its checkpointer and trackers).
#include <levanter/trainer/config.hpp>

#include <algorithm>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <haliax/detail/gemm_bf16.hpp>
#include <levanter/config/validate.hpp>

namespace levanter {

using config::check_int;
using config::check_path_component;
using config::check_remote;
using config::detail::join_index;
namespace bounds = config::bounds;

std::string cpu_bf16_instructions() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  // cpuid rather than __builtin_cpu_supports, whose feature names differ between GCC and Clang.
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return {};  // no OSXSAVE: no extended state
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool avx512_state = (xcr0_lo & 0xe6u) == 0xe6u;        // the OS saves ZMM and mask registers
  const bool amx_state = (xcr0_lo & 0x60000u) == 0x60000u;     // the OS saves the tile registers
  std::string s;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5)) && avx512_state) s = "AVX512_BF16";
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22)) && amx_state)
    s += s.empty() ? "AMX-BF16" : " and AMX-BF16";
  return s;
#else
  return {};
#endif
}

static void check_dtype(config::validator& v, const config::MpPolicy& mp) {
  using config::dtype;
  auto bad = [](dtype d) { return d == dtype::f16 || d == dtype::f64; };
  if (bad(mp.param) || bad(mp.compute) || bad(mp.output)) {
    v.refuse("trainer.mp", "float16 and float64 policies are not supported (float16 needs loss scaling)",
             "use f32, bfloat16, or p=f32,c=bfloat16");
  } else if (mp.param == dtype::bf16 || mp.compute == dtype::bf16 || mp.output == dtype::bf16) {
    // What the policy does here, said once: bfloat16 matrix products where they can run, f32 (bitwise mp: f32's
    // results, tests/train_lm_bf16_policy.sh) where they cannot. Parameters stay f32 either way.
    const std::string isa = cpu_bf16_instructions();
    const std::string kept = mp.param == dtype::bf16 ? "; parameters are kept in f32 (p=bfloat16 is not supported)"
                                                     : "";
    if (mp.compute != dtype::bf16) {
      v.note("trainer.mp", "the compute dtype is f32: the run computes in f32, with the same results as mp: f32" +
                               kept);
    } else if (haliax::bf16_matmul_available()) {
      v.note("trainer.mp", "matrix products run in bfloat16 (operands rounded to bfloat16, sums in f32) on " + isa +
                               " through " + haliax::bf16_matmul_backend() +
                               "; norms, softmax, attention scores, the loss, gradients' sums and the optimizer "
                               "stay f32" + kept);
    } else if (isa.empty()) {
      v.note("trainer.mp", "this CPU has no bfloat16 instructions (AVX512_BF16 or AMX-BF16): the run computes in f32, "
                           "with the same results as mp: f32" + kept);
    } else {
      v.note("trainer.mp", "this CPU has " + isa + ", but no bfloat16 GEMM runs here (" +
                               haliax::bf16_matmul_backend() +
                               "): the run computes in f32, with the same results as mp: f32" + kept);
    }
  }
}

haliax::matmul_precision matmul_precision_of(const TrainerConfig& t) {
  return t.mp.compute == config::dtype::bf16 && haliax::bf16_matmul_available() ? haliax::matmul_precision::bf16
                                                                                 : haliax::matmul_precision::f32;
}

void validate(config::validator& v, const TrainerConfig& t) {
  check_dtype(v, t.mp);
  for (std::size_t i = 0; i < t.tracker.items.size(); ++i) {
    const std::string key = t.tracker.is_list ? join_index("trainer.tracker", i) : "trainer.tracker";
    const auto& tr = t.tracker.items[i];
    if (tr.get_if<WandbConfig>())
      v.refuse(key, "the wandb tracker needs the Weights & Biases service, which this build cannot reach",
               "use tracker: {type: tensorboard} (view with `tensorboard --logdir tblogs`), tracker: {type: json_logger} "
               "(metrics.jsonl in the run dir), a list of both, or noop");
    if (const auto* tb = tr.get_if<TensorboardConfig>()) {
      if (tb->logdir) check_remote(v, key + ".logdir", *tb->logdir, "directory");
      if (tb->purge_step) check_int(v, key + ".purge_step", *tb->purge_step, 0, bounds::max_steps);
      check_int(v, key + ".max_queue", tb->max_queue, 1, 1 << 20);
      check_int(v, key + ".flush_secs", tb->flush_secs, 1, 86400);
    }
  }
  if (t.id) check_path_component(v, "trainer.id", *t.id, "run id");
  if (t.log_dir.empty()) v.error("trainer.log_dir", "is empty; give a directory (default logs/)");
  else check_remote(v, "trainer.log_dir", t.log_dir, "directory");
  if (t.checkpointer.base_path.empty())
    v.error("trainer.checkpointer.base_path", "is empty; give a directory (default checkpoints/)");
  if (t.wandb.set)
    v.refuse("trainer.wandb",
             "trainer.wandb (a deprecated upstream alias of tracker, which upstream turns into a Weights & Biases "
             "tracker whatever trainer.tracker says) is not supported",
             "remove it (on the command line: --trainer.wandb null) and use trainer.tracker: {type: tensorboard} or "
             "{type: json_logger} (or a list of both)",
             t.wandb.where);
  if (t.quantization.set)
    v.refuse("trainer.quantization", "quantized (fp8/int8) training is not supported", "remove trainer.quantization",
             t.quantization.where);
  if (t.model_averaging) {
    if (const auto* e = t.model_averaging->get_if<EmaModelAveragingConfig>())
      config::check_real(v, "trainer.model_averaging.beta", e->beta, 0, 1, false, true);
    if (const auto* e = t.model_averaging->get_if<EmaDecaySqrtConfig>()) {
      config::check_real(v, "trainer.model_averaging.beta", e->beta, 0, 1, false, true);
      config::check_int(v, "trainer.model_averaging.switch_step", e->switch_step, 0, config::bounds::max_steps);
      config::check_int(v, "trainer.model_averaging.decay_steps", e->decay_steps, 1, config::bounds::max_steps);
    }
  }
  for (std::size_t i = 0; i < t.watch.watch_targets.items.size(); ++i) {
    const auto& w = t.watch.watch_targets.items[i];
    if (w != "grads" && w != "params" && w != "updates" && w != "opt_state")
      v.error(t.watch.watch_targets.is_list ? join_index("trainer.watch.watch_targets", i) : "trainer.watch.watch_targets",
              "unknown watch target '" + w + "': use grads, params, updates or opt_state");
  }
  check_int(v, "trainer.watch.interval", t.watch.interval, 0, bounds::max_steps, "0 turns watching off");
  check_int(v, "trainer.profiler_start_step", t.profiler_start_step, 0, bounds::max_steps);
  check_int(v, "trainer.profiler_num_steps", t.profiler_num_steps, 1, bounds::max_steps);
  if (t.initialize_from) check_remote(v, "trainer.initialize_from", *t.initialize_from, "directory");
  if (t.shutdown_at_exit)
    v.refuse("trainer.shutdown_at_exit", "shutting the machine down at exit is not supported",
             "set shutdown_at_exit: false");
  // Tensor parallelism: ranks per model group (docs/distributed.md); that it divides the rank count and that
  // tensor_parallel_axes is set is checked when the ranks are known (distributed::make_plan).
  if (t.model_axis_size <= 0)
    v.error("trainer.model_axis_size", "must be positive; use 1");
  else
    check_int(v, "trainer.model_axis_size", t.model_axis_size, 1, std::int64_t{1} << 16, "ranks per model group");
  if (t.replica_ici_axis_size != 1)
    v.refuse("trainer.replica_ici_axis_size", "replica mesh axes are not implemented (docs/distributed.md)",
             "use replica_ici_axis_size: 1");
  if (t.replica_dcn_axis_size != 1 && t.replica_dcn_axis_size != -1)
    v.refuse("trainer.replica_dcn_axis_size", "multi-slice replicas are not supported yet",
             "use replica_dcn_axis_size: 1");
  check_remote(v, "trainer.checkpointer.base_path", t.checkpointer.base_path, "directory");
  if (t.load_checkpoint_path) check_remote(v, "trainer.load_checkpoint_path", *t.load_checkpoint_path, "directory");

  // batch sizes
  const auto& steps = t.train_batch_size.steps;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const std::string key = t.train_batch_size.is_constant() ? "trainer.train_batch_size"
                                                             : join_index("trainer.train_batch_size", i);
    if (steps[i].value <= 0)
      v.error(key, "train_batch_size must be positive (got " + std::to_string(steps[i].value) + ")");
    else
      check_int(v, t.train_batch_size.is_constant() ? key : key + ".value", steps[i].value, 1, bounds::max_batch,
                "sequences per step");
    if (i > 0) check_int(v, key + ".start", steps[i].start, 1, bounds::max_steps);
    if (i == 0 && steps[i].start != 0)
      v.error(key, "a batch-size schedule must start at step 0 (got start " + std::to_string(steps[i].start) + ")");
    if (i > 0 && steps[i].start <= steps[i - 1].start)
      v.error(key, "schedule starts must increase (" + std::to_string(steps[i].start) + " after " +
                       std::to_string(steps[i - 1].start) + ")");
  }
  if (t.per_device_parallelism != -1) {
    if (t.per_device_parallelism <= 0) {
      v.error("trainer.per_device_parallelism",
              "must be -1 (whole batch) or positive (got " + std::to_string(t.per_device_parallelism) + ")");
    } else if (check_int(v, "trainer.per_device_parallelism", t.per_device_parallelism, 1, bounds::max_batch,
                         "or -1 for the whole batch")) {
      for (const auto& s : steps)
        if (s.value > 0 && s.value % t.per_device_parallelism != 0) {
          v.error("trainer.per_device_parallelism", "train_batch_size " + std::to_string(s.value) +
                      " is not divisible by per_device_parallelism " + std::to_string(t.per_device_parallelism) +
                      "; choose a micro-batch size that divides the batch size");
          break;
        }
    }
  }
  if (t.per_device_eval_parallelism != -1 && t.per_device_eval_parallelism <= 0)
    v.error("trainer.per_device_eval_parallelism",
            "must be -1 (same as training) or positive (got " + std::to_string(t.per_device_eval_parallelism) + ")");
  else if (t.per_device_eval_parallelism != -1)
    check_int(v, "trainer.per_device_eval_parallelism", t.per_device_eval_parallelism, 1, bounds::max_batch,
              "or -1 for the training micro-batch");
  if (t.num_train_steps <= 0)
    v.error("trainer.num_train_steps", "must be positive (got " + std::to_string(t.num_train_steps) + ")");
  else if (check_int(v, "trainer.num_train_steps", t.num_train_steps, 1, bounds::max_steps)) {
    // Sequences over the whole run (the data offsets): batch sizes x steps.
    double examples = 0;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const double end = i + 1 < steps.size() ? double(std::min(steps[i + 1].start, t.num_train_steps))
                                              : double(t.num_train_steps);
      if (end > double(steps[i].start)) examples += (end - double(steps[i].start)) * double(steps[i].value);
    }
    if (examples > double(bounds::max_examples))
      v.error("trainer.num_train_steps", "the run would read " + config::fmt_num(examples) +
                                             " sequences (train_batch_size x num_train_steps); the limit is " +
                                             config::fmt_bound(bounds::max_examples) +
                                             "; use fewer steps or smaller batches");
  }
  if (t.steps_per_eval <= 0)
    v.error("trainer.steps_per_eval", "must be positive (got " + std::to_string(t.steps_per_eval) + ")");
  else
    check_int(v, "trainer.steps_per_eval", t.steps_per_eval, 1, bounds::max_steps);
  // Upstream stops evaluating after max_eval_batches batches (None: the whole validation set); 0 would evaluate
  // nothing and log a meaningless loss.
  if (t.max_eval_batches)
    check_int(v, "trainer.max_eval_batches", *t.max_eval_batches, 1, bounds::max_steps,
              "or null (leave it out) to evaluate the whole validation set");

  // checkpoint keep policies
  const auto& keep = t.checkpointer.keep;
  for (std::size_t i = 0; i < keep.size(); ++i) {
    const std::string key = join_index("trainer.checkpointer.keep", i);
    if (keep[i].every <= 0)
      v.error(key + ".every", "must be positive (got " + std::to_string(keep[i].every) + ")");
    else
      check_int(v, key + ".every", keep[i].every, 1, bounds::max_steps);
    if (keep[i].until) check_int(v, key + ".until", *keep[i].until, 1, bounds::max_steps);
    if (!keep[i].until && i + 1 < keep.size())
      v.error(key + ".until", "only the last keep policy may omit 'until'; give this one an until step");
    if (i > 0 && keep[i].until && keep[i - 1].until && *keep[i].until <= *keep[i - 1].until)
      v.error(key + ".until", "keep policies must have increasing 'until' (" + std::to_string(*keep[i].until) +
                                  " after " + std::to_string(*keep[i - 1].until) + ")");
  }
  if (t.checkpointer.save_interval.seconds <= 0)
    v.error("trainer.checkpointer.save_interval", "must be a positive duration (e.g. 15m)");
  else if (auto why = config::detail::duration_problem(t.checkpointer.save_interval.seconds); !why.empty())
    v.error("trainer.checkpointer.save_interval", why);

  // JAX-only keys: accepted, ignored, listed
  const char* jax_only[] = {"trainer.jax_config", "trainer.log_jaxprs", "trainer.log_xla_hlo",
                            "trainer.jax_compilation_cache_dir", "trainer.profiler_perfetto_link"};
  for (const char* k : jax_only)
    if (v.set_in_config(k)) v.note(k, "ignored (JAX-specific)");
  if (t.ray.set || v.set_in_config("trainer.ray")) v.note("trainer.ray", "ignored (JAX-specific: Ray is not used)");
  if (t.distributed.set) v.note("trainer.distributed", "ignored (JAX-specific; multi-process runs use mpirun)");
  if (v.set_in_config("trainer.require_accelerator"))
    v.note("trainer.require_accelerator", "ignored (JAX-specific; the CPU/GPU choice is made at build time)");
}

}  // namespace levanter

LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::TrainerConfig)
