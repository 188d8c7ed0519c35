// haliax/nn/dropout.hpp: inverted dropout driven by a PRNG key, deterministic for a given key.
//
//   haliax::nn::Dropout drop{0.1};
//   auto y = drop(x, key, /*inference=*/false);     // same axes as x; identity when inference or p == 0
#pragma once

#include <string_view>

#include <boost/hana/define_struct.hpp>
#include <stdexcept>
#include <string>

#include "../core.hpp"
#include "../ops/elementwise.hpp"
#include "../random.hpp"

namespace haliax::nn {

/// Zeroes each element with probability `pdrop` and scales the rest by 1 / (1 - pdrop) (upstream
/// `haliax.nn.Dropout`). The mask comes from `bernoulli(key, 1 - pdrop)` over all of x's axes, so a run is
/// reproducible from its key; `inference = true` (evaluation) makes it the identity.
struct Dropout {
  /// Upstream class name (`haliax.nn.Dropout`): weight-decay masks also match the class path `<class_name>.<field>`.
  static constexpr std::string_view class_name = "Dropout";
  BOOST_HANA_DEFINE_STRUCT(Dropout, (double, pdrop));

  template <class T, auto... A>
  named_array<T, axes<A...>> operator()(const named_array<T, axes<A...>>& x, random::key k, bool inference = false) const {
    if (pdrop < 0.0 || pdrop >= 1.0)
      throw std::invalid_argument("haliax::nn::Dropout: pdrop must be in [0, 1), got " + std::to_string(pdrop));
    if (inference || pdrop == 0.0) return x;
    auto keep = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return random::bernoulli(k, sized_axis<std::remove_cvref_t<decltype(A)>>{x.sizes()[I]}..., static_cast<float>(1.0 - pdrop));
    }(std::make_index_sequence<sizeof...(A)>{});
    return multiply(where(keep, x, 0.0), static_cast<double>(1.0 / (1.0 - pdrop)));
  }
};

}  // namespace haliax::nn
