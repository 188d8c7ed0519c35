// tests/tokenizer_corpus.hpp: the deterministic text generator of tests/oracle/gen_tokenizer_golden.py, byte for
// byte (splitmix64 per document; English words, whitespace runs, punctuation, digits, contractions, several
// scripts, emoji with ZWJ and skin tones, combining marks, special-token strings, very long words and documents).
// The script writes the FNV-1a-64 of the whole corpus to tests/golden/tokenizers/corpus.txt; test_tokenizer.cpp
// checks that this file reproduces it. Change both files together.
//
//   std::string doc = tokcorpus::gen_doc(17);   // document 17 of the golden corpus
#pragma once

#include <array>
#include <cstdint>
#include <levanter/data/detail/utf8.hpp>
#include <span>
#include <string>
#include <string_view>

namespace tokcorpus {

inline constexpr std::uint64_t fnv_offset = 0xcbf29ce484222325ULL;

/// FNV-1a-64 of `bytes`, continuing from `h`.
inline std::uint64_t fnv1a64(std::string_view bytes, std::uint64_t h = fnv_offset) {
  for (unsigned char b : bytes) h = (h ^ b) * 0x100000001b3ULL;
  return h;
}

/// FNV-1a-64 of ids as int32 little-endian bytes.
inline std::uint64_t fnv_ids(std::span<const std::int32_t> ids) {
  std::uint64_t h = fnv_offset;
  for (std::int32_t id : ids) {
    const auto u = static_cast<std::uint32_t>(id);
    for (int k = 0; k < 4; ++k) h = (h ^ ((u >> (8 * k)) & 0xFF)) * 0x100000001b3ULL;
  }
  return h;
}

/// splitmix64.
struct rng {
  std::uint64_t s;
  std::uint64_t next() {
    s += 0x9E3779B97F4A7C15ULL;
    std::uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  std::uint64_t below(std::uint64_t n) { return next() % n; }
};

inline void put_cp(std::string& out, std::uint32_t c) { levanter::data::detail::append_utf8(out, c); }

namespace detail {

// The tables below are the script's WORDS, WS, PUNCT, SUFFIXES, SPECIALS, FRAGMENTS, SCRIPTS, ... in order.
inline constexpr std::string_view words[] = {"the",
                                             "of",
                                             "and",
                                             "to",
                                             "in",
                                             "is",
                                             "was",
                                             "that",
                                             "for",
                                             "it",
                                             "with",
                                             "as",
                                             "his",
                                             "on",
                                             "be",
                                             "at",
                                             "by",
                                             "had",
                                             "are",
                                             "but",
                                             "from",
                                             "or",
                                             "have",
                                             "an",
                                             "they",
                                             "which",
                                             "one",
                                             "you",
                                             "were",
                                             "her",
                                             "all",
                                             "she",
                                             "there",
                                             "would",
                                             "their",
                                             "we",
                                             "him",
                                             "been",
                                             "has",
                                             "when",
                                             "who",
                                             "will",
                                             "more",
                                             "no",
                                             "if",
                                             "out",
                                             "so",
                                             "said",
                                             "what",
                                             "up",
                                             "its",
                                             "about",
                                             "into",
                                             "than",
                                             "them",
                                             "can",
                                             "only",
                                             "other",
                                             "new",
                                             "some",
                                             "could",
                                             "time",
                                             "these",
                                             "two",
                                             "may",
                                             "then",
                                             "do",
                                             "first",
                                             "any",
                                             "my",
                                             "now",
                                             "such",
                                             "like",
                                             "our",
                                             "over",
                                             "man",
                                             "me",
                                             "even",
                                             "most",
                                             "made",
                                             "after",
                                             "also",
                                             "did",
                                             "many",
                                             "before",
                                             "must",
                                             "through",
                                             "back",
                                             "years",
                                             "where",
                                             "much",
                                             "your",
                                             "way",
                                             "well",
                                             "down",
                                             "should",
                                             "because",
                                             "each",
                                             "just",
                                             "those",
                                             "people",
                                             "how",
                                             "too",
                                             "little",
                                             "state",
                                             "good",
                                             "very",
                                             "make",
                                             "world",
                                             "still",
                                             "own",
                                             "see",
                                             "men",
                                             "work",
                                             "long",
                                             "get",
                                             "here",
                                             "between",
                                             "both",
                                             "life",
                                             "being",
                                             "under",
                                             "never",
                                             "day",
                                             "same",
                                             "another",
                                             "know",
                                             "while",
                                             "last",
                                             "might",
                                             "us",
                                             "great",
                                             "old",
                                             "year",
                                             "off",
                                             "come",
                                             "since",
                                             "against",
                                             "go",
                                             "came",
                                             "right",
                                             "used",
                                             "take",
                                             "three",
                                             "tokenizer",
                                             "levanter",
                                             "haliax",
                                             "transformer",
                                             "attention",
                                             "gradient",
                                             "internationalization"};
inline constexpr std::string_view ws[] = {" ",    "  ",   "\t",   "\n",       "\r\n",   "\n\n",   "   ",
                                          " \n",  "\r",   " \t ", "\u00a0",   "\u3000", "\u2009", "\n   ",
                                          "\t\t", "\x0b", "\x0c", "\xc2\x85", "\u2028", "    "};
inline constexpr std::string_view punct = ".,;:!?-()[]{}\"'/\\@#$%^&*_+=<>|~`";
inline constexpr std::string_view suffixes[] = {"'s",  "'t",  "'re", "'ve", "'m", "'ll", "'d", "'S",     "'T",
                                                "'RE", "'VE", "'M",  "'LL", "'D", "'Ll", "'x", "\u2019s"};
inline constexpr std::string_view specials[] = {"<|endoftext|>",   "<s>",   "</s>",         "<|begin_of_text|>",
                                                "<|end_of_text|>", "<unk>", "<|endoftext|", "<s",
                                                "<tool>",          "[MASK]"};
inline constexpr std::string_view fragments[] = {"http://www.example.com/a?b=c&d=1",
                                                 "foo_bar",
                                                 "x=1;",
                                                 "3.14159",
                                                 "e-mail",
                                                 "O'Neil",
                                                 "l'\u00e9t\u00e9",
                                                 "i++",
                                                 "a->b",
                                                 "#include <vector>",
                                                 "    return 0;",
                                                 "<0x41>",
                                                 "\u2581already\u2581spaced",
                                                 "C:\\path\\x",
                                                 "snake_case_name",
                                                 "CamelCaseName",
                                                 "1,000,000",
                                                 "10:30pm",
                                                 "$5.00",
                                                 "--flag=value",
                                                 "::",
                                                 "..."};
struct block {
  std::uint32_t start, count;
};
inline constexpr block scripts[] = {{0xC0, 64},      {0x100, 128},    {0x3B1, 25}, {0x410, 64},  {0x621, 26},
                                    {0x5D0, 27},     {0x915, 37},     {0xE01, 46}, {0x3041, 83}, {0x30A1, 90},
                                    {0x4E00, 20902}, {0xAC00, 11172}, {0x561, 38}};
inline constexpr std::size_t devanagari = 6;
inline constexpr block digit_blocks[] = {{0x660, 10}, {0x966, 10}, {0xFF10, 10}, {0x30, 10}};
inline constexpr std::uint32_t number_misc[] = {0xB2, 0xB3, 0xB9, 0xBD, 0xBC, 0x2160, 0x2161, 0x216B};
inline constexpr std::uint32_t hands[] = {0x1F44B, 0x1F44C, 0x1F44D, 0x1F44E, 0x1F44F, 0x1F450};
// word ws punct digits contraction uni emoji combining special odddigit long frag
inline constexpr std::array<std::uint32_t, 12> styles[] = {
    {40, 14, 10, 6, 6, 4, 1, 1, 1, 1, 1, 3},
    {10, 10, 4, 3, 2, 30, 6, 5, 1, 3, 1, 2},
    {15, 25, 15, 8, 3, 3, 1, 1, 2, 1, 1, 12},
    {10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 3, 10},
};

template <class T, std::size_t N>
constexpr std::uint64_t len(const T (&)[N]) {
  return N;
}

inline std::size_t pick(rng& r, const std::array<std::uint32_t, 12>& w) {
  std::uint64_t total = 0;
  for (auto x : w) total += x;
  std::uint64_t x = r.below(total);
  for (std::size_t k = 0; k < w.size(); ++k) {
    if (x < w[k]) return k;
    x -= w[k];
  }
  return w.size() - 1;
}

inline void gen_word(rng& r, std::string& d) {
  std::string w(words[r.below(len(words))]);
  const auto c = r.below(8);
  if (c == 0) {
    w[0] = static_cast<char>(w[0] - 'a' + 'A');
  } else if (c == 1) {
    for (auto& ch : w) ch = static_cast<char>(ch - 'a' + 'A');
  }
  if (r.below(4) != 0) d += ' ';
  d += w;
}

inline void digits(rng& r, std::string& d, std::uint64_t n) {
  for (std::uint64_t k = 0; k < n; ++k) d.push_back(static_cast<char>('0' + r.below(10)));
}

inline void gen_piece(rng& r, std::string& d, std::size_t kind) {
  switch (kind) {
    case 0:
      gen_word(r, d);
      break;
    case 1:
      d += ws[r.below(len(ws))];
      break;
    case 2: {
      const char p = punct[r.below(punct.size())];
      d.append(1 + r.below(3), p);
      break;
    }
    case 3:
      if (r.below(2) == 0) d += ' ';
      digits(r, d, 1 + r.below(12));
      break;
    case 4:
      gen_word(r, d);
      d += suffixes[r.below(len(suffixes))];
      break;
    case 5: {
      const auto si = r.below(len(scripts));
      if (r.below(2) == 0) d += ' ';
      const auto n = 1 + r.below(8);
      for (std::uint64_t k = 0; k < n; ++k) {
        put_cp(d, scripts[si].start + static_cast<std::uint32_t>(r.below(scripts[si].count)));
        if (si == devanagari && r.below(2) == 0) put_cp(d, 0x93E + static_cast<std::uint32_t>(r.below(15)));
      }
      break;
    }
    case 6: {
      const auto e = r.below(5);
      if (e == 0) {
        put_cp(d, 0x1F600 + static_cast<std::uint32_t>(r.below(64)));
      } else if (e == 1) {
        put_cp(d, hands[r.below(len(hands))]);
        put_cp(d, 0x1F3FB + static_cast<std::uint32_t>(r.below(5)));
      } else if (e == 2) {
        d += "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466";
      } else if (e == 3) {
        d += "\u2764\uFE0F";
      } else {
        put_cp(d, 0x1F1E6 + static_cast<std::uint32_t>(r.below(26)));
        put_cp(d, 0x1F1E6 + static_cast<std::uint32_t>(r.below(26)));
      }
      break;
    }
    case 7: {
      d.push_back(static_cast<char>('a' + r.below(26)));
      const auto n = 1 + r.below(3);
      for (std::uint64_t k = 0; k < n; ++k) put_cp(d, 0x300 + static_cast<std::uint32_t>(r.below(0x70)));
      break;
    }
    case 8:
      if (r.below(2) == 0) d += ' ';
      d += specials[r.below(len(specials))];
      if (r.below(2) == 0) d += ' ';
      break;
    case 9:
      if (r.below(3) == 0) {
        put_cp(d, number_misc[r.below(len(number_misc))]);
      } else {
        const auto& b = digit_blocks[r.below(len(digit_blocks))];
        const auto n = 1 + r.below(5);
        for (std::uint64_t k = 0; k < n; ++k) put_cp(d, b.start + static_cast<std::uint32_t>(r.below(b.count)));
      }
      break;
    case 10:
      if (r.below(4) == 0) {
        digits(r, d, 20 + r.below(80));
      } else {
        d += ' ';
        const auto n = 30 + r.below(300);
        for (std::uint64_t k = 0; k < n; ++k) {
          const char base = r.below(8) == 0 ? 'A' : 'a';
          d.push_back(static_cast<char>(base + r.below(26)));
        }
      }
      break;
    default:
      if (r.below(2) == 0) d += ' ';
      d += fragments[r.below(len(fragments))];
      break;
  }
}

}  // namespace detail

/// Document `i` of the golden corpus (UTF-8). Documents 999, 1999, ... are long (100-150 KB): one huge word,
/// whitespace runs of up to 3000 characters, or a long mixed document.
inline std::string gen_doc(std::uint64_t i) {
  using namespace detail;
  rng r{0x70C7E5700000000ULL + i};
  std::string d;
  if (i % 1000 == 999) {
    const auto kind = (i / 1000) % 3;
    if (kind == 0) {
      const auto n = 100000 + r.below(40000);
      for (std::uint64_t k = 0; k < n; ++k) d.push_back(static_cast<char>('a' + r.below(26)));
    } else if (kind == 1) {
      while (d.size() < 110000) {
        const auto w = ws[r.below(len(ws))];
        const auto reps = 1 + r.below(3000);
        for (std::uint64_t k = 0; k < reps; ++k) d += w;
        gen_word(r, d);
      }
    } else {
      while (d.size() < 150000) gen_piece(r, d, pick(r, styles[3]));
    }
    return d;
  }
  const auto& weights = styles[r.below(len(styles))];
  const auto target = 200 + r.below(3800);
  while (d.size() < target) gen_piece(r, d, pick(r, weights));
  return d;
}

}  // namespace tokcorpus
