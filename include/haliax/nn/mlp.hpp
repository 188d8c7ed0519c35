// haliax/nn/mlp.hpp: the transformer feed-forward block, up-projection, activation, down-projection.
//
//   using mlp_t = haliax::nn::Mlp<Embed, Mlp>;
//   auto mlp = mlp_t::init(key, 768 * Embed, 3072 * Mlp, haliax::nn::activation::gelu_new);
//   auto y = mlp(x);     // {batch, pos, embed} -> {batch, pos, embed}
#pragma once

#include <boost/hana/define_struct.hpp>
#include <string_view>

#include "../core.hpp"
#include "../random.hpp"
#include "activation.hpp"
#include "functions.hpp"
#include "linear.hpp"

namespace haliax::nn {

/// Applies `a` elementwise.
template <class X>
X apply_activation(activation a, const X& x) {
  switch (a) {
    case activation::relu:
      return relu(x);
    case activation::gelu:
      return gelu(x, false);
    case activation::gelu_new:
      return gelu_new(x);
    case activation::quick_gelu:
      return quick_gelu(x);
    case activation::silu:
      return silu(x);
  }
  return x;
}

template <auto EmbedAx, auto HiddenAx, class Pre = axes<>, class T = float>
struct Mlp;

/// c_proj(act(c_fc(x))): `c_fc` maps Embed to Hidden, `c_proj` Hidden back to Embed (the GPT-2 MLP; upstream
/// `haliax.nn.MLP` with one hidden layer). Parameters carry the stacking axes `Pre...`.
template <auto EmbedAx, auto HiddenAx, auto... P, class T>
struct Mlp<EmbedAx, HiddenAx, axes<P...>, T> {
  using embed_tag = std::remove_cvref_t<decltype(EmbedAx)>;
  using hidden_tag = std::remove_cvref_t<decltype(HiddenAx)>;
  using up_type = Linear<axes<EmbedAx>, axes<HiddenAx>, axes<P...>, T>;
  using down_type = Linear<axes<HiddenAx>, axes<EmbedAx>, axes<P...>, T>;
  /// Upstream class name (`haliax.nn.MLP`): weight-decay masks also match the class path `<class_name>.<field>`.
  static constexpr std::string_view class_name = "MLP";
  BOOST_HANA_DEFINE_STRUCT(Mlp, (up_type, c_fc), (down_type, c_proj), (activation, act));

  static Mlp init(random::key k, sized_axis<std::remove_cvref_t<decltype(EmbedAx)>> embed,
                  sized_axis<std::remove_cvref_t<decltype(HiddenAx)>> hidden, activation act = activation::gelu_new,
                  bool use_bias = true, double init_scale = 1.0) requires(sizeof...(P) == 0) {
    auto [k1, k2] = random::split(k);
    Mlp m;
    m.c_fc = up_type::init(k1, embed, hidden, use_bias, init_scale);
    m.c_proj = down_type::init(k2, hidden, embed, use_bias, init_scale);
    m.act = act;
    return m;
  }

  /// Applies the block to `x`, which must have the Embed axis and not the Hidden one (as `c_fc` needs); the
  /// other axes are kept, Embed comes last. A wrong input fails at the call, naming the axis:
  /// `[with Missing = haliax::axis_types<Embed>]`.
  template <class AxX>
  requires(sizeof...(P) == 0) && LinearInput<axis_types_of<AxX>, axis_types<embed_tag>, axis_types<hidden_tag>>
  auto operator()(const named_array<T, AxX>& x) const {
    return c_proj(apply_activation(act, c_fc(x)));
  }
};

}  // namespace haliax::nn
