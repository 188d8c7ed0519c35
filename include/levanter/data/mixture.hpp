// levanter/data/mixture.hpp: upstream Levanter's block-deterministic dataset mixture (`MixtureDataset`,
// `data/mixture.py`) as a pure index function, equal to it bit for bit: global example index → (dataset, index
// within that dataset).
//
//   namespace ld = levanter::data;
//   auto stages = ld::mixture_stages_from_steps({{0, {{"web", 0.7}, {"code", 0.3}}}}, /*batch_size=*/32, 2048);
//   ld::mixture_index mix({"web", "code"}, stages, 2048, mix_key, {n_web, n_code});
//   auto [dataset, index] = mix(global_index);   // dataset is a position in the names given
//
// How upstream mixes (and so this file):
// * Weights of each stage are divided by their sum (summed in the order given); zero weights are dropped, and a
//   dataset with zero weight in every stage takes no part (dataset ids count only the others, in config order).
// * Every block of `block_size` consecutive examples holds the same number of examples of each dataset:
//   trunc(w·B) each, and what is left (B − Σ) goes to the dataset with the largest count (the first on ties).
// * Within block b the ids (dataset_id << 16) + k, laid out dataset after dataset, are shuffled with
//   jax.random.permutation(fold_in(mix_key, b), ids) — mix_key is the first half of split(data_key).
// * An id (d, k) in block b of stage s is example k + Σ_{earlier stages} counts·blocks + (b − first block of s)·
//   count_s(d) of dataset d; with `stop_strategy: restart` finite datasets wrap: that index modulo the length.
// * Staged weights `[[step, {name: w}], ...]` start at example offset step·batch_size (BatchSchedule with a
//   constant batch size); the first stage must start at 0 and every start must be a multiple of block_size and
//   larger than the previous one (upstream asserts this).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <haliax/random.hpp>
#include <levanter/data/text.hpp>
#include <list>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace levanter::data {

/// One stage of a mixture: from example offset `start` on, sample with these weights (name, weight), in the
/// order they are written in the config (the order of the sum that normalises them).
struct mixture_stage {
  std::int64_t start = 0;
  std::vector<std::pair<std::string, double>> weights;
};

/// upstream `rescale_mixture_schedule_for_batch_schedule` for a constant batch size: stage starts given in
/// training steps become example offsets step·batch_size. `stages[i].start` holds the step. Validates what
/// MixtureDataset asserts (first stage at step 0, offsets increasing and multiples of block_size) and throws
/// data_error naming `data.train_weights[i]` otherwise.
inline std::vector<mixture_stage> mixture_stages_from_steps(std::vector<mixture_stage> stages, std::int64_t batch_size,
                                                            std::int64_t block_size) {
  if (batch_size <= 0) throw data_error("mixture: batch size must be positive, got " + std::to_string(batch_size));
  std::int64_t previous_step = 0;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const std::int64_t step = stages[i].start;
    const std::string where = "data.train_weights[" + std::to_string(i) + "]";
    if (step < 0)
      throw data_error(where + ": step " + std::to_string(step) +
                       " is negative; stages start at a training step >= 0 (the first at 0)");
    if (i == 0 && step != 0)
      throw data_error(where + ": the first stage must start at step 0, not " + std::to_string(step));
    const std::int64_t offset = step * batch_size;
    if (i > 0) {
      if (step <= previous_step)
        throw data_error(where + ": stages must be sorted by step; step " + std::to_string(step) +
                         " does not come after step " + std::to_string(previous_step));
      if (block_size > 0 && offset % block_size != 0)
        throw data_error(where + ": stage starts at step " + std::to_string(step) + ", i.e. example " +
                         std::to_string(offset) + " (step x batch size " + std::to_string(batch_size) +
                         "), which is not a multiple of data.mixture_block_size = " + std::to_string(block_size) +
                         "; pick a step that is a multiple of " +
                         std::to_string(block_size / std::gcd(block_size, batch_size)) +
                         " or change mixture_block_size");
    }
    stages[i].start = offset;
    previous_step = step;
  }
  return stages;
}

/// The mixture of `names.size()` datasets as upstream's MixtureDataset with stop_strategy "restart" and
/// randomize_blocks true: a pure function of (names, stages, block_size, key, lengths, index). Thread-safe.
class mixture_index {
 public:
  /// names: every configured dataset, in config order (`data.configs`); stages: weights with starts in example
  /// offsets (see mixture_stages_from_steps); key: MixtureDataset's key (mix_key); lengths: examples in each
  /// dataset (same order as names; only those with a nonzero weight somewhere must be positive).
  /// Throws data_error for: no stages, weights naming an unknown dataset, negative, non-finite or all-zero
  /// weights, a block size outside [1, 65535], unsorted or unaligned stage starts, an empty dataset in use.
  mixture_index(std::vector<std::string> names, std::vector<mixture_stage> stages, std::int64_t block_size,
                haliax::random::key key, std::vector<std::int64_t> lengths)
      : names_(std::move(names)), block_size_(block_size), key_(key), lengths_(std::move(lengths)) {
    if (names_.empty()) throw data_error("mixture: data.configs is empty; give at least one dataset");
    if (lengths_.size() != names_.size())
      throw std::invalid_argument("levanter::data::mixture_index: " + std::to_string(names_.size()) + " names but " +
                                  std::to_string(lengths_.size()) + " lengths");
    if (stages.empty()) throw data_error("data.train_weights: no weights given; give {name: weight, ...}");
    if (block_size_ <= 0 || block_size_ >= (1 << 16))
      throw data_error("data.mixture_block_size: must be in [1, 65535] (ids pack the index in 16 bits), got " +
                       std::to_string(block_size_));
    const std::size_t n = names_.size();

    // Normalise each stage's weights (upstream _normalize_weights) after checking the names.
    std::vector<std::vector<double>> stage_w;  // per stage, per configured dataset
    for (std::size_t s = 0; s < stages.size(); ++s) {
      const std::string where =
          stages.size() == 1 ? std::string("data.train_weights") : "data.train_weights[" + std::to_string(s) + "]";
      if (s == 0 && stages[s].start != 0)
        throw data_error(where + ": the first stage must start at example 0, not " + std::to_string(stages[s].start));
      if (s > 0 && stages[s].start % block_size_ != 0)
        throw data_error(where + ": stage start " + std::to_string(stages[s].start) +
                         " is not a multiple of data.mixture_block_size = " + std::to_string(block_size_));
      if (s > 0 && stages[s].start <= stages[s - 1].start)
        throw data_error(where + ": stages must be sorted; start " + std::to_string(stages[s].start) +
                         " does not come after " + std::to_string(stages[s - 1].start));
      double total = 0;
      for (const auto& [name, w] : stages[s].weights) {
        if (std::find(names_.begin(), names_.end(), name) == names_.end())
          throw data_error(where + "." + name + ": no dataset '" + name + "' in data.configs (known: " + joined() +
                           ")");
        if (!std::isfinite(w)) throw data_error(where + "." + name + ": weight must be a finite number");
        if (w < 0)
          throw data_error(where + "." + name + ": weight " + format(w) + " is negative; weights must be >= 0");
        total += w;
      }
      if (total == 0) throw data_error(where + ": the weights sum to 0; give at least one dataset a positive weight");
      std::vector<double> w(n, 0.0);
      for (const auto& [name, wt] : stages[s].weights)
        if (wt > 0) w[position(name)] = wt / total;
      stage_w.push_back(std::move(w));
      starts_.push_back(stages[s].start);
    }

    // Datasets in use: a positive weight in some stage, in config order.
    for (std::size_t i = 0; i < n; ++i) {
      bool any = false;
      for (const auto& w : stage_w) any = any || w[i] > 0;
      if (!any) continue;
      if (lengths_[i] <= 0)
        throw data_error("data.configs." + names_[i] + ": the dataset has no examples (length " +
                         std::to_string(lengths_[i]) + ") but a positive weight in data.train_weights");
      used_.push_back(i);
    }

    // Per-block counts per stage, and the cumulative counts at each stage's end (upstream
    // _initialize_stage_counts).
    const std::size_t u = used_.size();
    std::vector<std::int64_t> cumulative(u, 0);
    for (std::size_t s = 0; s < stage_w.size(); ++s) {
      std::vector<std::int64_t> c(u, 0);
      std::int64_t sum = 0;
      for (std::size_t d = 0; d < u; ++d) {
        c[d] = static_cast<std::int64_t>(stage_w[s][used_[d]] * static_cast<double>(block_size_));
        sum += c[d];
      }
      const std::size_t largest = static_cast<std::size_t>(std::max_element(c.begin(), c.end()) - c.begin());
      c[largest] += block_size_ - sum;
      for (std::size_t d = 0; d < u; ++d)
        if (c[d] == 0 && stage_w[s][used_[d]] > 0)
          warnings_.push_back("mixture: dataset '" + names_[used_[d]] + "' has 0 examples per block of " +
                              std::to_string(block_size_) + " in stage " + std::to_string(s) + " (weight " +
                              format(stage_w[s][used_[d]]) + "); increase data.mixture_block_size");
      if (s + 1 < stage_w.size()) {
        const std::int64_t blocks = (stages[s + 1].start - stages[s].start) / block_size_;
        for (std::size_t d = 0; d < u; ++d) cumulative[d] += c[d] * blocks;
        after_stage_.push_back(cumulative);
      }
      std::vector<std::int32_t> ids;
      ids.reserve(static_cast<std::size_t>(block_size_));
      for (std::size_t d = 0; d < u; ++d)
        for (std::int64_t k = 0; k < c[d]; ++k) ids.push_back(static_cast<std::int32_t>((d << 16) + k));
      unpermuted_.push_back(std::move(ids));
      counts_.push_back(std::move(c));
    }
  }

  /// (dataset, index within it) of global example `global_index` >= 0; dataset is a position in `names`.
  std::pair<std::size_t, std::int64_t> operator()(std::int64_t global_index) const {
    if (global_index < 0)
      throw std::out_of_range("levanter::data::mixture_index: negative index " + std::to_string(global_index));
    const std::int64_t block = global_index / block_size_;
    const auto ids = block_ids(block);
    return resolve((*ids)[static_cast<std::size_t>(global_index % block_size_)], block);
  }

  /// The examples [start, start + count) at once (one block permutation per block touched).
  std::vector<std::pair<std::size_t, std::int64_t>> batch(std::int64_t start, std::int64_t count) const {
    std::vector<std::pair<std::size_t, std::int64_t>> out;
    out.reserve(static_cast<std::size_t>(std::max<std::int64_t>(count, 0)));
    for (std::int64_t i = start; i < start + count; ++i) out.push_back((*this)(i));
    return out;
  }

  /// Examples of each configured dataset (positions in `names`) in every block of the stage holding `block`.
  std::vector<std::int64_t> block_counts(std::int64_t block) const {
    std::vector<std::int64_t> out(names_.size(), 0);
    const auto& c = counts_[stage_of_block(block)];
    for (std::size_t d = 0; d < used_.size(); ++d) out[used_[d]] = c[d];
    return out;
  }

  /// The shuffled ids (dataset_id << 16) + k of block `block`, dataset_id counting datasets in use (upstream's
  /// MixtureDataset._get_block).
  std::shared_ptr<const std::vector<std::int32_t>> block_ids(std::int64_t block) const {
    {
      std::lock_guard<std::mutex> lock(cache_->mutex);
      for (auto it = cache_->entries.begin(); it != cache_->entries.end(); ++it)
        if (it->first == block) {
          cache_->entries.splice(cache_->entries.begin(), cache_->entries, it);
          return it->second;
        }
    }
    const auto& base = unpermuted_[stage_of_block(block)];
    namespace tf = haliax::detail::threefry;
    const auto mode =
        haliax::random::threefry_partitionable() ? tf::counter_mode::partitionable : tf::counter_mode::original;
    const auto k = haliax::random::fold_in(key_, static_cast<std::uint32_t>(block));
    const auto perm = haliax::detail::random_dists::permutation(k.data(), base.size(), mode);
    auto ids = std::make_shared<std::vector<std::int32_t>>(base.size());
    for (std::size_t i = 0; i < base.size(); ++i) (*ids)[i] = base[static_cast<std::size_t>(perm[i])];
    std::lock_guard<std::mutex> lock(cache_->mutex);
    cache_->entries.emplace_front(block, ids);
    if (cache_->entries.size() > cache_capacity) cache_->entries.pop_back();
    return ids;
  }

  /// Positions in `names` of the datasets taking part (upstream's dataset ids, in order).
  const std::vector<std::size_t>& datasets_in_use() const { return used_; }
  const std::vector<std::string>& names() const { return names_; }
  std::int64_t block_size() const { return block_size_; }
  /// Upstream's warnings: datasets with a positive weight but no example per block.
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  static constexpr std::size_t cache_capacity = 32;
  struct block_cache {
    std::mutex mutex;
    std::list<std::pair<std::int64_t, std::shared_ptr<const std::vector<std::int32_t>>>> entries;
  };

  std::size_t stage_of_block(std::int64_t block) const {
    const std::int64_t start = block * block_size_;
    const auto it = std::upper_bound(starts_.begin(), starts_.end(), start);
    return it == starts_.begin() ? 0 : static_cast<std::size_t>(it - starts_.begin() - 1);
  }

  std::pair<std::size_t, std::int64_t> resolve(std::int32_t id, std::int64_t block) const {
    const std::size_t s = stage_of_block(block);
    const auto d = static_cast<std::size_t>(id >> 16);
    const std::int64_t k = id & 0xffff;
    const std::int64_t base = s > 0 ? after_stage_[s - 1][d] : 0;
    const std::int64_t in_stage = (block * block_size_ - starts_[s]) / block_size_;
    const std::int64_t index = k + base + in_stage * counts_[s][d];
    return {used_[d], index % lengths_[used_[d]]};
  }

  std::size_t position(const std::string& name) const {
    return static_cast<std::size_t>(std::find(names_.begin(), names_.end(), name) - names_.begin());
  }
  std::string joined() const {
    std::string s;
    for (const auto& n : names_) s += (s.empty() ? "" : ", ") + n;
    return s;
  }
  static std::string format(double w) {
    std::string s = std::to_string(w);
    return s;
  }

  std::vector<std::string> names_;
  std::int64_t block_size_;
  haliax::random::key key_;
  std::vector<std::int64_t> lengths_;
  std::vector<std::int64_t> starts_;
  std::vector<std::size_t> used_;
  std::vector<std::vector<std::int64_t>> counts_;       // per stage, per dataset in use
  std::vector<std::vector<std::int64_t>> after_stage_;  // cumulative counts at the end of each stage but the last
  std::vector<std::vector<std::int32_t>> unpermuted_;   // per stage
  std::vector<std::string> warnings_;
  std::shared_ptr<block_cache> cache_ = std::make_shared<block_cache>();
};

/// The keys LMMixtureDatasetConfig.train_set derives from the data key (train_lm: the first of
/// split(PRNGKey(trainer.seed), 4), or PRNGKey(data_seed)): mix_key, shuffle_key = split(data_key); the i-th
/// dataset in use (config order, nonzero weight somewhere) is shuffled with the i-th key of
/// levanter.utils.jax_utils.key_iterator(shuffle_key) (key, sub = split(key); yield sub).
struct mixture_keys {
  haliax::random::key mix;
  std::vector<haliax::random::key> component;  // one per dataset in use
};

inline mixture_keys make_mixture_keys(haliax::random::key data_key, std::size_t datasets_in_use) {
  const auto [mix, shuffle] = haliax::random::split(data_key);
  mixture_keys out{mix, {}};
  auto k = shuffle;
  for (std::size_t i = 0; i < datasets_in_use; ++i) {
    const auto [next, sub] = haliax::random::split(k);
    out.component.push_back(sub);
    k = next;
  }
  return out;
}

}  // namespace levanter::data
