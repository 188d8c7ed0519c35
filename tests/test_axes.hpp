// Axis vocabulary and helpers shared by the tests.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <haliax/haliax.hpp>
#include <random>
#include <vector>

namespace test_axes {
inline constexpr struct Batch final : haliax::axis<"batch"> {
} Batch;
inline constexpr struct Embed final : haliax::axis<"embed"> {
} Embed;
inline constexpr struct Pos final : haliax::axis<"position"> {
} Pos;
inline constexpr struct KPos final : haliax::axis<"key_position"> {
} KPos;
inline constexpr struct Head final : haliax::axis<"head"> {
} Head;
inline constexpr struct Mlp final : haliax::axis<"mlp"> {
} Mlp;
inline constexpr struct Vocab final : haliax::axis<"vocab"> {
} Vocab;
inline constexpr struct X final : haliax::axis<"x"> {
} X;
inline constexpr struct Y final : haliax::axis<"y"> {
} Y;
inline constexpr struct Z final : haliax::axis<"z"> {
} Z;
inline constexpr struct W final : haliax::axis<"w"> {
} W;

/// Deterministic random host data in [-1, 1).
template <class T = float>
std::vector<T> random_values(std::size_t n, unsigned seed = 1) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(gen));
  return v;
}

/// An array of random values in [-1, 1) with the given sized axes.
template <class T = float, class... S>
auto random_array(unsigned seed, S... s) {
  std::size_t n = (static_cast<std::size_t>(s.size) * ... * std::size_t{1});
  return haliax::from_host<T>(random_values<T>(n, seed), s...);
}

/// Checks two host vectors are elementwise close (relative + absolute tolerance).
template <class T, class U>
void check_close(const std::vector<T>& got, const std::vector<U>& want, double rtol = 1e-5, double atol = 1e-6) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    if (std::isnan(w)) {
      CHECK_MESSAGE(std::isnan(g), "index " << i);
      continue;
    }
    CHECK_MESSAGE(std::abs(g - w) <= atol + rtol * std::abs(w), "index " << i << ": got " << g << " want " << w);
  }
}
}  // namespace test_axes
