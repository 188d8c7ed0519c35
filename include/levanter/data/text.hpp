// levanter/data/text.hpp: the embedded default's byte-level tokenizer and upstream's `TokenSeqDataset` layout over
// a token stream already in memory: the stream cut into non-overlapping windows of `seq_len` tokens, the tail that
// does not fill a window dropped. Documents come from data/sources.hpp, token caches from data/cache.hpp.
//
// Window `i` is a pure function of (tokens, seq_len, key, i), so a resumed run needs no replay.
#pragma once

#include <algorithm>
#include <cstdint>
#include <haliax/axis.hpp>
#include <string>
#include <vector>

namespace haliax::random {
struct key;
}  // namespace haliax::random

namespace levanter::data {

/// The axis of examples (windows) when permuting their order.
inline constexpr struct Examples final : haliax::axis<"examples"> {
} Examples;

/// The byte-level tokenizer of the embedded default: ids 0–255 are the UTF-8 bytes, 256 is EOS. Needs no files.
/// (`tokenizer::byte_level()` in data/tokenizer.hpp is the same tokenizer behind the general interface.)
struct byte_tokenizer {
  static constexpr std::int32_t eos_id = 256;
  static constexpr std::int64_t vocab_size = 257;
  static constexpr const char* name = "byte";
  std::vector<std::int32_t> encode(const std::string& text) const {
    std::vector<std::int32_t> ids(text.size());
    std::transform(text.begin(), text.end(), ids.begin(),
                   [](char c) { return static_cast<std::int32_t>(static_cast<unsigned char>(c)); });
    return ids;
  }
  std::string decode(const std::vector<std::int32_t>& ids) const {
    std::string s;
    for (auto t : ids)
      if (t >= 0 && t < 256) s.push_back(static_cast<char>(t));
    return s;
  }
};

/// Non-overlapping windows of `seq_len` tokens over a token stream (upstream TokenSeqDataset), with an optional
/// fixed permutation of the window order (`shuffle: true`, keyed by the data key).
class token_windows {
 public:
  token_windows(std::vector<std::int32_t> tokens, std::int64_t seq_len);
  std::int64_t size() const { return count_; }
  std::int64_t seq_len() const { return seq_len_; }
  std::int64_t num_tokens() const { return static_cast<std::int64_t>(tokens_.size()); }

  /// Permutes the window order with `key` (a jax.random.permutation-equal permutation).
  void shuffle(haliax::random::key key);

  /// Copies window `i mod size()` into `out` (seq_len tokens).
  void window(std::int64_t i, std::int32_t* out) const;

  /// Examples [first, first + n) as a row-major [n, seq_len] buffer.
  std::vector<std::int32_t> examples(std::int64_t first, std::int64_t n) const;

 private:
  std::vector<std::int32_t> tokens_;
  std::int64_t seq_len_;
  std::int64_t count_ = 0;
  std::vector<std::int64_t> order_;
};

}  // namespace levanter::data
