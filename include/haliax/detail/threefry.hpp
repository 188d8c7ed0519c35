// Threefry-2x32 counter-based random bits, bit-compatible with jax.random.
//
// Everything here reproduces the *default* PRNG implementation of JAX
// ("threefry2x32"): key construction from an integer seed, split, fold_in and
// random_bits.  JAX has two ways of laying out the counters that feed the
// hash, selected by the config flag `jax_threefry_partitionable`:
//
//   * counter_mode::partitionable (flag True, the default since JAX 0.5):
//     element i of an array of n values is hashed from the 64-bit counter
//     (hi = i >> 32, lo = i & 0xffffffff); split uses the same counters.
//   * counter_mode::original (flag False, the pre-0.5 default): a flat iota of
//     32-bit words is cut in two halves that are hashed pairwise.
//
// Per-element functions are KOKKOS_INLINE_FUNCTION so they can run inside
// Kokkos kernels.  The original layout needs the total element count n, the
// partitionable one ignores it.
#pragma once

#include <Kokkos_Macros.hpp>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace haliax::detail::threefry {

/// Raw threefry key: the two uint32 words of a JAX uint32[2] key array.
struct key_data {
  std::uint32_t k0 = 0;
  std::uint32_t k1 = 0;

  KOKKOS_INLINE_FUNCTION constexpr bool operator==(const key_data& o) const { return k0 == o.k0 && k1 == o.k1; }
  KOKKOS_INLINE_FUNCTION constexpr bool operator!=(const key_data& o) const { return !(*this == o); }
};

/// A pair of 32-bit words (threefry block input/output).
struct word_pair {
  std::uint32_t w0 = 0;
  std::uint32_t w1 = 0;
};

/// Counter layout, i.e. the value of `jax_threefry_partitionable`.
enum class counter_mode : int {
  partitionable = 0,  ///< jax_threefry_partitionable=True (JAX >= 0.5 default)
  original = 1,       ///< jax_threefry_partitionable=False
};

/// The mode used when none is given: JAX's current default.
inline constexpr counter_mode default_counter_mode = counter_mode::partitionable;

/// How an integer seed becomes a key, i.e. the value of `jax_enable_x64`.
enum class seed_mode : int {
  x32 = 0,  ///< jax_enable_x64=False (JAX default): seed wraps to int32 -> [0, low32]
  x64 = 1,  ///< jax_enable_x64=True: 64-bit seed -> [high32, low32]
};

inline constexpr seed_mode default_seed_mode = seed_mode::x32;

// ---------------------------------------------------------------------------
// The block function.

KOKKOS_INLINE_FUNCTION constexpr std::uint32_t rotl32(std::uint32_t x, unsigned r) {
  return (x << r) | (x >> (32u - r));
}

/// Threefry-2x32 with 20 rounds, as jax._src.prng's lowering: key schedule
/// (k0, k1, k0 ^ k1 ^ 0x1BD11BDA), rotations {13,15,26,6} / {17,29,16,24},
/// a key injection (plus the injection index) after every 4 rounds.
KOKKOS_INLINE_FUNCTION constexpr word_pair hash(key_data key, word_pair counter) {
  const std::uint32_t ks[3] = {key.k0, key.k1, key.k0 ^ key.k1 ^ 0x1BD11BDAu};
  constexpr unsigned rot[2][4] = {{13u, 15u, 26u, 6u}, {17u, 29u, 16u, 24u}};
  std::uint32_t x0 = counter.w0 + ks[0];
  std::uint32_t x1 = counter.w1 + ks[1];
  for (unsigned inj = 1; inj <= 5; ++inj) {
    const unsigned* r = rot[(inj - 1u) & 1u];
    for (unsigned j = 0; j < 4; ++j) {
      x0 += x1;
      x1 = rotl32(x1, r[j]);
      x1 ^= x0;
    }
    x0 += ks[inj % 3u];
    x1 += ks[(inj + 1u) % 3u] + static_cast<std::uint32_t>(inj);
  }
  return word_pair{x0, x1};
}

// ---------------------------------------------------------------------------
// Keys.

/// jax.random.PRNGKey(seed).  With seed_mode::x32 (JAX's default, x64
/// disabled) the seed is wrapped to 32 bits and the key is [0, low32]; with
/// seed_mode::x64 the key is [seed >> 32, seed & 0xffffffff] (negative int64
/// seeds are taken in two's complement, as JAX does).
KOKKOS_INLINE_FUNCTION constexpr key_data prng_key(std::uint64_t seed, seed_mode mode = default_seed_mode) {
  const auto lo = static_cast<std::uint32_t>(seed & 0xFFFFFFFFull);
  const auto hi = static_cast<std::uint32_t>(seed >> 32);
  return mode == seed_mode::x64 ? key_data{hi, lo} : key_data{0u, lo};
}

/// jax.random.fold_in(key, data): hash of the counter (0, data).
KOKKOS_INLINE_FUNCTION constexpr key_data fold_in(key_data key, std::uint32_t data) {
  const word_pair h = hash(key, word_pair{0u, data});
  return key_data{h.w0, h.w1};
}

/// The i-th of the n keys returned by jax.random.split(key, n).
KOKKOS_INLINE_FUNCTION constexpr key_data split_at(key_data key, std::uint64_t i, std::uint64_t n,
                                                   counter_mode mode = default_counter_mode) {
  if (mode == counter_mode::partitionable) {
    const word_pair h = hash(key, word_pair{static_cast<std::uint32_t>(i >> 32), static_cast<std::uint32_t>(i)});
    return key_data{h.w0, h.w1};
  }
  // Original: the 2n words of iota(2n) are hashed as pairs (j, j + n); the
  // outputs are laid out as [all first words..., all second words...] and
  // then read two at a time.
  auto word = [&](std::uint64_t j) -> std::uint32_t {
    const std::uint64_t base = j < n ? j : j - n;
    const word_pair h = hash(key, word_pair{static_cast<std::uint32_t>(base), static_cast<std::uint32_t>(base + n)});
    return j < n ? h.w0 : h.w1;
  };
  return key_data{word(2 * i), word(2 * i + 1)};
}

// ---------------------------------------------------------------------------
// Random bits.  Element i of a flat (row-major) array of n elements.

namespace detail {
// Original layout: word j of the ceil-padded iota(m) of m 32-bit words.
KOKKOS_INLINE_FUNCTION constexpr std::uint32_t original_word(key_data key, std::uint64_t j, std::uint64_t m) {
  const std::uint64_t half = (m + 1) / 2;
  const std::uint64_t base = j < half ? j : j - half;
  const std::uint64_t second = base + half;
  const word_pair h =
      hash(key, word_pair{static_cast<std::uint32_t>(base), second < m ? static_cast<std::uint32_t>(second) : 0u});
  return j < half ? h.w0 : h.w1;
}

KOKKOS_INLINE_FUNCTION constexpr word_pair partitionable_pair(key_data key, std::uint64_t i) {
  return hash(key, word_pair{static_cast<std::uint32_t>(i >> 32), static_cast<std::uint32_t>(i)});
}
}  // namespace detail

/// jax.random.bits(key, shape, uint32) element i of n.
KOKKOS_INLINE_FUNCTION constexpr std::uint32_t bits32_at(key_data key, std::uint64_t i, std::uint64_t n,
                                                         counter_mode mode = default_counter_mode) {
  if (mode == counter_mode::partitionable) {
    const word_pair h = detail::partitionable_pair(key, i);
    return h.w0 ^ h.w1;
  }
  return detail::original_word(key, i, n);
}

/// jax.random.bits(key, shape, uint64) element i of n (needs x64 in JAX).
KOKKOS_INLINE_FUNCTION constexpr std::uint64_t bits64_at(key_data key, std::uint64_t i, std::uint64_t n,
                                                         counter_mode mode = default_counter_mode) {
  if (mode == counter_mode::partitionable) {
    const word_pair h = detail::partitionable_pair(key, i);
    return (static_cast<std::uint64_t>(h.w0) << 32) | h.w1;
  }
  // 2n words; the high halves are words [0, n), the low halves [n, 2n): both
  // come from the same hash of the counter pair (i, i + n).
  const word_pair h = hash(key, word_pair{static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i + n)});
  return (static_cast<std::uint64_t>(h.w0) << 32) | h.w1;
}

/// jax.random.bits(key, shape, uint16 / uint8) element i of n.
KOKKOS_INLINE_FUNCTION constexpr std::uint32_t bits_small_at(key_data key, unsigned bit_width, std::uint64_t i,
                                                             std::uint64_t n,
                                                             counter_mode mode = default_counter_mode) {
  const std::uint32_t mask = bit_width == 8 ? 0xFFu : 0xFFFFu;
  if (mode == counter_mode::partitionable) {
    const word_pair h = detail::partitionable_pair(key, i);
    return (h.w0 ^ h.w1) & mask;
  }
  const std::uint64_t per_word = 32u / bit_width;
  const std::uint64_t m = (n * bit_width + 31u) / 32u;
  const std::uint32_t w = detail::original_word(key, i / per_word, m);
  return (w >> (static_cast<unsigned>(i % per_word) * bit_width)) & mask;
}

/// Any supported width (8, 16, 32, 64), widened to 64 bits.
KOKKOS_INLINE_FUNCTION constexpr std::uint64_t bits_at(key_data key, unsigned bit_width, std::uint64_t i,
                                                       std::uint64_t n, counter_mode mode = default_counter_mode) {
  switch (bit_width) {
    case 64:
      return bits64_at(key, i, n, mode);
    case 32:
      return bits32_at(key, i, n, mode);
    default:
      return bits_small_at(key, bit_width, i, n, mode);
  }
}

// ---------------------------------------------------------------------------
// Host conveniences (bulk).

/// jax.random.split(key, n) on the host.
inline std::vector<key_data> split(key_data key, std::size_t n = 2, counter_mode mode = default_counter_mode) {
  std::vector<key_data> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = split_at(key, i, n, mode);
  return out;
}

/// jax.random.bits for a shape with `count` elements (flat row-major), any
/// width in {8, 16, 32, 64}, widened to uint64.  The original counter layout
/// is supported up to 2^32 - 2 words (JAX switches to a split-based scheme
/// beyond that).
inline std::vector<std::uint64_t> random_bits(key_data key, std::size_t count, unsigned bit_width = 32,
                                              counter_mode mode = default_counter_mode) {
  std::vector<std::uint64_t> out(count);
  for (std::size_t i = 0; i < count; ++i) out[i] = bits_at(key, bit_width, i, count, mode);
  return out;
}

}  // namespace haliax::detail::threefry
