// levanter/config/validate.hpp: the checks `train_lm` runs on a decoded config before doing any work.
//
// `validate(cfg, sources)` returns every problem at once. Errors are features we refuse (with what to use
// instead) and impossible values; notes are keys we read but ignore (JAX-only settings). Each message starts with
// the dotted key path and, where known, the file and line it was set at:
//
//   data.id (config/gpt2_nano.yaml:2): Hugging Face datasets are not supported (no network here); convert ...
//   trainer.per_device_parallelism (x.yaml:9): train_batch_size 32 is not divisible by per_device_parallelism 5; ...
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <levanter/config/train_lm_config.hpp>
#include <levanter/config/yaml.hpp>

namespace levanter::config {

/// What validate() found: `errors` stop the program; `notes` are keys accepted but ignored.
struct validation_result {
  std::vector<std::string> errors;
  std::vector<std::string> notes;
  bool ok() const { return errors.empty(); }
};

namespace detail {

/// Builds messages in one template: "<key> (<file:line>): <problem>; <what to do>".
struct validator {
  const source_map& sources;
  validation_result result;

  bool set_in_config(const std::string& key) const { return sources.count(key) != 0; }
  /// Whether the config sets `prefix` or any key below it.
  bool set_under(const std::string& prefix) const {
    auto it = sources.lower_bound(prefix);
    return it != sources.end() && it->first.compare(0, prefix.size(), prefix) == 0 &&
           (it->first.size() == prefix.size() || it->first[prefix.size()] == '.');
  }
  std::string at(const std::string& key, const std::string& fallback = "") const {
    auto it = sources.find(key);
    const std::string w = it != sources.end() ? it->second : fallback;
    return w.empty() ? std::string() : " (" + w + ")";
  }
  void error(const std::string& key, const std::string& what, const std::string& where = "") {
    result.errors.push_back(key + at(key, where) + ": " + what);
  }
  void note(const std::string& key, const std::string& what) {
    result.notes.push_back(key + at(key) + ": " + what);
  }
  /// `key` refers to a feature we do not implement: "<name> is not supported...; <instead>".
  void refuse(const std::string& key, const std::string& feature, const std::string& instead,
              const std::string& where = "") {
    error(key, feature + "; " + instead, where);
  }
};

inline std::string url_scheme(const std::string& url) {
  auto p = url.find("://");
  if (p == std::string::npos || p == 0) return {};
  for (std::size_t i = 0; i < p; ++i)
    if (!std::isalnum(static_cast<unsigned char>(url[i])) && url[i] != '+' && url[i] != '-' && url[i] != '.')
      return {};
  return url.substr(0, p);
}

inline std::string fmt_num(double v) { return format_double(v); }

inline void check_remote(validator& v, const std::string& key, const std::string& value, const std::string& what) {
  if (auto s = url_scheme(value); !s.empty())
    v.refuse(key, "'" + value + "' is a remote URL (" + s + "://); remote storage is not supported (no network here)",
             "copy the files to a local disk and use a local " + what);
}

inline void check_data(validator& v, const LmDataConfig& d) {
  if (d.id)
    v.refuse("data.id", "Hugging Face datasets ('" + *d.id + "') are not supported (no network here)",
             "convert the dataset to local .jsonl files and list them in data.train_urls / data.validation_urls");
  const std::pair<const char*, const std::vector<std::string>*> url_lists[] = {
      {"data.train_urls", &d.train_urls}, {"data.validation_urls", &d.validation_urls}};
  for (const auto& [name, list] : url_lists)
    for (std::size_t i = 0; i < list->size(); ++i)
      check_remote(v, join_index(name, i), (*list)[i], "path (globs and {a..b} ranges work)");
  check_remote(v, "data.cache_dir", d.cache_dir, "cache directory");

  // Mixtures: configs + train_weights (checked in full when the data is built: names, weights, stages).
  if (d.train_weights.set && !d.configs.set)
    v.error("data.train_weights", "mixture weights need data.configs (a map of dataset name -> sources)");
  if (d.configs.set && (!d.train_urls.empty() || !d.validation_urls.empty()))
    v.error("data.configs", "give either data.configs (a mixture) or data.train_urls/validation_urls (one dataset), "
                            "not both");
  if (d.stop_strategy && *d.stop_strategy != "restart")
    v.refuse("data.stop_strategy", "stop_strategy '" + *d.stop_strategy + "' is not implemented (upstream implements "
             "only restart either)", "use stop_strategy: restart");
  if (d.mixture_block_size && (*d.mixture_block_size <= 0 || *d.mixture_block_size >= 65536))
    v.error("data.mixture_block_size", "must be in [1, 65535] (got " + std::to_string(*d.mixture_block_size) + ")");
  const std::pair<const char*, bool> unsupported[] = {{"target_budget", d.target_budget.set},
                                                      {"experiment_budget", d.experiment_budget.set},
                                                      {"max_train_batches", d.max_train_batches.has_value()},
                                                      {"num_validation_sequences", d.num_validation_sequences.has_value()}};
  for (const auto& [k, on] : unsupported)
    if (on)
      v.refuse(std::string("data.") + k, std::string("data.") + k + " (simulated epoching / caps) is not supported yet",
               std::string("remove data.") + k);
  if (d.bad_documents != "stop" && d.bad_documents != "skip")
    v.error("data.bad_documents", "unknown policy '" + d.bad_documents + "': use stop or skip");
  if (d.cache_options.target_size_bytes() <= 0)
    v.error("data.cache_options.target_size_per_flush", "'" + d.cache_options.target_size_per_flush +
                                                            "' is not a size (e.g. 512MB)");
  if (d.cache_options.batch_size <= 0) v.error("data.cache_options.batch_size", "must be positive");
  if (d.cache_options.num_threads < 0) v.error("data.cache_options.num_threads", "must be >= 0 (0: one per core)");
  if (d.format.set) {
    YAML::Node f = YAML::Load(d.format.yaml);
    std::string type = f.IsScalar() ? f.Scalar() : (f.IsMap() && f["type"] ? f["type"].Scalar() : "text");
    bool ok = type == "text";
    if (ok && f.IsMap())
      for (auto it = f.begin(); it != f.end(); ++it)
        if (it->first.Scalar() != "type" && it->first.Scalar() != "text_key") ok = false;
    if (!ok)
      v.refuse("data.format", "format '" + type + "' is not supported yet (only plain text documents)",
               "use format: {type: text, text_key: text}, or leave data.format out", d.format.where);
  }
  const std::string& t = d.tokenizer;
  const bool local_json = t.size() > 5 && t.substr(t.size() - 5) == ".json";
  const bool local_dir = std::filesystem::is_directory(t) && std::filesystem::exists(std::filesystem::path(t) / "tokenizer.json");
  if (t == "passthrough") {
    if (!d.vocab_size || *d.vocab_size <= 0)
      v.error("data.vocab_size", "the passthrough tokenizer needs a positive vocab_size; set data.vocab_size");
  } else if (t != "byte" && !local_json && !local_dir) {
    check_remote(v, "data.tokenizer", t, "tokenizer.json path");
    if (url_scheme(t).empty())
      v.refuse("data.tokenizer", "tokenizer '" + t + "' is a Hugging Face hub name and Hugging Face hub tokenizers "
               "need a download (not supported: no network here)",
               "pass a local tokenizer.json path, or use tokenizer: byte");
  }
  if (d.permutation_type && *d.permutation_type != "linear" && *d.permutation_type != "feistel")
    v.error("data.permutation_type", "unknown permutation_type '" + *d.permutation_type + "'; use linear or feistel");
  if (auto* era = std::get_if<int64_t>(&d.shuffle); era && *era <= 0)
    v.error("data.shuffle", "an era length must be positive (got " + std::to_string(*era) +
                                "); use true for a full shuffle or false for none");
  if (d.shuffle_buffer_size) v.note("data.shuffle_buffer_size", "ignored (shuffling is by permutation)");
  if (d.chat_template) v.note("data.chat_template", "ignored (chat formats are not supported yet)");
  if (!d.id && d.name) v.note("data.name", "ignored (it names a Hugging Face dataset configuration)");
}

inline void check_viz(validator& v, const TrainVizConfig& z) {
  if (z.every < 0) v.error("viz.every", "must be >= 0 (0 turns the heatmap off)");
  if (z.every > 0 && z.num_docs <= 0) v.error("viz.num_docs", "must be positive");
}

inline void check_dtype(validator& v, const MpPolicy& mp) {
  auto bad = [](dtype d) { return d == dtype::f16 || d == dtype::f64; };
  if (bad(mp.param) || bad(mp.compute) || bad(mp.output))
    v.refuse("trainer.mp", "float16 and float64 policies are not supported (float16 needs loss scaling)",
             "use f32, bfloat16, or p=f32,c=bfloat16");
  else if (mp.param == dtype::bf16 || mp.compute == dtype::bf16 || mp.output == dtype::bf16)
    v.note("trainer.mp", "bfloat16 compute is not implemented on this backend yet: the run computes in f32 (its "
                         "losses will differ slightly from an upstream bfloat16 run)");
}

inline void check_trainer(validator& v, const TrainerConfig& t) {
  check_dtype(v, t.mp);
  for (std::size_t i = 0; i < t.tracker.items.size(); ++i) {
    const std::string key = t.tracker.is_list ? join_index("trainer.tracker", i) : "trainer.tracker";
    const auto& tr = t.tracker.items[i];
    if (tr.get_if<WandbConfig>())
      v.refuse(key, "the wandb tracker needs the Weights & Biases service, which this build cannot reach",
               "use tracker: {type: tensorboard} (view with `tensorboard --logdir tblogs`), tracker: {type: json_logger} "
               "(metrics.jsonl in the run dir), a list of both, or noop");
    if (const auto* tb = tr.get_if<TensorboardConfig>(); tb && tb->logdir)
      check_remote(v, key + ".logdir", *tb->logdir, "directory");
  }
  if (t.wandb.set)
    v.refuse("trainer.wandb", "trainer.wandb (a deprecated upstream alias of tracker) is not supported",
             "use trainer.tracker: {type: tensorboard} or {type: json_logger} (or a list of both)", t.wandb.where);
  if (t.quantization.set)
    v.refuse("trainer.quantization", "quantized (fp8/int8) training is not supported", "remove trainer.quantization",
             t.quantization.where);
  if (t.model_averaging.set)
    v.refuse("trainer.model_averaging", "model averaging (EMA) is not supported yet", "remove trainer.model_averaging",
             t.model_averaging.where);
  for (std::size_t i = 0; i < t.watch.watch_targets.items.size(); ++i) {
    const auto& w = t.watch.watch_targets.items[i];
    if (w != "grads" && w != "params" && w != "updates" && w != "opt_state")
      v.error(t.watch.watch_targets.is_list ? join_index("trainer.watch.watch_targets", i) : "trainer.watch.watch_targets",
              "unknown watch target '" + w + "': use grads, params, updates or opt_state");
  }
  if (t.watch.interval < 0) v.error("trainer.watch.interval", "must be >= 0 (0 turns watching off)");
  if (t.profiler && t.profiler_num_steps <= 0) v.error("trainer.profiler_num_steps", "must be positive");
  if (t.initialize_from) check_remote(v, "trainer.initialize_from", *t.initialize_from, "directory");
  if (t.shutdown_at_exit)
    v.refuse("trainer.shutdown_at_exit", "shutting the machine down at exit is not supported",
             "set shutdown_at_exit: false");
  if (t.model_axis_size > 1)
    v.refuse("trainer.model_axis_size", "tensor parallelism (model_axis_size " + std::to_string(t.model_axis_size) +
             ") is not supported yet (distribution arrives later)", "use model_axis_size: 1");
  if (t.model_axis_size <= 0) v.error("trainer.model_axis_size", "must be positive; use 1");
  if (t.replica_ici_axis_size != 1)
    v.refuse("trainer.replica_ici_axis_size", "replica mesh axes are not supported yet (distribution arrives later)",
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
    } else {
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
  if (t.num_train_steps <= 0)
    v.error("trainer.num_train_steps", "must be positive (got " + std::to_string(t.num_train_steps) + ")");
  if (t.steps_per_eval <= 0)
    v.error("trainer.steps_per_eval", "must be positive (got " + std::to_string(t.steps_per_eval) + ")");
  if (t.max_eval_batches && *t.max_eval_batches < 0)
    v.error("trainer.max_eval_batches", "must be >= 0 or unset (got " + std::to_string(*t.max_eval_batches) + ")");

  // checkpoint keep policies
  const auto& keep = t.checkpointer.keep;
  for (std::size_t i = 0; i < keep.size(); ++i) {
    const std::string key = join_index("trainer.checkpointer.keep", i);
    if (keep[i].every <= 0)
      v.error(key + ".every", "must be positive (got " + std::to_string(keep[i].every) + ")");
    if (!keep[i].until && i + 1 < keep.size())
      v.error(key + ".until", "only the last keep policy may omit 'until'; give this one an until step");
    if (i > 0 && keep[i].until && keep[i - 1].until && *keep[i].until <= *keep[i - 1].until)
      v.error(key + ".until", "keep policies must have increasing 'until' (" + std::to_string(*keep[i].until) +
                                  " after " + std::to_string(*keep[i - 1].until) + ")");
  }
  if (t.checkpointer.save_interval.seconds <= 0)
    v.error("trainer.checkpointer.save_interval", "must be a positive duration (e.g. 15m)");

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

inline bool valid_activation(const std::string& a) {
  static const char* names[] = {"relu", "silu", "swish", "gelu", "gelu_new", "quick_gelu", "tanh"};
  return std::find(std::begin(names), std::end(names), a) != std::end(names);
}

inline void check_model(validator& v, const Gpt2Config& m) {
  const std::pair<const char*, int> positive[] = {{"model.seq_len", m.seq_len},
                                                  {"model.hidden_dim", m.hidden_dim},
                                                  {"model.num_layers", m.num_layers},
                                                  {"model.num_heads", m.num_heads},
                                                  {"model.mlp_scale", m.mlp_scale}};
  for (const auto& [k, val] : positive)
    if (val <= 0) v.error(k, "must be positive (got " + std::to_string(val) + ")");
  if (m.hidden_dim > 0 && m.num_heads > 0 && m.hidden_dim % m.num_heads != 0)
    v.error("model.num_heads", "hidden_dim " + std::to_string(m.hidden_dim) + " is not divisible by num_heads " +
                                   std::to_string(m.num_heads) + "; choose num_heads dividing hidden_dim");
  const std::pair<const char*, double> drops[] = {
      {"model.embed_pdrop", m.embed_pdrop}, {"model.resid_pdrop", m.resid_pdrop}, {"model.attn_pdrop", m.attn_pdrop}};
  for (const auto& [k, p] : drops)
    if (!(p >= 0 && p < 1)) v.error(k, "a dropout probability must be in [0, 1) (got " + fmt_num(p) + ")");
  if (!(m.layer_norm_epsilon > 0))
    v.error("model.layer_norm_epsilon", "must be positive (got " + fmt_num(m.layer_norm_epsilon) + ")");
  if (!(m.initializer_range >= 0))
    v.error("model.initializer_range", "must be >= 0 (got " + fmt_num(m.initializer_range) + ")");
  if (!valid_activation(m.activation_function))
    v.error("model.activation_function", "unknown activation '" + m.activation_function +
                                             "'; use one of relu, silu, swish, gelu, gelu_new, quick_gelu, tanh");
  if (m.attn_backend && *m.attn_backend != "default" && *m.attn_backend != "jax_flash" && *m.attn_backend != "vanilla")
    v.refuse("model.attn_backend", "attention backend '" + *m.attn_backend + "' is not supported",
             "use default or jax_flash (blocked attention) or vanilla");
  if (m.flash_attention_block_size && *m.flash_attention_block_size <= 0)
    v.error("model.flash_attention_block_size", "must be positive");
  if (m.cross_entropy_block_size && *m.cross_entropy_block_size <= 0)
    v.error("model.cross_entropy_block_size", "must be positive");
}

inline void check_optimizer(validator& v, const AdamConfig& o) {
  if (!(o.learning_rate >= 0)) v.error("optimizer.learning_rate", "must be >= 0 (got " + fmt_num(o.learning_rate) + ")");
  if (!(o.weight_decay >= 0)) v.error("optimizer.weight_decay", "must be >= 0 (got " + fmt_num(o.weight_decay) + ")");
  if (!(o.beta1 >= 0 && o.beta1 < 1)) v.error("optimizer.beta1", "must be in [0, 1) (got " + fmt_num(o.beta1) + ")");
  if (!(o.beta2 >= 0 && o.beta2 < 1)) v.error("optimizer.beta2", "must be in [0, 1) (got " + fmt_num(o.beta2) + ")");
  if (!(o.epsilon > 0)) v.error("optimizer.epsilon", "must be positive (got " + fmt_num(o.epsilon) + ")");
  if (!(o.warmup >= 0)) v.error("optimizer.warmup", "must be >= 0 (a fraction or a number of steps)");
  if (o.decay && !(*o.decay >= 0)) v.error("optimizer.decay", "must be >= 0 (a fraction or a number of steps)");
  if (!(o.rewarmup >= 0)) v.error("optimizer.rewarmup", "must be >= 0 (a fraction or a number of steps)");
  if (!(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1))
    v.error("optimizer.min_lr_ratio", "must be in [0, 1] (got " + fmt_num(o.min_lr_ratio) + ")");
  if (o.max_grad_norm && !(*o.max_grad_norm >= 0))
    v.error("optimizer.max_grad_norm", "must be >= 0 or unset (got " + fmt_num(*o.max_grad_norm) + ")");
  if (o.cooldown)
    v.refuse("optimizer.cooldown", "cooldown is deprecated upstream and not supported",
             "use decay (the length of the final decay) with the normal schedule");
  if (o.haps)
    v.refuse("optimizer.haps", "haps is deprecated upstream and not supported",
             "use cycles: [end steps of each cycle]");
  int cyc = (o.cycle_length ? 1 : 0) + (o.cycles ? 1 : 0) + (o.haps ? 1 : 0);
  if (cyc > 1)
    v.error(o.cycle_length ? "optimizer.cycle_length" : "optimizer.cycles",
            "use at most one of cycle_length, cycles and haps");
  if (auto* p = o.lr_schedule.get_if<PowerLrSchedule>()) {
    if (!p->batch_size || !p->seq_length)
      v.error("optimizer.lr_schedule", "the power schedule needs batch_size and seq_length; set "
                                       "lr_schedule: {type: power, batch_size: B, seq_length: L}");
    if (!(p->a > 0 && p->b < 0)) v.error("optimizer.lr_schedule", "the power schedule expects a > 0 and b < 0");
  }
  if (auto* s = o.lr_schedule.get_if<InvSqrtLrSchedule>(); s && !(s->timescale > 0))
    v.error("optimizer.lr_schedule.timescale", "must be positive");
  if (o.update_rms_clipping && o.clip_update_norm)
    v.error("optimizer.update_rms_clipping", "update_rms_clipping cannot be combined with clip_update_norm "
                                             "(upstream rejects it); keep one of them");
  if (o.update_rms_clipping && !(*o.update_rms_clipping > 0))
    v.error("optimizer.update_rms_clipping", "must be positive");
  if (auto* n = std::get_if<int64_t>(&o.skip_bad_steps); n && *n <= 0)
    v.error("optimizer.skip_bad_steps", "a history length must be positive (or use true/false)");
}

}  // namespace detail

/// Every problem of a `train_lm` config (errors), and the keys it reads but ignores (notes).
inline validation_result validate(const TrainLmConfig& cfg, const source_map& sources) {
  detail::validator v{sources, {}};
  detail::check_data(v, cfg.data);
  detail::check_viz(v, cfg.viz);
  detail::check_trainer(v, cfg.trainer);
  if (auto* m = cfg.model.get_if<Gpt2Config>()) detail::check_model(v, *m);
  if (auto* o = cfg.optimizer.get_if<AdamConfig>()) detail::check_optimizer(v, *o);

  if (auto* b = std::get_if<bool>(&cfg.initialize_from_hf); b && *b)
    v.refuse("initialize_from_hf", "initialize_from_hf: true downloads the model's reference checkpoint from the "
             "Hugging Face Hub, which is not reachable here",
             "download it (huggingface-cli download gpt2 --local-dir DIR) and set initialize_from_hf: DIR");
  if (auto* s = std::get_if<std::string>(&cfg.initialize_from_hf))
    check_remote(v, "initialize_from_hf", *s, "directory");
  if (cfg.use_hf_model_config && !std::holds_alternative<std::string>(cfg.initialize_from_hf))
    v.error("use_hf_model_config", "takes the model config from initialize_from_hf, which is not set to a directory");
  if (cfg.hf_save_path) check_remote(v, "hf_save_path", *cfg.hf_save_path, "directory");
  if (cfg.hf_save_steps <= 0) v.error("hf_save_steps", "must be positive");
  if (cfg.hf_save_dtype && *cfg.hf_save_dtype != "float32" && *cfg.hf_save_dtype != "bfloat16" &&
      *cfg.hf_save_dtype != "float16" && *cfg.hf_save_dtype != "f32" && *cfg.hf_save_dtype != "bf16" &&
      *cfg.hf_save_dtype != "f16" && *cfg.hf_save_dtype != "fp32" && *cfg.hf_save_dtype != "fp16")
    v.error("hf_save_dtype", "unknown dtype '" + *cfg.hf_save_dtype + "': use float32, bfloat16 or float16");
  if (cfg.hf_upload.set)
    v.refuse("hf_upload", "uploading to the Hugging Face hub is not supported (no network here)", "remove hf_upload",
             cfg.hf_upload.where);
  if (cfg.eval_harness.set)
    v.refuse("eval_harness", "lm-eval-harness evaluation is not supported", "remove eval_harness",
             cfg.eval_harness.where);
  if (cfg.log_entropy) v.refuse("log_entropy", "entropy histograms are not supported yet", "set log_entropy: false");
  if (cfg.initialize_from_checkpoint_path)
    check_remote(v, "initialize_from_checkpoint_path", *cfg.initialize_from_checkpoint_path, "directory");
  if (cfg.epoch > 0)
    v.refuse("epoch", "epoch-bounded training (epoch " + std::to_string(cfg.epoch) + ") is not supported yet",
             "use epoch: 0 and bound the run with trainer.num_train_steps");
  if (cfg.epoch < 0) v.error("epoch", "must be >= 0 (0: unbounded)");
  if (!(cfg.z_loss_weight >= 0)) v.error("z_loss_weight", "must be >= 0");
  if (cfg.hf_save_dtype && !cfg.hf_save_path) v.note("hf_save_dtype", "ignored (no hf_save_path)");
  return v.result;
}

}  // namespace levanter::config
