// levanter/data/lm_data.hpp: the `data:` section of train_lm put together (upstream LMTaskConfig /
// UrlSingleDatasetLMConfig / LMMixtureDatasetConfig): the tokenizer, one token cache per dataset and split
// (built in the background on first use, reused afterwards), upstream's example layout (TokenSeqDataset:
// non-overlapping windows of seq_len tokens of the concatenated stream), shuffling by permutation, mixtures,
// and the validation sets with their tags.
//
// Every training example is a pure function of (config, data key, index), so batch s is the same whether the run
// started at 0 or resumed at s. Unshuffled single-dataset runs start training as soon as the first windows are
// in the cache; shuffled ones and mixtures need the length of each dataset and wait for its cache to finish.
#pragma once

#include <cstdint>
#include <functional>
#include <haliax/random.hpp>
#include <levanter/data/cache.hpp>
#include <levanter/data/config.hpp>
#include <levanter/data/mixture.hpp>
#include <levanter/data/packing.hpp>
#include <levanter/data/permutation.hpp>
#include <levanter/data/sources.hpp>
#include <levanter/data/tokenizer.hpp>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace levanter::data {

/// The tokenizer `data.tokenizer` names: `byte` (the embedded default's), `passthrough` (ids as text, with
/// data.vocab_size), or a local tokenizer.json / a directory holding one.
tokenizer make_tokenizer(const LmDataConfig& d);

/// One dataset: a single source (name "") or one entry of `data.configs`.
struct dataset_spec {
  std::string name;
  std::vector<std::string> train_urls, validation_urls;
  std::string cache_dir;          ///< holds `train/` and `validation/`
  std::vector<std::string> tags;  ///< extra eval tags (upstream `tags`)
  std::optional<std::string> text_key;  ///< the component's `format: {type: text, text_key}`; unset: data's
  bool text_pack = false;  ///< `format: {type: text, pack: true}`: whole documents packed with segment ids
  std::optional<supervised_format> supervised;  ///< `format: {type: supervised, ...}`: packed supervised examples
  std::optional<chat_format> chat;  ///< `format: {type: chat}` (multi-turn): packed rows of rendered conversations
};

/// The datasets of the config, in config order (a mixture's `configs` keep the order they are written in).
std::vector<dataset_spec> dataset_specs(const LmDataConfig& d);

/// `data.train_weights`: `{name: w}` (one stage from step 0) or `[[step, {name: w}], ...]`; starts in steps.
std::vector<mixture_stage> weight_stages(const LmDataConfig& d, const std::vector<dataset_spec>& specs);

/// Examples of one dataset: windows of seq_len tokens over its text cache, packed supervised examples, or chosen
/// examples of another's (a validation set split off a training set). Each example comes with its loss mask and
/// segment ids (`example`).
class cache_windows {
 public:
  cache_windows(std::shared_ptr<token_cache> c, std::int64_t seq_len) : cache_(std::move(c)), seq_len_(seq_len) {}
  /// The packed examples of a supervised cache (`mask_inputs`: train on the responses only).
  cache_windows(std::shared_ptr<const packed_examples> p, std::shared_ptr<token_cache> c, bool mask_inputs)
      : cache_(std::move(c)), seq_len_(p->seq_len()), packs_(std::move(p)), mask_inputs_(mask_inputs) {}
  /// Examples index[0], index[1], ... of `base` (every one must exist in base's finished cache).
  cache_windows(const cache_windows& base, std::vector<std::int64_t> index)
      : cache_(base.cache_), seq_len_(base.seq_len_), packs_(base.packs_), mask_inputs_(base.mask_inputs_),
        index_(std::make_shared<const std::vector<std::int64_t>>(std::move(index))) {}
  std::int64_t seq_len() const { return seq_len_; }
  const token_cache& cache() const { return *cache_; }
  /// Whether the examples are packed supervised rows (their loss masks come from the data, not from the tokens).
  bool packed() const { return packs_ != nullptr; }
  /// Examples in the finished cache (waits for the build to finish).
  std::int64_t final_size() const {
    if (index_) return static_cast<std::int64_t>(index_->size());
    return packs_ ? packs_->size() : cache_->total_tokens() / seq_len_;
  }
  /// Whether example `w` exists, waiting until it is built or the build ends without it.
  bool has(std::int64_t w) const {
    if (index_ || packs_) return w >= 0 && w < final_size();
    return cache_->wait_for_tokens((w + 1) * seq_len_) >= (w + 1) * seq_len_;
  }
  /// The tokens of example `w`.
  void window(std::int64_t w, std::int32_t* out) const;
  /// Example `w`: tokens, loss mask and segment ids (seq_len each). Text windows follow upstream
  /// `LmExample.causal` (`eos_id` starts segments, `ignore_id` masks targets; causal_labels); packed ones the
  /// supervised mask (packed_examples::example).
  void example(std::int64_t w, std::int64_t eos_id, std::int64_t ignore_id, std::int32_t* tokens, std::uint8_t* keep,
               std::int32_t* segment) const;

 private:
  std::shared_ptr<token_cache> cache_;
  std::int64_t seq_len_;
  std::shared_ptr<const packed_examples> packs_;  // set: supervised examples
  bool mask_inputs_ = true;
  std::shared_ptr<const std::vector<std::int64_t>> index_;  // set: the examples of cache_ this view holds
};

/// The token cache of one split ("train" or "validation") of dataset `s`, opened, or built in the background when
/// missing: text rows, or supervised / single-turn chat rows as its format says. `log` (may be empty) gets a line.
std::shared_ptr<token_cache> open_split_cache(const LmDataConfig& d, const tokenizer& tok, const dataset_spec& s,
                                              const std::vector<std::string>& urls, const char* split,
                                              const std::function<void(const std::string&)>& log);
/// The examples of one split of dataset `s` as train_lm reads them: windows of seq_len tokens, packed documents
/// (`format: {type: text, pack: true}`) or packed supervised rows (these wait for the whole cache). eval_lm reads
/// its sets through it, so every format is evaluated as it trains.
std::shared_ptr<cache_windows> open_split(const LmDataConfig& d, const tokenizer& tok, const dataset_spec& s,
                                          const std::vector<std::string>& urls, const char* split,
                                          std::int64_t seq_len, const std::function<void(const std::string&)>& log);

/// Rows of examples, row-major [n, seq_len] each: tokens, loss mask (1 = the position is trained) and segment ids.
struct example_batch {
  std::vector<std::int32_t> tokens;
  std::vector<std::uint8_t> keep;
  std::vector<std::int32_t> segments;
};

/// A validation set: the windows of one dataset's validation split and the tags its losses are logged under.
struct validation_set {
  std::string name;  ///< dataset name ("" for a single source)
  std::vector<std::string> tags;
  std::shared_ptr<cache_windows> windows;
};

/// The data of a run.
class lm_data {
 public:
  struct options {
    std::int64_t seq_len = 0;
    std::int64_t batch_size = 0;  ///< for staged mixture weights (steps -> example offsets)
    haliax::random::key data_key;
    std::function<void(const std::string&)> log;  ///< progress lines
    /// train_lm's `epoch` (upstream EpochDataset): passes over a single dataset's training windows before the data
    /// ends; 0 for no end (each pass in the same order). A mixture ends by its stop_strategy instead.
    std::int64_t epochs = 0;
  };

  lm_data(const LmDataConfig& d, const options& o);

  const tokenizer& tok() const { return tok_; }
  const std::vector<dataset_spec>& specs() const { return specs_; }
  const std::vector<validation_set>& validation_sets() const { return valid_; }
  /// The training windows of dataset `i` of specs() (null when it has no train_urls).
  const std::shared_ptr<cache_windows>& train_windows(std::size_t i) const { return train_.at(i); }
  bool is_mixture() const { return mixture_.has_value(); }
  std::int64_t seq_len() const { return seq_len_; }

  /// Examples [first, first + n) as a row-major [n, seq_len] buffer.
  std::vector<std::int32_t> examples(std::int64_t first, std::int64_t n) const;
  /// Examples [first, first + n) with their loss masks and segment ids (cache_windows::example).
  example_batch batch(std::int64_t first, std::int64_t n, std::int64_t eos_id, std::int64_t ignore_id) const;

  /// Training windows of a single source (waits for its cache to finish).
  std::int64_t single_size() const { return train_.front()->final_size(); }

  /// Training examples before the data ends: `epochs` passes over a single source (waits for its cache to
  /// finish), or a mixture's length under first_exhausted / all_exhausted; none when the data never ends.
  std::optional<std::int64_t> train_length() const;

 private:
  // The dataset and example that training example i is.
  std::pair<const cache_windows*, std::int64_t> locate(std::int64_t i) const;

  tokenizer tok_;
  std::int64_t seq_len_;
  std::vector<dataset_spec> specs_;
  std::vector<std::shared_ptr<cache_windows>> train_;  // per spec (null: no train_urls)
  std::vector<validation_set> valid_;
  permutation_kind kind_ = permutation_kind::linear;
  shuffle_setting shuffle_ = shuffle_setting::none();
  bool shuffled_ = false;
  haliax::random::key single_key_;
  mutable std::once_flag single_once_;
  mutable std::int64_t single_n_ = 0;
  mutable std::optional<example_order> single_order_;
  std::int64_t epochs_ = 0;
  std::optional<mixture_index> mixture_;
  std::vector<std::optional<example_order>> orders_;
  std::vector<std::optional<example_order>> split_;  // num_validation_sequences: the order the split cut, per spec
};

}  // namespace levanter::data
