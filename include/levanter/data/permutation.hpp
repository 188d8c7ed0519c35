// levanter/data/permutation.hpp: the stateless example orders of upstream Levanter's data pipeline, equal to
// it bit for bit: `LcgPermutation` / `FeistelPermutation` (`data/_prp.py`), the full shuffle of
// `PermutationDataset` (`shuffle: true`) and the era shuffle of `EraShufflingDataset` (`shuffle: <era_length>`,
// `data/permutation.py`).
//
//   namespace ld = levanter::data;
//   auto p = ld::permutation::make(ld::permutation_kind::feistel, 1000, haliax::random::make_key(0));
//   std::uint64_t j = p(17);                                         // where example 17 of the order comes from
//   auto order = ld::example_order::eras(ld::permutation_kind::linear, 256, n_examples, key);
//   std::uint64_t src = order(global_index);                         // pure function of (kind, sizes, key, index)
//
// Upstream seeds a NumPy `Generator(PCG64(seed))` with `seed = jax.random.randint(key, (), 0, 2**30)` and draws
// the permutation's parameters from it; `numpy_pcg64` below reproduces NumPy's SeedSequence seeding, the PCG64
// generator (128-bit LCG, XSL-RR output, 32-bit draws buffered from 64-bit ones) and `Generator.integers`
// (Lemire's bounded method as NumPy's `random_bounded_uint64_fill` does it).
//
// Upstream's LcgPermutation evaluates `(a * x + b) % length` with NumPy's promotion of int64 times uint64, which
// is float64: for lengths below about 9.4e7 every step is exact; above, the products round and the result (still
// what upstream produces, reproduced here) is no longer a bijection. FeistelPermutation is exact for any length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <haliax/random.hpp>
#include <levanter/data/error.hpp>
#include <string_view>
#include <vector>

namespace levanter::data {

// ---------------------------------------------------------------------------------------------------------
// NumPy's random numbers (numpy/random/bit_generator.pyx, _pcg64.pyx, src/distributions/distributions.c)

/// NumPy's `SeedSequence(entropy).generate_state(n_words, np.uint32)` for a non-negative integer entropy and
/// the default pool size 4 (no spawn key).
std::vector<std::uint32_t> numpy_seed_sequence_state(std::uint64_t entropy, std::size_t n_words);

/// NumPy's `np.random.PCG64(seed)` bit generator for an integer seed, with `Generator.integers`.
class numpy_pcg64 {
 public:
  explicit numpy_pcg64(std::uint64_t seed);

  /// The next 64-bit output (`next_uint64`).
  std::uint64_t next64();

  /// The next 32-bit output (`next_uint32`): the low half of a 64-bit draw, then its high half.
  std::uint32_t next32();

  /// `Generator.integers(low, high)` (int64 or uint64 dtype, endpoint=False): one value in [low, high).
  /// Repeated calls equal one call with `size=n`. Throws std::invalid_argument when low >= high, as NumPy does.
  std::int64_t integers(std::int64_t low, std::int64_t high);
  std::uint64_t integers_u64(std::uint64_t low, std::uint64_t high);

 private:
  __extension__ typedef unsigned __int128 u128;  // GCC/Clang 128-bit integer (PCG64 state)
  static constexpr u128 multiplier = (static_cast<u128>(0x2360ed051fc65da4ull) << 64) | 0x4385df649fccf645ull;

  void step() { state_ = state_ * multiplier + inc_; }

  // random_bounded_uint64_fill for one value: off + a value in the closed range [0, rng].
  std::uint64_t bounded(std::uint64_t off, std::uint64_t rng);

  u128 state_ = 0;
  u128 inc_ = 0;
  bool has_uint32_ = false;
  std::uint32_t uinteger_ = 0;
};

/// `jax.random.randint(k, (), minval, maxval).item()`: one int32 draw (the current threefry counter layout).
std::int32_t jax_randint_scalar(haliax::random::key k, std::int64_t minval, std::int64_t maxval);

// ---------------------------------------------------------------------------------------------------------
// Permutations (data/_prp.py)

/// `permutation_type:` — "feistel" (FeistelPermutation) or "linear" (LcgPermutation).
enum class permutation_kind { feistel, linear };

/// "feistel" / "linear" → permutation_kind; anything else is a data_error naming `key` (e.g.
/// "data.permutation_type"). Upstream's default when the key is null is linear (with a warning).
permutation_kind parse_permutation_kind(std::string_view s, std::string_view key = "data.permutation_type");

inline const char* to_string(permutation_kind k) { return k == permutation_kind::feistel ? "feistel" : "linear"; }

/// A stateless pseudo-random permutation of [0, length), equal to upstream's `Permutation.make(kind, length,
/// key)`: `p(i)` for i in [0, length) is the image of i; other i throw std::out_of_range (upstream: IndexError).
class permutation {
 public:
  /// Upstream's `Permutation.make(kind, length, prng_key)` (Feistel with its default 5 rounds).
  /// A linear permutation of length 0 throws std::invalid_argument (upstream: NumPy's ValueError).
  static permutation make(permutation_kind kind, std::uint64_t length, haliax::random::key key);

  /// The image of i. Throws std::out_of_range when i >= size().
  std::uint64_t operator()(std::uint64_t i) const;

  std::uint64_t size() const { return length_; }
  permutation_kind kind() const { return kind_; }
  /// LcgPermutation's parameters (p(x) = (a·x + b) mod length); 0 for Feistel.
  std::int64_t a() const { return a_; }
  std::int64_t b() const { return b_; }

 private:
  static constexpr int rounds = 5;
  static constexpr int max_cycle_walks = 1000;

  std::uint64_t feistel(std::uint64_t x) const;

  permutation_kind kind_ = permutation_kind::linear;
  std::uint64_t length_ = 0;
  std::int64_t a_ = 0, b_ = 0;
  unsigned right_bits_ = 0;
  std::uint64_t r_mask_ = 0;
  std::uint64_t keys_[rounds] = {};
};

// ---------------------------------------------------------------------------------------------------------
// Example orders (data/permutation.py)

/// The order in which a dataset of known, final length is read: example `order(i)` of the underlying dataset is
/// the i-th example seen. Pure function of (kind, lengths, key, i).
///
/// * `identity(n)`: `shuffle: false`.
/// * `full(kind, n, key)`: `shuffle: true`, upstream PermutationDataset: one permutation of all n examples,
///   made from the final length (upstream waits for the cache to finish before it can build it).
/// * `eras(kind, L, n, key)`: `shuffle: L` (L > 0), upstream EraShufflingDataset: index i lies in era e = i / L and
///   maps to e·L + P_e(i − e·L), P_e = permutation::make(kind, min(L, n − e·L), fold_in(key, e)). Only the last
///   era can be shorter. While the length is not yet final, upstream waits until the underlying dataset holds
///   (e+1)·L examples or is finished, so an era's permutation is only ever built over a full era or over the final
///   short one; the result is therefore the same as this function with the final n.
/// Indices >= n throw std::out_of_range (upstream: IndexError).
/// Upstream quirk: under a mixture, EraShufflingDataset receives NumPy int64 indices and a Feistel era permutation
/// then fails (`numpy.int64` has no `bit_length`); era shuffles with Feistel only run upstream on a single dataset.
class example_order {
 public:
  static example_order identity(std::uint64_t length);
  static example_order full(permutation_kind kind, std::uint64_t length, haliax::random::key key);
  static example_order eras(permutation_kind kind, std::uint64_t era_length, std::uint64_t length,
                            haliax::random::key key);

  std::uint64_t operator()(std::uint64_t i) const;

  /// The permutation of era `era` (eras mode only).
  permutation era_permutation(std::uint64_t era) const;

  std::uint64_t size() const { return length_; }

 private:
  enum class mode { identity, full, eras };
  mode mode_ = mode::identity;
  std::uint64_t length_ = 0, era_length_ = 0;
  permutation_kind kind_ = permutation_kind::linear;
  haliax::random::key key_{};
  permutation perm_{};
};

/// `shuffle:` as upstream reads it: `false` (or an integer <= 0) → none, `true` → full, an integer L > 0 →
/// eras of L examples.
struct shuffle_setting {
  enum class mode { none, full, eras };
  mode how = mode::none;
  std::uint64_t era_length = 0;

  static shuffle_setting none() { return {}; }
  static shuffle_setting full() { return {mode::full, 0}; }
  /// `shuffle: <n>`: eras of n examples; n <= 0 means no shuffle (upstream tests `shuffle > 0`).
  static shuffle_setting eras(std::int64_t n) {
    return n > 0 ? shuffle_setting{mode::eras, static_cast<std::uint64_t>(n)} : shuffle_setting{};
  }
};

/// The order of a dataset of `length` examples under `shuffle:` and `permutation_type:` (upstream turns a null
/// permutation_type into linear, with a warning).
example_order make_example_order(const shuffle_setting& shuffle, permutation_kind kind, std::uint64_t length,
                                 haliax::random::key key);

}  // namespace levanter::data
