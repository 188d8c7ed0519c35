// haliax/nn/linear.hpp: the affine layer, with input and output each one or several named axes.
//
//   using c_fc_t = haliax::nn::Linear<axes<Embed>, axes<Mlp>>;
//   auto c_fc = c_fc_t::init(key, 768 * Embed, 3072 * Mlp);      // weight {embed, mlp}, bias {mlp}
//   auto h = c_fc(x);                                          // {batch, pos, embed} -> {batch, pos, mlp}
//
// `Pre` are leading axes the parameters carry when a module is stacked (`Stacked<Layers, Block>` stores every
// layer's Linear with a leading Layers axis); a module is applied only without them (a layer's view).
//
// A `linear_side` in force as the thread's ambient value (ambient.hpp) adds its output to every float Linear it
// recognises by its weight, as upstream's LoraLinear does beside the Linear it wraps (levanter/lora.hpp):
//
//   haliax::ambient_scope scope(side);             // y = x . W + b + side(x) for the Linears `side` knows
#pragma once

#include <string_view>

#include <boost/hana/define_struct.hpp>
#include <cmath>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "../ambient.hpp"
#include "../core.hpp"
#include "../ops/dot.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/layout.hpp"
#include "../random.hpp"
#include "tensor_parallel.hpp"

namespace haliax::nn {

/// An input with axes `Have` suits a Linear from `In` to `Out` (all `axis_types<...>`): it has every In axis
/// and no Out axis. A failure names the axes: `[with Missing = haliax::axis_types<Hidden>]` (an In axis the
/// input lacks) or `[with Present = haliax::axis_types<Embed>]` (an Out axis it already has).
template <class Have, class In, class Out>
concept LinearInput = HasAxes<Have, In> && LacksAxes<Have, Out>;

template <class In, class Out, class Pre = axes<>, class T = float, bool OutFirst = false>
struct Linear;

/// The axes a linear_side sees: the Linear's input with its In axes flattened to side_in and all its other axes to
/// side_rows (in order); it answers with side_out, the Out axes flattened.
inline constexpr struct SideRows final : axis<"side_rows"> {
} SideRows;
inline constexpr struct SideIn final : axis<"side_in"> {
} SideIn;
inline constexpr struct SideOut final : axis<"side_out"> {
} SideOut;

/// A computation beside the float Linears applied on this thread while it is the ambient value.
struct linear_side : ambient {
  /// `weight`: the data of the applied Linear's weight (one layer's view of a stacked weight points into the stacked
  /// buffer, at the layer's offset); `x` {side_rows, side_in}: its input. Returns {side_rows, side_out}, added to
  /// the Linear's output after the bias, or nothing for a Linear the side does not touch.
  virtual std::optional<named_array<float, axes<SideRows, SideOut>>> apply(
      const float* weight, const named_array<float, axes<SideRows, SideIn>>& x) const = 0;
};

/// y = x . W + b, contracting the `In` axes of `x` with W's and producing the `Out` axes (upstream
/// `haliax.nn.Linear`). Every other axis of `x` is kept. Parameters: `weight` {Pre..., In..., Out...} (GPT-2's
/// Conv1D layout), or {Pre..., Out..., In...} with `OutFirst` (upstream `out_first=True`, torch's nn.Linear
/// layout, which the Llama family uses), and an optional `bias` {Pre..., Out...}.
template <auto... I, auto... O, auto... P, class T, bool OutFirst>
struct Linear<axes<I...>, axes<O...>, axes<P...>, T, OutFirst> {
  using weight_type =
      std::conditional_t<OutFirst, named_array<T, axes<P..., O..., I...>>, named_array<T, axes<P..., I..., O...>>>;
  using bias_type = named_array<T, axes<P..., O...>>;
  using in_types = axis_types<std::remove_cvref_t<decltype(I)>...>;
  using out_types = axis_types<std::remove_cvref_t<decltype(O)>...>;

  /// Upstream class name (`haliax.nn.Linear`): weight-decay masks also match the class path `<class_name>.<field>`.
  static constexpr std::string_view class_name = "Linear";
  BOOST_HANA_DEFINE_STRUCT(Linear, (weight_type, weight), (std::optional<bias_type>, bias));

  /// Upstream initialisation: weight ~ truncated_normal(-3, 3) * init_scale / sqrt(fan_in) with fan_in the
  /// product of the In sizes (drawn in the weight's own layout, so Out first with `OutFirst`); bias zero. Sizes
  /// are given In first, then Out:
  /// `Linear<axes<Embed>, axes<Heads, HeadSize>>::init(k, 768 * Embed, 12 * Heads, 64 * HeadSize)`.
  static Linear init(random::key k, sized_axis<std::remove_cvref_t<decltype(I)>>... in,
                     sized_axis<std::remove_cvref_t<decltype(O)>>... out, bool use_bias = true,
                     double init_scale = 1.0) requires(sizeof...(P) == 0 && std::is_same_v<T, float>) {
    const double fan_in = static_cast<double>((in.size * ... * std::int64_t{1}));
    Linear m;
    if constexpr (OutFirst)
      m.weight = multiply(random::truncated_normal(k, out..., in..., -3.0f, 3.0f),
                          static_cast<float>(init_scale / std::sqrt(fan_in)));
    else
      m.weight = multiply(random::truncated_normal(k, in..., out..., -3.0f, 3.0f),
                          static_cast<float>(init_scale / std::sqrt(fan_in)));
    if (use_bias) m.bias = zeros<float>(out...);
    return m;
  }

  /// Applies the layer to `x` (element type T), which must have every `In` axis and no `Out` axis; the result
  /// has x's other axes, then Out. A wrong input fails at the call, naming the axis (`LinearInput`).
  template <class AxX>
  requires(sizeof...(P) == 0) && LinearInput<axis_types_of<AxX>, in_types, out_types>
  auto operator()(const named_array<T, AxX>& x) const {
    auto y = apply_weight(x);
    if constexpr (std::is_same_v<T, float>) {
      if (const auto& a = current_ambient())
        if (const auto* side = dynamic_cast<const linear_side*>(a.get())) add_side(*side, x, y);
    }
    return y;
  }

 private:
  template <class AxX>
  auto apply_weight(const named_array<T, AxX>& x) const {
    if constexpr (std::is_same_v<T, float>) {
      // Tensor parallelism (tensor_parallel.hpp): column-parallel when an output axis is split, row-parallel when
      // an input axis is.
      if (const tensor_parallel* tp = current_tensor_parallel()) {
        const bool row = (tp->splits(std::remove_cvref_t<decltype(I)>::name) || ...);
        const bool col = (tp->splits(std::remove_cvref_t<decltype(O)>::name) || ...);
        if (row && col)
          throw shape_error("haliax::nn::Linear: both an input and an output axis are split over the tensor-parallel "
                            "group; split one of them");
        if (col) {
          auto y = dot(detail::tp::enter(x, *tp), weight, I...);
          if (bias) return add(y, *bias);
          return y;
        }
        if (row) {
          auto y = detail::tp::leave(dot(x, weight, I...), *tp);
          if (bias) return add(y, *bias);
          return y;
        }
      }
    }
    auto y = dot(x, weight, I...);
    if (bias) return add(y, *bias);
    return y;
  }

  // y += side(x), the input and the answer reshaped to and from the side's {side_rows, side_in / side_out}.
  template <class AxX, class Y>
  void add_side(const linear_side& side, const named_array<float, AxX>& x, Y& y) const {
    auto xr = rearrange<axes<ellipsis, I...>>(x);  // x's own buffer when the In axes are already last
    constexpr std::size_t n_in = sizeof...(I), rank = AxX::rank;
    std::int64_t rows = 1, in = 1;
    for (std::size_t d = 0; d < rank; ++d) (d + n_in < rank ? rows : in) *= xr.sizes()[d];
    auto z = side.apply(weight.data(), haliax::detail::layout::reinterpret<axes<SideRows, SideIn>>(xr, {rows, in}));
    if (!z) return;
    if (z->sizes()[0] != rows || z->sizes()[1] * rows != y.element_count())
      throw shape_error("haliax::nn::Linear: a linear_side answered " + z->shape_string() + " for an output " +
                        y.shape_string());
    y = add(y, haliax::detail::layout::reinterpret<typename Y::axes_type>(*z, y.sizes()));
  }
};

}  // namespace haliax::nn
