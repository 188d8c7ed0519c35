// levanter/main/sample_lm.hpp: the `sample_lm` program (upstream `levanter.main.sample_lm`): text continuations of
// prompts from a trained model, with a KV cache (levanter/inference/generate.hpp).
//
//   sample_lm --checkpoint_path checkpoints/RUN --prompts '["Four score and", "Once upon"]' --max_new_tokens 32
//   sample_lm --hf_checkpoint path/to/hf_dir --temperature 0 --stop_sequence null
//   sample_lm config/sampler/sample_nano.yaml --hf_checkpoint path/to/Llama-3.2-1B   # upstream's config, local model
//
// The model: the newest complete checkpoint under checkpoint_path (its config.yaml gives the model section and the
// tokenizer unless given), or a local Hugging Face directory (hf_checkpoint; its config.json gives the model and its
// tokenizer.json the tokenizer). Prompts are tokenized without special tokens, as upstream; each prompt gets
// n_generations continuations per round, sampled at `temperature` (0: greedy) until max_new_tokens or the stop
// sequence (its tokens, whole), and the rounds repeat the prompts (upstream times them). Generation i of prompt p in
// round r draws with the seed mixed from (seed, r, p, i), so every continuation is reproducible alone.
//
// A round's continuations decode as one batch of at most `engine.max_seqs` (upstream InferenceEngineConfig's, default
// 16) sequences of different lengths (generate_batch), each equal to its continuation alone; the rest of the engine
// section is read and not used (docs/generation.md). `trainer` is accepted for its `mp`, which is not applied (f32).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <levanter/config/cli.hpp>
#include <levanter/data/tokenizer.hpp>
#include <levanter/inference/generate.hpp>
#include <levanter/main/model_loading.hpp>
#include <levanter/main/programs.hpp>
#include <levanter/models/registry.hpp>
#include <levanter/trainer/config.hpp>

namespace levanter {

/// upstream SampleLmConfig.
struct SampleLmConfig {
  std::optional<std::string> checkpoint_path;
  std::optional<std::string> hf_checkpoint;
  TrainerConfig trainer;
  ModelChoice model;
  std::optional<std::string> tokenizer;
  config::Opaque engine;
  std::vector<std::string> prompts = {"What is the square root of 17?", "Four score and seven years ago, our",
                                      "On the first day of Christmas, my true love gave to me",
                                      "In a hole in the ground there lived a hobbit, not a nasty, dirty, wet hole"};
  std::optional<std::string> stop_sequence = ".";
  int64_t max_new_tokens = 192;
  double temperature = 0.7;
  int64_t seed = 2;
  int64_t n_generations = 1;
  int64_t n_rounds = 4;
  bool profile = false;
  std::optional<std::string> log_kernel_jaxprs_path;
};

}  // namespace levanter

template <>
struct levanter::config::schema<levanter::SampleLmConfig> {
  using T = levanter::SampleLmConfig;
  static constexpr auto fields = std::make_tuple(
      field("checkpoint_path", &T::checkpoint_path, "a train_lm checkpoint, or a directory holding step-N checkpoints (the newest is used)"),
      field("hf_checkpoint", &T::hf_checkpoint, "a local Hugging Face model directory (instead of checkpoint_path)"),
      field("trainer", &T::trainer, "trainer section (accepted for upstream compatibility; generation runs in f32)"),
      field("model", &T::model, "model config (default: the checkpoint's config.yaml, or config.json of hf_checkpoint)"),
      field("tokenizer", &T::tokenizer, "tokenizer: a local tokenizer.json or its directory, byte or passthrough (default: the checkpoint's data.tokenizer, or hf_checkpoint's tokenizer.json)"),
      field("engine", &T::engine, "upstream's InferenceEngineConfig: max_seqs (16) continuations decode as one batch; the rest is read, not used"),
      field("prompts", &T::prompts, "prompts to continue"),
      field("stop_sequence", &T::stop_sequence, "text whose tokens end a continuation (null: none)"),
      field("max_new_tokens", &T::max_new_tokens, "most tokens generated per continuation"),
      field("temperature", &T::temperature, "sampling temperature; 0 is greedy"),
      field("seed", &T::seed, "sampling seed"),
      field("n_generations", &T::n_generations, "continuations per prompt and round"),
      field("n_rounds", &T::n_rounds, "times the prompts are run (each round is timed)"),
      field("profile", &T::profile, "JAX profiling upstream; not used here"),
      field("log_kernel_jaxprs_path", &T::log_kernel_jaxprs_path, "upstream's kernel jaxpr dump; not used here"));
};

namespace levanter {

/// One continuation: its round, prompt, generation index and the generation itself (tokens and text).
struct sample {
  std::int64_t round = 0, prompt = 0, index = 0;
  generation gen;
  std::string text;
};

namespace detail {

/// Where a generating program's model and tokenizer come from (sample_lm, serve_lm).
struct model_source {
  std::optional<checkpoint::checkpoint_info> checkpoint;
  std::optional<TrainLmConfig> train_config;
  std::optional<hf::hf_dir> hf;
  data::tokenizer tok = data::tokenizer::byte_level();
  /// The model section: the given one, else the checkpoint's config.yaml, else the Hugging Face config.json.
  ModelChoice model;
};

/// The model source of a program's keys: exactly one of checkpoint_path (a train_lm checkpoint or a directory of
/// them, the newest used) and hf_checkpoint (a local Hugging Face directory); the tokenizer given, else the
/// directory's own, else the checkpoint's data.tokenizer; the model section given (per `sources`), else the
/// checkpoint's or the directory's. `say` reports what was chosen. Throws config::config_error, data::data_error,
/// checkpoint::error or hf::error naming the key.
model_source resolve_model_source(const std::optional<std::string>& checkpoint_path,
                                  const std::optional<std::string>& hf_checkpoint, const ModelChoice& model,
                                  const std::optional<std::string>& tokenizer, const config::source_map& sources,
                                  const std::function<void(const std::string&)>& say);

/// What sample_lm needs besides the model type.
struct sample_job : model_source {
  const SampleLmConfig* cfg = nullptr;
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<std::int32_t> stop;  ///< the stop sequence's tokens (empty: none)
  std::int64_t max_seqs = 16;      ///< continuations decoded as one batch (engine.max_seqs)
};

/// The source's model section as config type C (the type it was dispatched on).
template <class C>
C sample_model_config(const model_source& job) {
  const C* c = model_config_as<C>(job.model);
  if (!c)
    throw config::config_error("model: a '" + std::string(job.model.type_name()) + "' section, but the model is a '" +
                               std::string(C::type_name) + "'");
  return *c;
}

/// The model of `src` (its weights from the checkpoint or the Hugging Face directory), checked against the tokenizer.
template <LmModel M>
loaded_lm<M> load_source_model(const model_source& src) {
  using C = typename M::config_type;
  const C given = sample_model_config<C>(src);
  loaded_lm<M> mdl = src.hf ? load_lm_from_hf<M>(*src.hf, given) : load_lm_from_checkpoint<M>(*src.checkpoint, given);
  if (src.tok.vocab_size() > mdl.model.vocab_size())
    throw config::config_error("tokenizer: '" + src.tok.name() + "' has " + std::to_string(src.tok.vocab_size()) +
                               " tokens, more than the model's vocabulary of " +
                               std::to_string(mdl.model.vocab_size()) + "; give the model's own tokenizer");
  return mdl;
}

/// Generates and prints every continuation of the job with `model`; returns them.
template <LmModel M>
std::vector<sample> sample_all(const M& model, const typename M::config_type& cfg, const sample_job& job,
                               std::ostream& out);

/// The sampling options of continuation (round, prompt, index): the config's, with the seed mixed from all four.
sampling_options sample_options(const SampleLmConfig& cfg, const std::vector<std::int32_t>& stop, std::int64_t round,
                                std::int64_t prompt, std::int64_t index);

/// Prints one continuation (and returns its text).
std::string print_sample(const sample_job& job, const sample& s, std::ostream& out);

/// Whether a key at or under `prefix` was set (per parse_command_line's sources; defined with viz_logprobs).
bool sources_under(const config::source_map& sources, const std::string& prefix);

}  // namespace detail

/// sample_lm with model type M (instantiated once per built-in model type in the library).
template <LmModel M>
std::vector<sample> run_sample_lm_with(const detail::sample_job& job, std::ostream& out) {
  const loaded_lm<M> mdl = detail::load_source_model<M>(job);
  out << "sample_lm: model " << mdl.name << (mdl.step ? " (step " + std::to_string(*mdl.step) + ")" : "") << "\n";
  return detail::sample_all(mdl.model, mdl.config, job, out);
}

/// sample_lm: every continuation, printed to `out` as it is made. `sources` says which keys were given. Throws
/// config::config_error, data::data_error, checkpoint::error or hf::error with a message for the user.
std::vector<sample> run_sample_lm(const SampleLmConfig& cfg, const config::source_map& sources, std::ostream& out);

namespace detail {

template <LmModel M>
std::vector<sample> sample_all(const M& model, const typename M::config_type& cfg, const sample_job& job,
                               std::ostream& out) {
  std::vector<sample> all;
  const auto logits = make_logits_fn(model, cfg);
  for (std::int64_t r = 0; r < job.cfg->n_rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::int64_t tokens = 0;
    std::vector<sample> round;
    std::vector<std::vector<std::int32_t>> prompts;
    std::vector<sampling_options> options;
    for (std::size_t p = 0; p < job.prompts.size(); ++p)
      for (std::int64_t i = 0; i < job.cfg->n_generations; ++i) {
        round.push_back(sample{r, static_cast<std::int64_t>(p), i, {}, {}});
        prompts.push_back(job.prompts[p]);
        options.push_back(sample_options(*job.cfg, job.stop, r, static_cast<std::int64_t>(p), i));
      }
    auto gens = generate_batch(logits, cfg.seq_len, prompts, options, job.max_seqs);
    for (std::size_t k = 0; k < round.size(); ++k) {
      auto& s = round[k];
      s.gen = std::move(gens[k]);
      tokens += static_cast<std::int64_t>(s.gen.tokens.size());
      s.text = print_sample(job, s, out);
      all.push_back(std::move(s));
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out << "Round " << r << " took " << secs << " seconds, " << tokens << " tokens ("
        << (secs > 0 ? static_cast<double>(tokens) / secs : 0.0) << " tokens/s)\n";
  }
  return all;
}

}  // namespace detail

}  // namespace levanter

// The built-in models (models/builtin.hpp) are instantiated once, in the library (files CMakeLists.txt generates).
#include <levanter/models/builtin_models.hpp>
#define LEVANTER_SAMPLE_LM_INSTANCE(M, C, ...) \
  template std::vector<sample> run_sample_lm_with<M>(const detail::sample_job&, std::ostream&);
#define LEVANTER_SAMPLE_LM_EXTERN(M, C, ...) extern LEVANTER_SAMPLE_LM_INSTANCE(M, C)
namespace levanter {
LEVANTER_BUILTIN_MODELS(LEVANTER_SAMPLE_LM_EXTERN)
}  // namespace levanter
