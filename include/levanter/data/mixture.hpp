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
// * `stop_strategy` (upstream's StopStrategy): `restart` (the default) makes the mixture endless. `first_exhausted`
//   ends it at the example after the one where any dataset yields its last example; `all_exhausted` at the example
//   after the last dataset does (datasets that ran out meanwhile wrap, as with restart). Where a dataset yields its
//   L-th example is found from its block counts and that one block's permutation. A dataset that stops being drawn
//   before its end (weight 0 in the last stage) never runs out: first_exhausted ignores it, and all_exhausted is
//   then endless, as upstream. Within a block a dataset's examples come in shuffled order, so in the block where it
//   runs out a draw or two may name an index past its end: those wrap, as with restart (upstream would read past
//   the dataset's end there).
// * Staged weights `[[step, {name: w}], ...]` start at example offset step·batch_size (BatchSchedule with a
//   constant batch size); the first stage must start at 0 and every start must be a multiple of block_size and
//   larger than the previous one (upstream asserts this).
#pragma once

#include <cstddef>
#include <cstdint>
#include <haliax/random.hpp>
#include <levanter/data/error.hpp>
#include <memory>
#include <optional>
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
std::vector<mixture_stage> mixture_stages_from_steps(std::vector<mixture_stage> stages, std::int64_t batch_size,
                                                     std::int64_t block_size);

/// upstream StopStrategy: what a mixture does when a dataset runs out.
enum class stop_strategy { restart, first_exhausted, all_exhausted };

/// "restart", "first_exhausted" or "all_exhausted"; data_error naming data.stop_strategy otherwise.
stop_strategy parse_stop_strategy(const std::string& name);
const char* to_string(stop_strategy s);

/// The mixture of `names.size()` datasets as upstream's MixtureDataset with randomize_blocks true: a pure function
/// of (names, stages, block_size, key, lengths, stop strategy, index). Thread-safe.
class mixture_index {
 public:
  /// names: every configured dataset, in config order (`data.configs`); stages: weights with starts in example
  /// offsets (see mixture_stages_from_steps); key: MixtureDataset's key (mix_key); lengths: examples in each
  /// dataset (same order as names; only those with a nonzero weight somewhere must be positive).
  /// Throws data_error for: no stages, weights naming an unknown dataset, negative, non-finite or all-zero
  /// weights, a block size outside [1, 65535], unsorted or unaligned stage starts, an empty dataset in use.
  mixture_index(std::vector<std::string> names, std::vector<mixture_stage> stages, std::int64_t block_size,
                haliax::random::key key, std::vector<std::int64_t> lengths,
                stop_strategy stop = stop_strategy::restart);

  /// (dataset, index within it) of global example `global_index` >= 0; dataset is a position in `names`. A finite
  /// mixture throws data_error for an index at or past length().
  std::pair<std::size_t, std::int64_t> operator()(std::int64_t global_index) const;

  /// Examples in the mixture: none (endless) with restart, or where first_exhausted / all_exhausted end it
  /// (upstream MixtureDataset.async_len).
  std::optional<std::int64_t> length() const { return length_; }

  /// The global index at which dataset `position` (of `names`) yields its `count`-th example (count >= 1), or
  /// none if it never does (upstream _first_exhaustion_index_for_dataset). Throws std::invalid_argument for a
  /// dataset not in use or count < 1.
  std::optional<std::int64_t> exhaustion_index(std::size_t position, std::int64_t count) const;

  stop_strategy stop() const { return stop_; }

  /// The examples [start, start + count) at once (one block permutation per block touched).
  std::vector<std::pair<std::size_t, std::int64_t>> batch(std::int64_t start, std::int64_t count) const;

  /// Examples of each configured dataset (positions in `names`) in every block of the stage holding `block`.
  std::vector<std::int64_t> block_counts(std::int64_t block) const;

  /// The shuffled ids (dataset_id << 16) + k of block `block`, dataset_id counting datasets in use (upstream's
  /// MixtureDataset._get_block).
  std::shared_ptr<const std::vector<std::int32_t>> block_ids(std::int64_t block) const;

  /// Positions in `names` of the datasets taking part (upstream's dataset ids, in order).
  const std::vector<std::size_t>& datasets_in_use() const { return used_; }
  const std::vector<std::string>& names() const { return names_; }
  std::int64_t block_size() const { return block_size_; }
  /// Upstream's warnings: datasets with a positive weight but no example per block.
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  static constexpr std::size_t cache_capacity = 32;
  struct block_cache;  // an LRU of shuffled blocks, shared by copies

  std::size_t stage_of_block(std::int64_t block) const;

  std::pair<std::size_t, std::int64_t> resolve(std::int32_t id, std::int64_t block) const;

  std::size_t position(const std::string& name) const;
  std::string joined() const;
  static std::string format(double w);

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
  std::shared_ptr<block_cache> cache_;
  stop_strategy stop_ = stop_strategy::restart;
  std::optional<std::int64_t> length_;
};

/// The keys LMMixtureDatasetConfig.train_set derives from the data key (train_lm: the first of
/// split(PRNGKey(trainer.seed), 4), or PRNGKey(data_seed)): mix_key, shuffle_key = split(data_key); the i-th
/// dataset in use (config order, nonzero weight somewhere) is shuffled with the i-th key of
/// levanter.utils.jax_utils.key_iterator(shuffle_key) (key, sub = split(key); yield sub).
struct mixture_keys {
  haliax::random::key mix;
  std::vector<haliax::random::key> component;  // one per dataset in use
};

mixture_keys make_mixture_keys(haliax::random::key data_key, std::size_t datasets_in_use);

}  // namespace levanter::data
