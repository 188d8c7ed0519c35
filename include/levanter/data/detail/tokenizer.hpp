// levanter/data/detail/tokenizer.hpp: internals of the tokenizer (src/data/tokenizer.cpp) that the unit tests
// check directly: the code-point classes, the split-pattern scanners, the SHA-256 of tokenizer files and the
// per-thread word cache. Not part of the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace levanter::data::detail::tok {

enum : std::uint8_t { cls_other = 0, cls_letter = 1, cls_number = 2, cls_space = 3 };

/// Decodes the character at s[i] (i < n); returns it and sets `len`. An invalid byte is U+FFFD of length 1.
char32_t next_cp(const char* s, std::size_t n, std::size_t i, std::size_t& len);

/// The class of a code point: letter (\p{L}), number (\p{N}), white space (\s) or other (unicode_tables.hpp).
std::uint8_t cp_class(char32_t c);

/// SHA-256 of `data`, as 64 lower-case hex digits.
std::string sha256_hex(std::string_view data);

/// The split regexes with hand-written scanners.
enum class pattern_kind { gpt2, llama3, qwen2 };

/// End of the match of pattern `p` that starts at byte i of s[0, n) (every pattern matches every character, so
/// the result is > i for i < n).
std::size_t match_pattern(pattern_kind p, const char* s, std::size_t n, std::size_t i);

/// The per-thread word cache: one tokenizer's pieces -> ids (cleared when another tokenizer uses the thread or when
/// it grows past its capacity, so memory stays bounded).
struct word_cache {
  std::uint64_t owner = 0;
  static constexpr std::size_t capacity = 1 << 17;  // words; the cache is emptied when full

  /// Ids of a cached word, or nullptr. Open addressing over flat arrays: no node per word, no pointer chasing.
  const std::int32_t* find(std::string_view word, std::size_t h, std::uint32_t& n) const;
  void insert(std::string_view word, std::size_t h, const std::int32_t* id, std::size_t n);
  void clear();
  std::size_t size() const { return count; }

 private:
  static constexpr std::uint32_t empty = 0xFFFFFFFFu;
  struct slot {
    std::size_t hash = 0;
    std::uint32_t key_off = 0, key_len = empty, ids_off = 0, ids_len = 0;
  };
  std::vector<slot> slots;
  std::string keys;
  std::vector<std::int32_t> ids;
  std::size_t count = 0;

  void grow();
};

}  // namespace levanter::data::detail::tok
