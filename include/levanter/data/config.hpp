// levanter/data/config.hpp: the `data:` section (upstream LMTaskConfig / UrlSingleDatasetLMConfig /
// LMMixtureDatasetConfig keys), beside the data pipeline that reads it (data/lm_data.hpp).
#pragma once

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include <levanter/config/section.hpp>
#include <levanter/config/types.hpp>

namespace levanter::config {
struct validator;
}  // namespace levanter::config

namespace levanter {

// ---- data ----------------------------------------------------------------------------------------------------
/// `data.cache_options` (upstream CacheOptions); none of these changes a cache's bytes.
struct CacheOptionsConfig {
  int64_t num_shard_groups = 128;               ///< accepted for upstream configs; the builder here is one process
  std::string target_size_per_flush = "512MB";  ///< a commit also ends at this much raw input
  int64_t batch_size = 1024;                    ///< documents per commit (upstream: 128 per tokenizer call)
  int64_t num_threads = 0;                      ///< tokenizing threads (0: one per core)
  /// target_size_per_flush in bytes ("512MB", "1GiB", "65536"); -1 when it does not parse or is not in [1, 2^50].
  int64_t target_size_bytes() const {
    std::size_t i = 0;
    while (i < target_size_per_flush.size() && (std::isdigit(static_cast<unsigned char>(target_size_per_flush[i])) ||
                                                 target_size_per_flush[i] == '.'))
      ++i;
    if (i == 0) return -1;
    const double v = std::atof(target_size_per_flush.substr(0, i).c_str());
    std::string unit = target_size_per_flush.substr(i);
    while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
    for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    const std::pair<const char*, double> units[] = {{"", 1},       {"B", 1},           {"KB", 1e3},     {"MB", 1e6},
                                                     {"GB", 1e9},   {"K", 1e3},         {"M", 1e6},      {"G", 1e9},
                                                     {"KIB", 1024}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}};
    for (const auto& [u, m] : units)
      if (unit == u) {
        const double bytes = v * m;  // at most 2^50 (1 PiB): anything larger is not a flush size
        return bytes >= 1 && bytes <= 1125899906842624.0 ? static_cast<int64_t>(bytes) : -1;
      }
    return -1;
  }
};
/// What the sft and sft_mixture programs (upstream main/sft.py, main/sft_mixture.py) set on the data they build; not
/// a key of train_lm's `data:`. The datasets (sft's one, or sft_mixture's `configs` with `train_weights`) are read
/// as upstream sft reads them: single-turn records (the first `input_role` and `output_role`
/// messages, EOS appended to the response as upstream's legacy chat preprocessing does) or supervised records, then
/// data::prompt_completion_options packing.
struct SftDataOptions {
  std::string input_role = "user", output_role = "assistant";
  int64_t max_seq_len = 2048;  ///< upstream's model_max_length: rows are cut to it
  int64_t epochs = 0;          ///< passes over the rows (upstream EpochDataset); 0: one, then the data ends
  /// sft_mixture (data.configs set): the examples to pack for the run (its mixture of rows is endless)
  int64_t examples = 0;
};

struct LmDataConfig {
  std::string tokenizer = "gpt2";
  std::optional<int64_t> vocab_size;
  std::string cache_dir = "cache/";
  CacheOptionsConfig cache_options;
  std::string bad_documents = "stop";
  bool enforce_eos = true;
  std::optional<std::string> chat_template;
  int64_t ignore_token_id = -100;
  std::variant<bool, int64_t> shuffle = false;
  std::optional<std::string> permutation_type;
  std::vector<std::string> train_urls;
  std::vector<std::string> validation_urls;
  std::optional<std::string> id;
  std::optional<std::string> name;
  bool stream = true;
  std::optional<std::vector<std::string>> tags;
  config::Opaque format;
  std::optional<std::string> text_key;
  // mixture keys (LMMixtureDatasetConfig)
  config::Opaque configs;
  config::Opaque train_weights;
  std::optional<std::string> stop_strategy;
  std::optional<int64_t> mixture_block_size;
  config::Opaque target_budget;
  config::Opaque experiment_budget;
  config::Opaque max_train_batches;         ///< {name: batches}
  config::Opaque num_validation_sequences;  ///< {name: sequences}
  bool shuffle_before_trainval_split = true;
  std::optional<int64_t> shuffle_buffer_size;
  std::optional<SftDataOptions> sft;  ///< set by the sft program (no YAML key)
};

/// Adds every problem of the `data:` section to `v` (keys under `data.`).
void validate(config::validator& v, const LmDataConfig& d);

}  // namespace levanter

template <>
struct levanter::config::schema<levanter::CacheOptionsConfig> {
  using T = levanter::CacheOptionsConfig;
  static constexpr auto fields = std::make_tuple(
      field("num_shard_groups", &T::num_shard_groups, "accepted (upstream's Ray shard groups; one builder here)"),
      field("target_size_per_flush", &T::target_size_per_flush, "raw input per commit at most, e.g. 512MB"),
      field("batch_size", &T::batch_size, "documents per commit"),
      field("num_threads", &T::num_threads, "tokenizing threads (0: one per core)"));
};
template <>
struct levanter::config::schema<levanter::LmDataConfig> {
  using T = levanter::LmDataConfig;
  static constexpr auto fields = std::make_tuple(
      field("tokenizer", &T::tokenizer, "tokenizer: 'byte' (built in), 'passthrough', or a tokenizer.json path"),
      field("vocab_size", &T::vocab_size, "vocabulary size (passthrough tokenizer)"),
      field("cache_dir", &T::cache_dir, "directory of the tokenized cache"),
      field("cache_options", &T::cache_options, "cache build options (threads, documents per commit)"),
      field("bad_documents", &T::bad_documents, "a malformed line or invalid UTF-8: stop (default) or skip (and count)"),
      field("enforce_eos", &T::enforce_eos, "append EOS to each document"),
      field("chat_template", &T::chat_template, "chat template (chat data)"),
      field("ignore_token_id", &T::ignore_token_id, "label id excluded from the loss"),
      field("shuffle", &T::shuffle, "false, true (full permutation) or an era length"),
      field("permutation_type", &T::permutation_type, "linear or feistel"),
      field("train_urls", &T::train_urls, "training files: local paths, globs, {a..b} ranges"),
      field("validation_urls", &T::validation_urls, "validation files"),
      field("id", &T::id, "Hugging Face dataset id (not supported: no network)"),
      field("name", &T::name, "Hugging Face dataset config name"),
      field("stream", &T::stream, "stream the HF dataset"),
      field("tags", &T::tags, "tags for per-tag eval losses"),
      field("format", &T::format, "document format (text, chat, supervised)"),
      field("text_key", &T::text_key, "JSON field holding the text"),
      field("configs", &T::configs, "mixture: {name: {train_urls, validation_urls, cache_dir, tags}}, in order"),
      field("train_weights", &T::train_weights, "mixture weights: {name: w} or [[step, {name: w}], ...]"),
      field("stop_strategy", &T::stop_strategy, "mixture stop strategy (restart)"),
      field("mixture_block_size", &T::mixture_block_size, "mixture block size (default 2048)"),
      field("target_budget", &T::target_budget, "mixture simulated epoching"),
      field("experiment_budget", &T::experiment_budget, "mixture simulated epoching"),
      field("max_train_batches", &T::max_train_batches, "mixture cap on training batches"),
      field("num_validation_sequences", &T::num_validation_sequences, "mixture validation sequences"),
      field("shuffle_before_trainval_split", &T::shuffle_before_trainval_split,
            "validation sequences: a fixed shuffle before the split"),
      field("shuffle_buffer_size", &T::shuffle_buffer_size, "shuffle buffer size"));
};

// The YAML machinery of this section is compiled once, in src/data/config.cpp.
LEVANTER_CONFIG_SECTION_EXTERN(levanter::LmDataConfig)
