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
#include <haliax/random.hpp>
#include <levanter/data/cache.hpp>
#include <levanter/data/mixture.hpp>
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
  /// The roles of the input and output messages (upstream sft's `input_role` / `output_role`; the chat format's
  /// single_turn reads "user" and "assistant").
  std::string input_role = "user", output_role = "assistant";
  /// Upstream sft's chat rows (`preprocess_legacy_chat_template`): when the tokenizer does not end a text with its
  /// EOS itself, the EOS token's text is appended to the output before tokenizing (its id, for a tokenizer whose EOS
  /// has no text).
  bool append_eos = false;

  std::int64_t max_segments() const { return pack ? 64 : 1; }
};

/// A dataset's `format: {type: chat}` with `single_turn: false` (upstream ChatLmDatasetFormat, ChatProcessor and
/// MultiturnChatDataset): each record's messages are rendered with a chat template (`levanter/data/jinja.hpp`) as
/// `transformers`' `apply_chat_template(messages, tokenize=True, return_assistant_tokens_mask=True)` does, so a row
/// holds the ids of the rendered text (no BOS/EOS added beyond the template's own) and an assistant mask per token:
/// 1 for the tokens of the template's `{% generation %}` text (the token holding its first character through the
/// token holding its last). Rows are packed greedily as supervised rows are, at most 64 per example (1 without
/// `pack`), and a row longer than seq_len keeps its first seq_len tokens (upstream's "left"). With
/// `mask_user_turns`, position p is trained when token p + 1 is in the same row and under the assistant mask; without,
/// every position whose next token is in its row.
struct chat_format {
  std::string messages_field = "messages";
  std::optional<std::string> chat_template;  ///< the format's template; unset: data.chat_template or the tokenizer's
  bool pack = true;
  bool mask_user_turns = true;
  std::int64_t max_segments() const { return pack ? 64 : 1; }
};

/// The template a chat dataset renders with: the format's `chat_template`, else `data_template` (data.chat_template),
/// else the tokenizer's (tokenizer_config.json / chat_template.jinja). None is a data_error saying where to set one;
/// with `mask_user_turns` a template without a `{% generation %}` block is a data_error too (upstream refuses it:
/// nothing would be trained).
std::string chat_template_for(const tokenizer& tok, const chat_format& f, const std::optional<std::string>& data_template);

/// The encode function of multi-turn chat rows (upstream ChatProcessor). Its document is the JSON list of messages
/// that decode_document makes with source_options::chat; it returns [n, ids (n)..., masks (n)...], which the cache
/// stores as tokens and assistant masks. The template is rendered with `messages`, `tools` and `documents` (null),
/// `add_generation_prompt` false and the tokenizer's template_tokens(); the text is encoded without special tokens
/// added. A template error names the template line; a record with no assistant token is a data_error when
/// `require_assistant` (mask_user_turns: nothing of it would be trained).
encode_fn make_chat_encode_fn(tokenizer tok, const std::string& chat_template, bool require_assistant);

/// The preprocessor metadata of a chat cache (upstream ChatProcessor.metadata: tokenizer, vocab_size, chat_template,
/// messages_field; with tokenizer_hash and `format: chat`).
nlohmann::json chat_metadata(const tokenizer& tok, const std::string& chat_template, const std::string& messages_field);

/// How upstream's sft program makes examples of a supervised cache (`create_prompt_completion_iterator` and
/// `pack_prompt_completions` in main/sft.py and data/packing.py): the rows are read in the order of a Feistel
/// permutation made with the data key (PermutationDataset), `epochs` times over when positive (EpochDataset; 0 reads
/// them once); a row whose prompt has more than seq_len - 1 tokens is dropped, a longer row keeps its first
/// min(seq_len, max_seq_len) tokens and is dropped when no response token is left; rows are packed first-fit into the
/// oldest of at most `max_buffered` open examples, an example leaving when it holds `max_segments` rows or is the
/// oldest of `max_buffered`, and the rest in order at the end. A row's segment id is its position in that stream.
struct prompt_completion_options {
  std::int64_t seq_len = 0;
  std::int64_t max_seq_len = 0;  ///< the tokenizer's model_max_length (sft's max_seq_len): rows are cut to it
  std::int64_t epochs = 0;
  haliax::random::key key;
  std::int64_t max_segments = 4, max_buffered = 16;  ///< sft's values
  std::int32_t pad_id = 0;
  /// sft_mixture: the rows of several caches, stream position i being row perm_d(k) of cache d for (d, k) =
  /// mixture(i) (upstream MixtureDataset over PermutationDatasets made with the same key), endless; packing stops
  /// after `examples` examples.
  std::optional<mixture_index> mixture;
  std::int64_t examples = 0;
};

/// The encode function of supervised rows (upstream SupervisedProcessor). Its document is the JSON array
/// `[input, output]` that decode_record makes of a record with source_options::fields (or messages_field); it returns
/// [sources_len, ids...] (the cache stores sources_len apart from the ids). With `append_eos`, a tokenizer without
/// an EOS is a data_error.
encode_fn make_supervised_encode_fn(tokenizer tok, const supervised_format& f);

/// The preprocessor metadata of a supervised cache (upstream SupervisedProcessor.metadata: tokenizer, vocab_size,
/// input_field, output_field, separate_with; with tokenizer_hash and `format: supervised`, and the roles and
/// append_eos when they are not the defaults), so a cache of text rows or of other fields is refused under it.
nlohmann::json supervised_metadata(const tokenizer& tok, const supervised_format& f);

/// One row's part of a packed example: `n` tokens of row `row` of cache `source` from its token `skip` on, under
/// `segment`.
struct packed_piece {
  std::int64_t row = 0, skip = 0, n = 0;
  std::int32_t segment = 0;
  std::uint32_t source = 0;
  bool operator==(const packed_piece&) const = default;
};

/// The packed examples of finished supervised caches: upstream GreedyPrepackedDataset with slice_strategy "right"
/// (train_lm's supervised and chat data), or upstream sft's prompt-completion packing (prompt_completion_options).
/// Row lengths and sources_len are read once; an example reads its rows' tokens.
class packed_examples {
 public:
  /// Greedy packing in cache order. Waits for `cache` to finish. A cache without sources_len (text rows) is a
  /// data_error.
  packed_examples(std::shared_ptr<token_cache> cache, std::int64_t seq_len, std::int64_t max_segments);
  /// Upstream sft's packing of one cache's rows, or (o.mixture) sft_mixture's of several. Waits for the caches to
  /// finish; a cache without sources_len or without rows is a data_error.
  packed_examples(std::vector<std::shared_ptr<token_cache>> caches, const prompt_completion_options& o);
  packed_examples(std::shared_ptr<token_cache> cache, const prompt_completion_options& o)
      : packed_examples(std::vector<std::shared_ptr<token_cache>>{std::move(cache)}, o) {}
  /// `format: {type: text, pack: true}` (ours: no upstream release packs text): the documents (rows) of a finished
  /// text cache, greedily and whole in cache order, at most `max_segments` per example; a document longer than
  /// seq_len gives examples of seq_len of its tokens each, and its remainder is packed as a document. Segment ids
  /// are document indices; `example(k, false, ...)` trains every position whose next token is in its document.
  static packed_examples documents(std::shared_ptr<token_cache> cache, std::int64_t seq_len, std::int64_t max_segments);
  /// The rows of a finished chat cache (assistant masks), greedily in cache order, at most `max_segments` per
  /// example; a row longer than seq_len is an example of its first seq_len tokens. `example(k, true, ...)` trains the
  /// positions whose next token is an assistant token of the same row.
  static packed_examples chat(std::shared_ptr<token_cache> cache, std::int64_t seq_len, std::int64_t max_segments);

  std::int64_t size() const { return static_cast<std::int64_t>(first_.size()) - 1; }
  std::int64_t seq_len() const { return seq_len_; }
  /// The greedy packs' row ranges (empty for prompt-completion packing).
  const std::vector<doc_range>& packs() const { return packs_; }
  /// The pieces of example `k`, in order.
  std::span<const packed_piece> pieces(std::int64_t k) const;
  /// Rows the prompt-completion packing dropped (a prompt too long, or nothing of the response left).
  std::int64_t dropped_rows() const { return dropped_; }

  /// Example `k`: seq_len tokens (then the padding id: 0, or prompt_completion_options::pad_id), `keep` (the loss
  /// mask above; `mask_inputs` false trains every position whose next token is in its row) and segment ids (row
  /// index or stream position, -1 for padding).
  void example(std::int64_t k, bool mask_inputs, std::int32_t* tokens, std::uint8_t* keep, std::int32_t* segment) const;

 private:
  packed_examples() = default;
  struct rows {
    std::shared_ptr<token_cache> cache;
    std::vector<std::int64_t> ends;  // row ends in tokens (exclusive)
    std::vector<std::int32_t> sources;
    std::int64_t begin(std::int64_t row) const { return row ? ends[static_cast<std::size_t>(row - 1)] : 0; }
  };
  static rows read_cache(std::shared_ptr<token_cache> cache);

  std::vector<rows> src_;
  std::int64_t seq_len_ = 0;
  std::int32_t pad_id_ = 0;
  std::vector<doc_range> packs_;
  bool chat_ = false;  // rows of a chat cache: the loss mask comes from the assistant masks
  std::vector<packed_piece> pieces_;
  std::vector<std::int64_t> first_{0};  // example k is pieces_[first_[k], first_[k + 1])
  std::int64_t dropped_ = 0;
};

}  // namespace levanter::data
