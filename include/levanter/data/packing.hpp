// levanter/data/packing.hpp: supervised examples and the packing of whole documents into fixed-length examples
// (upstream `data/packing.py` and `data/text.py`'s SupervisedProcessor / SupervisedDataset), and the per-row rule
// that turns tokens into a loss mask and segment ids (upstream `LmExample.causal`).
//
//   format: {type: supervised, input_field: prompt, output_field: response, separate_with: "\n", mask_inputs: true}
//
// A supervised record {prompt, response} becomes one row of the cache: the ids of `prompt + separate_with +
// response` (the tokenizer's template applied, as upstream's `tokenizer(...)`), and apart from them `sources_len`,
// the length of the ids of `prompt + separate_with` alone. Packing puts whole rows one after another into examples
// of seq_len tokens (greedy, in cache order, at most 64 rows per example with `pack: true`, 1 without), pads with id
// 0 and segment id -1, and keeps the last seq_len tokens of a longer row ("right", as upstream's SupervisedDataset).
// Segment ids are the rows' cache indices, so packed rows never attend to each other.
//
// The loss mask (ours; see docs/data.md): position i is trained when token i + 1 is in the same row and, with
// `mask_inputs`, is a response token (its index in the whole row is at least sources_len). The pinned upstream
// release trains position i when token i itself is a response token (one position late: the first response token is
// never predicted, and the last one predicts the next row or the padding); current upstream dropped this dataset.
//
//   auto packs = levanter::data::packed_examples(cache, 32, 64);
//   packs.example(k, true, tokens, keep, segments);   // one example of 32 tokens
#pragma once

#include <cstdint>
#include <levanter/data/cache.hpp>
#include <levanter/data/tokenizer.hpp>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace levanter::data {

/// The rows [begin, end) that make one packed example.
struct doc_range {
  std::int64_t begin = 0, end = 0;
  bool operator==(const doc_range&) const = default;
};

/// Upstream `pack_documents` for one field: greedy, in order, a pack ends before the document that would make it
/// longer than `max_length` tokens or hold more than `max_segments` documents. A document longer than
/// `max_length` is a pack of its own when `slice_too_long` (the reader keeps a slice of it), else a data_error
/// naming it. `max_segments` must be positive.
std::vector<doc_range> pack_documents(std::span<const std::int64_t> lengths, std::int64_t max_length,
                                      std::optional<std::int64_t> max_segments, bool slice_too_long);

/// Upstream `LmExample.causal` for one row of `n` tokens without given segment ids: `keep[p]` (position p is
/// trained) is true but at the last position and where token p + 1 is `ignore_id`; `segment[p]` counts the EOS
/// tokens before p (a new segment starts after each EOS, so documents in one window never attend to each other).
/// (Inline: the model library, linked after the data library, uses it too.)
inline void causal_labels(const std::int32_t* tokens, std::int64_t n, std::int64_t eos_id, std::int64_t ignore_id,
                          std::uint8_t* keep, std::int32_t* segment) {
  std::int32_t s = 0;
  for (std::int64_t p = 0; p < n; ++p) {
    if (p > 0 && tokens[p - 1] == eos_id) ++s;
    segment[p] = s;
    keep[p] = p + 1 < n && tokens[p + 1] != ignore_id;
  }
}

/// A dataset's `format: {type: supervised, ...}` (upstream SupervisedLmDatasetFormat).
struct supervised_format {
  std::string input_field = "prompt";
  std::string output_field = "response";
  std::optional<std::string> separate_with;  ///< appended to the input before both are tokenized
  bool pack = true;                          ///< up to 64 rows per example; false: one row per example
  bool mask_inputs = true;                   ///< train only on the response tokens
  /// Set for `format: {type: chat, single_turn: true}` (upstream SingleTurnChatProcessor): the records' messages
  /// field; the first user message is the input and the first assistant message the output.
  std::optional<std::string> messages_field;

  std::int64_t max_segments() const { return pack ? 64 : 1; }
};

/// The encode function of supervised rows (upstream SupervisedProcessor). Its document is the JSON array
/// `[input, output]` that decode_record makes of a record with source_options::fields; it returns
/// [sources_len, ids...] (the cache stores sources_len apart from the ids).
encode_fn make_supervised_encode_fn(tokenizer tok, const supervised_format& f);

/// The preprocessor metadata of a supervised cache (upstream SupervisedProcessor.metadata: tokenizer, vocab_size,
/// input_field, output_field, separate_with; with tokenizer_hash and `format: supervised`), so a cache of text
/// rows or of other fields is refused under it.
nlohmann::json supervised_metadata(const tokenizer& tok, const supervised_format& f);

/// The packed examples of a finished supervised cache (upstream GreedyPrepackedDataset with slice_strategy "right").
/// Row lengths and sources_len are read once; an example reads its rows' tokens.
class packed_examples {
 public:
  /// Waits for `cache` to finish. A cache without sources_len (text rows) is a data_error.
  packed_examples(std::shared_ptr<token_cache> cache, std::int64_t seq_len, std::int64_t max_segments);

  std::int64_t size() const { return static_cast<std::int64_t>(packs_.size()); }
  std::int64_t seq_len() const { return seq_len_; }
  const std::vector<doc_range>& packs() const { return packs_; }

  /// Example `k`: seq_len tokens (padding 0), `keep` (the loss mask above; `mask_inputs` false trains every
  /// position whose next token is in its row) and segment ids (row index, -1 for padding).
  void example(std::int64_t k, bool mask_inputs, std::int32_t* tokens, std::uint8_t* keep, std::int32_t* segment) const;

 private:
  std::shared_ptr<token_cache> cache_;
  std::int64_t seq_len_;
  std::vector<std::int64_t> ends_;  // row ends in tokens (exclusive)
  std::vector<std::int32_t> sources_;
  std::vector<doc_range> packs_;
};

}  // namespace levanter::data
