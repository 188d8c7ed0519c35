// levanter/data/tokenizer.hpp: Hugging Face `tokenizer.json` tokenizers (BPE models) in C++, giving the same ids as
// the Python `tokenizers` library (`Tokenizer.encode(text, add_special_tokens=...).ids` and `Tokenizer.decode`),
// plus upstream Levanter's two built-ins: the byte-level default and "passthrough" (text of integer ids).
//
// Supported (anything else is refused with a data_error naming the file, the key and the value):
//   model      BPE: vocab, merges ("a b" strings or [a, b] pairs), unk_token, fuse_unk, byte_fallback,
//              ignore_merges; continuing_subword_prefix / end_of_word_suffix null or "", dropout null.
//   normalizer null, Prepend, Replace (String pattern: one pass over non-overlapping matches; an empty pattern
//              matches at every character boundary, as the library's), Sequence of those.
//   pre_tok.   null, ByteLevel (GPT-2 regex or none; last step only), Metaspace, Split with a String pattern or
//              one of the known regexes (GPT-2, Llama 3, Qwen 2; hand-written scanners with the regex engine's
//              leftmost-alternative semantics), Sequence of those.
//   post_proc. null, ByteLevel, TemplateProcessing, RobertaProcessing, BertProcessing, Sequence of those.
//   decoder    null, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence of those.
//   added_tokens with special, lstrip, rstrip, single_word, normalized: as the library's AddedVocabulary, matched
//              leftmost-longest, the non-normalized ones in the raw text first, then the normalized ones in the
//              normalized text; empty ones are ignored, and a later entry with the same content replaces the
//              earlier one's flags. (Two tokens that match the same text, e.g. "A" and "a" under a lower-casing
//              normalizer, are matched as the lower id here; the library's choice varies from run to run.)
//
// Limits on hostile files (each refused with a data_error naming the file, the key and the value): JSON nested
// deeper than 512 levels, Sequences nested deeper than 64 or more than 1024 components in one pipeline, ids
// outside [0, 2^31-1] or more than 2^20 past the number of tokens, more than 4096 post-processor special tokens.
// A normalizer or decoder that grows a text past 64 times its length + 1 MiB (e.g. chained Replace "a" -> "aa")
// throws data_error from encode/decode.
//
// Unicode classes (\p{L}, \p{N}, \s) come from unicode_tables.hpp (data in src/data/unicode_tables.cpp): Unicode 16.0,
// the version of the library's regex engine (checked code point by code point). `single_word` added tokens approximate
// the regex `\w` by letters, numbers and '_'. Text that is not valid UTF-8 is accepted: each invalid byte is one
// "other" character.
//
// Speed: a BPE word is merged by rank with a binary heap (as the Rust library does); words are cached per thread
// (encode) or per worker in a pool that stays warm between calls (encode_batch); results never depend on either.
//
//   auto tok = levanter::data::tokenizer::from_file("tests/golden/tokenizers/gpt2_style");
//   auto ids = tok.encode("Hello world");            // == Tokenizer.encode("Hello world").ids
#pragma once

#include <cstdint>
#include <levanter/data/error.hpp>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace levanter::data {

namespace detail::tok {
struct impl;
}  // namespace detail::tok

/// A tokenizer: a Hugging Face `tokenizer.json` BPE model, the byte-level default, or "passthrough". Immutable and
/// cheap to copy (copies share state); `encode`/`decode` may be called from many threads at once.
///
///   auto tok = tokenizer::from_file("path/to/tokenizer.json");
///   std::vector<std::int32_t> ids = tok.encode("Hello world");  // Python: tok.encode("Hello world").ids
class tokenizer {
 public:
  /// Loads a tokenizer.json (or a directory holding one). Throws data_error naming the file and the unsupported
  /// key/value for anything this port does not implement.
  static tokenizer from_file(const std::string& path);

  /// Loads the text of a tokenizer.json held in memory; `name` stands for the file in messages and is name().
  /// BOS/EOS come from the well-known token names (there is no tokenizer_config.json beside it).
  static tokenizer from_json(std::string_view json, const std::string& name = "tokenizer.json (in memory)");

  /// The embedded default: ids 0..255 are the UTF-8 bytes, 256 is EOS ("byte"); vocab 257.
  static tokenizer byte_level();

  /// Upstream's "passthrough": the text is whitespace-separated integer ids in [0, vocab_size).
  static tokenizer passthrough(std::int64_t vocab_size);

  /// Token ids of `text`; equals Python `Tokenizer.encode(text, add_special_tokens=...).ids`.
  std::vector<std::int32_t> encode(std::string_view text, bool add_special_tokens = true) const;

  /// encode() of every text, on `num_threads` threads (<= 0: hardware concurrency); the same ids for any count.
  std::vector<std::vector<std::int32_t>> encode_batch(const std::vector<std::string>& texts, int num_threads,
                                                      bool add_special_tokens = true) const;

  /// Text of `ids`; equals Python `Tokenizer.decode(ids, skip_special_tokens=...)` (unknown ids are dropped).
  std::string decode(std::span<const std::int32_t> ids, bool skip_special_tokens = false) const;

  /// Number of distinct tokens, added tokens included (Python `get_vocab_size(with_added_tokens=True)`).
  std::int64_t vocab_size() const;
  std::optional<std::int32_t> bos_id() const;
  std::optional<std::int32_t> eos_id() const;
  /// Whether encode(text, true) adds the BOS / EOS (from the post-processor's template).
  bool adds_bos() const;
  bool adds_eos() const;
  /// The BOS / EOS token as text (Hugging Face's `bos_token` / `eos_token`), which encode() turns into its id;
  /// nullopt when there is none and for the built-ins (the byte-level EOS, id 256, has no text).
  std::optional<std::string> bos_token() const;
  std::optional<std::string> eos_token() const;
  /// Whether upstream's long-text workaround applies (tokenizers issue 1495): the tokenizer.json normalizer is a
  /// `Replace` or a `Sequence` (e.g. SentencePiece/Llama 2 style). See data/cache.hpp make_encode_fn.
  bool splits_long_texts() const;
  /// The chat template of the tokenizer's directory (`chat_template.jinja`, else tokenizer_config.json's
  /// `chat_template`: a string, or the entry named "default" of a list), as transformers reads it; nullopt if none.
  const std::optional<std::string>& chat_template() const;
  /// The special tokens transformers passes to a chat template (its `special_tokens_map`): `bos_token`,
  /// `eos_token` and the unk/sep/pad/cls/mask tokens tokenizer_config.json sets, as text.
  const std::vector<std::pair<std::string, std::string>>& template_tokens() const;
  /// The exclusive end (in bytes of `text`) of each token of `ids = encode(text, false)`: the tokens' bytes spell
  /// the text in order (an added token with lstrip/rstrip also covers the white space it took). Throws data_error
  /// when they do not, and for tokenizers whose tokens cannot spell a text byte by byte (a normalizer, a
  /// SentencePiece-style model without byte-level symbols, passthrough). Chat loss masks are computed from it.
  std::vector<std::int64_t> token_ends(std::span<const std::int32_t> ids, std::string_view text) const;
  /// True for the built-ins ("byte", "passthrough"), which no tokenizer file describes.
  bool is_builtin() const;
  /// The path given to from_file, "byte", or "passthrough".
  const std::string& name() const;
  /// SHA-256 (hex) of the tokenizer file's bytes (of a fixed description for the built-ins).
  std::string content_hash() const;

  /// Id of a token as written in the vocabulary (added tokens first), or nullopt.
  std::optional<std::int32_t> token_to_id(std::string_view token) const;

  /// Readable text of one token, as the decoder shows it inside a text (a SentencePiece "▁the" is " the", a
  /// GPT-2 "Ġthe" is " the"; a lone byte of a multi-byte character is U+FFFD); "" for unknown ids.
  std::string token_text(std::int32_t id) const;

  /// Bytes of UTF-8 text this token stands for (for bits-per-byte): special tokens 0, a byte-fallback or
  /// byte-level byte 1, otherwise the length of its text.
  std::int64_t token_byte_length(std::int32_t id) const;

 private:
  explicit tokenizer(std::shared_ptr<const detail::tok::impl> p);
  std::shared_ptr<const detail::tok::impl> p_;
};

}  // namespace levanter::data
