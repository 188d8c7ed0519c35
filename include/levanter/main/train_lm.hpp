// levanter/main/train_lm.hpp: the `train_lm` program (upstream `levanter.main.train_lm`): wiring, and nothing else.
// It reads the config, picks the model type from `model.type` once, and for that type builds the data, the
// model and the optimizer, hands them to the Trainer (trainer/trainer.hpp) with evaluation, Hugging Face exports
// and the heatmap as hooks, and writes the summary.
//
//   train_lm_main(argc, argv, default_yaml)          the whole program (src/main/train_lm.cpp)
//   run_train_lm<M>(cfg, model_config, yaml, out)    one run of model type M (instantiated per model type)
//
// Run directory `<trainer.log_dir>/<run id>/` (trainer/run.hpp) gains `run_metadata.json`, `summary.json` (at the
// end), `train_lm.log`, and with `viz.every` the heatmap `logprobs.html`. Checkpoints go to
// `<trainer.checkpointer.base_path>/<run id>/step-N/`. A run resumes from the newest complete checkpoint there (or
// under trainer.load_checkpoint_path), else from trainer.initialize_from (another run, its step included), else
// starts at step 0, optionally with the model of initialize_from_checkpoint_path or a local Hugging Face
// directory (initialize_from_hf).
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <variant>
#include <vector>

#include <haliax/autodiff.hpp>
#include <levanter/checkpoint/train_state.hpp>
#include <levanter/compat/hf.hpp>
#include <levanter/config/validate.hpp>
#include <levanter/data/lm_data.hpp>
#include <levanter/eval.hpp>
#include <levanter/io/atomic_file.hpp>
#include <levanter/main/programs.hpp>
#include <levanter/main/train_lm_config.hpp>
#include <levanter/models/lm.hpp>
#include <levanter/optim/optimizer.hpp>
#include <levanter/run_metadata.hpp>
#include <levanter/trainer/trainer.hpp>
#include <levanter/viz/logprobs.hpp>

namespace levanter {


namespace detail {
/// The tokens' display text for the heatmap.
viz::token_text_fn token_text_of(const data::tokenizer& tok);
/// The `viz:` windows: the first `num_docs` validation windows, permuted with `data_seed` when set.
std::vector<std::vector<std::int32_t>> train_viz_documents(const data::lm_data& data, const TrainVizConfig& v,
                                                           std::int64_t seq_len);
/// The training examples [first, first + count) as an lm_example.
lm_example training_batch(const data::lm_data& data, std::int64_t first, std::int64_t count, std::int64_t seq_len,
                          std::int64_t eos, std::int64_t ignore_id);
/// The line train_lm prints about the model and data at the start.
std::string describe_run(std::string_view model_type, std::int64_t parameters, std::int64_t vocab,
                         const data::lm_data& data, std::int64_t seq_len);
}  // namespace detail

namespace detail {

/// Upstream sft's `reinitialize_some_tokens`: the rows `ids` of the token embeddings (`embeddings`) and of a separate
/// LM head (`lm_head`; a tied head is the embeddings) are re-drawn as jax.random.truncated_normal(key_i, (ids, Embed),
/// -3, 3) · std + mean, the mean and (population) standard deviation per embedding feature taken over the whole
/// vocabulary before the change; key_0, key_1 = split(key) for the embeddings and the head.
template <LmModel M>
void reinit_token_rows(M& model, const std::vector<std::int32_t>& ids, haliax::random::key key, bool embeddings,
                       bool lm_head) {
  const auto keys = haliax::random::split(key);  // not a structured binding: clang before 16 cannot capture one
  const auto emb_key = keys.first, head_key = keys.second;
  const std::int64_t vocab = model.vocab_size();
  haliax::tree::for_each_leaf(model, [&](const std::string& name, auto& leaf) {
    const bool is_emb = name == "embeddings.token_embeddings.weight", is_head = name == "lm_head.weight";
    if (!((is_emb && embeddings) || (is_head && lm_head))) return;
    const std::int64_t n = leaf.element_count(), E = n / vocab;
    const auto draws = haliax::random::truncated_normal(is_emb ? emb_key : head_key,
                                                        static_cast<std::int64_t>(ids.size()) * Vocab, E * Embed,
                                                        -3.0f, 3.0f)
                           .to_host();
    haliax::with_host_elements(leaf, 0, n, haliax::host_access::read_write, [&](float* w) {
      std::vector<double> mean(static_cast<std::size_t>(E), 0.0), var(static_cast<std::size_t>(E), 0.0);
      for (std::int64_t v = 0; v < vocab; ++v)
        for (std::int64_t e = 0; e < E; ++e) mean[static_cast<std::size_t>(e)] += w[v * E + e];
      for (auto& m : mean) m /= static_cast<double>(vocab);
      for (std::int64_t v = 0; v < vocab; ++v)
        for (std::int64_t e = 0; e < E; ++e) {
          const double d = w[v * E + e] - mean[static_cast<std::size_t>(e)];
          var[static_cast<std::size_t>(e)] += d * d;
        }
      for (std::size_t j = 0; j < ids.size(); ++j)
        for (std::int64_t e = 0; e < E; ++e) {
          const auto ue = static_cast<std::size_t>(e);
          const float sd = static_cast<float>(std::sqrt(var[ue] / static_cast<double>(vocab)));
          w[ids[j] * E + e] = draws[j * static_cast<std::size_t>(E) + ue] * sd + static_cast<float>(mean[ue]);
        }
    });
  });
}

/// What one `train_lm` run is made of, built in this order: the model config (replaced by a Hugging Face
/// config.json with use_hf_model_config), the run directory and trackers, the data, the Trainer with the model and
/// its optimizer, and the state to train from (resumed, or initialised from a checkpoint or Hugging Face).
template <LmModel M>
struct train_lm_run {
  using config_type = typename M::config_type;

  train_lm_run(const TrainLmConfig& c, config_type model_config, const std::string& resolved_yaml, std::ostream& out)
      : cfg(c), mc(std::move(model_config)), recorded_yaml(resolved_yaml) {
    const auto& t = cfg.trainer;
    start_from_hf();
    run.emplace(t, recorded_yaml, out, "train_lm");
    log = run->logger();

    // Keys as upstream: data, loader, model, training.
    auto keys = haliax::random::split(haliax::random::make_key(static_cast<std::uint64_t>(t.seed)), 4);
    const auto data_key =
        cfg.data_seed ? haliax::random::make_key(static_cast<std::uint64_t>(*cfg.data_seed)) : keys[0];
    const auto model_key = keys[2];
    const auto training_key = keys[3];

    // Data: the tokenizer, a cache per dataset and split (built in the background the first time), the order.
    data::lm_data::options dopt;
    dopt.seq_len = mc.seq_len;
    dopt.batch_size = t.train_batch_size.at(0);
    dopt.data_key = data_key;
    dopt.log = log;
    dopt.epochs = cfg.epoch;
    data.emplace(cfg.data, dopt);
    const data::tokenizer& tok = data->tok();
    vocab = hf_init ? hf_init->vocab_size : cfg.data.vocab_size.value_or(tok.vocab_size());
    if (vocab < tok.vocab_size())
      throw config::config_error(std::string(hf_init ? "initialize_from_hf: the checkpoint's vocabulary ("
                                                     : "data.vocab_size (") +
                                 std::to_string(vocab) + " tokens) is smaller than the tokenizer's (" +
                                 std::to_string(tok.vocab_size()) + ", " + tok.name() + ")");
    // EOS marks document boundaries (segment ids); -1 when the tokenizer has none (passthrough).
    eos = tok.eos_id() ? *tok.eos_id() : -1;

    // Before anything is allocated: a model too large for this machine is a config error, not an allocation failure.
    check_model_fits(mc.parameter_count(vocab), distributed::world().size(),
                     "model (type " + std::string(config_type::type_name) + ")");

    // The model, its optimizer, and the Trainer that resumes them.
    const double z_loss = cfg.z_loss_weight;
    trainer.emplace(
        t, *run,
        [this, z_loss](const M& m, const lm_example& ex, const forward_options& fo) {
          return compute_next_token_loss(m, mc, ex, z_loss, fo);
        },
        trainer_options{3.0 * mc.flops_per_token(vocab), static_cast<std::int64_t>(mc.seq_len),
                        checkpoint_policy_of(mc), matmul_shapes_of(mc, vocab), recomputed_flops_per_token(mc, vocab)});
    M fresh = M::init(mc, vocab, model_key);
    auto opt = trainer->make_optimizer(cfg.optimizer, fresh);
    state = trainer->initial_state(std::move(fresh), std::move(opt), training_key);
    if (!trainer->resumed_from()) initialize_model();
    if (cfg.reinit_tokens && state.step == 0) {  // upstream sft: only when the run starts at step 0
      const auto& r = *cfg.reinit_tokens;
      std::vector<std::int32_t> ids;
      for (const auto& name : r.tokens) {
        const auto id = tok.token_to_id(name);
        if (!id || *id >= vocab)
          throw config::config_error("reinit_tokens: '" + name + "' is not a token of the tokenizer (" + tok.name() +
                                     "); list tokens as the vocabulary writes them");
        ids.push_back(*id);
      }
      const auto reinit_key = r.mixture_key ? keys[1] : haliax::random::split(training_key).second;
      detail::reinit_token_rows(state.model, ids, reinit_key, r.embeddings, r.lm_head);
      log("reinit_tokens: re-drew the rows of " + std::to_string(ids.size()) + " tokens" +
          (r.embeddings ? " in the embeddings" : "") + (r.embeddings && r.lm_head ? " and" : "") +
          (r.lm_head ? " in the LM head" : ""));
    }
    if (!run->id_given())
      log("to resume this run after an interruption, run it again with --trainer.id " + run->id());
  }
  train_lm_run(const train_lm_run&) = delete;  // the Trainer's loss refers to this->mc

  /// Logs the run's metadata and hyperparameters and the lines that describe it (rank 0 writes the files).
  void announce() {
    const json metadata = run_metadata();
    if (run->writer()) io::write_file_atomic(run->dir() / "run_metadata.json", metadata.dump(2) + "\n");
    json hparams = config_to_json(recorded_yaml);
    hparams["run_metadata"] = metadata;
    run->tracker().log_hyperparameters(hparams);
    log("run " + run->id() + " -> " + run->dir().string());
    log(detail::describe_run(model_type_name(mc), haliax::tree::parameter_count(state.model), vocab, *data,
                             mc.seq_len));
  }

  const TrainLmConfig& cfg;
  config_type mc;
  std::string recorded_yaml;  ///< what the run directory and checkpoints record
  std::optional<hf::hf_dir> hf_init;
  std::optional<run_context> run;
  std::function<void(const std::string&)> log;
  std::optional<data::lm_data> data;
  std::int64_t vocab = 0, eos = -1;
  std::optional<Trainer<M>> trainer;
  train_state<M> state;
  std::optional<double> eval_loss;  ///< the last evaluation's, set by the evaluation hook

 private:
  // A Hugging Face model to start from: its config.json may also give the model config.
  void start_from_hf() {
    const auto* hf_path = std::get_if<std::string>(&cfg.initialize_from_hf);
    if (!hf_path) return;
    if constexpr (hf::HfConvertible<M>) {
      hf_init.emplace(hf::open_dir(*hf_path, "initialize_from_hf"));
      if (cfg.use_hf_model_config) {
        mc = hf::config_from_hf<M>(mc, *hf_init);
        if (cfg.hf_seq_len) mc.seq_len = *cfg.hf_seq_len;
        // The run directory and every checkpoint record the architecture that trains, not the command line's model
        // section (which use_hf_model_config replaced): export_lm_to_hf, eval_lm and viz_logprobs read it there.
        TrainLmConfig recorded = cfg;
        recorded.model = as_model_choice(mc);
        recorded_yaml = config::to_yaml_string(recorded);
      } else {
        hf::check_matches<M>(mc, *hf_init, "initialize_from_hf '" + *hf_path + "'");
      }
    } else {
      throw config::config_error("initialize_from_hf: model type '" + std::string(config_type::type_name) +
                                 "' has no Hugging Face adapter");
    }
  }
  // A fresh run's model from initialize_from_checkpoint_path or the Hugging Face checkpoint.
  void initialize_model() {
    if (cfg.initialize_from_checkpoint_path) {
      auto load_model = [&](const checkpoint::checkpoint_info& c) {
        auto l = checkpoint::load_train_state<M>(c, state.model, nullptr, cfg.trainer.allow_partial_checkpoint);
        log("model initialised from " + c.path.string() + " (step " + std::to_string(l.step) + ")");
      };
      if (checkpoint::resume_newest(*cfg.initialize_from_checkpoint_path, load_model, log) ==
          checkpoint::resume_outcome::none_found)
        throw checkpoint::error("initialize_from_checkpoint_path: there is no checkpoint under '" +
                                *cfg.initialize_from_checkpoint_path + "'");
    } else if (hf_init) {
      if constexpr (hf::HfConvertible<M>) hf::load(*hf_init, state.model, mc);
      log("model initialised from the Hugging Face checkpoint " + hf_init->dir);
    }
  }
};

/// train_lm's hooks on the Trainer: evaluation every steps_per_eval steps and at the end (upstream's
/// TaggedEvaluator; with trainer.model_averaging the average too, under eval/ema/), Hugging Face exports every
/// hf_save_steps (of the average when there is one), the heatmap every viz.every steps; then the caller's `hooks`.
template <LmModel M>
void add_train_lm_hooks(train_lm_run<M>& r, const std::vector<hook<M>>& hooks) {
  namespace fs = std::filesystem;
  const auto& cfg = r.cfg;
  const auto& t = cfg.trainer;
  auto& trainer = *r.trainer;
  auto& run = *r.run;
  const data::tokenizer& tok = r.data->tok();
  const auto& mc = r.mc;
  if (!r.data->validation_sets().empty()) {
    const std::int64_t eval_batch = t.per_device_eval_parallelism > 0 ? t.per_device_eval_parallelism
                                    : t.per_device_parallelism > 0    ? t.per_device_parallelism
                                                                      : t.train_batch_size.at(0);
    const eval::options eo{eval_batch, t.max_eval_batches.value_or(0), r.eos, cfg.data.ignore_token_id};
    trainer.add_hook(t.steps_per_eval, [&r, &run, &tok, &mc, eo](const step_info<M>& info) {
      haliax::no_grad_guard ng;
      const auto& sets = r.data->validation_sets();
      const auto res = eval::evaluate_tagged(sets, eo, tok, [&](const lm_example& ex) {
        return compute_next_token_loss(*info.model, mc, ex).item();
      });
      if (!res.loss) return;
      run.tracker().log(res.metrics, info.step);
      run.say("eval step " + std::to_string(info.step) + "  " + res.line);
      r.eval_loss = res.loss;
      if (info.eval_model && info.eval_model != info.model) {
        const auto a = eval::evaluate_tagged(sets, eo, tok, [&](const lm_example& ex) {
          return compute_next_token_loss(*info.eval_model, mc, ex).item();
        });
        json renamed = json::object();
        for (const auto& el : a.metrics.items()) {
          const std::string k = el.key();
          renamed[k.rfind("eval/", 0) == 0 ? "eval/ema/" + k.substr(5) : k] = el.value();
        }
        run.tracker().log(renamed, info.step);
        run.say("eval step " + std::to_string(info.step) + "  (average) " + a.line);
      }
    });
  }

  // upstream's save_hf_checkpoint_callback: not after the first step; `<hf_save_path>/<run id>/step-<info.step>`
  if (cfg.hf_save_path) {
    if constexpr (hf::HfConvertible<M>) {
      const fs::path base = fs::path(*cfg.hf_save_path) / run.id();
      const auto dtype = hf::dtype_from_config(cfg.hf_save_dtype);
      const hf::token_ids ids{tok.bos_id(), tok.eos_id()};
      trainer.add_hook(cfg.hf_save_steps, [&r, base, dtype, ids](const step_info<M>& info) {
        if (info.step == 0) return;
        const auto dir = base / ("step-" + std::to_string(info.step));
        hf::save(info.eval_model ? *info.eval_model : *info.model, r.mc, r.vocab, dir.string(), ids, dtype);
        r.log("exported a Hugging Face checkpoint to " + dir.string());
      });
    } else {
      throw config::config_error("hf_save_path: model type '" + std::string(M::config_type::type_name) +
                                 "' has no Hugging Face adapter");
    }
  }

  if (cfg.viz.every > 0) {
    const auto docs = detail::train_viz_documents(*r.data, cfg.viz, mc.seq_len);
    const std::string path = cfg.viz.path ? *cfg.viz.path : (run.dir() / "logprobs.html").string();
    viz::page_info info;
    info.model_name = "run " + run.id();
    info.eos_id = r.eos;
    const auto text = detail::token_text_of(tok);
    trainer.add_hook(cfg.viz.every, [&mc, docs, path, info, text](const step_info<M>& s) {
      viz::write_logprobs_for_model(*s.model, mc, docs, text, path, s.next_step, info);
    });
  }
  for (const auto& h : hooks) trainer.add_hook(h);
}

/// The end of a run (train_lm's and lora_lm's): summary.json with `extra` keys added, the trackers' summary, the
/// closing line; sets res.eval_loss. Defined in src/main/train_lm.cpp.
void write_run_summary(run_context& run, train_result& res, std::optional<double> eval_loss, int ranks,
                       const json& extra = json::object());

/// The end of a train_lm run.
template <LmModel M>
void write_summary(train_lm_run<M>& r, train_result& res) {
  write_run_summary(*r.run, res, r.eval_loss, r.trainer->comm().size());
}

}  // namespace detail

/// One run of `train_lm` with model type `M` and its config `mc` (the `model:` section, possibly replaced by an
/// HF config.json with use_hf_model_config). `hooks` run with the program's own (after evaluation). Throws
/// config::config_error, data::data_error, checkpoint::error, hf::error or training_error with a message for the
/// user.
template <LmModel M>
train_result run_train_lm(const TrainLmConfig& cfg, typename M::config_type mc, const std::string& resolved_yaml,
                          std::ostream& out, const std::vector<hook<M>>& hooks = {}) {
  detail::train_lm_run<M> r(cfg, std::move(mc), resolved_yaml, out);  // the run, data, model, optimizer, Trainer
  r.announce();
  detail::add_train_lm_hooks(r, hooks);
  auto& trainer = *r.trainer;
  if (trainer.comm().size() > 1) {
    r.log(trainer.plan().describe() + " (" + trainer.comm().backend() + ")");
    for (const auto& n : trainer.plan().notes) r.log("note: " + n);
  }
  r.log("OpenBLAS core " + openblas_core() + ", " + std::to_string(haliax::num_threads()) + " threads" +
        (trainer.comm().size() > 1 ? " per rank" : "") + "; MFU is over the GEMM rate measured on this model's " +
        "products in the step's precision: " + std::to_string(static_cast<long long>(trainer.peak_flops() / 1e9)) +
        " GFLOP/s" + (trainer.comm().size() > 1 ? " (all ranks)" : ""));
  const auto& data = *r.data;
  const std::int64_t seq_len = r.mc.seq_len, eos = r.eos;
  const auto ignore = cfg.data.ignore_token_id;
  auto res = trainer.train(r.state, [&](std::int64_t first, std::int64_t count) {
    return detail::training_batch(data, first, count, seq_len, eos, ignore);
  }, data.train_length());
  detail::write_summary(r, res);
  return res;
}

}  // namespace levanter

// The built-in models (models/builtin.hpp) are instantiated once, in the library (files CMakeLists.txt generates).
#include <levanter/models/builtin_models.hpp>
#define LEVANTER_TRAIN_LM_INSTANCE(M, C, ...)                                                                  \
  template train_result run_train_lm<M>(const TrainLmConfig&, C, const std::string&, std::ostream&, \
                                        const std::vector<hook<M>>&);
#define LEVANTER_TRAIN_LM_EXTERN(M, C, ...) extern LEVANTER_TRAIN_LM_INSTANCE(M, C)
namespace levanter {
LEVANTER_BUILTIN_MODELS(LEVANTER_TRAIN_LM_EXTERN)
}  // namespace levanter
