// levanter/data/text.hpp: the text data path of `train_lm` for local files: documents from `.jsonl` (a text
// field per line) or `.txt` (one document per file), the built-in byte-level tokenizer, and upstream's
// `TokenSeqDataset` layout — the documents' tokens concatenated (EOS after each) and cut into non-overlapping
// windows of `seq_len` tokens; the tail that does not fill a window is dropped.
//
// Batch `s` is a pure function of (data, seed, step): examples [s·B, (s+1)·B) of the (optionally permuted)
// window order, wrapping around at the end of the data, so a resumed run needs no replay.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <glob.h>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <haliax/random.hpp>
#include <levanter/data/error.hpp>

namespace levanter::data {

/// The axis of examples (windows) when permuting their order.
inline constexpr struct Examples final : haliax::axis<"examples"> {
} Examples;


/// The byte-level tokenizer of the embedded default: ids 0–255 are the UTF-8 bytes, 256 is EOS. Needs no files.
struct byte_tokenizer {
  static constexpr std::int32_t eos_id = 256;
  static constexpr std::int64_t vocab_size = 257;
  static constexpr const char* name = "byte";
  std::vector<std::int32_t> encode(const std::string& text) const {
    std::vector<std::int32_t> ids(text.size());
    std::transform(text.begin(), text.end(), ids.begin(), [](char c) { return static_cast<std::int32_t>(static_cast<unsigned char>(c)); });
    return ids;
  }
  std::string decode(const std::vector<std::int32_t>& ids) const {
    std::string s;
    for (auto t : ids)
      if (t >= 0 && t < 256) s.push_back(static_cast<char>(t));
    return s;
  }
};

/// Expands one `train_urls` entry: a local path or a glob. A pattern that matches nothing is an error.
inline std::vector<std::string> expand_url(const std::string& url) {
  const bool pattern = url.find_first_of("*?[") != std::string::npos;
  if (!pattern) {
    std::ifstream probe(url);
    if (!probe) throw data_error("data file '" + url + "' not found (paths are relative to the working directory)");
    return {url};
  }
  glob_t g{};
  std::vector<std::string> out;
  if (::glob(url.c_str(), 0, nullptr, &g) == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  if (out.empty()) throw data_error("data pattern '" + url + "' matches no file");
  std::sort(out.begin(), out.end());
  return out;
}


/// Calls `f(text)` for every document of a local file: `.jsonl`/`.json` (field `text_key` of each line) or `.txt`
/// (the whole file). A malformed line or a missing field stops with the file and line.
template <class F>
void for_each_document(const std::string& path, const std::string& text_key, F&& f) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw data_error("cannot open data file '" + path + "'");
  if (ends_with(path, ".txt")) {
    std::stringstream ss;
    ss << in.rdbuf();
    f(ss.str());
    return;
  }
  if (!ends_with(path, ".jsonl") && !ends_with(path, ".json"))
    throw data_error("data file '" + path +
                     "': unsupported format (use .jsonl or .txt here; compressed files arrive with the data pipeline)");
  std::string line;
  std::int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw data_error(path + ":" + std::to_string(lineno) + ": malformed JSON line (" + e.what() + ")");
    }
    auto it = j.find(text_key);
    if (it == j.end() || !it->is_string())
      throw data_error(path + ":" + std::to_string(lineno) + ": no string field '" + text_key +
                       "' (set data.text_key to the field holding the text)");
    f(it->get<std::string>());
  }
}

/// Tokens of the documents of `urls`, concatenated, EOS after each document (upstream `enforce_eos`).
template <class Tokenizer>
std::vector<std::int32_t> tokenize_files(const std::vector<std::string>& urls, const Tokenizer& tok,
                                         const std::string& text_key, bool enforce_eos) {
  std::vector<std::int32_t> out;
  std::int64_t docs = 0;
  for (const auto& u : urls)
    for (const auto& path : expand_url(u))
      for_each_document(path, text_key, [&](const std::string& text) {
        auto ids = tok.encode(text);
        out.insert(out.end(), ids.begin(), ids.end());
        if (enforce_eos) out.push_back(Tokenizer::eos_id);
        ++docs;
      });
  if (docs == 0) throw data_error("no documents in the data files given");
  return out;
}

/// Non-overlapping windows of `seq_len` tokens over a token stream (upstream TokenSeqDataset), with an optional
/// fixed permutation of the window order (`shuffle: true`, keyed by the data key).
class token_windows {
 public:
  token_windows(std::vector<std::int32_t> tokens, std::int64_t seq_len) : tokens_(std::move(tokens)), seq_len_(seq_len) {
    if (seq_len <= 0) throw std::invalid_argument("token_windows: seq_len must be positive");
    count_ = static_cast<std::int64_t>(tokens_.size()) / seq_len;
  }
  std::int64_t size() const { return count_; }
  std::int64_t seq_len() const { return seq_len_; }
  std::int64_t num_tokens() const { return static_cast<std::int64_t>(tokens_.size()); }

  /// Permutes the window order with `key` (a jax.random.permutation-equal permutation).
  void shuffle(haliax::random::key key) {
    auto p = haliax::random::permutation(key, count_ * Examples).to_host();
    order_.assign(p.begin(), p.end());
  }

  /// Copies window `i mod size()` into `out` (seq_len tokens).
  void window(std::int64_t i, std::int32_t* out) const {
    std::int64_t w = i % count_;
    if (!order_.empty()) w = order_[static_cast<std::size_t>(w)];
    std::copy_n(tokens_.data() + w * seq_len_, seq_len_, out);
  }

  /// Examples [first, first + n) as a row-major [n, seq_len] buffer.
  std::vector<std::int32_t> examples(std::int64_t first, std::int64_t n) const {
    std::vector<std::int32_t> out(static_cast<std::size_t>(n * seq_len_));
    for (std::int64_t r = 0; r < n; ++r) window(first + r, out.data() + r * seq_len_);
    return out;
  }

 private:
  std::vector<std::int32_t> tokens_;
  std::int64_t seq_len_;
  std::int64_t count_ = 0;
  std::vector<std::int64_t> order_;
};

}  // namespace levanter::data
