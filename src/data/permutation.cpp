// data/permutation.hpp: upstream's permutations and example orders, and NumPy's PCG64 that seeds them.
#include <algorithm>
#include <cmath>
#include <levanter/data/permutation.hpp>
#include <numeric>
#include <stdexcept>
#include <string>

namespace levanter::data {

std::vector<std::uint32_t> numpy_seed_sequence_state(std::uint64_t entropy, std::size_t n_words) {
  constexpr std::uint32_t init_a = 0x43b0d7e5u, mult_a = 0x931e8875u, init_b = 0x8b51f9ddu, mult_b = 0x58f38dedu;
  constexpr std::uint32_t mix_mult_l = 0xca01f9ddu, mix_mult_r = 0x4973f715u;
  constexpr unsigned xshift = 16;
  constexpr std::size_t pool_size = 4;

  std::vector<std::uint32_t> words;  // the integer as little-endian 32-bit words; 0 is one word
  do {
    words.push_back(static_cast<std::uint32_t>(entropy & 0xffffffffu));
    entropy >>= 32;
  } while (entropy != 0);

  std::uint32_t hash_const = init_a;
  const auto hashmix = [&](std::uint32_t value) {
    value ^= hash_const;
    hash_const *= mult_a;
    value *= hash_const;
    value ^= value >> xshift;
    return value;
  };
  const auto mix = [](std::uint32_t x, std::uint32_t y) {
    std::uint32_t r = mix_mult_l * x - mix_mult_r * y;
    r ^= r >> xshift;
    return r;
  };
  std::uint32_t pool[pool_size];
  for (std::size_t i = 0; i < pool_size; ++i) pool[i] = hashmix(i < words.size() ? words[i] : 0u);
  for (std::size_t src = 0; src < pool_size; ++src)
    for (std::size_t dst = 0; dst < pool_size; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src]));
  for (std::size_t src = pool_size; src < words.size(); ++src)
    for (std::size_t dst = 0; dst < pool_size; ++dst) pool[dst] = mix(pool[dst], hashmix(words[src]));

  std::vector<std::uint32_t> out(n_words);
  std::uint32_t h = init_b;
  for (std::size_t i = 0; i < n_words; ++i) {
    std::uint32_t v = pool[i % pool_size];
    v ^= h;
    h *= mult_b;
    v *= h;
    v ^= v >> xshift;
    out[i] = v;
  }
  return out;
}

numpy_pcg64::numpy_pcg64(std::uint64_t seed) {
  const auto w = numpy_seed_sequence_state(seed, 8);  // generate_state(4, np.uint64), little-endian halves
  std::uint64_t v[4];
  for (int i = 0; i < 4; ++i)
    v[i] = static_cast<std::uint64_t>(w[2 * i]) | (static_cast<std::uint64_t>(w[2 * i + 1]) << 32);
  const u128 init_state = (static_cast<u128>(v[0]) << 64) | v[1];
  const u128 init_seq = (static_cast<u128>(v[2]) << 64) | v[3];
  state_ = 0;
  inc_ = (init_seq << 1) | 1u;
  step();
  state_ += init_state;
  step();
}

std::uint64_t numpy_pcg64::next64() {
  step();
  const auto hi = static_cast<std::uint64_t>(state_ >> 64), lo = static_cast<std::uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  const std::uint64_t x = hi ^ lo;
  return rot == 0 ? x : (x >> rot) | (x << (64u - rot));
}

std::uint32_t numpy_pcg64::next32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  const std::uint64_t n = next64();
  has_uint32_ = true;
  uinteger_ = static_cast<std::uint32_t>(n >> 32);
  return static_cast<std::uint32_t>(n & 0xffffffffu);
}

std::int64_t numpy_pcg64::integers(std::int64_t low, std::int64_t high) {
  if (low >= high) throw std::invalid_argument("numpy_pcg64::integers: low >= high");
  return static_cast<std::int64_t>(bounded(static_cast<std::uint64_t>(low),
                                           static_cast<std::uint64_t>(high) - static_cast<std::uint64_t>(low) - 1u));
}

std::uint64_t numpy_pcg64::integers_u64(std::uint64_t low, std::uint64_t high) {
  if (low >= high) throw std::invalid_argument("numpy_pcg64::integers_u64: low >= high");
  return bounded(low, high - low - 1u);
}

std::uint64_t numpy_pcg64::bounded(std::uint64_t off, std::uint64_t rng) {
  if (rng == 0) return off;
  if (rng <= 0xffffffffull) {
    if (rng == 0xffffffffull) return off + next32();
    const std::uint32_t r = static_cast<std::uint32_t>(rng);
    const std::uint32_t excl = r + 1u;
    std::uint64_t m = static_cast<std::uint64_t>(next32()) * excl;
    std::uint32_t leftover = static_cast<std::uint32_t>(m);
    if (leftover < excl) {
      const std::uint32_t threshold = (0xffffffffu - r) % excl;
      while (leftover < threshold) {
        m = static_cast<std::uint64_t>(next32()) * excl;
        leftover = static_cast<std::uint32_t>(m);
      }
    }
    return off + (m >> 32);
  }
  if (rng == ~0ull) return off + next64();
  const std::uint64_t excl = rng + 1u;
  u128 m = static_cast<u128>(next64()) * excl;
  std::uint64_t leftover = static_cast<std::uint64_t>(m);
  if (leftover < excl) {
    const std::uint64_t threshold = (~0ull - rng) % excl;
    while (leftover < threshold) {
      m = static_cast<u128>(next64()) * excl;
      leftover = static_cast<std::uint64_t>(m);
    }
  }
  return off + static_cast<std::uint64_t>(m >> 64);
}

std::int32_t jax_randint_scalar(haliax::random::key k, std::int64_t minval, std::int64_t maxval) {
  namespace tf = haliax::detail::threefry;
  namespace rd = haliax::detail::random_dists;
  const auto mode =
      haliax::random::threefry_partitionable() ? tf::counter_mode::partitionable : tf::counter_mode::original;
  const auto p = rd::make_randint_params(minval, maxval);
  const auto k_hi = tf::split_at(k.data(), 0, 2, mode), k_lo = tf::split_at(k.data(), 1, 2, mode);
  return rd::randint_i32(tf::bits32_at(k_hi, 0, 1, mode), tf::bits32_at(k_lo, 0, 1, mode), p);
}

permutation_kind parse_permutation_kind(std::string_view s, std::string_view key) {
  if (s == "feistel") return permutation_kind::feistel;
  if (s == "linear") return permutation_kind::linear;
  throw data_error(std::string(key) + ": unknown permutation type '" + std::string(s) +
                   "'; use \"feistel\" or \"linear\"");
}

permutation permutation::make(permutation_kind kind, std::uint64_t length, haliax::random::key key) {
  permutation p;
  p.kind_ = kind;
  p.length_ = length;
  numpy_pcg64 rng(static_cast<std::uint64_t>(jax_randint_scalar(key, 0, std::int64_t{1} << 30)));
  if (kind == permutation_kind::linear) {
    if (length == 0)
      throw std::invalid_argument("levanter::data::permutation::make: a linear permutation needs length >= 1");
    if (length == 1) {
      p.a_ = 1;
      p.b_ = 0;
    } else {
      const auto n = static_cast<std::int64_t>(length);
      do p.a_ = rng.integers(1, n);
      while (std::gcd(p.a_, n) != 1);
      p.b_ = rng.integers(0, n);
    }
  } else {
    // m = next power of two >= length (upstream: 1 << (length - 1).bit_length(), so length 0 gives m = 2)
    unsigned bits = 0;
    if (length == 0)
      bits = 1;
    else
      while ((std::uint64_t{1} << bits) < length) ++bits;
    const unsigned left_bits = bits / 2;
    p.right_bits_ = bits - left_bits;
    p.r_mask_ = p.right_bits_ >= 64 ? ~0ull : (std::uint64_t{1} << p.right_bits_) - 1u;
    for (int r = 0; r < rounds; ++r) p.keys_[r] = rng.integers_u64(0, std::uint64_t{1} << p.right_bits_);
  }
  return p;
}

std::uint64_t permutation::operator()(std::uint64_t i) const {
  if (i >= length_)
    throw std::out_of_range("levanter::data::permutation: index " + std::to_string(i) +
                            " is out of bounds for length " + std::to_string(length_));
  if (kind_ == permutation_kind::linear) {
    // NumPy computes int64 * uint64 in float64: reproduce its rounding (exact below ~9.4e7 elements).
    const double y = static_cast<double>(a_) * static_cast<double>(i) + static_cast<double>(b_);
    return static_cast<std::uint64_t>(std::fmod(y, static_cast<double>(length_)));
  }
  if (length_ == 1) return 0;
  std::uint64_t out = feistel(i);
  for (int cycles = 0; out >= length_; ++cycles) {
    if (cycles >= max_cycle_walks)
      throw std::runtime_error("levanter::data::permutation: Feistel cycle-walking exceeded " + std::to_string(cycles) +
                               " iterations");
    out = feistel(out);
  }
  return out;
}

std::uint64_t permutation::feistel(std::uint64_t x) const {
  std::uint64_t right = x & r_mask_;
  std::uint64_t left = right_bits_ >= 64 ? 0 : x >> right_bits_;
  for (int r = 0; r < rounds; ++r) {
    const std::uint64_t f = ((right & r_mask_) * 2654435761ull + keys_[r]) & r_mask_;
    const std::uint64_t new_right = left ^ f;
    left = right;
    right = new_right;
  }
  return (right_bits_ >= 64 ? 0 : left << right_bits_) | right;
}

example_order example_order::identity(std::uint64_t length) {
  example_order o;
  o.length_ = length;
  return o;
}

example_order example_order::full(permutation_kind kind, std::uint64_t length, haliax::random::key key) {
  example_order o;
  o.mode_ = mode::full;
  o.length_ = length;
  o.kind_ = kind;
  o.key_ = key;
  if (length > 0) o.perm_ = permutation::make(kind, length, key);
  return o;
}

example_order example_order::eras(permutation_kind kind, std::uint64_t era_length, std::uint64_t length,
                                  haliax::random::key key) {
  if (era_length == 0) throw std::invalid_argument("levanter::data::example_order::eras: era_length must be > 0");
  example_order o;
  o.mode_ = mode::eras;
  o.length_ = length;
  o.era_length_ = era_length;
  o.kind_ = kind;
  o.key_ = key;
  return o;
}

std::uint64_t example_order::operator()(std::uint64_t i) const {
  if (i >= length_)
    throw std::out_of_range("levanter::data::example_order: index " + std::to_string(i) +
                            " is out of bounds for a dataset of " + std::to_string(length_) + " examples");
  switch (mode_) {
    case mode::identity:
      return i;
    case mode::full:
      return perm_(i);
    case mode::eras: {
      const std::uint64_t era = i / era_length_, start = era * era_length_;
      return start + era_permutation(era)(i - start);
    }
  }
  return i;
}

permutation example_order::era_permutation(std::uint64_t era) const {
  const std::uint64_t start = era * era_length_;
  const std::uint64_t n = std::min(era_length_, length_ - start);
  return permutation::make(kind_, n, haliax::random::fold_in(key_, static_cast<std::uint32_t>(era)));
}

example_order make_example_order(const shuffle_setting& shuffle, permutation_kind kind, std::uint64_t length,
                                 haliax::random::key key) {
  switch (shuffle.how) {
    case shuffle_setting::mode::full:
      return example_order::full(kind, length, key);
    case shuffle_setting::mode::eras:
      return example_order::eras(kind, shuffle.era_length, length, key);
    case shuffle_setting::mode::none:
      break;
  }
  return example_order::identity(length);
}

}  // namespace levanter::data
