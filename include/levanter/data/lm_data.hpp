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
};

/// The datasets of the config, in config order (a mixture's `configs` keep the order they are written in).
std::vector<dataset_spec> dataset_specs(const LmDataConfig& d);

/// `data.train_weights`: `{name: w}` (one stage from step 0) or `[[step, {name: w}], ...]`; starts in steps.
std::vector<mixture_stage> weight_stages(const LmDataConfig& d, const std::vector<dataset_spec>& specs);

/// Examples of one dataset: windows of seq_len tokens over its cache, or chosen windows of another's (a
/// validation set split off a training set).
class cache_windows {
 public:
  cache_windows(std::shared_ptr<token_cache> c, std::int64_t seq_len) : cache_(std::move(c)), seq_len_(seq_len) {}
  /// Windows index[0], index[1], ... of `base` (every one must exist in base's finished cache).
  cache_windows(const cache_windows& base, std::vector<std::int64_t> index)
      : cache_(base.cache_), seq_len_(base.seq_len_),
        index_(std::make_shared<const std::vector<std::int64_t>>(std::move(index))) {}
  std::int64_t seq_len() const { return seq_len_; }
  const token_cache& cache() const { return *cache_; }
  /// Windows in the finished cache (waits for the build to finish).
  std::int64_t final_size() const {
    return index_ ? static_cast<std::int64_t>(index_->size()) : cache_->total_tokens() / seq_len_;
  }
  /// Whether window `w` exists, waiting until it is built or the build ends without it.
  bool has(std::int64_t w) const {
    if (index_) return w >= 0 && w < final_size();
    return cache_->wait_for_tokens((w + 1) * seq_len_) >= (w + 1) * seq_len_;
  }
  void window(std::int64_t w, std::int32_t* out) const {
    const std::int64_t at = index_ ? (*index_)[static_cast<std::size_t>(w)] : w;
    cache_->read_tokens(at * seq_len_, seq_len_, out);
  }

 private:
  std::shared_ptr<token_cache> cache_;
  std::int64_t seq_len_;
  std::shared_ptr<const std::vector<std::int64_t>> index_;  // set: the windows of cache_ this view holds
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

  /// Training windows of a single source (waits for its cache to finish).
  std::int64_t single_size() const { return train_.front()->final_size(); }

  /// Training examples before the data ends: `epochs` passes over a single source (waits for its cache to
  /// finish), or a mixture's length under first_exhausted / all_exhausted; none when the data never ends.
  std::optional<std::int64_t> train_length() const;

 private:
  void example(std::int64_t i, std::int32_t* out) const;

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
