// levanter/data/sources.hpp: where documents come from — upstream's URL lists (`train_urls`, `validation_urls`,
// `data/sharded_datasource.py`) for local files. A URL expands like upstream's `expand_glob`: brace expansion first
// (Python `braceexpand` semantics: `{1..128}`, `{001..128}`, `{a..e}`, `{a,b{c,d}}`, in the order written), then a
// glob per candidate (its matches sorted bytewise, as fsspec does). Formats by extension, each optionally `.gz`
// (zlib) or `.zst`/`.zstd` (libzstd), always streamed:
//   * `.jsonl` and `.json`: one JSON object per line, the document is field `text_key` (blank lines skipped);
//   * `.txt`: one document per line, the line's newline kept (upstream `TextUrlDataSource` iterates the lines of
//     a text-mode file).
// A malformed line, a missing field or invalid UTF-8 stops the read (`bad_document_policy::stop`) or is skipped
// and counted (`skip`); every message names the file and line.
//
//   levanter::data::source_options src;               // text_key "text", stop on a bad line
//   auto files = levanter::data::expand_urls({"data/shard-{000..015}.jsonl.zst"});
//   auto stats = levanter::data::read_documents(files, src, [](std::string_view text) { ... });
//
// The decompression (zlib, libzstd) is in src/data/sources.cpp; levanter::levanter links both libraries.
#pragma once

#include <cstdint>
#include <functional>
#include <levanter/data/error.hpp>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace levanter::data {

/// What to do with a document that cannot be read (malformed JSON, missing text field, invalid UTF-8).
enum class bad_document_policy {
  stop,  ///< throw data_error naming file and line (the default)
  skip,  ///< leave it out and count it (the count is reported by the reader / the cache)
};

/// How documents are read from the files.
struct source_options {
  std::string text_key = "text";  ///< JSON field holding the text (upstream `text_key`)
  /// Supervised records (format: supervised): the string fields read from each JSON record, in order (input,
  /// output); the document is then the JSON array of their values. Empty for text documents (`text_key`).
  std::vector<std::string> fields;
  /// Single-turn chat records (format: chat with single_turn): the field holding the OpenAI-style messages; the
  /// document is then the JSON array [first user message's content, first assistant message's content].
  std::string messages_field;
  /// The roles whose first messages are the input and the output (upstream sft's input_role / output_role).
  std::string input_role = "user", output_role = "assistant";
  /// Multi-turn chat records (format: chat): the document is the JSON list in `messages_field` (a list of objects,
  /// each with a string `role`), which the encode function renders with a chat template.
  bool chat = false;
  /// Whether records are read as (input, output) pairs (`fields` or `messages_field`): supervised rows.
  bool pairs() const { return !chat && (!fields.empty() || !messages_field.empty()); }
  bad_document_policy on_bad_document = bad_document_policy::stop;
};

/// Parses "stop" / "skip" (a config value) into the policy; anything else is a data_error.
bad_document_policy parse_bad_document_policy(const std::string& s);

// ---- URL expansion --------------------------------------------------------------------------------------------

/// Brace expansion of one pattern with Python `braceexpand` semantics, in the order written:
/// `a{1..3}` → a1 a2 a3; `f{001..003}` → f001 f002 f003; `{a,b{x,y}}` → a bx by; `{a}` and `{}` stay literal;
/// `\{` escapes a brace. Unbalanced braces are a data_error.
std::vector<std::string> brace_expand(const std::string& pattern);

/// True for URLs this build cannot read (`gs://`, `s3://`, `http(s)://`, `hf://`, any `scheme://` but `file://`).
bool is_remote_url(const std::string& url);

/// Expands a URL list into local files: remote schemes are refused, `file://` is stripped, braces expand in order,
/// globs (`*`, `?`, `[...]`) expand to their regular files sorted bytewise. A pattern that matches nothing, a
/// missing file or a file listed twice (upstream: "Duplicate shard name") is a data_error naming it.
std::vector<std::string> expand_urls(const std::vector<std::string>& urls);

/// Upstream's shard names (`_mk_shard_name_mapping`): the path without the files' common prefix (the directory
/// for a single file), '.' replaced by '_'. Stable when the data directory moves.
std::vector<std::string> shard_names(const std::vector<std::string>& files);

// ---- streaming decompression ----------------------------------------------------------------------------------

/// A stream of bytes from a file, decompressed on the fly. `read` returns 0 at the end.
class byte_stream {
 public:
  virtual ~byte_stream() = default;
  virtual std::size_t read(char* out, std::size_t n) = 0;
};

/// The data formats (after the compression suffix is removed).
enum class file_format { jsonl, txt };

/// The format of a data file from its name: `.jsonl`/`.json`/`.txt`, optionally followed by `.gz`, `.zst` or
/// `.zstd`. Anything else is a data_error naming the file and the supported formats.
file_format format_of(const std::string& path, std::string* compression = nullptr);

/// Opens `path` as a decompressed byte stream (by its suffix: `.gz`, `.zst`/`.zstd`, or plain).
std::unique_ptr<byte_stream> open_byte_stream(const std::string& path);

// ---- records ------------------------------------------------------------------------------------------------

/// One line of a data file, undecoded: its bytes (newline removed), 1-based line number and decompressed byte
/// offset of its start.
struct record {
  std::string bytes;
  std::int64_t line = 0;
  std::int64_t offset = 0;
  bool had_newline = true;  ///< false for a last line that ends without a newline
};

/// Reads the records of one data file in order, streaming (memory: one buffer and the current line). For jsonl,
/// blank lines are not records; for txt every line is.
class record_reader {
 public:
  explicit record_reader(const std::string& path);
  const std::string& path() const { return path_; }
  file_format format() const { return format_; }

  /// The next record, or false at the end of the file.
  bool next(record& r);

 private:
  bool next_line(std::string& line, bool& had_newline);

  std::string path_;
  file_format format_;
  std::unique_ptr<byte_stream> in_;
  std::vector<char> buf_;
  std::size_t pos_ = 0, end_ = 0;
  std::int64_t line_ = 0, offset_ = 0;
  bool seen_record_ = false;
};

/// The byte index of the first invalid UTF-8 sequence in `s` (overlongs, surrogates and code points above
/// U+10FFFF are invalid), or npos when it is valid.
std::size_t find_invalid_utf8(std::string_view s);

/// The text of a record: for txt the line with its newline ("\r\n" read as "\n", as Python's text mode does;
/// none for a last line without one), for jsonl field `text_key` of the object. Returns an empty
/// string on success, else the message of what is wrong (naming file, line and, for UTF-8, the byte offset).
std::string decode_record(const std::string& path, file_format fmt, const record& r, const std::string& text_key,
                          std::string& text);
/// The document of a record under `src`: decode_record with its text_key; with `src.fields` the JSON array of those
/// string fields; with `src.messages_field` the JSON array of the first user and the first assistant message's
/// contents (a .txt file, or a record lacking what is read, is an error message naming the file, line and field).
std::string decode_document(const std::string& path, file_format fmt, const record& r, const source_options& src,
                            std::string& text);

/// What a read produced.
struct read_stats {
  std::int64_t documents = 0;  ///< documents passed on
  std::int64_t skipped = 0;    ///< bad documents left out (policy `skip`)
};

/// Calls `f(text)` for every document of `files` in order (serially; the cache builder is the parallel path).
/// Bad documents follow `src.on_bad_document`; no document at all is a data_error.
read_stats read_documents(const std::vector<std::string>& files, const source_options& src,
                          const std::function<void(std::string_view)>& f);

}  // namespace levanter::data
