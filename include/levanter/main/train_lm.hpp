// levanter/main/train_lm.hpp: the `train_lm` program (upstream `levanter.main.train_lm`): parse and validate the
// config, set up the run directory and trackers, build the data, the GPT-2 and AdamW, train with micro-batching,
// evaluate on the validation split, and write the summary.
//
// Run directory `<trainer.log_dir>/<run id>/`: `config.yaml` (the resolved config), `run_metadata.json` (source
// revision, build, libraries, BLAS kernels and threads, host), `metrics.jsonl` (json_logger records),
// `summary.json` (written at the end), `train_lm.log` (the progress lines), and with trainer.profiler
// `profile.txt` / `profile.json` (per-op time of the profiled steps).
//
// Checkpoints go to `<trainer.checkpointer.base_path>/<run id>/step-N/` (checkpoint/checkpointer.hpp). A run
// resumes from the newest complete checkpoint there (or under trainer.load_checkpoint_path), else from
// trainer.initialize_from (another run, its step included), else starts at step 0, optionally with the model
// of initialize_from_checkpoint_path or a local Hugging Face directory (initialize_from_hf). Every batch is a
// pure function of (config, seed, step), so a resumed run computes exactly what an uninterrupted one does.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <unistd.h>

#include <haliax/autodiff.hpp>
#include <levanter/checkpoint/train_state.hpp>
#include <levanter/compat/hf_gpt2.hpp>
#include <levanter/config/cli.hpp>
#include <levanter/config/train_lm_config.hpp>
#include <levanter/config/validate.hpp>
#include <levanter/config/yaml.hpp>
#include <levanter/data/lm_data.hpp>
#include <levanter/data/text.hpp>
#include <levanter/main/viz_lm.hpp>
#include <levanter/models/gpt2.hpp>
#include <levanter/optim/adamw.hpp>
#include <levanter/profiler.hpp>
#include <levanter/run_metadata.hpp>
#include <levanter/trainer.hpp>
#include <levanter/watch.hpp>

namespace levanter {

inline constexpr struct Example final : haliax::axis<"example"> {
} Example;

/// Everything a finished run reports (also written to summary.json).
struct train_result {
  std::string run_dir;
  std::int64_t steps = 0;
  double first_loss = 0, final_loss = 0;
  std::optional<double> eval_loss;
  std::int64_t tokens = 0;
  double seconds = 0;
  std::int64_t parameters = 0;
  std::int64_t start_step = 0;           ///< the step training began at (the resumed checkpoint's step, or 0)
  std::optional<std::string> resumed_from;  ///< the checkpoint directory loaded, when resuming
  std::optional<std::string> last_checkpoint;  ///< the last checkpoint committed by this run
};

namespace detail {

inline std::unique_ptr<tracker> make_tracker(const TrainerConfig& t, const std::filesystem::path& run_dir) {
  std::vector<std::unique_ptr<tracker>> ts;
  for (const auto& choice : t.tracker.items) {
    if (const auto* j = choice.get_if<JsonLoggerConfig>())
      ts.push_back(std::make_unique<json_logger_tracker>((run_dir / "metrics.jsonl").string(), j->logger_name));
    else if (choice.get_if<NoopTrackerConfig>())
      ts.push_back(std::make_unique<noop_tracker>());
    else if (const auto* tb = choice.get_if<TensorboardConfig>())
      ts.push_back(std::make_unique<tensorboard_tracker>(
          (std::filesystem::path(tb->logdir.value_or("tblogs")) / run_dir.filename()).string(),
          tb->filename_suffix.value_or(""), tb->write_to_disk));
    else
      throw config::config_error("trainer.tracker: type '" + std::string(choice.type_name()) + "' is not supported");
  }
  if (ts.size() == 1) return std::move(ts.front());
  return std::make_unique<composite_tracker>(std::move(ts));
}

/// What an evaluation of one validation set adds up: the summed next-token loss (nats), the number of
/// predicted tokens and the UTF-8 bytes they stand for (for bits per byte).
struct eval_totals {
  double nll = 0;
  double targets = 0;
  double bytes = 0;
  double loss() const { return targets > 0 ? nll / targets : std::nan(""); }
  double bpb() const { return bytes > 0 ? nll / std::log(2.0) / bytes : std::nan(""); }
  eval_totals& operator+=(const eval_totals& o) {
    nll += o.nll;
    targets += o.targets;
    bytes += o.bytes;
    return *this;
  }
};

/// The next-token loss of `model` over the first windows of `windows` in batches of `batch` (no gradients).
inline eval_totals evaluate(const gpt2::LMHeadModel& model, const Gpt2Config& mc, const data::cache_windows& windows,
                            std::int64_t batch, std::int64_t max_batches, std::int64_t eos, std::int64_t ignore_id,
                            const data::tokenizer& tok) {
  haliax::no_grad_guard ng;
  const std::int64_t n = windows.final_size();
  batch = std::min(batch, n);
  eval_totals tot;
  if (batch <= 0) return tot;
  const std::int64_t available = n / batch;
  const std::int64_t nb = max_batches > 0 ? std::min(available, max_batches) : available;
  const std::int64_t L = windows.seq_len();
  std::vector<std::int32_t> host(static_cast<std::size_t>(batch * L));
  for (std::int64_t b = 0; b < nb; ++b) {
    for (std::int64_t r = 0; r < batch; ++r) windows.window(b * batch + r, host.data() + r * L);
    auto tokens = haliax::from_host<std::int32_t>(host, batch * Batch, L * Pos);
    auto ex = lm_example::causal(tokens, eos, ignore_id);
    const double mean = gpt2::next_token_loss(model, mc, ex).item();
    double targets = 0, bytes = 0;
    for (std::int64_t r = 0; r < batch; ++r)
      for (std::int64_t p = 0; p + 1 < L; ++p) {
        const auto next = host[static_cast<std::size_t>(r * L + p + 1)];
        if (next == ignore_id) continue;
        targets += 1;
        bytes += double(tok.token_byte_length(next));
      }
    tot += eval_totals{mean * targets, targets, bytes};
  }
  return tot;
}

/// A YAML tree as JSON (scalars that read as numbers or booleans become numbers or booleans).
inline json yaml_to_json(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      json j = json::object();
      for (const auto& kv : n) j[kv.first.as<std::string>()] = yaml_to_json(kv.second);
      return j;
    }
    case YAML::NodeType::Sequence: {
      json j = json::array();
      for (const auto& v : n) j.push_back(yaml_to_json(v));
      return j;
    }
    case YAML::NodeType::Scalar: {
      const auto s = n.Scalar();
      if (n.Tag() != "!") {
        if (s == "true" || s == "false") return s == "true";
        char* end = nullptr;
        const long long i = std::strtoll(s.c_str(), &end, 10);
        if (!s.empty() && *end == 0) return i;
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && *end == 0) return d;
      }
      return s;
    }
    default:
      return nullptr;
  }
}

}  // namespace detail

/// Trains as `cfg` says. `out` receives the progress lines; each hook runs every `every` steps after the update
/// (and after the last step when `at_end`). Throws config::config_error, data::data_error or training_error with
/// a message for the user.
inline train_result run_train_lm(const TrainLmConfig& cfg, const std::string& resolved_yaml, std::ostream& out,
                                 const std::vector<hook>& hooks = {}) {
  namespace fs = std::filesystem;
  const auto& t = cfg.trainer;
  const auto* mc_ptr = cfg.model.get_if<Gpt2Config>();
  const auto* opt_cfg = cfg.optimizer.get_if<AdamConfig>();
  if (!mc_ptr || !opt_cfg) throw config::config_error("train_lm: only model.type gpt2 and optimizer.type adam are supported");

  // Run directory, resolved config, trackers.
  const std::string run_id = resolve_run_id(t.id);
  const fs::path run_dir = fs::path(t.log_dir) / run_id;
  fs::create_directories(run_dir);
  write_file_atomic(run_dir / "config.yaml", resolved_yaml);
  auto trk = detail::make_tracker(t, run_dir);
  std::ofstream log_file(run_dir / "train_lm.log", std::ios::app);
  std::mutex say_mu;  // the checkpointer reports from its writer thread
  auto say = [&](const std::string& line) {
    std::lock_guard lk(say_mu);
    out << line << std::endl;
    log_file << line << std::endl;
  };

  // Keys as upstream: data, loader, model, training.
  auto keys = haliax::random::split(haliax::random::make_key(static_cast<std::uint64_t>(t.seed)), 4);
  auto data_key = cfg.data_seed ? haliax::random::make_key(static_cast<std::uint64_t>(*cfg.data_seed)) : keys[0];
  const auto model_key = keys[2];
  auto training_key = keys[3];

  // A Hugging Face model to start from: its config.json may also give the model config.
  Gpt2Config mc_hf;
  std::optional<hf::gpt2_dir> hf_init;
  if (const auto* hf_path = std::get_if<std::string>(&cfg.initialize_from_hf)) {
    hf_init.emplace(hf::open_gpt2_dir(*hf_path, "initialize_from_hf"));
    if (cfg.use_hf_model_config) {
      mc_hf = hf::merge_hf_config(*mc_ptr, hf_init->config, *hf_path + "/config.json");
      mc_ptr = &mc_hf;
    } else {
      hf::check_matches(*mc_ptr, hf_init->config, "initialize_from_hf '" + *hf_path + "'");
    }
  }
  const Gpt2Config& mc = *mc_ptr;

  // Data: the tokenizer, a cache per dataset and split (built in the background the first time), the order.
  std::unique_ptr<data::lm_data> data_ptr;
  {
    data::lm_data::options dopt;
    dopt.seq_len = mc.seq_len;
    dopt.batch_size = t.train_batch_size.at(0);
    dopt.data_key = data_key;
    dopt.log = [&](const std::string& m) { say("train_lm: " + m); };
    data_ptr = std::make_unique<data::lm_data>(cfg.data, dopt);
  }
  const data::lm_data& train = *data_ptr;
  const data::tokenizer& tok = train.tok();
  const std::int64_t vocab = hf_init ? hf_init->vocab_size : cfg.data.vocab_size.value_or(tok.vocab_size());
  if (vocab < tok.vocab_size())
    throw config::config_error(std::string(hf_init ? "initialize_from_hf: the checkpoint's vocabulary (" : "data.vocab_size (") +
                               std::to_string(vocab) + " tokens) is smaller than the tokenizer's (" +
                               std::to_string(tok.vocab_size()) + ", " + tok.name() + ")");
  // EOS marks document boundaries (segment ids); -1 when the tokenizer has none (passthrough).
  const std::int64_t eos = tok.eos_id() ? *tok.eos_id() : -1;

  // Model and optimizer.
  auto model = gpt2::LMHeadModel::init(mc, vocab, model_key);
  const std::int64_t n_params = haliax::tree::parameter_count(model);
  optim::adamw opt(*opt_cfg, t.num_train_steps);
  auto opt_state = opt.init(model);

  // Resume, or initialise from elsewhere.
  const auto ck_policy = checkpoint::policy_from_config(t.checkpointer, run_id);
  std::int64_t start_step = 0;
  std::optional<std::string> resumed_from;
  auto load_full = [&](const checkpoint::checkpoint_info& c) {
    auto loaded = checkpoint::load_train_state(c, model, &opt_state, t.allow_partial_checkpoint);
    if (!loaded.had_opt_state)
      throw checkpoint::error("'" + c.path.string() + "' holds no optimizer state (a model-only checkpoint: use "
                              "initialize_from_checkpoint_path to start a run from it)");
    for (const auto& m : loaded.missing) say("train_lm: checkpoint lacks '" + m + "'; keeping its initial value");
    start_step = loaded.step;
    if (loaded.training_key) training_key = *loaded.training_key;
    resumed_from = c.path.string();
  };
  auto log_line = [&](const std::string& m) { say("train_lm: " + m); };
  checkpoint::resume_outcome outcome = checkpoint::resume_outcome::none_found;
  if (t.load_checkpoint.value_or(true)) {
    const fs::path where = t.load_checkpoint_path ? fs::path(*t.load_checkpoint_path) : ck_policy.base_path;
    outcome = checkpoint::resume_newest(where, load_full, log_line);
    if (outcome == checkpoint::resume_outcome::none_found) {
      if (t.load_checkpoint.value_or(false))
        throw checkpoint::error("trainer.load_checkpoint is true but there is no checkpoint under '" + where.string() +
                                "' (check trainer.load_checkpoint_path / trainer.checkpointer.base_path and trainer.id)");
      if (!t.initialize_from) say("train_lm: no checkpoint under " + where.string() + "; starting at step 0");
    }
  }
  if (outcome == checkpoint::resume_outcome::none_found && t.initialize_from) {
    outcome = checkpoint::resume_newest(*t.initialize_from, load_full, log_line);
    if (outcome == checkpoint::resume_outcome::none_found)
      throw checkpoint::error("trainer.initialize_from: there is no checkpoint under '" + *t.initialize_from + "'");
  }
  if (outcome == checkpoint::resume_outcome::loaded) {
    say("train_lm: resumed from " + *resumed_from + " at step " + std::to_string(start_step));
  } else if (cfg.initialize_from_checkpoint_path) {
    auto loaded_model = [&](const checkpoint::checkpoint_info& c) {
      auto l = checkpoint::load_train_state<gpt2::LMHeadModel>(c, model, nullptr, t.allow_partial_checkpoint);
      say("train_lm: model initialised from " + c.path.string() + " (step " + std::to_string(l.step) + ")");
    };
    if (checkpoint::resume_newest(*cfg.initialize_from_checkpoint_path, loaded_model, log_line) ==
        checkpoint::resume_outcome::none_found)
      throw checkpoint::error("initialize_from_checkpoint_path: there is no checkpoint under '" +
                              *cfg.initialize_from_checkpoint_path + "'");
  } else if (hf_init) {
    hf::load_gpt2(*hf_init, model);
    say("train_lm: model initialised from the Hugging Face checkpoint " + hf_init->dir);
  }
  if (start_step >= t.num_train_steps && resumed_from)
    say("train_lm: the checkpoint is already at step " + std::to_string(start_step) + " of " +
        std::to_string(t.num_train_steps) + "; nothing to train");
  checkpoint::checkpointer ckpt(ck_policy, {}, log_line);
  if (resumed_from) ckpt.resumed_at(start_step);
  if (!t.id && !std::getenv("RUN_ID"))
    say("train_lm: to resume this run after an interruption, run it again with --trainer.id " + run_id);
  auto state_files = [&](std::int64_t step) {
    return checkpoint::train_state_files(model, &opt_state, step, training_key, data_offset_at(t.train_batch_size, step),
                                         resolved_yaml);
  };
  const std::optional<fs::path> hf_save_dir =
      cfg.hf_save_path ? std::optional<fs::path>(fs::path(*cfg.hf_save_path) / run_id) : std::nullopt;
  auto export_hf = [&](std::int64_t step) {
    const auto dir = *hf_save_dir / ("step-" + std::to_string(step));
    hf::save_gpt2(model, mc, vocab, dir.string(), hf::dtype_from_config(cfg.hf_save_dtype), hf::default_max_shard_bytes,
                  eos >= 0 ? eos : vocab - 1);
    say("train_lm: exported a Hugging Face checkpoint to " + dir.string());
  };

  throughput_meter meter;
  meter.flops_per_token = 3.0 * mc.flops_per_token(vocab);
  meter.peak_flops = measure_gemm_peak();

  const json metadata = run_metadata();
  write_file_atomic(run_dir / "run_metadata.json", metadata.dump(2) + "\n");
  {
    json hparams = detail::yaml_to_json(YAML::Load(resolved_yaml));
    hparams["run_metadata"] = metadata;
    trk->log_hyperparameters(hparams);
  }
  const watch::options watch_opts{t.watch.include_norms, t.watch.include_per_parameter_norms,
                                  t.watch.include_histograms, t.watch.split_scan_layers};
  auto watching = [&](const char* target) {
    const auto& w = t.watch.watch_targets.items;
    return std::find(w.begin(), w.end(), target) != w.end();
  };
  profiler prof;
  const std::int64_t prof_first = std::max<std::int64_t>(t.profiler_start_step, start_step);
  const std::int64_t prof_end = std::min<std::int64_t>(prof_first + t.profiler_num_steps, t.num_train_steps);
  double prof_seconds = 0;
  double hook_seconds = 0;  // the previous step's hooks (eval, checkpoint, exports), logged with this step
  say("train_lm: run " + run_id + " -> " + run_dir.string());
  say("train_lm: gpt2 " + std::to_string(n_params) + " parameters, vocab " + std::to_string(vocab) + " (tokenizer " +
      tok.name() + "), sequences of " + std::to_string(mc.seq_len) + " tokens" +
      (train.is_mixture() ? ", a mixture of " + std::to_string(train.specs().size()) + " datasets" : "") + ", " +
      std::to_string(train.validation_sets().size()) + " validation set(s)");
  say("train_lm: OpenBLAS core " + openblas_core() + ", " + std::to_string(haliax::num_threads()) +
      " threads, measured GEMM peak " + std::to_string(static_cast<long long>(meter.peak_flops / 1e9)) + " GFLOP/s");

  const auto ignore = cfg.data.ignore_token_id;
  const auto policy = mc.gradient_checkpointing ? haliax::nn::checkpoint_policy::per_layer
                                                : haliax::nn::checkpoint_policy::none;
  const std::int64_t eval_batch_default = t.train_batch_size.at(0);
  // Evaluation (upstream TaggedEvaluator): eval/loss over all validation tokens, eval/<tag>/loss per dataset
  // name and tag, eval/macro_loss (mean over tags), and bits per byte alongside.
  auto run_eval = [&](std::int64_t step) -> std::optional<double> {
    const auto& sets = train.validation_sets();
    if (sets.empty()) return std::nullopt;
    const std::int64_t eb = t.per_device_eval_parallelism > 0 ? t.per_device_eval_parallelism
                            : t.per_device_parallelism > 0    ? t.per_device_parallelism
                                                              : eval_batch_default;
    detail::eval_totals all;
    std::map<std::string, detail::eval_totals> by_tag;
    std::vector<std::string> tag_order;
    for (const auto& v : sets) {
      const auto e = detail::evaluate(model, mc, *v.windows, eb, t.max_eval_batches.value_or(0), eos, ignore, tok);
      all += e;
      for (const auto& tag : v.tags) {
        if (!by_tag.count(tag)) tag_order.push_back(tag);
        by_tag[tag] += e;
      }
    }
    if (all.targets == 0) return std::nullopt;
    json m = {{"eval/loss", all.loss()}, {"eval/bpb", all.bpb()}};
    double macro = 0;
    for (const auto& tag : tag_order) {
      m["eval/" + tag + "/loss"] = by_tag[tag].loss();
      m["eval/" + tag + "/bpb"] = by_tag[tag].bpb();
      macro += by_tag[tag].loss();
    }
    if (!tag_order.empty()) m["eval/macro_loss"] = macro / double(tag_order.size());
    trk->log(m, step);
    std::string line = "eval step " + std::to_string(step) + "  loss " + std::to_string(all.loss()) + "  bpb " +
                       std::to_string(all.bpb());
    for (const auto& tag : tag_order) line += "  " + tag + " " + std::to_string(by_tag[tag].loss());
    say(line);
    return all.loss();
  };

  // The token-probability heatmap, refreshed every viz.every steps.
  std::vector<std::vector<std::int32_t>> viz_docs;
  const std::string viz_path = cfg.viz.path ? *cfg.viz.path : (run_dir / "logprobs.html").string();
  if (cfg.viz.every > 0) {
    if (train.validation_sets().empty())
      throw config::config_error("viz.every is set but there is no validation data to show (data.validation_urls)");
    const auto& w = *train.validation_sets().front().windows;
    const std::int64_t n = w.final_size();
    const std::int64_t k = std::min<std::int64_t>(cfg.viz.num_docs, n);
    std::optional<data::example_order> order;
    if (cfg.viz.data_seed)
      order.emplace(data::example_order::full(data::permutation_kind::feistel, static_cast<std::uint64_t>(n),
                                              haliax::random::make_key(static_cast<std::uint64_t>(*cfg.viz.data_seed))));
    for (std::int64_t i = 0; i < k; ++i) {
      std::vector<std::int32_t> doc(static_cast<std::size_t>(mc.seq_len));
      w.window(order ? static_cast<std::int64_t>((*order)(static_cast<std::uint64_t>(i))) : i, doc.data());
      viz_docs.push_back(std::move(doc));
    }
  }
  auto viz_text = [&](std::int32_t id) {
    if (tok.name() == "byte") return viz::byte_token_text(id);
    if (tok.name() == "passthrough") return std::to_string(id) + " ";
    auto s = tok.token_text(id);
    return s.empty() ? "<|" + std::to_string(id) + "|>" : s;
  };
  auto refresh_viz = [&](std::int64_t step) {
    viz::page_info info;
    info.model_name = "run " + run_id;
    info.eos_id = eos;
    viz::write_logprobs_for_model(model, mc, viz_docs, viz_text, viz_path, step, info);
  };

  train_result res;
  res.run_dir = run_dir.string();
  res.parameters = n_params;
  res.start_step = start_step;
  res.resumed_from = resumed_from;
  res.steps = start_step;
  const auto t_start = std::chrono::steady_clock::now();
  const std::int64_t print_every = std::max<std::int64_t>(1, std::min<std::int64_t>(10, t.num_train_steps / 20));
  for (std::int64_t step = start_step; step < t.num_train_steps; ++step) {
    if (t.profiler && step == prof_first) prof.start();
    const auto t0 = std::chrono::steady_clock::now();
    double loading_seconds = 0;
    const std::int64_t B = t.train_batch_size.at(step);
    const std::int64_t mb = t.per_device_parallelism > 0 ? std::min(t.per_device_parallelism, B) : B;
    const std::int64_t micro = B / mb;
    const std::int64_t offset = data_offset_at(t.train_batch_size, step);
    const auto step_key = haliax::random::fold_in(training_key, static_cast<std::uint32_t>(step));

    double loss_sum = 0;
    std::optional<gpt2::LMHeadModel> grads;
    for (std::int64_t m = 0; m < micro; ++m) {
      const auto tl = std::chrono::steady_clock::now();
      std::vector<std::int32_t> host;
      {
        haliax::detail::profile::region r([] { return std::string("train_lm: load batch"); }, 0.0);
        host = train.examples(offset + m * mb, mb);  // waits only if the cache has not reached these windows
      }
      loading_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - tl).count();
      auto tokens = haliax::from_host<std::int32_t>(host, mb * Batch, mc.seq_len * Pos);
      auto ex = lm_example::causal(tokens, eos, ignore);
      gpt2::forward_options fo;
      fo.inference = false;
      fo.key = haliax::random::fold_in(step_key, static_cast<std::uint32_t>(m));
      fo.checkpointing = policy;
      auto [loss, g] = haliax::value_and_grad([&](const gpt2::LMHeadModel& p) {
        return gpt2::next_token_loss(p, mc, ex, cfg.z_loss_weight, fo);
      })(model);
      loss_sum += loss.item();
      if (!grads)
        grads = std::move(g);
      else
        haliax::tree::zip_leaves(*grads, g, [](const std::string&, auto& acc, auto& x) { acc = acc + x; });
    }
    if (micro > 1)
      *grads = haliax::tree::map(*grads, [s = 1.0f / float(micro)](const std::string&, const auto& x) { return x * s; });
    const double loss = loss_sum / double(micro);
    check_finite(loss, "train/loss", step, t.crash_on_nan, t.crash_on_inf);
    json watched = json::object();
    const bool watch_now = t.watch.enabled() && step % t.watch.interval == 0;
    std::optional<gpt2::LMHeadModel> before;  // for the `updates` target: the parameters before the update
    if (watch_now) {
      haliax::detail::profile::region r([] { return std::string("train_lm: watch"); }, 0.0);
      haliax::no_grad_guard ng;
      if (watching("grads")) watch::summarize("grad", *grads, watch_opts, watched, trk.get(), step);
      if (watching("updates"))
        before = haliax::tree::map(model, [](const std::string&, const auto& x) { return x * 1.0f; });
    }
    optim::update_stats stats;
    {
      haliax::detail::profile::region r([] { return std::string("optimizer update"); }, 0.0);
      stats = opt.update(model, *grads, opt_state, loss);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (watch_now) {
      haliax::detail::profile::region r([] { return std::string("train_lm: watch"); }, 0.0);
      haliax::no_grad_guard ng;
      if (watching("params")) watch::summarize("params", model, watch_opts, watched, trk.get(), step);
      if (before) {
        haliax::tree::zip_leaves(*before, model, [](const std::string&, auto& b, const auto& p) { b = p - b; });
        watch::summarize("updates", *before, watch_opts, watched, trk.get(), step);
        before.reset();
      }
      if (watching("opt_state")) {
        watch::summarize("opt_state/mu", opt_state.mu, watch_opts, watched, trk.get(), step);
        watch::summarize("opt_state/nu", opt_state.nu, watch_opts, watched, trk.get(), step);
      }
    }
    const auto t_hooks = std::chrono::steady_clock::now();

    if (step == start_step) res.first_loss = loss;
    res.final_loss = loss;
    res.steps = step + 1;
    json metrics = {{"train/loss", loss}, {"global_step", step}, {"optim/learning_rate", stats.learning_rate},
                    {"optim/grad_norm", stats.grad_norm}, {"run_progress", double(step + 1) / double(t.num_train_steps)}};
    if (stats.skipped) metrics["optim/skipped_step"] = 1;
    const json perf = meter.on_step(B * mc.seq_len, B, secs);
    for (const auto& el : perf.items()) metrics[el.key()] = el.value();
    metrics["throughput/loading_time"] = loading_seconds;
    metrics["throughput/hook_time"] = hook_seconds;
    for (const auto& el : watched.items()) metrics[el.key()] = el.value();
    {
      haliax::detail::profile::region r([] { return std::string("train_lm: log metrics"); }, 0.0);
      trk->log(metrics, step);
    }

    if ((step + 1) % print_every == 0 || step == 0 || step + 1 == t.num_train_steps) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
      const double eta = elapsed / double(step + 1 - start_step) * double(t.num_train_steps - step - 1);
      say(progress_line(step + 1, t.num_train_steps, loss, stats.learning_rate, metrics["throughput/tokens_per_second"].get<double>(),
                        metrics["throughput/mfu"].get<double>(), eta));
    }
    if (t.steps_per_eval > 0 && (step + 1) % t.steps_per_eval == 0 && step + 1 < t.num_train_steps) run_eval(step + 1);
    if (!hooks.empty()) {
      const step_info info{step + 1, t.num_train_steps, loss, stats.learning_rate, secs, B * mc.seq_len};
      for (const auto& h : hooks)
        if ((h.every > 0 && (step + 1) % h.every == 0) || (h.at_end && step + 1 == t.num_train_steps)) h.fn(info);
    }
    const bool last = step + 1 == t.num_train_steps;
    ckpt.on_step(step + 1, [&] { return state_files(step + 1); }, last);
    if (hf_save_dir && ((cfg.hf_save_steps > 0 && (step + 1) % cfg.hf_save_steps == 0) || last))
      export_hf(step + 1);
    if (cfg.viz.every > 0 && ((step + 1) % cfg.viz.every == 0 || last)) refresh_viz(step + 1);
    const auto t_end = std::chrono::steady_clock::now();
    hook_seconds = std::chrono::duration<double>(t_end - t_hooks).count();
    if (prof.running()) {
      prof_seconds += std::chrono::duration<double>(t_end - t0).count();
      if (step + 1 == prof_end) {
        prof.stop();
        prof.write(run_dir, prof_first, prof_end - prof_first, prof_seconds);
        say("train_lm: profile of steps " + std::to_string(prof_first) + ".." + std::to_string(prof_end - 1) + " in " +
            (run_dir / "profile.txt").string());
      }
    }
  }
  if (prof.running()) prof.stop();
  ckpt.wait();
  if (res.steps > start_step)  // the last step is always saved
    res.last_checkpoint = (ck_policy.base_path / ("step-" + std::to_string(res.steps))).string();
  else if (resumed_from)
    res.last_checkpoint = resumed_from;
  res.eval_loss = run_eval(res.steps);
  res.tokens = meter.total_tokens;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();

  json summary = {{"run_id", run_id},
                  {"steps", res.steps},
                  {"parameters", res.parameters},
                  {"first_loss", res.first_loss},
                  {"final_loss", res.final_loss},
                  {"total_tokens", res.tokens},
                  {"seconds", res.seconds},
                  {"tokens_per_second", res.seconds > 0 ? double(res.tokens) / res.seconds : 0.0},
                  {"openblas_core", openblas_core()},
                  {"threads", haliax::num_threads()}};
  if (res.eval_loss) summary["eval_loss"] = *res.eval_loss;
  if (res.start_step > 0) summary["start_step"] = res.start_step;
  if (res.resumed_from) summary["resumed_from"] = *res.resumed_from;
  if (res.last_checkpoint) summary["checkpoint"] = *res.last_checkpoint;
  trk->log_summary(summary);
  trk->finish();
  write_file_atomic(run_dir / "summary.json", summary.dump(2) + "\n");
  say("train_lm: done, " + std::to_string(res.steps) + " steps in " + human_duration(res.seconds) + ", loss " +
      std::to_string(res.first_loss) + " -> " + std::to_string(res.final_loss) + "; summary in " +
      (run_dir / "summary.json").string());
  return res;
}

}  // namespace levanter
