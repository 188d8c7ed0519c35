// levanter/main/train_lm_config.hpp: `train_lm`'s config (upstream TrainLmConfig in main/train_lm.py), composed of
// the sections that live beside their subsystems: data (data/config.hpp), trainer (trainer/config.hpp, with the
// checkpointer's and trackers' sections), model (models/registry.hpp), optimizer (optim/config.hpp). Keys we parse
// but do not implement are kept as `config::Opaque` or optional values and refused by validation with a message.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include <levanter/config/cli.hpp>
#include <levanter/config/types.hpp>
#include <levanter/config/validate.hpp>
#include <levanter/data/config.hpp>
#include <levanter/models/registry.hpp>
#include <levanter/optim/config.hpp>
#include <levanter/trainer/config.hpp>

namespace levanter {

/// `viz:` (ours; upstream has the separate viz_lm program): a token-probability heatmap of validation windows,
/// rewritten every `every` steps (and at the end) while training runs.
struct TrainVizConfig {
  int64_t every = 0;                     ///< 0: off
  int64_t num_docs = 8;                  ///< validation windows shown
  std::optional<std::string> path;       ///< default: <run dir>/logprobs.html
  std::optional<int64_t> data_seed = 0;  ///< which windows: a permutation of them with this seed (null: the first)
};

/// Set by the sft programs, not a key: upstream sft's `reinit_tokens` (re-drawn embedding / head rows at step 0).
struct ReinitTokensSetting {
  std::vector<std::string> tokens;
  bool embeddings = true, lm_head = true;
  bool mixture_key = false;  ///< sft_mixture draws with the second key of the seed's split, sft with split(training)
};

// ---- train_lm ------------------------------------------------------------------------------------------------
struct TrainLmConfig {
  LmDataConfig data;
  TrainerConfig trainer;
  ModelChoice model;
  OptimizerChoice optimizer;
  std::variant<bool, std::string> initialize_from_hf = false;
  bool use_hf_model_config = false;
  double z_loss_weight = 0.0;
  std::optional<std::string> hf_save_path;
  config::Opaque hf_upload;
  int64_t hf_save_steps = 10000;
  std::optional<std::string> hf_save_dtype;
  std::optional<int64_t> data_seed;
  std::optional<std::string> initialize_from_checkpoint_path;
  int64_t epoch = 0;
  config::Opaque eval_harness;
  int64_t eval_harness_steps = 10000;
  bool log_entropy = false;
  TrainVizConfig viz;
  /// Set by the sft program, not a key: the sequence length that replaces the Hugging Face config's with
  /// use_hf_model_config (upstream sft's max_seq_len).
  std::optional<int64_t> hf_seq_len;
  std::optional<ReinitTokensSetting> reinit_tokens;  ///< set by the sft programs, not a key
};

}  // namespace levanter

template <>
struct levanter::config::schema<levanter::TrainVizConfig> {
  using T = levanter::TrainVizConfig;
  static constexpr auto fields = std::make_tuple(
      field("every", &T::every, "refresh every this many steps (0: off)"),
      field("num_docs", &T::num_docs, "validation windows shown"),
      field("path", &T::path, "HTML file (default: <run dir>/logprobs.html)"),
      field("data_seed", &T::data_seed, "seed of the window choice (null: the first windows)"));
};

template <>
struct levanter::config::schema<levanter::TrainLmConfig> {
  using T = levanter::TrainLmConfig;
  static constexpr auto fields = std::make_tuple(
      field("data", &T::data, "training and validation data"),
      field("trainer", &T::trainer, "training loop settings"),
      field("model", &T::model, "model architecture (type: gpt2, llama, mistral, qwen, qwen3)"),
      field("optimizer", &T::optimizer, "optimizer and learning-rate schedule (type: adam)"),
      field("initialize_from_hf", &T::initialize_from_hf, "start from a local Hugging Face GPT-2 directory (config.json + safetensors)"),
      field("use_hf_model_config", &T::use_hf_model_config, "take the model config from the HF checkpoint"),
      field("z_loss_weight", &T::z_loss_weight, "weight of the logsumexp^2 auxiliary loss"),
      field("hf_save_path", &T::hf_save_path, "export Hugging Face checkpoints to <hf_save_path>/<run id>/step-N every hf_save_steps"),
      field("hf_upload", &T::hf_upload, "upload HF checkpoints (not supported)"),
      field("hf_save_steps", &T::hf_save_steps, "steps between HF exports"),
      field("hf_save_dtype", &T::hf_save_dtype, "dtype of HF exports"),
      field("data_seed", &T::data_seed, "seed of the data order (default: from trainer.seed)"),
      field("initialize_from_checkpoint_path", &T::initialize_from_checkpoint_path, "start from the model of this checkpoint (fresh optimizer, step 0)"),
      field("epoch", &T::epoch, "number of epochs over the data (0: unbounded)"),
      field("eval_harness", &T::eval_harness, "lm-eval-harness (not supported)"),
      field("eval_harness_steps", &T::eval_harness_steps, "steps between harness evaluations"),
      field("log_entropy", &T::log_entropy, "log entropy histograms (not supported)"),
      field("viz", &T::viz, "token-probability heatmap of validation windows, refreshed while training"));
};


namespace levanter {
/// Checks a decoded train_lm config before any work: every error at once (with the key, the file and line it was
/// set at, and what to do), and notes for keys we accept but ignore.
config::validation_result validate_train_lm(const TrainLmConfig& cfg, const config::source_map& sources);

/// What `train_lm --dry_run` checks beyond validate_train_lm, needing no training data: every data file the URLs
/// name exists and can be opened, the tokenizer loads, and the model's parameters, gradients and moments fit in the
/// machine's memory. Throws data::data_error or config::config_error naming the key.
void dry_run_checks(const TrainLmConfig& cfg);

}  // namespace levanter

// The config machinery for TrainLmConfig is instantiated once, in the library (src/main/train_lm.cpp).
namespace levanter::config {
extern template TrainLmConfig decode<TrainLmConfig>(const YAML::Node&, const std::string&, const source_map&,
                                                    const std::string&);
extern template YAML::Node encode<TrainLmConfig>(const TrainLmConfig&);
extern template std::string to_yaml_string<TrainLmConfig>(const TrainLmConfig&);
extern template std::string help_text<TrainLmConfig>(const std::string&, const TrainLmConfig&);
extern template command_line<TrainLmConfig> parse_command_line<TrainLmConfig>(int, const char* const*,
                                                                              const std::string&, const std::string&);
}  // namespace levanter::config
