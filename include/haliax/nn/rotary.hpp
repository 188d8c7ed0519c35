// haliax/nn/rotary.hpp: rotary position embeddings (RoPE) in the "rotate half" form that Hugging Face Llama
// checkpoints and upstream `levanter.layers.rotary` use: the head axis is split in two halves (x1, x2) and each
// pair (x1[i], x2[i]) is rotated by the angle position * inv_freq[i].
//
//   nn::rope_spec spec;                                           // default: theta 10000, no scaling
//   auto t = nn::rope_tables(q.sized(Pos), q.sized(HeadSize), spec);   // cos/sin {position, head_size}
//   auto qr = nn::apply_rotary(q, t, Pos, HeadSize);                 // q: {batch, position, ..., head_size}
//
// Frequencies (`rope_inv_freq`) follow `transformers`' rope initialisers, which is what a Hugging Face checkpoint
// was trained with:
//   plain    inv_freq[i] = 1 / theta^(2i / D) / factor              (rope.type default, and linear with factor)
//   llama3   low frequencies (wavelength > original / low_freq_factor) divided by factor, high ones kept, the
//            band between interpolated smoothly (Llama 3.1)
//   yarn     a linear ramp between interpolated (1 / factor) and extrapolated frequencies over the dimensions
//            between the beta_fast and beta_slow correction points, and cos/sin scaled by the attention factor
//            0.1 * mscale * ln(factor) + 1 (or the one given).
// Upstream Levanter's yarn also divides the positions by `factor`; transformers (and the checkpoints) do not, and
// we follow transformers (docs/models.md).
//
// `apply_rotary` is one pass over x with its own gradient (the inverse rotation of the incoming gradient), so it
// costs one read and one write of q and k per layer. The tables are computed in double and rounded to float.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../core.hpp"
#include "../ops/layout.hpp"

namespace haliax::nn {

/// Which frequency schedule RoPE uses (see the header comment).
enum class rope_kind { plain, llama3, yarn };

/// A RoPE configuration (upstream `RotaryEmbeddingsConfig` / transformers' `rope_scaling`).
struct rope_spec {
  rope_kind kind = rope_kind::plain;
  double theta = 10000.0;
  double factor = 1.0;
  double low_freq_factor = 1.0;                          ///< llama3
  double high_freq_factor = 4.0;                         ///< llama3
  std::int64_t original_max_position_embeddings = 8192;  ///< llama3, yarn
  double beta_fast = 32.0;                               ///< yarn
  double beta_slow = 1.0;                                ///< yarn
  double mscale = 1.0;                                   ///< yarn
  std::optional<double> mscale_all_dim;                  ///< yarn (DeepSeek style attention factor)
  std::optional<double> attention_factor;                ///< yarn: overrides the computed factor
  bool truncate = true;                                  ///< yarn: round the correction range to integers
};

/// The D/2 inverse frequencies of a head of size `head_size` (even), in float as transformers computes them.
inline std::vector<float> rope_inv_freq(const rope_spec& s, std::int64_t head_size) {
  if (head_size <= 0 || head_size % 2 != 0)
    throw std::invalid_argument("haliax::nn::rope: the head size must be positive and even (got " +
                                std::to_string(head_size) + ")");
  if (!(s.theta > 0) || !(s.factor > 0))
    throw std::invalid_argument("haliax::nn::rope: theta and factor must be positive");
  const std::int64_t half = head_size / 2;
  std::vector<double> base(half);
  for (std::int64_t i = 0; i < half; ++i)
    base[i] = 1.0 / std::pow(s.theta, static_cast<double>(2 * i) / static_cast<double>(head_size));
  std::vector<float> out(half);
  switch (s.kind) {
    case rope_kind::plain:
      for (std::int64_t i = 0; i < half; ++i) out[i] = static_cast<float>(base[i] / s.factor);
      break;
    case rope_kind::llama3: {
      const double old_len = static_cast<double>(s.original_max_position_embeddings);
      const double low_wavelen = old_len / s.low_freq_factor;
      const double high_wavelen = old_len / s.high_freq_factor;
      for (std::int64_t i = 0; i < half; ++i) {
        const double wavelen = 2 * std::numbers::pi / base[i];
        double f = wavelen > low_wavelen ? base[i] / s.factor : base[i];
        if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
          const double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
          f = (1 - smooth) * f / s.factor + smooth * f;
        }
        out[i] = static_cast<float>(f);
      }
      break;
    }
    case rope_kind::yarn: {
      const double dim = static_cast<double>(head_size);
      const double orig = static_cast<double>(s.original_max_position_embeddings);
      auto correction_dim = [&](double rotations) {
        return dim * std::log(orig / (rotations * 2 * std::numbers::pi)) / (2 * std::log(s.theta));
      };
      double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
      if (s.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, dim - 1);
      if (low == high) high += 0.001;
      for (std::int64_t i = 0; i < half; ++i) {
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolate = 1 - ramp;  // weight of the original frequency
        out[i] = static_cast<float>(base[i] / s.factor * (1 - extrapolate) + base[i] * extrapolate);
      }
      break;
    }
  }
  return out;
}

/// The factor cos and sin are multiplied by: 1 except for yarn (transformers' `attention_factor`).
inline double rope_attention_scaling(const rope_spec& s) {
  if (s.kind != rope_kind::yarn) return 1.0;
  if (s.attention_factor) return *s.attention_factor;
  auto mscale_of = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
  if (s.mscale_all_dim && *s.mscale_all_dim != 0 && s.mscale != 0)
    return mscale_of(s.factor, s.mscale) / mscale_of(s.factor, *s.mscale_all_dim);
  return mscale_of(s.factor, 1.0);
}

/// cos and sin {position, head_size} of positions start, start + 1, ...: each half of the head axis holds the
/// angles position * inv_freq, times the attention scaling.
template <AxisTag P, AxisTag H>
struct rope_table {
  named_array<float, axes<haliax::detail::tag_v<P>, haliax::detail::tag_v<H>>> cos;
  named_array<float, axes<haliax::detail::tag_v<P>, haliax::detail::tag_v<H>>> sin;
};

template <AxisTag P, AxisTag H>
rope_table<P, H> rope_tables(sized_axis<P> pos, sized_axis<H> head, const rope_spec& s, std::int64_t start = 0) {
  const auto inv = rope_inv_freq(s, head.size);
  const double scale = rope_attention_scaling(s);
  const std::int64_t half = head.size / 2;
  std::vector<float> c(static_cast<std::size_t>(pos.size * head.size)), sn(c.size());
  for (std::int64_t p = 0; p < pos.size; ++p)
    for (std::int64_t i = 0; i < half; ++i) {
      // float angle as transformers (float32 product of position and inverse frequency)
      const float angle = static_cast<float>(start + p) * inv[i];
      const float cv = static_cast<float>(std::cos(static_cast<double>(angle)) * scale);
      const float sv = static_cast<float>(std::sin(static_cast<double>(angle)) * scale);
      c[p * head.size + i] = c[p * head.size + i + half] = cv;
      sn[p * head.size + i] = sn[p * head.size + i + half] = sv;
    }
  return {from_host<float>(c, pos, head), from_host<float>(sn, pos, head)};
}

namespace detail::rotary {

/// y = x * cos + rotate_half(x) * sin over rows of the head axis (innermost, size D); `sign` -1 applies the
/// inverse rotation (the gradient). `rows` rows, the position of row r is (r / inner) % npos.
template <class T>
void rotate(const T* x, T* y, const float* cs, const float* sn, std::int64_t rows, std::int64_t inner,
            std::int64_t npos, std::int64_t d, float sign) {
  const std::int64_t h = d / 2;
  // In the arrays' execution space: host code must not read device memory (it ran on the host until 2026-11-29, and
  // the first Llama step on a GPU crashed here).
  Kokkos::parallel_for("haliax::nn::apply_rotary",
                       Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, Kokkos::IndexType<std::int64_t>>(0, rows),
                       KOKKOS_LAMBDA(const std::int64_t r) {
                         const std::int64_t p = (r / inner) % npos;
                         const T* xr = x + r * d;
                         T* yr = y + r * d;
                         const float* c = cs + p * d;
                         const float* s = sn + p * d;
                         using C = std::conditional_t<std::is_same_v<T, double>, double, float>;  // double stays double
                         const C sg = static_cast<C>(sign);
                         for (std::int64_t i = 0; i < h; ++i) {
                           const C a = static_cast<C>(xr[i]), b = static_cast<C>(xr[i + h]);
                           yr[i] = static_cast<T>(a * static_cast<C>(c[i]) - sg * b * static_cast<C>(s[i]));
                           yr[i + h] = static_cast<T>(b * static_cast<C>(c[i + h]) + sg * a * static_cast<C>(s[i + h]));
                         }
                       });
}

}  // namespace detail::rotary

/// RoPE applied to `x`, whose innermost axis is the head axis `H` and which has the position axis `P` (of the
/// table's size): {batch, position, heads..., head_size}. Gradient: the inverse rotation of the incoming one.
template <class T, class Ax, AxisTag P, AxisTag H>
requires AxisOf<P, Ax> && AxisOf<H, Ax> named_array<T, Ax> apply_rotary(const named_array<T, Ax>& x,
                                                                        const rope_table<P, H>& t, P, H) {
  namespace lay = haliax::detail::layout;
  namespace hd = haliax::detail;
  constexpr std::size_t kp = hd::index_of_v<hd::to_list<Ax>, P>;
  constexpr std::size_t kh = hd::index_of_v<hd::to_list<Ax>, H>;
  static_assert(kh + 1 == Ax::rank, "haliax::nn::apply_rotary: the head axis must be the innermost axis of x");
  const auto& s = x.sizes();
  const std::int64_t d = s[kh], npos = s[kp];
  if (t.cos.size(P{}) != npos || t.cos.size(H{}) != d)
    throw shape_error("haliax::nn::apply_rotary: the RoPE table is " + t.cos.shape_string() + " but x is " +
                      x.shape_string());
  std::int64_t inner = 1;
  for (std::size_t k = kp + 1; k < kh; ++k) inner *= s[k];
  const std::int64_t rows = d == 0 ? 0 : x.element_count() / d;
  auto y = named_array<T, Ax>::allocate(s, "haliax::nn::apply_rotary");
  detail::rotary::rotate(x.data(), y.data(), t.cos.data(), t.sin.data(), rows, inner, npos, d, 1.0f);
  lay::record_grad(
      y,
      [t, rows, inner, npos, d, s](const named_array<T, Ax>& g, auto) {
        auto gx = named_array<T, Ax>::allocate(s, "haliax::nn::apply_rotary(grad)");
        detail::rotary::rotate(g.data(), gx.data(), t.cos.data(), t.sin.data(), rows, inner, npos, d, -1.0f);
        return std::tuple{gx};
      },
      x);
  return y;
}

}  // namespace haliax::nn
