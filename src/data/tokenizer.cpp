// data/tokenizer.hpp: Hugging Face tokenizer.json BPE tokenizers and the built-in byte-level and passthrough ones.
#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <levanter/data/detail/tokenizer.hpp>
#include <levanter/data/detail/utf8.hpp>
#include <levanter/data/tokenizer.hpp>
#include <levanter/data/unicode_tables.hpp>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

namespace levanter::data {

namespace detail::tok {

// ---- Unicode helpers --------------------------------------------------------------------------------------------

std::uint8_t cp_class(char32_t c) {
  static const auto ascii = [] {
    std::array<std::uint8_t, 128> t{};
    for (int i = 0; i < 128; ++i) {
      if ((i >= 'a' && i <= 'z') || (i >= 'A' && i <= 'Z'))
        t[i] = cls_letter;
      else if (i >= '0' && i <= '9')
        t[i] = cls_number;
      else if (i == ' ' || (i >= 9 && i <= 13))
        t[i] = cls_space;
    }
    return t;
  }();
  if (c < 128) return ascii[c];
  const unicode_range* b = unicode_class_ranges;
  const unicode_range* e = unicode_class_ranges + unicode_class_range_count;
  auto it = std::upper_bound(b, e, static_cast<std::uint32_t>(c),
                             [](std::uint32_t v, const unicode_range& r) { return v < r.first; });
  if (it == b) return static_cast<std::uint8_t>(cls_other);
  --it;
  return c <= it->last ? it->cls : static_cast<std::uint8_t>(cls_other);
}

/// Decodes the character at s[i] (i < n); returns it and sets `len`. An invalid byte is U+FFFD of length 1 and
/// counts as "other" (the 0xFFFD code point is a symbol).
char32_t next_cp(const char* s, std::size_t n, std::size_t i, std::size_t& len) {
  const auto* u = reinterpret_cast<const unsigned char*>(s);
  const unsigned c = u[i];
  if (c < 0x80) {
    len = 1;
    return c;
  }
  auto cont = [&](std::size_t k) { return i + k < n && (u[i + k] & 0xC0) == 0x80; };
  if (c >= 0xC2 && c < 0xE0 && cont(1)) {
    len = 2;
    return ((c & 0x1F) << 6) | (u[i + 1] & 0x3F);
  }
  if (c >= 0xE0 && c < 0xF0 && cont(1) && cont(2)) {
    const char32_t v = ((c & 0x0F) << 12) | ((u[i + 1] & 0x3F) << 6) | (u[i + 2] & 0x3F);
    if (v >= 0x800 && !(v >= 0xD800 && v < 0xE000)) {
      len = 3;
      return v;
    }
  }
  if (c >= 0xF0 && c < 0xF5 && cont(1) && cont(2) && cont(3)) {
    const char32_t v = ((c & 0x07) << 18) | ((u[i + 1] & 0x3F) << 12) | ((u[i + 2] & 0x3F) << 6) | (u[i + 3] & 0x3F);
    if (v >= 0x10000 && v <= 0x10FFFF) {
      len = 4;
      return v;
    }
  }
  len = 1;
  return 0xFFFD;
}

std::uint8_t class_at(const char* s, std::size_t n, std::size_t i, std::size_t& len) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    len = 1;
    return cp_class(c);
  }
  return cp_class(next_cp(s, n, i, len));
}

using levanter::data::detail::append_utf8;

/// Rust's `String::from_utf8_lossy`: each maximal invalid subsequence becomes one U+FFFD.
std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* u = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned c = u[i];
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    std::size_t need = 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
      need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    if (need == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    std::size_t k = 1;
    for (; k <= need && i + k < n; ++k) {
      const unsigned b = u[i + k];
      const unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
      if (b < l || b > h) break;
    }
    if (k == need + 1)
      out.append(s.substr(i, need + 1));
    else
      out += "\xEF\xBF\xBD";
    i += k;
  }
  return out;
}

bool valid_utf8(std::string_view s) {
  std::size_t i = 0, len = 0;
  while (i < s.size()) {
    const char32_t c = next_cp(s.data(), s.size(), i, len);
    if (c == 0xFFFD && !(len == 3 && s.compare(i, 3, "\xEF\xBF\xBD") == 0)) return false;
    i += len;
  }
  return true;
}

/// GPT-2's byte-to-character table (`bytes_to_unicode`): printable bytes map to themselves, the rest to U+0100+.
const std::array<char32_t, 256>& byte_to_char() {
  static const auto t = [] {
    std::array<char32_t, 256> m{};
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      m[b] = keep ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
    }
    return m;
  }();
  return t;
}

/// The inverse of byte_to_char for a whole string; nullopt if a character is not in the table.
std::optional<std::string> byte_level_to_bytes(std::string_view s) {
  static const auto inv = [] {
    std::unordered_map<char32_t, unsigned char> m;
    for (int b = 0; b < 256; ++b) m[byte_to_char()[b]] = static_cast<unsigned char>(b);
    return m;
  }();
  std::string out;
  std::size_t i = 0, len = 0;
  while (i < s.size()) {
    const char32_t c = next_cp(s.data(), s.size(), i, len);
    auto it = inv.find(c);
    if (it == inv.end() || (c == 0xFFFD && len == 1)) return std::nullopt;
    out.push_back(static_cast<char>(it->second));
    i += len;
  }
  return out;
}

// ---- SHA-256 (content hash of the tokenizer file) ---------------------------------------------------------------

std::string sha256_hex(std::string_view data) {
  static constexpr std::uint32_t k[64] = {
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
      0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
      0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
      0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
      0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
      0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
      0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
      0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
  std::uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  auto rotr = [](std::uint32_t x, int r) { return (x >> r) | (x << (32 - r)); };
  std::string msg(data);
  const std::uint64_t bits = static_cast<std::uint64_t>(data.size()) * 8;
  msg.push_back(static_cast<char>(0x80));
  while (msg.size() % 64 != 56) msg.push_back(0);
  for (int i = 7; i >= 0; --i) msg.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
  for (std::size_t off = 0; off < msg.size(); off += 64) {
    std::uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      const auto* p = reinterpret_cast<const unsigned char*>(msg.data() + off + 4 * i);
      w[i] = (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) | p[3];
    }
    for (int i = 16; i < 64; ++i) {
      const std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      const std::uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const std::uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
  }
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (auto v : h)
    for (int i = 7; i >= 0; --i) out.push_back(hex[(v >> (4 * i)) & 0xF]);
  return out;
}

// ---- the known split regexes, as scanners ----------------------------------------------------------------------

constexpr std::string_view gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view llama3_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view qwen2_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

/// End of the run of characters of class `k` starting at i.
std::size_t run_end(const char* s, std::size_t n, std::size_t i, std::uint8_t k) {
  std::size_t len = 0;
  while (i < n && class_at(s, n, i, len) == k) i += len;
  return i;
}

/// The `\s+(?!\S)|\s+` tail shared by all three patterns, at a white-space character i.
std::size_t match_space_tail(const char* s, std::size_t n, std::size_t i) {
  std::size_t j = i, last = i, len = 0;
  while (j < n && class_at(s, n, j, len) == cls_space) {
    last = j;
    j += len;
  }
  if (j == n) return j;
  // \s+(?!\S) backtracks one character off a run followed by non-space; a run of one falls through to \s+.
  return last > i ? last : j;
}

/// Length of the GPT-2 pattern's match starting at i (the pattern matches every character, so one always does).
std::size_t match_gpt2(const char* s, std::size_t n, std::size_t i) {
  if (s[i] == '\'' && i + 1 < n) {
    const char c1 = s[i + 1];
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
    if (i + 2 < n) {
      const char c2 = s[i + 2];
      if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return i + 3;
    }
  }
  std::size_t len = 0;
  std::uint8_t k = class_at(s, n, i, len);
  if (s[i] == ' ' && i + 1 < n) {
    std::size_t len1 = 0;
    const std::uint8_t k1 = class_at(s, n, i + 1, len1);
    if (k1 != cls_space) return run_end(s, n, i + 1, k1);
  }
  if (k != cls_space) return run_end(s, n, i, k);
  return match_space_tail(s, n, i);
}

bool ieq(char c, char lower) { return c == lower || c == lower - 32; }

/// Length of the Llama 3 (max_digits 3) or Qwen 2 (max_digits 1) pattern's match starting at i.
std::size_t match_llama3(const char* s, std::size_t n, std::size_t i, int max_digits) {
  if (s[i] == '\'' && i + 1 < n) {
    const char c1 = s[i + 1];
    if (ieq(c1, 's') || ieq(c1, 't') || ieq(c1, 'm') || ieq(c1, 'd')) return i + 2;
    // U+017F LATIN SMALL LETTER LONG S case-folds to 's'
    if (c1 == '\xC5' && i + 2 < n && s[i + 2] == '\xBF') return i + 3;
    if (i + 2 < n) {
      const char c2 = s[i + 2];
      if ((ieq(c1, 'r') && ieq(c2, 'e')) || (ieq(c1, 'v') && ieq(c2, 'e')) || (ieq(c1, 'l') && ieq(c2, 'l')))
        return i + 3;
    }
  }
  std::size_t len = 0;
  const std::uint8_t k = class_at(s, n, i, len);
  if (k == cls_letter) return run_end(s, n, i, cls_letter);
  if (k != cls_number && s[i] != '\r' && s[i] != '\n' && i + len < n) {
    std::size_t len1 = 0;
    if (class_at(s, n, i + len, len1) == cls_letter) return run_end(s, n, i + len, cls_letter);
  }
  if (k == cls_number) {
    std::size_t j = i;
    for (int d = 0; d < max_digits && j < n && class_at(s, n, j, len) == cls_number; ++d) j += len;
    return j;
  }
  auto other_tail = [&](std::size_t from) {
    std::size_t j = run_end(s, n, from, cls_other);
    while (j < n && (s[j] == '\r' || s[j] == '\n')) ++j;
    return j;
  };
  if (s[i] == ' ' && i + 1 < n) {
    std::size_t len1 = 0;
    if (class_at(s, n, i + 1, len1) == cls_other) return other_tail(i + 1);
  }
  if (k == cls_other) return other_tail(i);
  // k == space: \s*[\r\n]+ ends after the run's last \r or \n, if it has one
  std::size_t j = i, end_nl = 0;
  while (j < n && class_at(s, n, j, len) == cls_space) {
    if (s[j] == '\r' || s[j] == '\n') end_nl = j + 1;
    j += len;
  }
  if (end_nl) return end_nl;
  return match_space_tail(s, n, i);
}

std::size_t match_pattern(pattern_kind p, const char* s, std::size_t n, std::size_t i) {
  switch (p) {
    case pattern_kind::gpt2:
      return match_gpt2(s, n, i);
    case pattern_kind::llama3:
      return match_llama3(s, n, i, 3);
    case pattern_kind::qwen2:
      return match_llama3(s, n, i, 1);
  }
  return n;
}

// ---- pipeline steps ---------------------------------------------------------------------------------------------

/// How much a normalizer or decoder may grow a text: to 64 times its length plus 1 MiB (a Replace whose content
/// holds its pattern, chained, would otherwise grow it exponentially).
std::size_t growth_cap(std::size_t n) { return 64 * n + (std::size_t{1} << 20); }

/// `tokenizers`' Replace with a String pattern, written to `out`: one left-to-right pass over the non-overlapping
/// matches (the content is never searched again). An empty pattern matches at every character boundary, as the
/// library's regex does: "ab" becomes "XaXbX", "" stays "". False (and `out` partial) once `out` would pass `cap`.
bool replace_all(std::string_view s, std::string_view pat, std::string_view content, std::string& out,
                 std::size_t cap) {
  out.clear();
  auto put = [&](std::string_view x) {
    if (out.size() + x.size() > cap) return false;
    out.append(x);
    return true;
  };
  if (pat.empty()) {
    if (s.empty()) return true;
    std::size_t len = 0;
    for (std::size_t i = 0; i < s.size(); i += len) {
      next_cp(s.data(), s.size(), i, len);
      if (!put(content) || !put(s.substr(i, len))) return false;
    }
    return put(content);
  }
  std::size_t pos = 0;
  for (std::size_t f; (f = s.find(pat, pos)) != std::string_view::npos; pos = f + pat.size())
    if (!put(s.substr(pos, f - pos)) || !put(content)) return false;
  return put(s.substr(pos));
}

/// replace_all with alignments: `al` holds one entry per byte of `s` (the end, in the original text, of the character
/// the byte comes from); `out_al` gets one per byte of `out`. Content replacing a match takes the match's last
/// character's entry (the replaced character's, for the one-character patterns of real tokenizers); content an empty
/// pattern inserts takes the next character's (the last one's at the end).
bool replace_all_aligned(std::string_view s, const std::vector<std::int64_t>& al, std::string_view pat,
                         std::string_view content, std::string& out, std::vector<std::int64_t>& out_al,
                         std::size_t cap) {
  out.clear();
  out_al.clear();
  auto put = [&](std::string_view x, const std::int64_t* a, std::int64_t same) {
    if (out.size() + x.size() > cap) return false;
    out.append(x);
    for (std::size_t i = 0; i < x.size(); ++i) out_al.push_back(a ? a[i] : same);
    return true;
  };
  if (s.empty()) return true;
  if (pat.empty()) {
    std::size_t len = 0;
    for (std::size_t i = 0; i < s.size(); i += len) {
      next_cp(s.data(), s.size(), i, len);
      if (!put(content, nullptr, al[i]) || !put(s.substr(i, len), al.data() + i, 0)) return false;
    }
    return put(content, nullptr, al.back());
  }
  std::size_t pos = 0;
  for (std::size_t f; (f = s.find(pat, pos)) != std::string_view::npos; pos = f + pat.size())
    if (!put(s.substr(pos, f - pos), al.data() + pos, 0) || !put(content, nullptr, al[f + pat.size() - 1]))
      return false;
  return put(s.substr(pos), al.data() + pos, 0);
}

struct normalizer_step {
  enum kind_t { prepend, replace } kind;
  std::string a, b;  // prepend: a; replace: a -> b
};

enum class split_behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct pretok_step {
  enum kind_t { split_regex, split_string, byte_level, metaspace } kind;
  pattern_kind pattern = pattern_kind::gpt2;
  std::string literal;  // split_string
  split_behavior behavior = split_behavior::isolated;
  bool add_prefix_space = false, use_regex = true;  // byte_level
  std::string replacement;                          // metaspace
  enum scheme_t { always, first, never } prepend_scheme = always;
  bool split = true;
};

struct decoder_step {
  enum kind_t { byte_level, metaspace, replace, byte_fallback, fuse, strip } kind;
  std::string a, b;  // replace a -> b; metaspace replacement a; strip content a
  int start = 0, stop = 0;
  bool prepend = true;  // metaspace: prepend_scheme != never
};

struct added_token {
  std::string content;
  std::int32_t id;
  bool special, lstrip, rstrip, single_word, normalized;
};

/// A byte trie over added tokens, for the leftmost-longest split.
struct token_trie {
  struct node {
    std::vector<std::pair<unsigned char, std::int32_t>> next;
    std::int32_t token = -1;  // index into the added-token list
  };
  std::vector<node> nodes{1};
  std::array<bool, 256> first{};
  bool empty() const { return nodes.size() == 1; }
  void insert(std::string_view s, std::int32_t tok) {
    if (s.empty()) return;
    std::int32_t cur = 0;
    first[static_cast<unsigned char>(s[0])] = true;
    for (char ch : s) {
      const auto c = static_cast<unsigned char>(ch);
      std::int32_t nx = -1;
      for (auto& [k, v] : nodes[cur].next)
        if (k == c) nx = v;
      if (nx < 0) {
        nx = static_cast<std::int32_t>(nodes.size());
        nodes[cur].next.emplace_back(c, nx);
        nodes.emplace_back();
      }
      cur = nx;
    }
    if (nodes[cur].token < 0) nodes[cur].token = tok;
  }
  /// Longest token starting at i: (length, token index) or (0, -1).
  std::pair<std::size_t, std::int32_t> longest(std::string_view s, std::size_t i) const {
    std::int32_t cur = 0;
    std::pair<std::size_t, std::int32_t> best{0, -1};
    for (std::size_t j = i; j < s.size(); ++j) {
      const auto c = static_cast<unsigned char>(s[j]);
      std::int32_t nx = -1;
      for (auto& [k, v] : nodes[cur].next)
        if (k == c) {
          nx = v;
          break;
        }
      if (nx < 0) break;
      cur = nx;
      if (nodes[cur].token >= 0) best = {j + 1 - i, nodes[cur].token};
    }
    return best;
  }
};

struct string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using string_map = std::unordered_map<std::string, std::int32_t, string_hash, std::equal_to<>>;

struct merge_entry {
  std::int32_t rank, new_id;
};

struct pair_hash {
  std::size_t operator()(std::uint64_t v) const noexcept {
    v ^= v >> 33;
    v *= 0xff51afd7ed558ccdULL;
    v ^= v >> 33;
    return static_cast<std::size_t>(v);
  }
};

// ---- the word cache ---------------------------------------------------------------------------------------------

const std::int32_t* word_cache::find(std::string_view word, std::size_t h, std::uint32_t& n) const {
  if (slots.empty()) return nullptr;
  const std::size_t mask = slots.size() - 1;
  for (std::size_t i = h & mask;; i = (i + 1) & mask) {
    const slot& sl = slots[i];
    if (sl.key_len == empty) return nullptr;
    if (sl.hash == h && sl.key_len == word.size() &&
        std::memcmp(keys.data() + sl.key_off, word.data(), word.size()) == 0) {
      n = sl.ids_len;
      return ids.data() + sl.ids_off;
    }
  }
}

void word_cache::insert(std::string_view word, std::size_t h, const std::int32_t* id, std::size_t n) {
  if (count >= capacity) clear();
  if (2 * (count + 1) > slots.size()) grow();
  const std::size_t mask = slots.size() - 1;
  std::size_t i = h & mask;
  while (slots[i].key_len != empty) i = (i + 1) & mask;
  slots[i] = {h, static_cast<std::uint32_t>(keys.size()), static_cast<std::uint32_t>(word.size()),
              static_cast<std::uint32_t>(ids.size()), static_cast<std::uint32_t>(n)};
  keys.append(word);
  ids.insert(ids.end(), id, id + n);
  ++count;
}

void word_cache::clear() {
  std::fill(slots.begin(), slots.end(), slot{});
  keys.clear();
  ids.clear();
  count = 0;
}

void word_cache::grow() {
  std::vector<slot> old(std::max<std::size_t>(1024, slots.size() * 2));
  old.swap(slots);
  const std::size_t mask = slots.size() - 1;
  for (const slot& sl : old) {
    if (sl.key_len == empty) continue;
    std::size_t i = sl.hash & mask;
    while (slots[i].key_len != empty) i = (i + 1) & mask;
    slots[i] = sl;
  }
}

std::atomic<std::uint64_t>& instance_counter() {
  static std::atomic<std::uint64_t> c{1};
  return c;
}

word_cache& thread_cache(std::uint64_t owner) {
  thread_local word_cache c;
  if (c.owner != owner) {
    c.clear();
    c.owner = owner;
  }
  return c;
}

// ---- the tokenizer state ----------------------------------------------------------------------------------------

struct impl {
  enum kind_t { bpe, bytes, passthrough } kind = bpe;
  std::string name, hash;
  std::uint64_t instance = instance_counter()++;
  // word caches lent to encode_batch's workers, so that they stay warm from one call to the next
  mutable std::mutex pool_mutex;
  mutable std::vector<std::unique_ptr<word_cache>> pool;
  std::unique_ptr<word_cache> borrow_cache() const {
    std::lock_guard<std::mutex> lock(pool_mutex);
    if (pool.empty()) return std::make_unique<word_cache>();
    auto c = std::move(pool.back());
    pool.pop_back();
    return c;
  }
  void return_cache(std::unique_ptr<word_cache> c) const {
    std::lock_guard<std::mutex> lock(pool_mutex);
    pool.push_back(std::move(c));
  }
  std::int64_t vocab_size = 0;

  // model
  string_map vocab;                      // model vocab, as written in tokenizer.json
  string_map raw_vocab;                  // byte-level models with ignore_merges: raw bytes -> id
  std::vector<std::string> id_to_token;  // model and added tokens, as written
  std::vector<std::uint8_t> has_token;
  std::unordered_map<std::uint64_t, merge_entry, pair_hash> merges;
  bool byte_symbols = false;  // pieces are raw bytes, symbols are bytes mapped by byte_to_char
  std::array<std::int32_t, 256> byte_symbol_id{};
  std::array<std::string, 256> byte_symbol_str;
  std::optional<std::int32_t> unk_id;
  std::string unk_token;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::array<std::int32_t, 256> fallback_id{};

  std::vector<normalizer_step> normalizers;
  std::vector<pretok_step> pretoks;
  std::vector<decoder_step> decoders;
  bool has_decoder = false;
  std::vector<added_token> added;
  token_trie raw_trie, norm_trie;
  std::unordered_set<std::int32_t> special_ids;
  string_map added_by_content;
  std::vector<std::int32_t> prefix_ids, suffix_ids;
  std::optional<std::int32_t> bos, eos;
  std::string bos_text, eos_text;  // the tokens as written (Hugging Face's bos_token / eos_token)
  std::optional<std::string> chat_template;  // tokenizer_config.json's chat_template or chat_template.jinja
  std::vector<std::pair<std::string, std::string>> template_tokens;  // special_tokens_map: name -> token text
  bool adds_bos = false, adds_eos = false;
  bool long_text_workaround = false;  // the normalizer is Replace or a Sequence

  // ---- encoding ----

  [[noreturn]] void too_long(const char* what, std::size_t step, std::string_view from) const {
    throw data_error("tokenizer '" + name + "': the " + what + " (step " + std::to_string(step) + ") grows a text of " +
                     std::to_string(from.size()) + " bytes past 64 times its length + 1 MiB, this port's limit (a " +
                     "Replace whose content holds its pattern, repeated): fix the tokenizer.json's " + what);
  }

  /// The normalizers applied to `s`. `budget`: bytes the normalized texts of one call may still take; the result
  /// takes its share, and a step that would pass it throws (no text can make memory grow without bound). With `al`
  /// (one entry per byte of `s`, as replace_all_aligned's), the alignments are carried to the result's bytes: a
  /// prefix takes the first character's entry.
  std::string normalize(std::string_view s, std::size_t& budget, std::vector<std::int64_t>* al = nullptr) const {
    std::string out(s), r;
    std::vector<std::int64_t> ra;
    for (std::size_t k = 0; k < normalizers.size(); ++k) {
      const auto& st = normalizers[k];
      if (st.kind == normalizer_step::prepend) {
        if (out.empty()) continue;
        if (out.size() + st.a.size() > budget) too_long("normalizer", k, s);
        out.insert(0, st.a);
        if (al) al->insert(al->begin(), st.a.size(), al->front());
      } else {
        if (!(al ? replace_all_aligned(out, *al, st.a, st.b, r, ra, budget) : replace_all(out, st.a, st.b, r, budget)))
          too_long("normalizer", k, s);
        out.swap(r);
        if (al) al->swap(ra);
      }
    }
    budget -= std::min(budget, out.size());
    return out;
  }

  /// AddedVocabulary::find_matches: calls f(piece, -1) for text and f(piece, id) for added tokens.
  template <class F>
  void split_added(std::string_view s, const token_trie& trie, F&& f) const {
    if (trie.empty()) {
      f(s, -1, std::size_t{0});
      return;
    }
    std::size_t start_offset = 0, i = 0;
    std::size_t space_from = 1, space_to = 0;  // [space_from, space_to): white space up to a non-space or the end
    while (i < s.size()) {
      if (!trie.first[static_cast<unsigned char>(s[i])]) {
        ++i;
        continue;
      }
      const auto [mlen, ti] = trie.longest(s, i);
      if (ti < 0) {
        ++i;
        continue;
      }
      std::size_t start = i, stop = i + mlen;
      i = stop;
      const auto& tok = added[ti];
      if (tok.single_word) {
        auto is_word = [&](std::size_t at) {
          std::size_t len = 0;
          const char32_t c = next_cp(s.data(), s.size(), at, len);
          const auto k = cp_class(c);
          return k == cls_letter || k == cls_number || c == '_';
        };
        bool start_space = start == 0;
        if (!start_space) {
          std::size_t p = start - 1;
          while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
          start_space = !is_word(p);
        }
        const bool stop_space = stop == s.size() || !is_word(stop);
        if (!start_space || !stop_space) continue;
      }
      if (tok.lstrip) {
        std::size_t p = start;
        while (p > start_offset) {  // spaces before start_offset are taken: stopping there keeps this linear
          std::size_t q = p - 1, len = 0;
          while (q > 0 && (static_cast<unsigned char>(s[q]) & 0xC0) == 0x80) --q;
          if (class_at(s.data(), s.size(), q, len) != cls_space) break;
          p = q;
        }
        start = std::max(p, start_offset);
      }
      if (tok.rstrip) {
        if (stop >= space_from && stop <= space_to) {
          stop = space_to;  // inside the run of spaces scanned last time (tokens that match spaces, rstripped)
        } else {
          std::size_t len = 0;
          space_from = stop;
          while (stop < s.size() && class_at(s.data(), s.size(), stop, len) == cls_space) stop += len;
          space_to = stop;
        }
      }
      if (start_offset < start) f(s.substr(start_offset, start - start_offset), -1, start_offset);
      // a token whose stripped spaces an earlier one took is dropped, as the library drops empty pieces (it panics
      // where lstrip moves the start past the end)
      if (start < stop) f(s.substr(start, stop - start), tok.id, start);
      start_offset = stop;
    }
    if (start_offset < s.size()) f(s.substr(start_offset), -1, start_offset);
  }

  /// Applies pre-tokenizer steps k.. to a piece; `at_start`: the piece begins the original text. Calls
  /// emit(piece, al) for each piece the model takes. `al`, when not null, holds each byte's alignment (the end, in
  /// the original text, of the character it comes from, as `tokenizers`' NormalizedString aligns it: an inserted
  /// prefix takes the first character's, a replacement the replaced character's) and is carried to the pieces.
  template <class F>
  void pretokenize(std::size_t k, std::string_view piece, bool at_start, F&& emit,
                   const std::int64_t* al = nullptr) const {
    if (piece.empty()) return;
    if (k == pretoks.size()) {
      emit(piece, al);
      return;
    }
    std::vector<std::int64_t> al2;  // the alignment of a piece this step rewrites
    const auto& st = pretoks[k];
    switch (st.kind) {
      case pretok_step::byte_level: {
        std::string buf;
        if (st.add_prefix_space && piece[0] != ' ') {
          buf.reserve(piece.size() + 1);
          buf.push_back(' ');
          buf.append(piece);
          if (al) {
            al2.assign(1, al[0]);
            al2.insert(al2.end(), al, al + piece.size());
            al = al2.data();
          }
          piece = buf;
        }
        if (!st.use_regex) {
          pretokenize(k + 1, piece, at_start, emit, al);
          return;
        }
        for (std::size_t i = 0; i < piece.size();) {
          const std::size_t j = match_gpt2(piece.data(), piece.size(), i);
          pretokenize(k + 1, piece.substr(i, j - i), at_start && i == 0, emit, al ? al + i : nullptr);
          i = j;
        }
        return;
      }
      case pretok_step::metaspace: {
        std::string buf;
        buf.reserve(piece.size() + 3);
        for (std::size_t i = 0; i < piece.size(); ++i) {
          const char c = piece[i];
          if (c == ' ')
            buf += st.replacement;
          else
            buf.push_back(c);
          if (al) al2.insert(al2.end(), c == ' ' ? st.replacement.size() : 1, al[i]);
        }
        const bool starts = buf.compare(0, st.replacement.size(), st.replacement) == 0;
        if (!starts &&
            (st.prepend_scheme == pretok_step::always || (st.prepend_scheme == pretok_step::first && at_start))) {
          buf.insert(0, st.replacement);
          if (al) al2.insert(al2.begin(), st.replacement.size(), al2.front());
        }
        std::string_view v = buf;
        const std::int64_t* va = al ? al2.data() : nullptr;
        if (!st.split) {
          pretokenize(k + 1, v, at_start, emit, va);
          return;
        }
        // MergedWithNext: every replacement character starts a new piece
        std::size_t from = 0;
        for (std::size_t f = v.find(st.replacement, 1); f != std::string_view::npos;
             f = v.find(st.replacement, f + st.replacement.size())) {
          if (f == 0) continue;
          pretokenize(k + 1, v.substr(from, f - from), at_start && from == 0, emit, va ? va + from : nullptr);
          from = f;
        }
        pretokenize(k + 1, v.substr(from), at_start && from == 0, emit, va ? va + from : nullptr);
        return;
      }
      case pretok_step::split_regex:
      case pretok_step::split_string: {
        // matches as (begin, end), then the behaviour decides what the pieces are
        std::vector<std::pair<std::size_t, std::size_t>> out;
        std::size_t prev = 0;  // end of the text already assigned to a piece
        bool last_is_match = false;
        auto add_match = [&](std::size_t b, std::size_t e) {
          const bool gap = b > prev;
          switch (st.behavior) {
            case split_behavior::removed:
              if (gap) out.emplace_back(prev, b);
              break;
            case split_behavior::isolated:
              if (gap) out.emplace_back(prev, b);
              out.emplace_back(b, e);
              break;
            case split_behavior::merged_with_previous:
              out.emplace_back(prev, e);
              break;
            case split_behavior::merged_with_next:
              if (gap) out.emplace_back(prev, b);
              prev = b;  // the match starts the next piece
              return;
            case split_behavior::contiguous:
              if (gap) out.emplace_back(prev, b);
              if (!gap && last_is_match)
                out.back().second = e;
              else
                out.emplace_back(b, e);
              break;
          }
          last_is_match = true;
          prev = e;
        };
        if (st.kind == pretok_step::split_regex) {
          for (std::size_t i = 0; i < piece.size();) {
            const std::size_t j = match_pattern(st.pattern, piece.data(), piece.size(), i);
            add_match(i, j);
            i = j;
          }
        } else if (!st.literal.empty()) {
          for (std::size_t f, from = 0; (f = piece.find(st.literal, from)) != std::string_view::npos;
               from = f + st.literal.size())
            add_match(f, f + st.literal.size());
        }
        if (prev < piece.size()) out.emplace_back(prev, piece.size());
        for (auto [b, e] : out)
          if (e > b) pretokenize(k + 1, piece.substr(b, e - b), at_start && b == 0, emit, al ? al + b : nullptr);
        return;
      }
    }
  }

  void merge_word(std::string_view w, std::vector<std::int32_t>& out) const {
    struct sym {
      std::int32_t id, prev, next;
      bool alive;
    };
    thread_local std::vector<sym> syms;
    thread_local std::vector<std::pair<std::int64_t, std::int32_t>> heap;  // (rank << 32 | pos, new_id)
    syms.clear();
    heap.clear();
    std::optional<std::int32_t> pending_unk;
    auto add = [&](std::int32_t id) {
      const auto n = static_cast<std::int32_t>(syms.size());
      syms.push_back({id, n - 1, n + 1, true});
    };
    auto missing = [&](std::string_view model_str) {
      if (byte_fallback) {
        bool all = true;
        for (char c : model_str) all = all && fallback_id[static_cast<unsigned char>(c)] >= 0;
        if (all) {
          for (char c : model_str) add(fallback_id[static_cast<unsigned char>(c)]);
          return;
        }
      }
      if (!unk_id)
        throw data_error("tokenizer '" + name + "': the text has a character that is not in the vocabulary ('" +
                         std::string(model_str) + "') and the model has no unk_token");
      if (pending_unk && !fuse_unk) add(*pending_unk);
      pending_unk = *unk_id;
    };
    auto found = [&](std::int32_t id) {
      if (pending_unk) {
        add(*pending_unk);
        pending_unk.reset();
      }
      add(id);
    };
    if (byte_symbols) {
      for (char c : w) {
        const auto b = static_cast<unsigned char>(c);
        if (byte_symbol_id[b] >= 0)
          found(byte_symbol_id[b]);
        else
          missing(byte_symbol_str[b]);
      }
    } else {
      std::size_t len = 0;
      for (std::size_t i = 0; i < w.size(); i += len) {
        next_cp(w.data(), w.size(), i, len);
        auto it = vocab.find(w.substr(i, len));
        if (it != vocab.end())
          found(it->second);
        else
          missing(w.substr(i, len));
      }
    }
    if (pending_unk) add(*pending_unk);
    if (!syms.empty()) syms.back().next = -1;
    auto lookup = [&](std::int32_t a, std::int32_t b) -> const merge_entry* {
      auto it = merges.find((static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
                            static_cast<std::uint32_t>(b));
      return it == merges.end() ? nullptr : &it->second;
    };
    auto cmp = [](const auto& x, const auto& y) { return x.first > y.first; };  // min-heap on (rank, pos)
    auto push = [&](std::int32_t pos, const merge_entry& m) {
      heap.emplace_back((static_cast<std::int64_t>(m.rank) << 32) | pos, m.new_id);
      std::push_heap(heap.begin(), heap.end(), cmp);
    };
    for (std::size_t i = 0; i + 1 < syms.size(); ++i)
      if (const auto* m = lookup(syms[i].id, syms[i + 1].id))
        heap.emplace_back((static_cast<std::int64_t>(m->rank) << 32) | static_cast<std::int64_t>(i), m->new_id);
    std::make_heap(heap.begin(), heap.end(), cmp);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), cmp);
      const auto [key, new_id] = heap.back();
      heap.pop_back();
      const auto pos = static_cast<std::int32_t>(key & 0xFFFFFFFF);
      auto& cur = syms[pos];
      if (!cur.alive || cur.next < 0) continue;
      const std::int32_t nx = cur.next;
      const auto* m = lookup(cur.id, syms[nx].id);
      if (!m || m->new_id != new_id) continue;  // a stale entry
      cur.id = new_id;
      syms[nx].alive = false;
      cur.next = syms[nx].next;
      if (cur.next >= 0) syms[cur.next].prev = pos;
      if (cur.prev >= 0)
        if (const auto* mp = lookup(syms[cur.prev].id, cur.id)) push(cur.prev, *mp);
      if (cur.next >= 0)
        if (const auto* mn = lookup(cur.id, syms[cur.next].id)) push(pos, *mn);
    }
    for (const auto& s : syms)
      if (s.alive) out.push_back(s.id);
  }

  void tokenize_piece(std::string_view piece, std::vector<std::int32_t>& out, word_cache& cache) const {
    if (piece.empty()) return;
    if (ignore_merges) {
      const auto& m = byte_symbols ? raw_vocab : vocab;
      if (auto it = m.find(piece); it != m.end()) {
        out.push_back(it->second);
        return;
      }
    }
    const std::size_t h = std::hash<std::string_view>{}(piece);
    std::uint32_t n = 0;
    if (const std::int32_t* hit = cache.find(piece, h, n)) {
      out.insert(out.end(), hit, hit + n);
      return;
    }
    const std::size_t before = out.size();
    merge_word(piece, out);
    if (piece.size() < 256) cache.insert(piece, h, out.data() + before, out.size() - before);
  }

  std::vector<std::int32_t> encode(std::string_view text, bool add_special, word_cache* cache_in = nullptr) const {
    std::vector<std::int32_t> out;
    if (kind == bytes) {
      out.reserve(text.size());
      for (char c : text) out.push_back(static_cast<unsigned char>(c));
      return out;
    }
    if (kind == passthrough) {
      std::size_t i = 0;
      while (i < text.size()) {
        while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
        if (i == text.size()) break;
        std::size_t j = i;
        while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
        const std::string tok(text.substr(i, j - i));
        std::size_t used = 0;
        long long v = -1;
        try {
          v = std::stoll(tok, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != tok.size() || v < 0 || v >= vocab_size)
          throw data_error("passthrough tokenizer: '" + tok + "' is not a token id in [0, " +
                           std::to_string(vocab_size) + ") (the text must be whitespace-separated integer ids)");
        out.push_back(static_cast<std::int32_t>(v));
        i = j;
      }
      return out;
    }
    out.reserve(text.size() / 3 + 4);
    if (add_special) out.insert(out.end(), prefix_ids.begin(), prefix_ids.end());
    auto& cache = cache_in ? *cache_in : thread_cache(instance);
    std::size_t budget = growth_cap(text.size());
    auto model = [&](std::string_view piece, const std::int64_t*) { tokenize_piece(piece, out, cache); };
    split_added(text, raw_trie, [&](std::string_view piece, std::int32_t id, std::size_t offset) {
      if (id >= 0) {
        out.push_back(id);
        return;
      }
      if (normalizers.empty() && norm_trie.empty()) {
        pretokenize(0, piece, offset == 0, model);
        return;
      }
      const std::string normed = normalize(piece, budget);
      split_added(normed, norm_trie, [&](std::string_view p2, std::int32_t id2, std::size_t off2) {
        if (id2 >= 0)
          out.push_back(id2);
        else
          pretokenize(0, p2, offset == 0 && off2 == 0, model);
      });
    });
    if (add_special) out.insert(out.end(), suffix_ids.begin(), suffix_ids.end());
    return out;
  }

  // ---- decoding ----

  std::vector<std::string> run_decoders(std::vector<std::string> toks, bool single) const {
    std::size_t in_size = 0;
    for (const auto& t : toks) in_size += t.size();
    const std::size_t cap = growth_cap(in_size);
    for (std::size_t k = 0; k < decoders.size(); ++k) {
      const auto& d = decoders[k];
      switch (d.kind) {
        case decoder_step::byte_level: {
          static const auto inv = [] {
            std::unordered_map<char32_t, unsigned char> m;
            for (int b = 0; b < 256; ++b) m[byte_to_char()[b]] = static_cast<unsigned char>(b);
            return m;
          }();
          std::string bytes;
          for (const auto& t : toks) {
            std::string part;
            bool ok = true;
            std::size_t len = 0;
            for (std::size_t i = 0; i < t.size() && ok; i += len) {
              const char32_t c = next_cp(t.data(), t.size(), i, len);
              auto it = inv.find(c);
              if (it == inv.end() || (c == 0xFFFD && len == 1))
                ok = false;
              else
                part.push_back(static_cast<char>(it->second));
            }
            bytes += ok ? part : t;
          }
          toks = {utf8_lossy(bytes)};
          break;
        }
        case decoder_step::metaspace:
          for (std::size_t i = 0; i < toks.size(); ++i) {
            std::string r;
            const std::string& t = toks[i];
            for (std::size_t p = 0; p < t.size();) {
              if (t.compare(p, d.a.size(), d.a) == 0) {
                if (!(i == 0 && !single && d.prepend && p == 0)) r.push_back(' ');
                p += d.a.size();
              } else {
                r.push_back(t[p++]);
              }
            }
            toks[i] = r;
          }
          break;
        case decoder_step::replace: {
          std::size_t total = 0;
          std::string r;
          for (auto& t : toks) {
            if (!replace_all(t, d.a, d.b, r, cap - total)) too_long("decoder", k, t);
            total += r.size();
            t.swap(r);
          }
          break;
        }
        case decoder_step::byte_fallback: {
          std::vector<std::string> res;
          std::string pend;
          std::size_t npend = 0;
          auto flush = [&] {
            if (!npend) return;
            if (valid_utf8(pend))
              res.push_back(pend);
            else
              for (std::size_t i = 0; i < npend; ++i) res.emplace_back("\xEF\xBF\xBD");
            pend.clear();
            npend = 0;
          };
          for (auto& t : toks) {
            int v = -1;
            if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
              auto hexv = [](char c) {
                return c >= '0' && c <= '9'   ? c - '0'
                       : c >= 'A' && c <= 'F' ? c - 'A' + 10
                       : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                              : -1;
              };
              const int h = hexv(t[3]), l = hexv(t[4]);
              if (h >= 0 && l >= 0) v = h * 16 + l;
            }
            if (v >= 0) {
              pend.push_back(static_cast<char>(v));
              ++npend;
            } else {
              flush();
              res.push_back(std::move(t));
            }
          }
          flush();
          toks = std::move(res);
          break;
        }
        case decoder_step::fuse: {
          std::string all;
          for (auto& t : toks) all += t;
          toks = {all};
          break;
        }
        case decoder_step::strip:
          if (single) break;
          for (auto& t : toks) {
            // strip up to `start` leading and `stop` trailing copies of the content character
            std::size_t b = 0, e = t.size();
            for (int i = 0; i < d.start && t.compare(b, d.a.size(), d.a) == 0 && b < e; ++i) b += d.a.size();
            for (int i = 0; i < d.stop && e >= b + d.a.size() && t.compare(e - d.a.size(), d.a.size(), d.a) == 0; ++i)
              e -= d.a.size();
            t = t.substr(b, e - b);
          }
          break;
      }
    }
    return toks;
  }

  std::string decode(std::span<const std::int32_t> ids, bool skip_special) const {
    if (kind == bytes) {
      std::string s;
      for (auto t : ids)
        if (t >= 0 && t < 256) s.push_back(static_cast<char>(t));
      return s;
    }
    if (kind == passthrough) {
      std::string s;
      for (auto t : ids) {
        if (!s.empty()) s.push_back(' ');
        s += std::to_string(t);
      }
      return s;
    }
    std::vector<std::string> toks;
    for (auto id : ids) {
      if (id < 0 || static_cast<std::size_t>(id) >= id_to_token.size() || !has_token[id]) continue;
      if (skip_special && special_ids.count(id)) continue;
      toks.push_back(id_to_token[id]);
    }
    if (!has_decoder) {
      std::string s;
      for (std::size_t i = 0; i < toks.size(); ++i) s += (i ? " " : "") + toks[i];
      return s;
    }
    std::string s;
    for (auto& t : run_decoders(std::move(toks), false)) s += t;
    return s;
  }
};

// ---- loading tokenizer.json -------------------------------------------------------------------------------------

struct loader {
  // Limits on hostile files: the loader recurses over Sequence components and the encoder over pre-tokenizer
  // steps, and nlohmann::json copies and prints recursively, so nesting and length are bounded (real files nest a
  // few levels and have a handful of steps).
  static constexpr int max_depth = 64;                   // Sequences inside Sequences
  static constexpr std::size_t max_steps = 1024;         // components of one pipeline (normalizer, pre_tokenizer, ...)
  static constexpr std::size_t max_json_depth = 512;     // arrays and objects inside one another
  static constexpr std::int64_t id_max = 0x7FFFFFFF;     // ids are std::int32_t
  static constexpr std::int64_t max_id_gap = 1 << 20;    // the largest id may pass the number of tokens by this much
  static constexpr std::size_t max_template_ids = 4096;  // special tokens a post-processor adds to a text

  std::string file;
  mutable std::size_t steps = 0;  // components of the pipeline being read
  [[noreturn]] void fail(const std::string& what) const { throw data_error("tokenizer '" + file + "': " + what); }

  /// Refuses JSON nested deeper than max_json_depth before nlohmann::json parses (and later copies) it.
  void check_json_depth(std::string_view s) const {
    std::size_t depth = 0;
    bool in_string = false;
    for (std::size_t i = 0; i < s.size(); ++i) {
      const char c = s[i];
      if (in_string) {
        if (c == '\\')
          ++i;
        else if (c == '"')
          in_string = false;
      } else if (c == '"') {
        in_string = true;
      } else if (c == '[' || c == '{') {
        if (++depth > max_json_depth)
          fail("JSON nested deeper than " + std::to_string(max_json_depth) + " levels (at byte " + std::to_string(i) +
               "), this port's limit; a tokenizer.json nests a few levels: the file is damaged or not a tokenizer");
      } else if ((c == ']' || c == '}') && depth > 0) {
        --depth;
      }
    }
  }

  /// Guards each component of a pipeline: Sequences nested at most max_depth deep, at most max_steps components.
  void enter(const std::string& where, int depth) const {
    const auto top = where.substr(0, where.find('.'));
    if (depth == 0) steps = 0;
    if (depth > max_depth)
      fail(top + " has Sequences nested more than " + std::to_string(max_depth) +
           " deep, this port's limit: flatten the Sequences (their steps run in order either way)");
    if (++steps > max_steps)
      fail(top + " has more than " + std::to_string(max_steps) + " components, this port's limit");
  }

  /// `v` (named `where` in messages) as an integer in [lo, hi]; anything else (a float, a string, out of range) is
  /// refused naming the key and the value.
  std::int64_t int_in(const nlohmann::json& v, const std::string& where, std::int64_t lo, std::int64_t hi) const {
    bool ok = false;
    std::int64_t x = 0;
    if (v.is_number_unsigned()) {
      const auto u = v.get<std::uint64_t>();
      ok = u <= static_cast<std::uint64_t>(hi);
      x = ok ? static_cast<std::int64_t>(u) : 0;
    } else if (v.is_number_integer()) {
      x = v.get<std::int64_t>();
      ok = true;
    }
    if (!ok || x < lo || x > hi)
      fail(where + " is " + show(v) + ", not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
           "]: the file is damaged or was not written by Hugging Face tokenizers");
    return x;
  }
  std::int32_t id_in(const nlohmann::json& v, const std::string& where) const {
    return static_cast<std::int32_t>(int_in(v, where, 0, id_max));
  }
  /// `s` if it is one character (the library's `char` fields: Metaspace's replacement, Strip's content).
  std::string one_char(std::string s, const std::string& where) const {
    std::size_t len = 0;
    if (s.empty() || (next_cp(s.data(), s.size(), 0, len), len != s.size()))
      fail(where + " is " + show(s) + ", not a single character");
    return s;
  }
  static std::string show(const nlohmann::json& j) {
    auto s = j.dump();
    return s.size() > 200 ? s.substr(0, 200) + "..." : s;
  }
  static std::string str_or(const nlohmann::json& j, const char* key, const std::string& def) {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? def : it->get<std::string>();
  }
  static bool bool_or(const nlohmann::json& j, const char* key, bool def) {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? def : it->get<bool>();
  }
  std::string type_of(const nlohmann::json& j, const std::string& where) const {
    if (!j.is_object() || !j.contains("type")) fail(where + " has no \"type\": " + show(j));
    return j["type"].get<std::string>();
  }
  std::string pattern_string(const nlohmann::json& p, const std::string& where, bool& is_regex) const {
    if (p.contains("String")) {
      is_regex = false;
      return p["String"].get<std::string>();
    }
    if (p.contains("Regex")) {
      is_regex = true;
      return p["Regex"].get<std::string>();
    }
    fail(where + ".pattern must be {\"String\": ...} or {\"Regex\": ...}, not " + show(p));
  }

  void normalizer(impl& t, const nlohmann::json& j, const std::string& where, int depth = 0) const {
    if (j.is_null()) return;
    enter(where, depth);
    const auto type = type_of(j, where);
    if (type == "Sequence") {
      const auto& seq = j.at("normalizers");
      for (std::size_t i = 0; i < seq.size(); ++i)
        normalizer(t, seq.at(i), where + ".normalizers[" + std::to_string(i) + "]", depth + 1);
    } else if (type == "Prepend") {
      t.normalizers.push_back({normalizer_step::prepend, j.at("prepend").get<std::string>(), {}});
    } else if (type == "Replace") {
      bool rx = false;
      auto pat = pattern_string(j.at("pattern"), where, rx);
      if (rx) fail(where + ": Replace with a Regex pattern is not supported (" + show(j["pattern"]) + ")");
      t.normalizers.push_back({normalizer_step::replace, pat, j.at("content").get<std::string>()});
    } else {
      fail(where + ".type \"" + type + "\" is not supported (supported normalizers: Prepend, Replace, Sequence)");
    }
  }

  void pre_tokenizer(impl& t, const nlohmann::json& j, const std::string& where, int depth = 0) const {
    if (j.is_null()) return;
    enter(where, depth);
    const auto type = type_of(j, where);
    if (!t.pretoks.empty() && t.pretoks.back().kind == pretok_step::byte_level)
      fail(where + ": a pre-tokenizer after ByteLevel is not supported");
    pretok_step st;
    if (type == "Sequence") {
      const auto& seq = j.at("pretokenizers");
      for (std::size_t i = 0; i < seq.size(); ++i)
        pre_tokenizer(t, seq.at(i), where + ".pretokenizers[" + std::to_string(i) + "]", depth + 1);
      return;
    } else if (type == "ByteLevel") {
      st.kind = pretok_step::byte_level;
      st.add_prefix_space = bool_or(j, "add_prefix_space", true);
      st.use_regex = bool_or(j, "use_regex", true);
    } else if (type == "Metaspace") {
      st.kind = pretok_step::metaspace;
      st.replacement = one_char(str_or(j, "replacement", "\xE2\x96\x81"), where + ".replacement");
      st.split = bool_or(j, "split", true);
      std::string scheme = str_or(j, "prepend_scheme", "");
      if (scheme.empty()) scheme = bool_or(j, "add_prefix_space", true) ? "always" : "never";
      if (scheme == "always")
        st.prepend_scheme = pretok_step::always;
      else if (scheme == "first")
        st.prepend_scheme = pretok_step::first;
      else if (scheme == "never")
        st.prepend_scheme = pretok_step::never;
      else
        fail(where + ".prepend_scheme \"" + scheme + "\" is not one of always, first, never");
    } else if (type == "Split") {
      bool rx = false;
      auto pat = pattern_string(j.at("pattern"), where, rx);
      if (bool_or(j, "invert", false)) fail(where + ".invert true is not supported");
      const auto beh = str_or(j, "behavior", "Isolated");
      if (beh == "Removed")
        st.behavior = split_behavior::removed;
      else if (beh == "Isolated")
        st.behavior = split_behavior::isolated;
      else if (beh == "MergedWithPrevious")
        st.behavior = split_behavior::merged_with_previous;
      else if (beh == "MergedWithNext")
        st.behavior = split_behavior::merged_with_next;
      else if (beh == "Contiguous")
        st.behavior = split_behavior::contiguous;
      else
        fail(where + ".behavior \"" + beh + "\" is not supported");
      if (!rx) {
        st.kind = pretok_step::split_string;
        st.literal = pat;
      } else {
        st.kind = pretok_step::split_regex;
        if (pat == gpt2_pattern)
          st.pattern = pattern_kind::gpt2;
        else if (pat == llama3_pattern)
          st.pattern = pattern_kind::llama3;
        else if (pat == qwen2_pattern)
          st.pattern = pattern_kind::qwen2;
        else
          fail(where + ".pattern.Regex \"" + pat +
               "\" is not one of the supported split patterns (GPT-2, Llama 3, Qwen 2); only these have scanners");
      }
    } else {
      fail(where + ".type \"" + type +
           "\" is not supported (supported pre-tokenizers: ByteLevel, Metaspace, Split, Sequence)");
    }
    t.pretoks.push_back(std::move(st));
  }

  void decoder(impl& t, const nlohmann::json& j, const std::string& where, int depth = 0) const {
    if (j.is_null()) return;
    enter(where, depth);
    t.has_decoder = true;
    const auto type = type_of(j, where);
    decoder_step d;
    if (type == "Sequence") {
      const auto& seq = j.at("decoders");
      for (std::size_t i = 0; i < seq.size(); ++i)
        decoder(t, seq.at(i), where + ".decoders[" + std::to_string(i) + "]", depth + 1);
      return;
    } else if (type == "ByteLevel") {
      d.kind = decoder_step::byte_level;
    } else if (type == "Metaspace") {
      d.kind = decoder_step::metaspace;
      d.a = one_char(str_or(j, "replacement", "\xE2\x96\x81"), where + ".replacement");
      std::string scheme = str_or(j, "prepend_scheme", "");
      if (scheme.empty()) scheme = bool_or(j, "add_prefix_space", true) ? "always" : "never";
      d.prepend = scheme != "never";
    } else if (type == "Replace") {
      bool rx = false;
      d.kind = decoder_step::replace;
      d.a = pattern_string(j.at("pattern"), where, rx);
      if (rx) fail(where + ": Replace with a Regex pattern is not supported (" + show(j["pattern"]) + ")");
      d.b = j.at("content").get<std::string>();
    } else if (type == "ByteFallback") {
      d.kind = decoder_step::byte_fallback;
    } else if (type == "Fuse") {
      d.kind = decoder_step::fuse;
    } else if (type == "Strip") {
      d.kind = decoder_step::strip;
      d.a = one_char(j.at("content").get<std::string>(), where + ".content");
      d.start = static_cast<int>(int_in(j.value("start", nlohmann::json(0)), where + ".start", 0, id_max));
      d.stop = static_cast<int>(int_in(j.value("stop", nlohmann::json(0)), where + ".stop", 0, id_max));
    } else {
      fail(where + ".type \"" + type +
           "\" is not supported (supported decoders: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, "
           "Sequence)");
    }
    t.decoders.push_back(std::move(d));
  }

  /// The id of a Roberta/Bert processor's [token, id] pair.
  std::int32_t special_id(const nlohmann::json& tok, const std::string& where) const {
    if (tok.is_array() && tok.size() == 2) return id_in(tok[1], where + "[1]");
    fail(where + " is not a [token, id] pair: " + show(tok));
  }

  void post_processor(impl& t, const nlohmann::json& j, const std::string& where, int depth = 0) const {
    if (j.is_null()) return;
    enter(where, depth);
    const auto type = type_of(j, where);
    if (type == "Sequence") {
      const auto& seq = j.at("processors");
      for (std::size_t i = 0; i < seq.size(); ++i)
        post_processor(t, seq.at(i), where + ".processors[" + std::to_string(i) + "]", depth + 1);
    } else if (type == "ByteLevel") {
      // offsets only
    } else if (type == "TemplateProcessing") {
      bool seen_a = false;
      const auto& single = j.at("single");
      for (std::size_t i = 0; i < single.size(); ++i) {
        const auto& piece = single.at(i);
        const auto at = where + ".single[" + std::to_string(i) + "]";
        if (piece.contains("Sequence")) {
          if (piece["Sequence"].value("id", "A") != "A") fail(where + ".single uses sequence B");
          int_in(piece["Sequence"].value("type_id", nlohmann::json(0)), at + ".Sequence.type_id", 0, 0xFFFFFFFF);
          seen_a = true;
        } else if (piece.contains("SpecialToken")) {
          const auto name = piece["SpecialToken"].at("id").get<std::string>();
          int_in(piece["SpecialToken"].value("type_id", nlohmann::json(0)), at + ".SpecialToken.type_id", 0,
                 0xFFFFFFFF);
          const auto& sp = j.at("special_tokens");
          if (!sp.contains(name))
            fail(where + ".single names special token \"" + name + "\" missing from special_tokens");
          auto& dst = seen_a ? t.suffix_ids : t.prefix_ids;
          const auto& ids = sp[name].at("ids");
          for (std::size_t k = 0; k < ids.size(); ++k) {
            if (t.prefix_ids.size() + t.suffix_ids.size() >= max_template_ids)
              fail(where + " adds more than " + std::to_string(max_template_ids) +
                   " special tokens to each text, this port's limit");
            dst.push_back(id_in(ids.at(k), where + ".special_tokens[\"" + name + "\"].ids[" + std::to_string(k) + "]"));
          }
        } else {
          fail(where + ".single has an unknown piece " + show(piece));
        }
      }
    } else if (type == "RobertaProcessing" || type == "BertProcessing") {
      t.prefix_ids.push_back(special_id(j.at("cls"), where + ".cls"));
      t.suffix_ids.push_back(special_id(j.at("sep"), where + ".sep"));
    } else {
      fail(where + ".type \"" + type +
           "\" is not supported (supported post-processors: ByteLevel, TemplateProcessing, RobertaProcessing, "
           "BertProcessing, Sequence)");
    }
  }

  void model(impl& t, const nlohmann::json& m) const {
    const auto type = str_or(m, "type", "BPE");
    if (type != "BPE")
      fail("model.type \"" + type +
           "\" is not supported (only BPE models are; WordPiece, Unigram and WordLevel are not)");
    if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
      fail("model.dropout " + show(m["dropout"]) + " is not supported (must be null)");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (!str_or(m, key, "").empty())
        fail(std::string("model.") + key + " " + show(m[key]) + " is not supported (must be null or \"\")");
    t.fuse_unk = bool_or(m, "fuse_unk", false);
    t.byte_fallback = bool_or(m, "byte_fallback", false);
    t.ignore_merges = bool_or(m, "ignore_merges", false);
    t.unk_token = str_or(m, "unk_token", "");
    const auto& vocab = m.at("vocab");
    if (!vocab.is_object()) fail("model.vocab must be an object of token: id, not " + show(vocab));
    for (const auto& [tok, id] : vocab.items()) {
      const bool plain = id.is_number_unsigned() && id.get<std::uint64_t>() <= static_cast<std::uint64_t>(id_max);
      t.vocab.emplace(tok, plain ? id.get<std::int32_t>() : id_in(id, "model.vocab[" + show(tok) + "]"));
    }
    if (!t.unk_token.empty()) {
      if (auto it = t.vocab.find(t.unk_token); it != t.vocab.end()) t.unk_id = it->second;
    }
    auto vid = [&](const std::string& s, std::size_t i) {
      auto it = t.vocab.find(s);
      if (it == t.vocab.end())
        fail("model.merges[" + std::to_string(i) + "] uses \"" + s + "\", which is not in model.vocab");
      return it->second;
    };
    const auto& merges = m.at("merges");
    if (!merges.is_array()) fail("model.merges must be an array, not " + show(merges));
    t.merges.reserve(merges.size() * 2);
    for (std::size_t i = 0; i < merges.size(); ++i) {
      std::string a, b;
      if (merges[i].is_string()) {
        const auto s = merges[i].get<std::string>();
        const auto sp = s.find(' ');
        if (sp == std::string::npos) fail("model.merges[" + std::to_string(i) + "] \"" + s + "\" is not \"a b\"");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else {
        a = merges[i].at(0).get<std::string>();
        b = merges[i].at(1).get<std::string>();
      }
      const auto ia = vid(a, i), ib = vid(b, i), inew = vid(a + b, i);
      t.merges[(static_cast<std::uint64_t>(static_cast<std::uint32_t>(ia)) << 32) | static_cast<std::uint32_t>(ib)] =
          merge_entry{static_cast<std::int32_t>(i), inew};
    }
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "<0x%02X>", b);
      auto it = t.vocab.find(std::string_view(buf));
      t.fallback_id[b] = it == t.vocab.end() ? -1 : it->second;
    }
  }

  void load(impl& t, const std::string& path) {
    namespace fs = std::filesystem;
    file = path;
    if (fs::is_directory(path)) file = (fs::path(path) / "tokenizer.json").string();
    std::ifstream in(file, std::ios::binary);
    if (!in)
      throw data_error("tokenizer '" + file +
                       "' not found or not readable (give a tokenizer.json or a directory holding one)");
    std::stringstream ss;
    ss << in.rdbuf();
    load_text(t, ss.str(), path);
    special_tokens(t, fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path());
  }

  /// Loads the text of a tokenizer.json (`file` names it in messages); `name` becomes tokenizer::name().
  void load_text(impl& t, std::string_view bytes, const std::string& name) {
    check_json_depth(bytes);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(bytes);
    } catch (const std::exception& e) {
      fail(std::string("not valid JSON: ") + e.what());
    }
    t.name = name;
    t.hash = sha256_hex(bytes);
    try {
      for (const char* key : {"truncation", "padding"})
        if (j.contains(key) && !j[key].is_null())
          fail(std::string(key) + " " + show(j[key]) + " is not supported (must be null)");
      model(t, j.at("model"));
      const auto norm = j.value("normalizer", nlohmann::json());
      normalizer(t, norm, "normalizer");
      // What upstream's BatchTokenizer._needs_long_sequence_workaround tests: the normalizer's Python class.
      t.long_text_workaround =
          norm.is_object() && (norm.value("type", "") == "Replace" || norm.value("type", "") == "Sequence");
      pre_tokenizer(t, j.value("pre_tokenizer", nlohmann::json()), "pre_tokenizer");
      post_processor(t, j.value("post_processor", nlohmann::json()), "post_processor");
      decoder(t, j.value("decoder", nlohmann::json()), "decoder");
      // Added tokens as the library's AddedVocabulary::add_tokens takes them: empty ones are ignored; a token whose
      // content is already a token keeps that id, a new one gets the next id after the model vocabulary (the file's
      // "id" is only range-checked); a later entry for the same id replaces the earlier one's flags (special stays
      // special), and a normalized one is matched, and decoded, as its normalized content.
      std::int64_t max_id = -1, next_id = static_cast<std::int64_t>(t.vocab.size());
      for (const auto& [tok, id] : t.vocab) max_id = std::max<std::int64_t>(max_id, id);
      std::map<std::int32_t, added_token> by_id;
      std::unordered_map<std::int32_t, std::string> normalized_text;
      std::size_t budget = growth_cap(bytes.size());  // for the normalized contents
      const auto& added = j.contains("added_tokens") ? j.at("added_tokens") : nlohmann::json::array();
      for (std::size_t i = 0; i < added.size(); ++i) {
        const auto& a = added.at(i);
        if (a.contains("id")) id_in(a.at("id"), "added_tokens[" + std::to_string(i) + "].id");
        added_token at{a.at("content").get<std::string>(),
                       -1,
                       bool_or(a, "special", false),
                       bool_or(a, "lstrip", false),
                       bool_or(a, "rstrip", false),
                       bool_or(a, "single_word", false),
                       bool_or(a, "normalized", !bool_or(a, "special", false))};
        if (at.content.empty()) continue;
        if (auto it = t.added_by_content.find(at.content); it != t.added_by_content.end())
          at.id = it->second;
        else if (auto iv = t.vocab.find(at.content); iv != t.vocab.end())
          at.id = iv->second;
        else if (next_id > id_max)
          fail("added_tokens[" + std::to_string(i) + "] would get id " + std::to_string(next_id) +
               ", past the largest id this port supports (" + std::to_string(id_max) + ")");
        else
          at.id = static_cast<std::int32_t>(next_id++);
        max_id = std::max<std::int64_t>(max_id, at.id);
        t.added_by_content[at.content] = at.id;
        if (at.special) t.special_ids.insert(at.id);
        if (at.normalized)
          if (auto n = t.normalize(at.content, budget); n != at.content) normalized_text[at.id] = std::move(n);
        by_id.insert_or_assign(at.id, std::move(at));
      }
      // tables indexed by id: a few sparse ids are fine, ids far past the number of tokens are refused
      const auto count = static_cast<std::int64_t>(t.vocab.size() + by_id.size());
      if (max_id >= count + max_id_gap)
        fail("the largest token id is " + std::to_string(max_id) + " but there are only " + std::to_string(count) +
             " tokens; ids more than " + std::to_string(max_id_gap) +
             " past the number of tokens are not supported (renumber model.vocab densely from 0)");
      t.id_to_token.assign(static_cast<std::size_t>(max_id + 1), {});
      t.has_token.assign(static_cast<std::size_t>(max_id + 1), 0);
      std::unordered_set<std::string> names;
      for (const auto& [tok, id] : t.vocab) {
        t.id_to_token[id] = tok;
        t.has_token[id] = 1;
        names.insert(tok);
      }
      for (const auto& [tok, id] : t.added_by_content) names.insert(tok);
      for (auto& [id, at] : by_id) {
        const auto n = normalized_text.find(id);
        const std::string& shown = n != normalized_text.end() ? n->second : at.content;
        const auto index = static_cast<std::int32_t>(t.added.size());
        t.id_to_token[id] = shown;
        t.has_token[id] = 1;
        if (at.normalized)
          t.norm_trie.insert(shown, index);
        else
          t.raw_trie.insert(at.content, index);
        t.added.push_back(std::move(at));
      }
      t.vocab_size = static_cast<std::int64_t>(names.size());
      // byte-level symbols when the pre-tokenizer ends with ByteLevel
      t.byte_symbols = !t.pretoks.empty() && t.pretoks.back().kind == pretok_step::byte_level;
      if (t.byte_symbols) {
        for (int b = 0; b < 256; ++b) {
          std::string s;
          append_utf8(s, byte_to_char()[b]);
          auto it = t.vocab.find(s);
          t.byte_symbol_id[b] = it == t.vocab.end() ? -1 : it->second;
          t.byte_symbol_str[b] = s;
        }
        if (t.ignore_merges)
          for (const auto& [tok, id] : t.vocab)
            if (auto raw = byte_level_to_bytes(tok)) t.raw_vocab.emplace(*raw, id);
      }
    } catch (const nlohmann::json::exception& e) {
      fail(std::string("unexpected structure: ") + e.what());
    }
  }

  /// bos/eos from tokenizer_config.json in `dir` (if given), else well-known names; whether the template adds them.
  static void special_tokens(impl& t, const std::optional<std::filesystem::path>& dir) {
    namespace fs = std::filesystem;
    auto id_of = [&](const std::string& s) -> std::optional<std::int32_t> {
      if (auto it = t.added_by_content.find(s); it != t.added_by_content.end()) return it->second;
      if (auto it = t.vocab.find(s); it != t.vocab.end()) return it->second;
      return std::nullopt;
    };
    const fs::path cfg = dir ? *dir / "tokenizer_config.json" : fs::path();
    bool bos_decided = false, eos_decided = false;
    if (dir && fs::exists(cfg)) {
      std::ifstream in(cfg);
      nlohmann::json c;
      try {
        c = nlohmann::json::parse(in);
      } catch (const std::exception& e) {
        throw data_error("tokenizer config '" + cfg.string() + "': not valid JSON: " + e.what());
      }
      // A key the file sets decides: a token (a string, or an AddedToken dict with its "content") must be in the
      // vocabulary, null means none (as transformers reads it: no guessing from well-known names then); anything
      // else is refused, naming the file and the key, rather than read differently from transformers.
      auto set_from = [&](const char* key, std::optional<std::int32_t>& id, std::string& text, bool& decided) {
        if (!c.is_object() || !c.contains(key)) return;
        decided = true;
        const auto& v = c[key];
        if (v.is_null()) return;
        std::optional<std::string> name;
        if (v.is_string()) name = v.get<std::string>();
        if (v.is_object() && v.contains("content") && v["content"].is_string()) name = v["content"].get<std::string>();
        if (!name)
          throw data_error("tokenizer config '" + cfg.string() + "': '" + key + "' is " + v.dump() +
                           "; give the token as a string (or {\"content\": ...}), or null for none");
        id = id_of(*name);
        if (!id)
          throw data_error("tokenizer config '" + cfg.string() + "': '" + key + "' is '" + *name +
                           "', which is not a token of this tokenizer's vocabulary");
        text = *name;
      };
      set_from("bos_token", t.bos, t.bos_text, bos_decided);
      set_from("eos_token", t.eos, t.eos_text, eos_decided);
      // transformers passes its special_tokens_map to chat templates: the tokens the config sets, as text.
      for (const char* key : {"unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
        if (!c.is_object() || !c.contains(key)) continue;
        const auto& v = c[key];
        if (v.is_string()) t.template_tokens.emplace_back(key, v.get<std::string>());
        if (v.is_object() && v.contains("content") && v["content"].is_string())
          t.template_tokens.emplace_back(key, v["content"].get<std::string>());
      }
      if (c.is_object() && c.contains("chat_template")) {
        const auto& v = c["chat_template"];
        if (v.is_string()) {
          t.chat_template = v.get<std::string>();
        } else if (v.is_array()) {  // named templates: transformers uses the one named "default"
          for (const auto& e : v)
            if (e.is_object() && e.value("name", nlohmann::json()) == "default" && e.contains("template") &&
                e["template"].is_string())
              t.chat_template = e["template"].get<std::string>();
          if (!t.chat_template)
            throw data_error("tokenizer config '" + cfg.string() + "': 'chat_template' is a list without a template " +
                             "named \"default\"; name one \"default\" or give the template in the data format's " +
                             "chat_template");
        } else if (!v.is_null()) {
          throw data_error("tokenizer config '" + cfg.string() + "': 'chat_template' is " + v.dump().substr(0, 80) +
                           "; give the template as a string");
        }
      }
    }
    if (dir && fs::exists(*dir / "chat_template.jinja")) {  // newer transformers keep the template apart
      std::ifstream in(*dir / "chat_template.jinja", std::ios::binary);
      t.chat_template = std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    if (t.bos) t.template_tokens.insert(t.template_tokens.begin(), {"bos_token", t.bos_text});
    if (t.eos) t.template_tokens.insert(t.template_tokens.begin() + (t.bos ? 1 : 0), {"eos_token", t.eos_text});
    if (!t.bos && !bos_decided)
      for (const char* s : {"<|begin_of_text|>", "<s>", "<|startoftext|>", "<bos>"})
        if ((t.bos = id_of(s))) {
          t.bos_text = s;
          break;
        }
    if (!t.eos && !eos_decided)
      for (const char* s : {"<|end_of_text|>", "</s>", "<|endoftext|>", "<eos>"})
        if ((t.eos = id_of(s))) {
          t.eos_text = s;
          break;
        }
    auto has = [](const std::vector<std::int32_t>& v, std::optional<std::int32_t> x) {
      return x && std::find(v.begin(), v.end(), *x) != v.end();
    };
    t.adds_bos = has(t.prefix_ids, t.bos);
    t.adds_eos = has(t.suffix_ids, t.eos);
  }
};

}  // namespace detail::tok

// ---- tokenizer -------------------------------------------------------------------------------------------------

tokenizer::tokenizer(std::shared_ptr<const detail::tok::impl> p) : p_(std::move(p)) {}

tokenizer tokenizer::from_file(const std::string& path) {
  auto t = std::make_shared<detail::tok::impl>();
  detail::tok::loader{}.load(*t, path);
  return tokenizer(std::move(t));
}

tokenizer tokenizer::from_json(std::string_view json, const std::string& name) {
  auto t = std::make_shared<detail::tok::impl>();
  detail::tok::loader l;
  l.file = name;
  l.load_text(*t, json, name);
  l.special_tokens(*t, std::nullopt);
  return tokenizer(std::move(t));
}

tokenizer tokenizer::byte_level() {
  auto t = std::make_shared<detail::tok::impl>();
  t->kind = detail::tok::impl::bytes;
  t->name = "byte";
  t->hash = detail::tok::sha256_hex("levanter byte-level tokenizer: 0..255 bytes, 256 eos");
  t->vocab_size = 257;
  t->eos = 256;
  return tokenizer(std::move(t));
}

tokenizer tokenizer::passthrough(std::int64_t vocab_size) {
  if (vocab_size <= 0) throw data_error("passthrough tokenizer: vocab_size must be positive (set data.vocab_size)");
  auto t = std::make_shared<detail::tok::impl>();
  t->kind = detail::tok::impl::passthrough;
  t->name = "passthrough";
  t->hash = detail::tok::sha256_hex("levanter passthrough tokenizer " + std::to_string(vocab_size));
  t->vocab_size = vocab_size;
  return tokenizer(std::move(t));
}

std::vector<std::int32_t> tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return p_->encode(text, add_special_tokens);
}

std::vector<std::vector<std::int32_t>> tokenizer::encode_batch(const std::vector<std::string>& texts, int num_threads,
                                                               bool add_special_tokens) const {
  std::vector<std::vector<std::int32_t>> out(texts.size());
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::size_t n = texts.size();
  const std::size_t nt = std::min<std::size_t>(static_cast<std::size_t>(num_threads), std::max<std::size_t>(n, 1));
  if (nt <= 1) {
    for (std::size_t i = 0; i < n; ++i) out[i] = encode(texts[i], add_special_tokens);
    return out;
  }
  std::atomic<std::size_t> next{0};
  std::vector<std::exception_ptr> errors(nt);
  auto work = [&](std::size_t w) {
    auto cache = p_->borrow_cache();
    cache->owner = p_->instance;
    try {
      constexpr std::size_t chunk = 16;
      for (std::size_t b; (b = next.fetch_add(chunk)) < n;)
        for (std::size_t i = b; i < std::min(n, b + chunk); ++i)
          out[i] = p_->encode(texts[i], add_special_tokens, cache.get());
    } catch (...) {
      errors[w] = std::current_exception();
    }
    p_->return_cache(std::move(cache));
  };
  std::vector<std::thread> threads;
  for (std::size_t w = 1; w < nt; ++w) threads.emplace_back(work, w);
  work(0);
  for (auto& th : threads) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

std::string tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special_tokens) const {
  return p_->decode(ids, skip_special_tokens);
}

std::int64_t tokenizer::vocab_size() const { return p_->vocab_size; }
std::optional<std::int32_t> tokenizer::bos_id() const { return p_->bos; }
std::optional<std::int32_t> tokenizer::eos_id() const { return p_->eos; }
bool tokenizer::adds_bos() const { return p_->adds_bos; }
bool tokenizer::adds_eos() const { return p_->adds_eos; }
std::optional<std::string> tokenizer::bos_token() const {
  if (p_->kind != detail::tok::impl::bpe || !p_->bos) return std::nullopt;
  return p_->bos_text;
}
std::optional<std::string> tokenizer::eos_token() const {
  if (p_->kind != detail::tok::impl::bpe || !p_->eos) return std::nullopt;
  return p_->eos_text;
}
bool tokenizer::splits_long_texts() const { return p_->long_text_workaround; }
const std::optional<std::string>& tokenizer::chat_template() const { return p_->chat_template; }
const std::vector<std::pair<std::string, std::string>>& tokenizer::template_tokens() const {
  return p_->template_tokens;
}

std::vector<std::int64_t> tokenizer::token_ends(std::span<const std::int32_t> ids, std::string_view text) const {
  const auto& t = *p_;
  if (t.kind == detail::tok::impl::passthrough)
    throw data_error("tokenizer 'passthrough' reads ids, not text: chat data needs a text tokenizer");
  std::vector<std::int64_t> ends;
  ends.reserve(ids.size());
  std::size_t k = 0;  // the next token to place
  auto fail = [&](const std::string& why) -> void {
    const std::string which = k < ids.size() ? "token " + std::to_string(k) + " (id " + std::to_string(ids[k]) + ")"
                                             : "the end of the tokens";
    throw data_error("tokenizer '" + t.name + "': " + which + " " + why +
                     "; chat loss masks map the template's text to the tokens that encode it (the ids must be "
                     "this tokenizer's encoding of the text, without added BOS/EOS)");
  };
  if (t.kind == detail::tok::impl::bytes) {
    if (ids.size() != text.size()) fail("does not match the text's " + std::to_string(text.size()) + " bytes");
    for (k = 0; k < ids.size(); ++k) {
      if (ids[k] != static_cast<unsigned char>(text[k])) fail("is not the text's byte " + std::to_string(k));
      ends.push_back(static_cast<std::int64_t>(k + 1));
    }
    return ends;
  }
  // The text is split, normalized and pre-tokenized as encode() does, each byte carrying its alignment (the end of
  // its character in `text`); the tokens of each piece must spell it, and a token ends where its last byte's
  // character ends (transformers' offset mapping: a prefix the normalizer adds belongs to the first character, a
  // replacement to the character it replaced).
  auto take_added = [&](std::int32_t id, std::int64_t end) {
    if (k >= ids.size() || ids[k] != id) fail("is not the added token " + std::to_string(id) + " of the text");
    ends.push_back(end);
    ++k;
  };
  auto spelling = [&](std::int32_t id, std::string& out) -> bool {
    if (id < 0 || static_cast<std::size_t>(id) >= t.id_to_token.size() || !t.has_token[id]) return false;
    const auto& tok = t.id_to_token[id];
    if (t.byte_symbols) {
      auto raw = detail::tok::byte_level_to_bytes(tok);
      if (!raw) return false;
      out = std::move(*raw);
      return true;
    }
    if (t.byte_fallback && tok.size() == 6 && tok.compare(0, 3, "<0x") == 0 && tok[5] == '>' &&
        std::isxdigit(static_cast<unsigned char>(tok[3])) && std::isxdigit(static_cast<unsigned char>(tok[4]))) {
      out.assign(1, static_cast<char>(std::stoi(tok.substr(3, 2), nullptr, 16)));
      return true;
    }
    out = tok;
    return true;
  };
  std::string piece_of_token;
  auto take_text = [&](std::string_view piece, const std::int64_t* al) {
    for (std::size_t pos = 0; pos < piece.size();) {
      if (k >= ids.size()) fail("is reached before the text's byte " + std::to_string(al[pos] - 1) + " is encoded");
      if (t.unk_id && ids[k] == *t.unk_id) fail("is the unknown token, whose text cannot be placed");
      if (!spelling(ids[k], piece_of_token)) fail("is not a token of the vocabulary");
      if (piece_of_token.empty() || piece.compare(pos, piece_of_token.size(), piece_of_token) != 0)
        fail("does not spell the text at byte " + std::to_string(al[pos] - 1));
      pos += piece_of_token.size();
      ends.push_back(al[pos - 1]);
      ++k;
    }
  };
  auto char_ends = [&](std::string_view piece, std::size_t offset) {
    std::vector<std::int64_t> al(piece.size());
    std::size_t len = 0;
    for (std::size_t i = 0; i < piece.size(); i += len) {
      detail::tok::next_cp(piece.data(), piece.size(), i, len);
      std::fill(al.begin() + static_cast<std::ptrdiff_t>(i), al.begin() + static_cast<std::ptrdiff_t>(i + len),
                static_cast<std::int64_t>(offset + i + len));
    }
    return al;
  };
  std::size_t budget = detail::tok::growth_cap(text.size());
  auto emit = [&](std::string_view piece, const std::int64_t* al) { take_text(piece, al); };
  t.split_added(text, t.raw_trie, [&](std::string_view piece, std::int32_t id, std::size_t offset) {
    if (id >= 0) {  // an added token's span covers the white space lstrip / rstrip gave it
      take_added(id, static_cast<std::int64_t>(offset + piece.size()));
      return;
    }
    auto al = char_ends(piece, offset);
    const std::string normed = t.normalizers.empty() ? std::string(piece) : t.normalize(piece, budget, &al);
    t.split_added(normed, t.norm_trie, [&](std::string_view p2, std::int32_t id2, std::size_t off2) {
      if (id2 >= 0)
        take_added(id2, al[off2 + p2.size() - 1]);
      else
        t.pretokenize(0, p2, offset == 0 && off2 == 0, emit, al.data() + off2);
    });
  });
  if (k != ids.size()) fail("is past the text's end: the tokens spell more than the text");
  return ends;
}
bool tokenizer::is_builtin() const { return p_->kind != detail::tok::impl::bpe; }
const std::string& tokenizer::name() const { return p_->name; }
std::string tokenizer::content_hash() const { return p_->hash; }

std::optional<std::int32_t> tokenizer::token_to_id(std::string_view token) const {
  const auto& t = *p_;
  if (t.kind == detail::tok::impl::bytes) {
    if (token.size() == 1) return static_cast<unsigned char>(token[0]);
    return std::nullopt;
  }
  if (t.kind == detail::tok::impl::passthrough) {
    std::int64_t v = 0;
    if (token.empty() || token.size() > 18) return std::nullopt;
    for (char c : token) {
      if (c < '0' || c > '9') return std::nullopt;
      v = v * 10 + (c - '0');
    }
    if (v >= t.vocab_size) return std::nullopt;
    return static_cast<std::int32_t>(v);
  }
  if (auto it = t.added_by_content.find(token); it != t.added_by_content.end()) return it->second;
  if (auto it = t.vocab.find(token); it != t.vocab.end()) return it->second;
  return std::nullopt;
}

std::string tokenizer::token_text(std::int32_t id) const {
  const auto& t = *p_;
  if (t.kind == detail::tok::impl::bytes) {
    if (id < 0 || id >= 256) return {};
    return detail::tok::utf8_lossy(std::string(1, static_cast<char>(id)));
  }
  if (t.kind == detail::tok::impl::passthrough) return std::to_string(id);
  if (id < 0 || static_cast<std::size_t>(id) >= t.id_to_token.size() || !t.has_token[id]) return {};
  if (!t.has_decoder) return t.id_to_token[id];
  std::string s;
  for (auto& x : t.run_decoders({t.id_to_token[id]}, true)) s += x;
  return s;
}

std::int64_t tokenizer::token_byte_length(std::int32_t id) const {
  const auto& t = *p_;
  if (t.kind == detail::tok::impl::bytes) return id >= 0 && id < 256 ? 1 : 0;
  if (t.kind == detail::tok::impl::passthrough) return 0;
  if (id < 0 || static_cast<std::size_t>(id) >= t.id_to_token.size() || !t.has_token[id]) return 0;
  if (t.special_ids.count(id)) return 0;
  const auto& tok = t.id_to_token[id];
  if (t.byte_symbols && !t.added_by_content.count(tok))
    if (auto raw = detail::tok::byte_level_to_bytes(tok)) return static_cast<std::int64_t>(raw->size());
  if (t.byte_fallback && tok.size() == 6 && tok.compare(0, 3, "<0x") == 0 && tok[5] == '>') return 1;
  std::string s = tok, r;
  for (std::size_t k = 0; k < t.decoders.size(); ++k) {
    const auto& d = t.decoders[k];
    if (d.kind == detail::tok::decoder_step::replace || d.kind == detail::tok::decoder_step::metaspace) {
      const std::string_view to = d.kind == detail::tok::decoder_step::replace ? std::string_view(d.b) : " ";
      if (!detail::tok::replace_all(s, d.a, to, r, detail::tok::growth_cap(tok.size()))) t.too_long("decoder", k, tok);
      s.swap(r);
    }
  }
  return static_cast<std::int64_t>(s.size());
}

}  // namespace levanter::data
