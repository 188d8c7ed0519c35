// levanter/main/viz_lm.hpp: the `viz_logprobs` program (upstream `levanter.main.viz_logprobs`): the per-token
// log-probabilities of a model on validation documents as an HTML heatmap (viz/logprobs_html.hpp), or, with a
// comparison model, also the page of their differences.
//
//   viz_logprobs --checkpoint_path checkpoints/RUN [--path logprobs.html] [--num_docs 32]
//   viz_logprobs --checkpoint_path hf/gpt2 --checkpoint_is_hf true --data.validation_urls '["v.jsonl"]'
//   viz_logprobs --checkpoint_path checkpoints/B --comparison_model_path checkpoints/A   # + logprobs_diff.html
//
// The newest complete checkpoint under checkpoint_path is used (or that checkpoint itself). The `model:` and
// `data:` sections default to those of the config.yaml the checkpoint carries (keys given on the command line
// or in a file override it key by key), so a train_lm checkpoint needs nothing else. The documents are the
// validation set's windows of seq_len tokens (as train_lm evaluates them), permuted with data_seed (upstream
// shuffles with PRNGKey(data_seed); null keeps the file order), the first num_docs of them. Each token is
// coloured by log p(token | the tokens before it in its window); the first token of a window has no value.
//
// The model type comes from the `model:` section when given, else from the checkpoint's config.yaml, else from a
// Hugging Face directory's config.json. train_lm refreshes the same page during training (viz/logprobs.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <levanter/config/cli.hpp>
#include <levanter/data/config.hpp>
#include <levanter/main/model_loading.hpp>
#include <levanter/main/programs.hpp>
#include <levanter/models/registry.hpp>
#include <levanter/trainer/config.hpp>
#include <levanter/viz/logprobs.hpp>

namespace levanter {

/// upstream VizLmConfig.
struct VizLmConfig {
  std::string checkpoint_path;
  std::string path = "logprobs.html";
  TrainerConfig trainer;
  LmDataConfig data;
  ModelChoice model;
  int64_t num_docs = 32;
  bool checkpoint_is_hf = false;
  std::optional<int64_t> data_seed = 0;
  std::optional<std::string> comparison_model_path;
  bool comparison_is_hf = false;
};

}  // namespace levanter

template <>
struct levanter::config::schema<levanter::VizLmConfig> {
  using T = levanter::VizLmConfig;
  static constexpr auto fields = std::make_tuple(
      field("checkpoint_path", &T::checkpoint_path, "a train_lm checkpoint, or a directory holding step-N checkpoints (the newest is used); a Hugging Face GPT-2 directory with checkpoint_is_hf"),
      field("path", &T::path, "HTML file to write (.html is appended if missing); the diff page goes next to it as *_diff.html"),
      field("trainer", &T::trainer, "trainer section (per_device_eval_parallelism sets the batch; the rest is accepted for upstream compatibility)"),
      field("data", &T::data, "data section; the validation_urls give the documents (default: the checkpoint's config.yaml)"),
      field("model", &T::model, "model config (default: the checkpoint's config.yaml; config.json for Hugging Face directories)"),
      field("num_docs", &T::num_docs, "number of validation windows to show"),
      field("checkpoint_is_hf", &T::checkpoint_is_hf, "checkpoint_path is a local Hugging Face GPT-2 directory"),
      field("data_seed", &T::data_seed, "seed of the permutation the documents are taken from (null: file order)"),
      field("comparison_model_path", &T::comparison_model_path, "a second model: also write the page of the log-prob differences"),
      field("comparison_is_hf", &T::comparison_is_hf, "comparison_model_path is a local Hugging Face GPT-2 directory"));
};

namespace levanter {

/// viz_logprobs. `sources` (from parse_command_line) says which keys were given; the rest of `model:` and
/// `data:` come from the checkpoint's config.yaml. Returns the pages written. Throws config::config_error,
/// data::data_error, checkpoint::error, hf::error or viz::viz_error with a message for the user.
std::vector<std::string> run_viz_logprobs(const VizLmConfig& cfg, const config::source_map& sources, std::ostream& out);


namespace detail {

/// Tokens of the validation documents with the data section's tokenizer; also the token-text function and EOS.
struct viz_tokens {
  std::vector<std::int32_t> ids;
  viz::token_text_fn text;
  std::int64_t eos_id = -1;
};
viz_tokens tokenize_validation(const LmDataConfig& d);

/// Where a model to show comes from: a checkpoint (with the config it carries) or a Hugging Face directory.
struct viz_source {
  std::string key;  ///< the setting that named it (checkpoint_path, comparison_model_path)
  std::optional<checkpoint::checkpoint_info> checkpoint;
  std::optional<TrainLmConfig> train_config;
  std::optional<hf::hf_dir> hf;
};

/// What viz_logprobs needs besides the model type.
struct viz_job {
  const VizLmConfig* cfg = nullptr;
  bool model_given = false;  ///< the `model:` section was given (else the checkpoint's is used)
  viz_source target;
  std::optional<viz_source> comparison;
  viz_tokens tokens;
};

/// A model of type M from `s`: its config from the given `model:` section, else the checkpoint's config.yaml, else
/// the Hugging Face config.json.
template <LmModel M>
loaded_lm<M> load_viz_model(const viz_source& s, const viz_job& job) {
  using C = typename M::config_type;
  std::optional<C> given;
  if (job.model_given) {
    const C* c = model_config_as<C>(job.cfg->model);
    if (!c)
      throw config::config_error(s.key + ": the model section is a '" + std::string(job.cfg->model.type_name()) +
                                 "', but this model is a '" + std::string(C::type_name) + "'");
    given = *c;
  }
  if (s.hf) {
    // Without a model section, the directory's own type (a Mistral's config.json gives the mistral family).
    if (!given) {
      const ModelChoice own = model_choice_for_hf(*s.hf);
      const C* c = model_config_as<C>(own);
      if (!c)
        throw config::config_error(s.key + ": '" + s.hf->dir + "' holds a '" + s.hf->model_type +
                                   "' model, but the other model is a '" + std::string(C::type_name) + "'");
      given = *c;
    }
    return load_lm_from_hf<M>(*s.hf, *given);
  }
  if (!given && s.train_config) {
    const C* c = model_config_as<C>(s.train_config->model);
    if (!c)
      throw config::config_error(s.key + ": the checkpoint holds a '" + std::string(s.train_config->model.type_name()) +
                                 "' model but the other model is a '" + std::string(C::type_name) + "'");
    given = *c;
  }
  if (!given)
    throw config::config_error(s.key + ": the checkpoint has no config.yaml; give the model section (--model.type " +
                               std::string(C::type_name) + " --model.hidden_dim ...)");
  return load_lm_from_checkpoint<M>(*s.checkpoint, *given);
}

/// Writes the page(s) with model type M.
std::vector<std::string> write_viz_pages(const viz_job& job, const std::vector<std::vector<std::int32_t>>& docs,
                                         const std::vector<viz::scored_doc>& scores,
                                         const std::vector<viz::scored_doc>* comparison,
                                         const std::string& model_name, std::optional<std::int64_t> step,
                                         const std::string& comparison_name, std::int64_t seq_len, std::ostream& out);
/// The windows to show, with a note when there are fewer than asked for.
std::vector<std::vector<std::int32_t>> viz_documents(const viz_job& job, std::int64_t seq_len, std::ostream& out);

}  // namespace detail

/// viz_logprobs with model type M (instantiated once per built-in model type in the library).
template <LmModel M>
std::vector<std::string> run_viz_logprobs_with(const detail::viz_job& job, std::ostream& out) {
  auto mdl = detail::load_viz_model<M>(job.target, job);
  out << "viz_logprobs: model " << mdl.name << (mdl.step ? " (step " + std::to_string(*mdl.step) + ")" : "") << ", "
      << haliax::tree::parameter_count(mdl.model) << " parameters\n";
  std::optional<loaded_lm<M>> cmp;
  if (job.comparison) {
    cmp.emplace(detail::load_viz_model<M>(*job.comparison, job));
    if (cmp->model.vocab_size() != mdl.model.vocab_size())
      throw config::config_error("comparison_model_path: its vocabulary (" + std::to_string(cmp->model.vocab_size()) +
                                 " tokens) differs from the model's (" + std::to_string(mdl.model.vocab_size()) + ")");
  }
  std::int64_t seq_len = mdl.config.seq_len;
  if (cmp) seq_len = std::min<std::int64_t>(seq_len, cmp->config.seq_len);
  const auto docs = detail::viz_documents(job, seq_len, out);
  const std::int64_t batch =
      job.cfg->trainer.per_device_eval_parallelism > 0 ? job.cfg->trainer.per_device_eval_parallelism : 0;
  const auto scores = viz::score_documents(mdl.model, mdl.config, docs, job.tokens.eos_id, batch);
  std::optional<std::vector<viz::scored_doc>> cscores;
  if (cmp) cscores = viz::score_documents(cmp->model, cmp->config, docs, job.tokens.eos_id, batch);
  return detail::write_viz_pages(job, docs, scores, cscores ? &*cscores : nullptr, mdl.name, mdl.step,
                                 cmp ? cmp->name + (cmp->step ? " (step " + std::to_string(*cmp->step) + ")" : "") : "",
                                 seq_len, out);
}

}  // namespace levanter

// The built-in models (models/builtin.hpp) are instantiated once, in the library (files CMakeLists.txt generates).
#include <levanter/models/builtin_models.hpp>
#define LEVANTER_VIZ_LM_INSTANCE(M, C, ...) \
  template std::vector<std::string> run_viz_logprobs_with<M>(const detail::viz_job&, std::ostream&);
#define LEVANTER_VIZ_LM_EXTERN(M, C, ...) extern LEVANTER_VIZ_LM_INSTANCE(M, C)
namespace levanter {
LEVANTER_BUILTIN_MODELS(LEVANTER_VIZ_LM_EXTERN)
}  // namespace levanter
