// levanter/main/sft.hpp: the `sft` and `sft_mixture` programs (upstream `levanter.main.sft` / `.sft_mixture`):
// supervised fine-tuning of a language model on single-turn chat records or prompt/response records, with upstream's
// SFTConfig / SFTMixtureConfig keys.
//
//   sft config/sft_tiny.yaml
//   sft --config_path sft.yaml --trainer.num_train_steps 100 --epoch 2
//
// It is train_lm with sft's data: `dataset_type: chat_jsonl` reads `chat_train_urls` (OpenAI-style messages: the
// first `input_role` message is the prompt, the first `output_role` message the response, EOS appended as upstream's
// legacy chat preprocessing does), `dataset_type: huggingface` reads `supervised_data`'s local `train_urls`
// (`input_field` / `output_field`). The rows are cached under `supervised_data.cache_dir`, read in a permutation of
// the data key, `epoch` times over (0: once), and packed as upstream sft packs them (4 rows per example, the loss on
// the responses only, no attention across rows: data::prompt_completion_options). Training ends at
// trainer.num_train_steps or when the packed examples run out.
//
// The model starts from a local Hugging Face directory (`initialize_from_hf: true` with `model_name_or_path`, or
// `initialize_from_hf: DIR`; its config.json gives the architecture, `max_seq_len` the sequence length) or from
// another run's checkpoint (`trainer.initialize_from`); upstream requires one of them. Checkpoints, resumption,
// logging and Hugging Face exports (`hf_save_path` every `hf_save_steps`) are train_lm's: the run
// directory records the train_lm config the run is, so export_lm_to_hf, eval_lm and viz_logprobs read sft runs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include <levanter/config/types.hpp>
#include <levanter/config/validate.hpp>
#include <levanter/main/train_lm_config.hpp>

namespace levanter {

/// Upstream SFTConfig (main/sft.py), its keys and defaults.
struct SftConfig {
  TrainerConfig trainer;
  ModelChoice model = as_model_choice(LlamaConfig{});  ///< upstream's default model is a Llama
  OptimizerChoice optimizer;
  /// A SupervisedSourceConfig ({cache_dir, train_urls, validation_urls, input_field, output_field, tags}) or a map
  /// of name -> one (upstream uses the first).
  config::Opaque supervised_data;
  std::variant<bool, std::string> initialize_from_hf = false;
  std::optional<std::string> hf_save_path;
  config::Opaque hf_upload;
  int64_t hf_save_steps = 0;
  int64_t max_seq_len = 2048;
  std::string model_name_or_path = "NousResearch/Llama-2-7b-hf";
  std::string tokenizer = "NousResearch/Llama-2-7b-hf";
  std::string dataset_type = "chat_jsonl";
  std::optional<std::vector<std::string>> chat_train_urls;
  std::string messages_field = "messages";
  std::string input_role = "user";
  std::string output_role = "assistant";
  std::optional<int64_t> data_seed;
  int64_t epoch = 0;
  config::Opaque reinit_tokens;
  bool reinit_lm_head = true;
  bool reinit_embeddings = true;
};

/// Upstream SFTMixtureConfig (main/sft_mixture.py), its keys and defaults: SFTConfig's without chat_train_urls and
/// epoch, with a map of sources mixed by weight. The rows of the sources are mixed (upstream MixtureDataset over
/// each source's permuted rows, blocks of mixture_block_size, the data key), without end, then packed as sft packs.
struct SftMixtureConfig {
  TrainerConfig trainer;
  ModelChoice model = as_model_choice(LlamaConfig{});
  OptimizerChoice optimizer;
  config::Opaque supervised_data;  ///< {name: {cache_dir, train_urls, input_field, output_field, tags}}
  config::Opaque mixture_weights;  ///< {name: weight}
  int64_t mixture_block_size = 2048;
  std::string stop_strategy = "restart";
  std::variant<bool, std::string> initialize_from_hf = false;
  std::optional<std::string> hf_save_path;
  config::Opaque hf_upload;
  int64_t hf_save_steps = 0;
  int64_t max_seq_len = 2048;
  std::string model_name_or_path = "marin-community/marin-8b-base";
  std::string tokenizer = "marin-community/marin-8b-base";
  std::string dataset_type = "chat_jsonl";
  std::string messages_field = "messages";
  std::string input_role = "user";
  std::string output_role = "assistant";
  std::optional<int64_t> data_seed;
  config::Opaque reinit_tokens;
  bool reinit_lm_head = true;
  bool reinit_embeddings = true;
};

/// The train_lm config an sft (or sft_mixture) config runs as, and what the check found: every error at once (keys
/// as the sft config names them), notes for what is accepted and ignored.
struct sft_plan {
  TrainLmConfig train;
  config::validation_result checked;
};
sft_plan plan_sft(const SftConfig& cfg, const config::source_map& sources);
sft_plan plan_sft_mixture(const SftMixtureConfig& cfg, const config::source_map& sources);

/// The whole programs: each parses its command line (a config path, --config_path, dotted overrides), answers
/// --help and --dry_run, trains; returns the exit code of levanter/main/programs.hpp.
int sft_main(int argc, char** argv);
int sft_mixture_main(int argc, char** argv);

}  // namespace levanter

template <>
struct levanter::config::schema<levanter::SftConfig> {
  using T = levanter::SftConfig;
  static constexpr auto fields = std::make_tuple(
      field("trainer", &T::trainer, "training loop settings"),
      field("model", &T::model, "model architecture (replaced by the Hugging Face config.json with initialize_from_hf)"),
      field("optimizer", &T::optimizer, "optimizer and learning-rate schedule"),
      field("supervised_data", &T::supervised_data,
            "{cache_dir, train_urls, input_field, output_field} or a map of name -> one (the first is used)"),
      field("initialize_from_hf", &T::initialize_from_hf,
            "true: start from model_name_or_path (a local Hugging Face directory); or that directory"),
      field("hf_save_path", &T::hf_save_path, "export Hugging Face checkpoints to <hf_save_path>/<run id>/step-N"),
      field("hf_upload", &T::hf_upload, "upload HF checkpoints (not supported)"),
      field("hf_save_steps", &T::hf_save_steps, "steps between HF exports"),
      field("max_seq_len", &T::max_seq_len, "rows are cut to this many tokens; the sequence length with initialize_from_hf"),
      field("model_name_or_path", &T::model_name_or_path, "the Hugging Face directory initialize_from_hf: true reads"),
      field("tokenizer", &T::tokenizer, "a local tokenizer.json or a directory holding one"),
      field("dataset_type", &T::dataset_type, "chat_jsonl (chat_train_urls) or huggingface (supervised_data's files)"),
      field("chat_train_urls", &T::chat_train_urls, "JSON-lines files of OpenAI-style chats (dataset_type chat_jsonl)"),
      field("messages_field", &T::messages_field, "the records' field holding the messages"),
      field("input_role", &T::input_role, "the role whose first message is the prompt"),
      field("output_role", &T::output_role, "the role whose first message is the response"),
      field("data_seed", &T::data_seed, "seed of the row order (default: from trainer.seed)"),
      field("epoch", &T::epoch, "passes over the rows (0: one, then training ends)"),
      field("reinit_tokens", &T::reinit_tokens, "true (Llama 3's chat tokens) or a list of tokens whose embedding rows are re-drawn at step 0"),
      field("reinit_lm_head", &T::reinit_lm_head, "with reinit_tokens: their output rows too"),
      field("reinit_embeddings", &T::reinit_embeddings, "with reinit_tokens: their input rows"));
};

template <>
struct levanter::config::schema<levanter::SftMixtureConfig> {
  using T = levanter::SftMixtureConfig;
  static constexpr auto fields = std::make_tuple(
      field("trainer", &T::trainer, "training loop settings"),
      field("model", &T::model, "model architecture (replaced by the Hugging Face config.json with initialize_from_hf)"),
      field("optimizer", &T::optimizer, "optimizer and learning-rate schedule"),
      field("supervised_data", &T::supervised_data, "{name: {cache_dir, train_urls, input_field, output_field}}"),
      field("mixture_weights", &T::mixture_weights, "{name: weight} (normalised)"),
      field("mixture_block_size", &T::mixture_block_size, "rows per block of the mixture"),
      field("stop_strategy", &T::stop_strategy, "restart (the mixture of rows has no end)"),
      field("initialize_from_hf", &T::initialize_from_hf,
            "true: start from model_name_or_path (a local Hugging Face directory); or that directory"),
      field("hf_save_path", &T::hf_save_path, "export Hugging Face checkpoints to <hf_save_path>/<run id>/step-N"),
      field("hf_upload", &T::hf_upload, "upload HF checkpoints (not supported)"),
      field("hf_save_steps", &T::hf_save_steps, "steps between HF exports"),
      field("max_seq_len", &T::max_seq_len, "rows are cut to this many tokens; the sequence length with initialize_from_hf"),
      field("model_name_or_path", &T::model_name_or_path, "the Hugging Face directory initialize_from_hf: true reads"),
      field("tokenizer", &T::tokenizer, "a local tokenizer.json or a directory holding one"),
      field("dataset_type", &T::dataset_type, "chat_jsonl (single-turn chats) or huggingface (prompt/response records)"),
      field("messages_field", &T::messages_field, "the records' field holding the messages"),
      field("input_role", &T::input_role, "the role whose first message is the prompt"),
      field("output_role", &T::output_role, "the role whose first message is the response"),
      field("data_seed", &T::data_seed, "seed of the row order and the mixture (default: from trainer.seed)"),
      field("reinit_tokens", &T::reinit_tokens, "true (Llama 3's chat tokens) or a list of tokens whose embedding rows are re-drawn at step 0"),
      field("reinit_lm_head", &T::reinit_lm_head, "with reinit_tokens: their output rows too"),
      field("reinit_embeddings", &T::reinit_embeddings, "with reinit_tokens: their input rows"));
};
