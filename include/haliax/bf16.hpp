// haliax/bf16.hpp: the bfloat16 element type (8-bit exponent, 7-bit mantissa).
//
// g++ 12 has no usable `__bf16`, so this is a storage type: arithmetic converts to float, and conversion
// from float rounds to nearest, ties to even (NaN stays NaN). `bf16(1.0f) + bf16(2.0f)` is a float.
#pragma once

#include <Kokkos_Macros.hpp>
#include <cstdint>
#include <cstring>

namespace haliax {

struct bf16 {
  std::uint16_t bits = 0;

  bf16() = default;
  /// Rounds to nearest even; NaNs become a quiet NaN with the sign kept.
  KOKKOS_INLINE_FUNCTION explicit bf16(float f) : bits(round_from_float(f)) {}
  KOKKOS_INLINE_FUNCTION explicit bf16(double d) : bf16(static_cast<float>(d)) {}
  KOKKOS_INLINE_FUNCTION explicit bf16(int i) : bf16(static_cast<float>(i)) {}

  KOKKOS_INLINE_FUNCTION operator float() const {
    std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }

  /// A bf16 from its raw 16 bits.
  KOKKOS_INLINE_FUNCTION static bf16 from_bits(std::uint16_t b) {
    bf16 r;
    r.bits = b;
    return r;
  }

  KOKKOS_INLINE_FUNCTION static std::uint16_t round_from_float(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
      return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
    }
    std::uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb;
    return static_cast<std::uint16_t>(u >> 16);
  }
};

KOKKOS_INLINE_FUNCTION bool operator==(bf16 a, bf16 b) { return float(a) == float(b); }

}  // namespace haliax
