// haliax/nn/stacked.hpp: a stack of identical layers whose parameters share a leading `Layers` axis.
//
//   template <class Pre = haliax::axes<>>
//   struct block {                                  // one layer; Pre = axes<Layers> when stacked
//     BOOST_HANA_DEFINE_STRUCT(block, (haliax::nn::LayerNorm<Embed, Pre>, ln), (haliax::nn::Mlp<Embed, Mlp, Pre>, mlp));
//     template <class X> X operator()(const X& x) const requires std::is_same_v<Pre, haliax::axes<>> { ... }
//   };
//   using stack_t = haliax::nn::Stacked<Layers, block>;
//   auto h = stack_t::init(12 * Layers, key, [&](haliax::random::key k) { return block<>::init(k, ...); });
//   auto y = h.fold(x, [](const block<>& layer, const auto& x, std::int64_t) { return layer(x); },
//                   haliax::nn::checkpoint_policy::per_layer);
//
// This is how upstream stores a transformer's layers (`haliax.nn.Stacked`): every parameter is one array
// {layers, ...}, so the optimizer, checkpoints and sharding see 1 array per parameter kind, not one per layer.
// `fold` runs the layers in order as a loop over views of the stacked buffers (no copies).
#pragma once

#include <string_view>

#include <boost/hana/accessors.hpp>
#include <boost/hana/at.hpp>
#include <boost/hana/define_struct.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/range.hpp>
#include <boost/hana/second.hpp>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "../autodiff.hpp"
#include "../core.hpp"
#include "../detail/ad.hpp"
#include "../ops/layout.hpp"
#include "../random.hpp"

namespace haliax::nn {

/// What a stacked fold keeps for the backward pass (upstream `gradient_checkpointing`).
enum class checkpoint_policy {
  none,       ///< keep every layer's internals (fastest, most memory)
  per_layer,  ///< keep only each layer's input (the carry) and recompute the layer in backward
              ///< (upstream `gradient_checkpointing: true`)
  nested,     ///< keep only every ceil(sqrt(L))-th carry; recompute groups of layers in backward
};

namespace detail::stacked {

template <class T>
inline constexpr bool is_optional_v = false;
template <class T>
inline constexpr bool is_optional_v<std::optional<T>> = true;

/// Visits a stacked module `s` (type Block<axes<Layers>>) together with the per-layer modules `ls`
/// (type Block<axes<>>), field by field. Array leaves go to `f(s_leaf, ls_leaves)`; other fields are copied
/// from the stack to the layers (`to_layers`) or from layer 0 to the stack.
template <class S, class L, class F>
void visit(S& s, const std::vector<L*>& ls, bool to_layers, F& f) {
  if constexpr (is_named_array_v<S>) {
    f(s, ls);
  } else if constexpr (is_optional_v<S>) {
    using LV = typename L::value_type;
    std::vector<LV*> sub;
    if (to_layers) {
      if (!s) return;
      for (auto* l : ls) sub.push_back(&l->emplace());
    } else {
      if (!ls.front()->has_value()) return;
      s.emplace();
      for (auto* l : ls) sub.push_back(&l->value());
    }
    visit(*s, sub, to_layers, f);
  } else if constexpr (boost::hana::Struct<S>::value) {
    constexpr auto n = decltype(boost::hana::length(boost::hana::accessors<S>()))::value;
    static_assert(n == decltype(boost::hana::length(boost::hana::accessors<L>()))::value,
                  "haliax::nn::Stacked: Block<axes<Layers>> and Block<axes<>> must have the same fields");
    boost::hana::for_each(boost::hana::make_range(boost::hana::size_c<0>, boost::hana::size_c<n>), [&](auto i) {
      auto get_s = boost::hana::second(boost::hana::at(boost::hana::accessors<S>(), i));
      auto get_l = boost::hana::second(boost::hana::at(boost::hana::accessors<L>(), i));
      using LF = std::remove_reference_t<decltype(get_l(*ls.front()))>;
      std::vector<LF*> sub;
      for (auto* l : ls) sub.push_back(&get_l(*l));
      visit(get_s(s), sub, to_layers, f);
    });
  } else {
    static_assert(std::is_same_v<S, L>, "haliax::nn::Stacked: a non-array field changes type between stacked and "
                                        "per-layer modules");
    if (to_layers) {
      for (auto* l : ls) *l = s;
    } else {
      s = *ls.front();
    }
  }
}

/// What a carry is compared by in `ReturnsCarry`: the axis tag types of an array (so that a note prints
/// `axis_types<Batch, Embed>`, not `axes<{}, {}>`), the type itself otherwise.
template <class C>
struct carry_axes {
  using type = C;
};
template <class T, class Axes>
struct carry_axes<named_array<T, Axes>> {
  using type = axis_types_of<Axes>;
};

}  // namespace detail::stacked

/// `Returned` and `Carry` have the same axes in the same order (both `axis_types<...>`): the step of
/// `ReturnsCarry` that names both lists.
template <class Returned, class Carry>
concept SameCarryAxes = std::is_same_v<Returned, Carry>;

/// A layer function's result `Returned` is exactly the carry type `Carry`: for arrays the same axes in the
/// same order and the same element type. A failure prints both axis lists:
/// `[with Returned = haliax::axis_types<Batch, Hidden>; Carry = haliax::axis_types<Batch, Embed>]`.
template <class Returned, class Carry>
concept ReturnsCarry = SameCarryAxes<typename detail::stacked::carry_axes<Returned>::type,
                                     typename detail::stacked::carry_axes<Carry>::type> &&
    std::is_same_v<Returned, Carry>;

/// `F` is a layer function for `Stacked<...>::fold` over layers of type `Layer`: `f(layer, carry, i)` (called
/// as const, with a const layer, a const carry and the std::int64_t layer index) returns the next carry, of
/// the carry's exact type.
template <class F, class Layer, class Carry>
concept LayerFunction = std::invocable<const F&, const Layer&, const Carry&, std::int64_t> &&
    ReturnsCarry<std::remove_cvref_t<std::invoke_result_t<const F&, const Layer&, const Carry&, std::int64_t>>,
                 Carry>;

/// Where a Stacked's layers come from when they are not held in its own arrays: `layer(i)` returns layer i as
/// fresh arrays (while a gradient is taken, tracked so that their gradients reach the source's owner). Levanter's
/// FSDP (levanter/distributed/fsdp.hpp) gathers each layer's parameters from the ranks just in time this way.
template <class Layer>
struct layer_source {
  virtual ~layer_source() = default;
  virtual std::int64_t num_layers() const = 0;
  virtual Layer layer(std::int64_t i) const = 0;
};

/// `Block<axes<>>` is one layer and `Block<axes<LayersAx>>` the same module with every parameter stacked on a
/// leading Layers axis. Reflected names: `stacked.<block fields>` (as upstream).
template <auto LayersAx, template <class> class Block>
struct Stacked {
  using layer_type = Block<axes<>>;
  using stacked_type = Block<axes<LayersAx>>;
  /// Upstream class name (`haliax.nn.Stacked`): weight-decay masks also match the class path `<class_name>.<field>`.
  static constexpr std::string_view class_name = "Stacked";
  BOOST_HANA_DEFINE_STRUCT(Stacked, (stacked_type, stacked));
  /// When set, `fold` and `unstack` take the layers from here and `stacked` is not read (not a parameter: trees,
  /// checkpoints and optimizers never see it).
  std::shared_ptr<const layer_source<layer_type>> source;

  /// Builds `n` layers with `make(key_i)` (keys from `split(k, n)`, as upstream's vmapped init) and stacks them.
  template <class Make>
  static Stacked init(sized_axis<std::remove_cvref_t<decltype(LayersAx)>> n, random::key k, Make make) {
    if (n.size < 1) throw shape_error("haliax::nn::Stacked::init: needs at least one layer (got " +
                                      std::to_string(n.size) + ")");
    auto keys = random::split(k, static_cast<std::size_t>(n.size));
    std::vector<layer_type> layers;
    layers.reserve(keys.size());
    for (auto& ki : keys) layers.push_back(make(ki));
    return from_layers(layers);
  }

  /// Stacks per-layer modules (all of the same shapes) into one.
  static Stacked from_layers(std::vector<layer_type> layers) {
    if (layers.empty()) throw shape_error("haliax::nn::Stacked::from_layers: no layers given");
    Stacked out;
    std::vector<layer_type*> ptrs;
    for (auto& l : layers) ptrs.push_back(&l);
    auto f = [&](auto& s_leaf, const auto& l_leaves) {
      using LL = std::remove_cvref_t<decltype(*l_leaves.front())>;
      std::vector<LL> arrays;
      for (auto* p : l_leaves) arrays.push_back(*p);
      s_leaf = stack(LayersAx, arrays);
    };
    detail::stacked::visit(out.stacked, ptrs, false, f);
    return out;
  }

  /// Number of layers (the size of the leading axis of every parameter).
  std::int64_t num_layers() const {
    if (source) return source->num_layers();
    std::int64_t n = -1;
    tree::for_each_leaf(stacked, [&](const std::string&, const auto& leaf) {
      if (n < 0) n = leaf.sizes()[0];
    });
    return n;
  }

  /// Every layer as a module of views into the stacked buffers (no copies). While a gradient is taken, each
  /// view's gradient is added into its slice of the stacked parameter's gradient as soon as it is produced.
  std::vector<layer_type> unstack() const {
    const std::int64_t n = num_layers();
    if (source) {
      std::vector<layer_type> from_source;
      for (std::int64_t i = 0; i < n; ++i) from_source.push_back(source->layer(i));
      return from_source;
    }
    std::vector<layer_type> layers(static_cast<std::size_t>(n < 0 ? 0 : n));
    if (layers.empty()) return layers;
    std::vector<layer_type*> ptrs;
    for (auto& l : layers) ptrs.push_back(&l);
    auto f = [&](const auto& s_leaf, const auto& l_leaves) {
      using SL = std::remove_cvref_t<decltype(s_leaf)>;
      using LL = std::remove_cvref_t<decltype(*l_leaves.front())>;
      using T = typename SL::value_type;
      if (s_leaf.sizes()[0] != n)
        throw shape_error("haliax::nn::Stacked: a parameter has " + std::to_string(s_leaf.sizes()[0]) +
                          " layers where the first has " + std::to_string(n) + ": " + s_leaf.shape_string());
      typename LL::shape_type ls{};
      for (std::size_t d = 0; d < LL::rank; ++d) ls[d] = s_leaf.sizes()[d + 1];
      const std::int64_t per = s_leaf.element_count() / n;
      std::shared_ptr<haliax::detail::ad::gather_node<T, typename SL::axes_type>> gather;
      if (haliax::detail::ad::tracked(s_leaf)) gather = haliax::detail::ad::make_gather(s_leaf);
      for (std::int64_t i = 0; i < n; ++i) {
        auto v = Kokkos::subview(s_leaf.view(), std::pair<std::size_t, std::size_t>(static_cast<std::size_t>(i * per),
                                                                                     static_cast<std::size_t>((i + 1) * per)));
        LL view(v, ls, s_leaf);
        if (gather) {
          haliax::detail::ad::make_sink(view, [gather, i, per](const LL& g) {
            const auto& acc = gather->ensure_grad();
            haliax::detail::ad::add_into_raw<T>("haliax::nn::Stacked(grad)", acc.data() + i * per, g.data(), per);
          });
        }
        *l_leaves[static_cast<std::size_t>(i)] = view;
      }
    };
    Block<axes<LayersAx>> s = stacked;  // visit needs a mutable stacked module; leaves are shared handles
    detail::stacked::visit(s, ptrs, true, f);
    return layers;
  }

  /// Runs the layers in order: `x = f(layer_i, x, i)` for i = 0..L-1, and returns the last x. `f` returns a
  /// value of x's exact type (`LayerFunction`; a layer that changes the carry's axes fails at this call, naming
  /// both axis lists). `policy` chooses what backward keeps (values and gradients do not change).
  template <class Carry, class F>
  requires LayerFunction<F, layer_type, Carry>
  Carry fold(Carry x, F f, checkpoint_policy policy = checkpoint_policy::none) const {
    if (source) return fold_from_source(std::move(x), f, policy);
    auto layers = unstack();
    const auto n = static_cast<std::int64_t>(layers.size());
    if (policy == checkpoint_policy::none || !is_recording()) {
      for (std::int64_t i = 0; i < n; ++i) x = f(std::as_const(layers[static_cast<std::size_t>(i)]), x, i);
      return x;
    }
    if (policy == checkpoint_policy::per_layer) {
      auto step = checkpoint([f](const layer_type& layer, const Carry& c, std::int64_t i) -> Carry {
        return f(layer, c, i);
      });
      for (std::int64_t i = 0; i < n; ++i) x = step(layers[static_cast<std::size_t>(i)], x, i);
      return x;
    }
    const auto group = static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(n))));
    auto run_group = checkpoint([f](const std::vector<layer_type>& g, const Carry& c, std::int64_t first) -> Carry {
      Carry y = c;
      for (std::size_t j = 0; j < g.size(); ++j) y = f(g[j], y, first + static_cast<std::int64_t>(j));
      return y;
    });
    for (std::int64_t first = 0; first < n; first += group) {
      const std::int64_t last = std::min(n, first + group);
      std::vector<layer_type> g(layers.begin() + first, layers.begin() + last);
      x = run_group(g, x, first);
    }
    return x;
  }

 private:
  // fold over layers taken from `source` one at a time: a layer's arrays live only while it runs (and, under a
  // checkpoint policy, again while its group is recomputed in backward), so at most one group is whole at once.
  template <class Carry, class F>
  Carry fold_from_source(Carry x, F f, checkpoint_policy policy) const {
    const std::int64_t n = source->num_layers();
    std::shared_ptr<const layer_source<layer_type>> src = source;
    if (policy == checkpoint_policy::none || !is_recording()) {
      for (std::int64_t i = 0; i < n; ++i) {
        const layer_type layer = src->layer(i);
        x = f(layer, x, i);
      }
      return x;
    }
    const std::int64_t group =
        policy == checkpoint_policy::per_layer
            ? 1
            : static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(n))));
    auto run_group = checkpoint([f, src](const Carry& c, std::int64_t first, std::int64_t last) -> Carry {
      Carry y = c;
      for (std::int64_t i = first; i < last; ++i) {
        const layer_type layer = src->layer(i);
        y = f(layer, y, i);
      }
      return y;
    });
    for (std::int64_t first = 0; first < n; first += group) x = run_group(x, first, std::min(n, first + group));
    return x;
  }
};

}  // namespace haliax::nn
