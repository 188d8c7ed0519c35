// haliax/nn/normalization.hpp: LayerNorm and RmsNorm over one named axis.
//
//   auto ln = haliax::nn::LayerNorm<Embed>::init(768 * Embed);   // weight and bias {embed}
//   auto y = ln(x);                                             // normalises each embed vector of x
#pragma once

#include <string_view>

#include <boost/hana/define_struct.hpp>
#include <optional>

#include "../core.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/reduction.hpp"
#include "functions.hpp"

namespace haliax::nn {

template <auto Ax, class Pre = axes<>, class T = float>
struct LayerNorm;

/// (x - mean) / sqrt(var + eps) over `Ax`, then * weight + bias (upstream `haliax.nn.LayerNorm`; weight and
/// bias {Pre..., Ax}, each optional). Every other axis of the input is kept.
template <auto Ax, auto... P, class T>
struct LayerNorm<Ax, axes<P...>, T> {
  using param_type = named_array<T, axes<P..., Ax>>;
  /// Upstream class name (`haliax.nn.LayerNorm`): weight-decay masks also match the class path `<class_name>.<field>`.
  static constexpr std::string_view class_name = "LayerNorm";
  BOOST_HANA_DEFINE_STRUCT(LayerNorm, (std::optional<param_type>, weight), (std::optional<param_type>, bias),
                           (double, eps));

  /// weight = 1, bias = 0; eps 1e-5 as upstream.
  static LayerNorm init(sized_axis<std::remove_cvref_t<decltype(Ax)>> axis, double eps = 1e-5, bool use_weight = true,
                        bool use_bias = true) requires(sizeof...(P) == 0) {
    LayerNorm m;
    if (use_weight) m.weight = ones<T>(axis);
    if (use_bias) m.bias = zeros<T>(axis);
    m.eps = eps;
    return m;
  }

  /// Normalises `x` (element type T) over `Ax`, which must be one of its axes; same axes out. A wrong input
  /// fails at the call, naming the axis: `[with Missing = haliax::axis_types<Embed>]`.
  template <class AxX>
  requires(sizeof...(P) == 0) && HasAxes<axis_types_of<AxX>, axis_types<std::remove_cvref_t<decltype(Ax)>>>
  named_array<T, AxX> operator()(const named_array<T, AxX>& x) const {
    using X = named_array<T, AxX>;
    X y = standardize(x, Ax, eps);
    if (weight) y = multiply(y, *weight);
    if (bias) y = add(y, *bias);
    return y;
  }
};

template <auto Ax, class Pre = axes<>, class T = float>
struct RmsNorm;

/// x / sqrt(mean(x^2) + eps) over `Ax`, then * weight (+ bias if present) (upstream `haliax.nn.RmsNorm`:
/// weight on, bias off by default). With `unit_offset` the scale is (1 + weight) and the weight starts at 0
/// (upstream Levanter's GemmaRMSNorm, Hugging Face's Gemma/Gemma2/Gemma3RMSNorm): the stored weight is what those
/// checkpoints hold.
template <auto Ax, auto... P, class T>
struct RmsNorm<Ax, axes<P...>, T> {
  using param_type = named_array<T, axes<P..., Ax>>;
  /// Upstream class name (`haliax.nn.RmsNorm`): weight-decay masks also match the class path `<class_name>.<field>`.
  static constexpr std::string_view class_name = "RmsNorm";
  BOOST_HANA_DEFINE_STRUCT(RmsNorm, (std::optional<param_type>, weight), (std::optional<param_type>, bias),
                           (double, eps), (bool, unit_offset));

  static RmsNorm init(sized_axis<std::remove_cvref_t<decltype(Ax)>> axis, double eps = 1e-6, bool use_weight = true,
                      bool use_bias = false, bool unit_offset = false) requires(sizeof...(P) == 0) {
    RmsNorm m;
    if (use_weight) m.weight = unit_offset ? zeros<T>(axis) : ones<T>(axis);
    if (use_bias) m.bias = zeros<T>(axis);
    m.eps = eps;
    m.unit_offset = unit_offset;
    return m;
  }

  /// Normalises `x` (element type T) over `Ax`, which must be one of its axes; same axes out. A wrong input
  /// fails at the call, naming the axis: `[with Missing = haliax::axis_types<Embed>]`.
  template <class AxX>
  requires(sizeof...(P) == 0) && HasAxes<axis_types_of<AxX>, axis_types<std::remove_cvref_t<decltype(Ax)>>>
  named_array<T, AxX> operator()(const named_array<T, AxX>& x) const {
    using X = named_array<T, AxX>;
    auto ms = mean(square(x), Ax);
    X y = multiply(x, rsqrt(add(ms, eps)));
    if (weight) y = multiply(y, unit_offset ? add(*weight, 1.0) : *weight);
    if (bias) y = add(y, *bias);
    return y;
  }
};

}  // namespace haliax::nn
