// levanter/main/eval_lm.hpp: the `eval_lm` program (upstream `levanter.main.eval_lm`): the loss of a trained model
// on the validation sets (or, with eval_on_train, the training sets), with the evaluator train_lm uses
// (eval.hpp: eval/loss, eval/bpb, eval/<tag>/loss, eval/<tag>/bpb, eval/macro_loss), logged to the trackers at
// step 0, printed as `Loss: <value>` and written to a JSON file.
//
//   eval_lm --checkpoint_path checkpoints/RUN                     # model and data from the checkpoint's config.yaml
//   eval_lm --hf_checkpoint hf/gpt2 --data.validation_urls '["valid.jsonl"]'   # architecture from config.json
//   eval_lm config.yaml --log_entropy true --log_param_stats true --output_path results.json
//
// Exactly one of checkpoint_path (a train_lm checkpoint, or a run directory holding step-N checkpoints: the newest
// complete one is used) and hf_checkpoint (a local Hugging Face directory) names the model. For a checkpoint, the
// `model:` and `data:` sections and the evaluation settings of `trainer:` (train_batch_size, per_device_parallelism,
// per_device_eval_parallelism, max_eval_batches, mp) default key by key to those of the config.yaml it carries, so
// `eval_lm --checkpoint_path RUN` reports the loss train_lm's last evaluation reported.
// For a Hugging Face directory the model type and architecture come from its config.json (upstream's
// use_hf_model_config), and the tokenizer, when data.tokenizer is not given, is the directory's tokenizer.json.
//
// The run directory `<trainer.log_dir>/<run id>/` gets config.yaml, eval_lm.log, the trackers' files and (unless
// output_path says otherwise) eval_results.json.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <haliax/autodiff.hpp>
#include <levanter/config/cli.hpp>
#include <levanter/config/validate.hpp>
#include <levanter/data/config.hpp>
#include <levanter/main/model_loading.hpp>
#include <levanter/main/programs.hpp>
#include <levanter/models/registry.hpp>
#include <levanter/tracker/tracker.hpp>
#include <levanter/trainer/config.hpp>
#include <levanter/watch.hpp>

namespace levanter {

/// upstream EvalLmConfig, plus output_path (ours).
struct EvalLmConfig {
  std::optional<std::string> checkpoint_path;
  std::optional<std::string> hf_checkpoint;
  TrainerConfig trainer;
  LmDataConfig data;
  ModelChoice model;
  bool eval_on_train = false;
  bool log_entropy = false;
  bool log_top2_gap = false;
  bool log_param_stats = false;
  std::optional<std::string> output_path;  ///< ours: the JSON file of the results (default <run dir>/eval_results.json)
};

}  // namespace levanter

template <>
struct levanter::config::schema<levanter::EvalLmConfig> {
  using T = levanter::EvalLmConfig;
  static constexpr auto fields = std::make_tuple(
      field("checkpoint_path", &T::checkpoint_path, "a train_lm checkpoint, or a directory holding step-N checkpoints (the newest complete one is used); give this or hf_checkpoint"),
      field("hf_checkpoint", &T::hf_checkpoint, "a local Hugging Face directory (config.json + safetensors; the architecture comes from config.json); give this or checkpoint_path"),
      field("trainer", &T::trainer, "trainer section: the evaluation batch (per_device_eval_parallelism, else per_device_parallelism, else train_batch_size), max_eval_batches, tracker, log_dir, id (batch keys default to the checkpoint's)"),
      field("data", &T::data, "data section: the validation sets and their tags, the tokenizer (default: the checkpoint's config.yaml, key by key)"),
      field("model", &T::model, "model config (default: the checkpoint's config.yaml, key by key; a Hugging Face directory's config.json)"),
      field("eval_on_train", &T::eval_on_train, "evaluate on the training sets (in file order, tagged with their dataset names) instead of the validation sets"),
      field("log_entropy", &T::log_entropy, "log the histogram of the predictive entropy (nats) over the evaluated tokens as analysis/<dataset>/entropy"),
      field("log_top2_gap", &T::log_top2_gap, "log the histogram of the gap between the two largest logits as analysis/<dataset>/top2_gap"),
      field("log_param_stats", &T::log_param_stats, "log the norm of every parameter (params/norm/<path>, per layer) and their histograms"),
      field("output_path", &T::output_path, "ours, not upstream's: the JSON file the results are written to (default: <run dir>/eval_results.json)"));
};

namespace levanter {

/// What eval_lm found.
struct eval_lm_result {
  std::optional<double> loss;  ///< eval/loss
  json metrics;                ///< everything logged (eval/*, analysis/*, params/*)
  std::string output_path;     ///< the JSON file written
  std::string run_dir;
};

/// The checks eval_lm can make before opening anything: exactly one of checkpoint_path and hf_checkpoint, and the
/// trainer section. The data and model sections are checked once the checkpoint's defaults are merged in.
config::validation_result validate_eval_lm(const EvalLmConfig& cfg, const config::source_map& sources);

/// eval_lm. `sources` (from parse_command_line) says which keys were given (the rest of model:, data: and the
/// batch keys of trainer: come from the checkpoint's config.yaml); `resolved_yaml` is written to the run
/// directory. Throws config::config_error, data::data_error, checkpoint::error or hf::error with a message for the
/// user.
eval_lm_result run_eval_lm(const EvalLmConfig& cfg, const config::source_map& sources,
                           const std::string& resolved_yaml, std::ostream& out);


namespace detail {

/// What eval_lm knows before the model type is chosen.
struct eval_job {
  const EvalLmConfig* cfg = nullptr;
  std::string resolved_yaml;
  config::source_map sources;  ///< the keys given (model:, data: and the batch keys default to the checkpoint's)
  std::optional<checkpoint::checkpoint_info> checkpoint;
  std::optional<TrainLmConfig> train_config;  ///< what the checkpoint carries
  std::optional<hf::hf_dir> hf;
  ModelChoice model;      ///< the model type (and the given settings)
  LmDataConfig data;      ///< with the checkpoint's defaults merged in
  TrainerConfig trainer;  ///< likewise
};

/// Whether a key at or under `prefix` was given.
bool given_under(const config::source_map& sources, const std::string& prefix);

/// The model as the evaluation sees it: its loss, its logits, its parameters, and a few facts for the report.
struct eval_model {
  std::string name;                  ///< the checkpoint or directory
  std::optional<std::int64_t> step;  ///< the checkpoint's step
  std::string type;                  ///< model.type
  std::int64_t parameters = 0;
  std::int64_t vocab = 0;
  std::int64_t seq_len = 0;
  std::function<double(const lm_example&)> loss;  ///< mean next-token loss of a batch
  /// Logits of a batch, row-major {batch, position, vocab}.
  std::function<std::vector<float>(const token_batch& tokens, const token_batch& segment_ids)> logits;
  /// Adds the parameters' norms to `metrics` and gives their histograms to `trk`.
  std::function<void(json& metrics, tracker& trk)> param_stats;
};

/// `e` (a checkpoint that does not fit the model), saying so when the model section was given.
checkpoint::error checkpoint_mismatch(const eval_job& job, const checkpoint::error& e);

/// `loss` over batches of at most `max_rows` windows at a time, combined into the batch's mean (weighted by the
/// predicted tokens of each part), so a large evaluation batch needs no more than `max_rows` windows of logits.
/// Each part keeps the example's own loss mask and segment ids.
std::function<double(const lm_example&)> chunked_loss(std::function<double(const lm_example&)> loss,
                                                      std::int64_t max_rows);

/// The evaluation, the analyses and the report, for any model type.
eval_lm_result evaluate_model(const eval_job& job, const eval_model& m, std::ostream& out);

/// The model config of type C: the checkpoint's config.yaml with the given `model.` keys over it, or the given
/// section alone (a Hugging Face directory, or a checkpoint without config.yaml).
template <class C>
C eval_model_config(const eval_job& job) {
  const C* given = model_config_as<C>(job.model);
  C out = given ? *given : C{};
  if (!job.train_config) return out;
  const C* saved = model_config_as<C>(job.train_config->model);
  if (!saved)
    throw config::config_error("model.type: the checkpoint holds a '" +
                               std::string(job.train_config->model.type_name()) + "' model, not a '" +
                               std::string(C::type_name) + "' one (set model.type: " +
                               std::string(job.train_config->model.type_name()) +
                               " with the model keys, or leave the model section out)");
  std::apply(
      [&](const auto&... f) {
        ((!given_under(job.sources, "model." + std::string(f.name)) ? void(out.*(f.member) = saved->*(f.member))
                                                                          : void()),
         ...);
      },
      config::schema<C>::fields);
  return out;
}

}  // namespace detail

/// eval_lm with model type M (instantiated once per built-in model type in the library).
template <LmModel M>
eval_lm_result run_eval_lm_with(const detail::eval_job& job, std::ostream& out) {
  using C = typename M::config_type;
  haliax::no_grad_guard ng;
  const C base = detail::eval_model_config<C>(job);
  auto loaded = [&] {
    if (job.hf) return load_lm_from_hf<M>(*job.hf, base);
    try {
      return load_lm_from_checkpoint<M>(*job.checkpoint, base);
    } catch (const checkpoint::error& e) {
      throw detail::checkpoint_mismatch(job, e);
    }
  }();
  const M& model = loaded.model;
  const C& mc = loaded.config;
  detail::eval_model m;
  m.name = loaded.name;
  m.step = loaded.step;
  m.type = std::string(model_type_name(mc));
  m.parameters = haliax::tree::parameter_count(model);
  m.vocab = model.vocab_size();
  m.seq_len = mc.seq_len;
  m.loss = [&](const lm_example& ex) { return compute_next_token_loss(model, mc, ex).item(); };
  m.logits = [&](const token_batch& tokens, const token_batch& segment_ids) {
    return lm_logits(model, mc, tokens, segment_ids).to_host();
  };
  m.param_stats = [&](json& metrics, tracker& trk) {
    // upstream summary_statistics_for_tree("params", model, split_scan_layers=True, include_histogram=True)
    watch::summarize("params", model, watch::options{true, true, true, true}, metrics, &trk, 0);
  };
  return detail::evaluate_model(job, m, out);
}

}  // namespace levanter

// The built-in models (models/builtin.hpp) are instantiated once, in the library (files CMakeLists.txt generates).
#include <levanter/models/builtin_models.hpp>
#define LEVANTER_EVAL_LM_INSTANCE(M, C, ...) \
  template eval_lm_result run_eval_lm_with<M>(const detail::eval_job&, std::ostream&);
#define LEVANTER_EVAL_LM_EXTERN(M, C, ...) extern LEVANTER_EVAL_LM_INSTANCE(M, C)
namespace levanter {
LEVANTER_BUILTIN_MODELS(LEVANTER_EVAL_LM_EXTERN)
}  // namespace levanter
