// levanter/data/cache.hpp: the tokenized data cache (upstream `store/cache.py`, `store/jagged_array.py`): documents
// are tokenized once, in background threads, into `<cache_dir>/<split>/`, and training reads the committed prefix
// while the build goes on. A killed build resumes where its last commit left it; a finished cache is reopened
// without reading the data again. The format (ours; upstream uses zarr3) is described in docs/data-cache.md:
//
//   <split>/shard_ledger.json       upstream's ledger fields + our own (commit point, written by rename)
//   <split>/input_ids/data.bin      int32 little-endian tokens of all rows, concatenated
//   <split>/input_ids/offsets.bin   int64 little-endian exclusive end (in tokens) of each row
//   <split>/sources_len/data.bin    supervised caches only: int32 little-endian sources_len of each row
//   <split>/assistant_masks/data.bin  chat caches only: one byte (0/1) per token, 1 inside `{% generation %}`
//
// A row is a document: the tokens `encode(text)` returned for it (BOS/EOS are the encode function's business; see
// make_encode_fn for upstream's rule).
// Output bytes depend only on the files, the encode function and the options recorded in the metadata, never on
// the thread count or on where a build was interrupted.
//
//   auto cache = levanter::data::open_or_build_cache("cache/train", files, src, encode, metadata, {});
//   cache->wait_for_tokens(seq_len * batch);  // training may start now
//   cache->read_tokens(0, seq_len, buf.data());
//
// nlohmann::json is only declared here (<nlohmann/json_fwd.hpp>); include <nlohmann/json.hpp> to build or read the
// metadata.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <levanter/data/sources.hpp>
#include <levanter/data/tokenizer.hpp>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace levanter::data {

/// How a cache is built (upstream `CacheOptions`); none of these changes the cache's bytes.
struct cache_options {
  int num_threads = 0;                      ///< tokenizing threads; 0 = std::thread::hardware_concurrency()
  std::int64_t docs_per_chunk = 1024;       ///< documents per work unit and commit (upstream `batch_size`)
  std::int64_t bytes_per_chunk = 32 << 20;  ///< a chunk also ends at this much raw input (`target_size_per_flush`)
  bool fsync = true;                        ///< sync data, offsets, ledger (and its directory) at each commit
  /// When another process is building the cache: wait for it to finish (then read what it built) instead of
  /// failing. One builder per cache, whatever the number of processes (e.g. the ranks of an mpirun job).
  bool wait_for_builder = true;
  std::function<void(const std::string&)> log;  ///< says when it waits
};

/// The function that turns a document into its row of tokens; called from several threads at once.
using encode_fn = std::function<std::vector<std::int32_t>(std::string_view)>;

/// Upstream `BatchTokenizer`'s preprocessor metadata for a tokenizer (`append_bos`/`append_eos` as make_encode_fn
/// decides them), plus `tokenizer_hash` and, for Hugging Face tokenizers, `bos_eos_as_text: true` (caches built
/// when the ids were appended instead lack it). A cache built with one metadata is refused under another, so every
/// program that opens caches must use this function.
nlohmann::json tokenizer_metadata(const tokenizer& tok, bool enforce_bos, bool enforce_eos);

/// The encode function of upstream `BatchTokenizer` (text data: `enforce_bos` true, `enforce_eos` from
/// `data.enforce_eos`). A token the tokenizer lacks is not enforced; BOS / EOS are added when the probe
/// `tok.encode("hi there")` (template applied) does not already start / end with them. For a Hugging Face tokenizer
/// they are added as text, as upstream does: `bos_token + " " + text + " " + eos_token` is encoded (special tokens
/// are split out first), so with a GPT-2 byte-level BPE a document becomes [BOS] + encode(" " + text + " ") + [EOS].
/// When the normalizer is `Replace` or a `Sequence` (tokenizer::splits_long_texts), a text longer than
/// `long_text_chars` characters (code points; upstream's 10,000) is encoded in pieces, each cut at the first white
/// space at or after that many characters, and the ids concatenated (each piece gets the template's tokens).
/// The built-ins keep their ids: "byte" appends its EOS id 256, "passthrough" has no BOS/EOS.
encode_fn make_encode_fn(tokenizer tok, bool enforce_bos, bool enforce_eos, std::size_t long_text_chars = 10000);

/// A tokenized cache being built or already finished. Reads are thread-safe and see only committed rows (the
/// counts are published with release/acquire after the bytes are written). Destroying it stops an unfinished build
/// at its last commit (the next open resumes).
class token_cache {
 public:
  token_cache(const token_cache&) = delete;
  token_cache& operator=(const token_cache&) = delete;
  ~token_cache();

  /// Tokens of all committed rows.
  std::int64_t committed_tokens() const;
  /// Committed rows (documents).
  std::int64_t committed_docs() const;
  /// UTF-8 bytes of the committed documents' text (for bits per byte).
  std::int64_t doc_bytes() const;
  /// Bytes of input lines (decompressed) consumed by the committed chunks: progress against the files' sizes.
  std::int64_t input_bytes() const;
  /// Bad documents left out so far (policy `skip`).
  std::int64_t skipped_documents() const;
  /// True once every document is committed and the ledger says `is_finished`.
  bool finished() const;
  /// The directory of this cache (`<cache_dir>/<split>`).
  const std::string& dir() const;

  /// Blocks until at least `n` tokens are committed or the build finished; returns the committed count. A failed
  /// build rethrows its error (a data_error naming file and line, or the encode function's exception).
  std::int64_t wait_for_tokens(std::int64_t n) const;
  /// Blocks until the build finished; returns the total token count (rethrows a build failure).
  std::int64_t total_tokens() const;
  /// Copies tokens [start, start + count) into `out`; they must be committed already (else std::out_of_range).
  void read_tokens(std::int64_t start, std::int64_t count, std::int32_t* out) const;
  /// Token range [begin, end) of committed row `row`.
  std::pair<std::int64_t, std::int64_t> row_range(std::int64_t row) const;
  /// The exclusive token ends of all committed rows.
  std::vector<std::int64_t> row_ends() const;
  /// Whether rows are supervised (source_options::fields): each has a sources_len besides its tokens.
  bool has_sources_len() const;
  /// sources_len of all committed rows (supervised caches only, else data_error).
  std::vector<std::int32_t> sources_lens() const;
  /// Whether rows are multi-turn chat (source_options::chat): each token has an assistant mask (1 = the template's
  /// `{% generation %}` text).
  bool has_assistant_masks() const;
  /// Copies the assistant masks of committed tokens [start, start + count) into `out` (chat caches only).
  void read_masks(std::int64_t start, std::int64_t count, std::uint8_t* out) const;

  // Opens or builds; use open_or_build_cache.
  token_cache(std::string dir, std::vector<std::string> files, source_options src, encode_fn encode,
              const nlohmann::json& metadata, cache_options opts);

 private:
  struct state;
  std::unique_ptr<state> s_;
};

/// Opens the cache at `split_dir` (`<cache_dir>/<split>`), or builds it from `files` (already expanded, see
/// expand_urls) in the background, resuming a killed build. Returns at once; reads see the committed prefix.
/// `preprocessor_metadata` (tokenizer name and content hash, vocab_size, append_bos, append_eos, ...; `text_key`
/// is added) must equal the ledger's of an existing cache, else data_error naming both values. With `files` empty
/// only a finished cache can be opened.
std::shared_ptr<token_cache> open_or_build_cache(const std::string& split_dir, const std::vector<std::string>& files,
                                                 const source_options& src, encode_fn encode,
                                                 const nlohmann::json& preprocessor_metadata,
                                                 const cache_options& opts = {});

}  // namespace levanter::data
