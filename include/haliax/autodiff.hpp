// haliax/autodiff.hpp: reverse-mode gradients of functions written with haliax ops.
//
//   auto loss_fn = [](const mlp& m, const batch_t& b) { return mean(square(m(b.x) - b.y)); };
//   auto [loss, grads] = haliax::value_and_grad(loss_fn)(model, batch);    // grads is an `mlp`
//
// The function is differentiated with respect to its first argument: an array, or a module (a struct
// reflected with BOOST_HANA_DEFINE_STRUCT, see tree.hpp) whose float leaves all receive gradients. The other
// arguments are constants. Model code is written on plain named arrays; while the gradient is taken, every op
// on a tracked array records its backward rule on a tape (detail/ad.hpp), and nothing is recorded otherwise.
#pragma once

#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ambient.hpp"
#include "core.hpp"
#include "detail/ad.hpp"
#include "detail/profile.hpp"
#include "tree.hpp"

namespace haliax {

namespace detail::ad {

template <class X>
inline constexpr bool is_pair_like_v = false;
template <class A, class B>
inline constexpr bool is_pair_like_v<std::pair<A, B>> = true;
template <class A, class... B>
inline constexpr bool is_pair_like_v<std::tuple<A, B...>> = true;

template <class X>
inline constexpr bool is_scalar_loss_v = false;
template <class T>
inline constexpr bool is_scalar_loss_v<named_array<T, axes<>>> = FloatElement<T>;

/// Drops autodiff nodes from every array leaf of `x` (whatever tree it is).
template <class X>
void strip(X& x) {
  if constexpr (is_named_array_v<X>) {
    x.set_ad_node(nullptr);
  } else if constexpr (is_pair_like_v<X>) {
    std::apply([](auto&... e) { (strip(e), ...); }, x);
  } else {
    tree::for_each_leaf(x, [](const std::string&, auto& leaf) { leaf.set_ad_node(nullptr); });
  }
}

/// Gives every float leaf of `m` a fresh leaf node on the active tape.
template <class M>
void attach_leaves(M& m) {
  tree::for_each_leaf(m, [](const std::string&, auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (FloatElement<typename L::value_type>) {
      if (leaf.valid()) make_leaf(leaf);
    }
  });
}

/// Replaces every float leaf of the tracked copy `m` by its gradient (zeros where nothing flowed).
template <class M>
void collect_grads(M& m) {
  tree::for_each_leaf(m, [](const std::string&, auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (FloatElement<typename L::value_type>) {
      auto n = leaf.ad_node();
      if (n && n->grad.valid()) {
        leaf = n->grad;
      } else if (leaf.valid()) {
        leaf = zeros_like(leaf);
      }
    }
    leaf.set_ad_node(nullptr);
  });
}

template <class Out>
const auto& loss_of(const Out& out) {
  if constexpr (is_pair_like_v<Out>) {
    return std::get<0>(out);
  } else {
    return out;
  }
}

template <class F, class M, class... Args>
auto run_value_and_grad(const F& f, const M& module, Args&&... args) {
  tape_scope scope;
  M p = module;
  attach_leaves(p);
  auto out = [&] {
    haliax::detail::profile::region prof([] { return std::string("forward"); }, 0.0);
    return f(std::as_const(p), std::forward<Args>(args)...);
  }();
  using Out = decltype(out);
  using Loss = std::remove_cvref_t<decltype(loss_of(out))>;
  static_assert(is_scalar_loss_v<Loss>,
                "haliax::value_and_grad: the function must return a rank-0 float array (the loss), or a pair "
                "(loss, aux)");
  const auto& loss = loss_of(out);
  {
    named_array<typename Loss::value_type, axes<>> seed;
    {
      pause_guard pause;
      seed = ones_like(loss);
    }
    haliax::detail::profile::region prof([] { return std::string("backward"); }, 0.0);
    backward(scope.t, loss, seed);
  }
  collect_grads(p);
  strip(out);
  return std::pair<Out, M>{std::move(out), std::move(p)};
}

}  // namespace detail::ad

/// `value_and_grad(f)(x, args...)` returns `{f(x, args...), df/dx}`. `f` returns a rank-0 float array (the
/// loss) or a `std::pair`/`std::tuple` whose first element is the loss and the rest auxiliary outputs (metrics),
/// which are returned as computed. The gradient has the type of `x`: an array or a module of the same type,
/// with zeros where the loss does not depend on a leaf. Int and bool leaves are passed through unchanged.
template <class F>
auto value_and_grad(F f) {
  return [f = std::move(f)](const auto& x, auto&&... args) {
    return detail::ad::run_value_and_grad(f, x, std::forward<decltype(args)>(args)...);
  };
}

/// `grad(f)(x, args...)`: only the gradient of `value_and_grad`.
template <class F>
auto grad(F f) {
  return [f = std::move(f)](const auto& x, auto&&... args) {
    return detail::ad::run_value_and_grad(f, x, std::forward<decltype(args)>(args)...).second;
  };
}

/// `x` as a constant: the same values, through which no gradient flows (upstream `stop_gradient`).
template <class T, class Axes>
named_array<T, Axes> stop_gradient(const named_array<T, Axes>& x) {
  auto r = x;
  r.set_ad_node(nullptr);
  return r;
}

/// Whether a gradient is being recorded on this thread (true inside the function given to `value_and_grad`).
inline bool is_recording() { return detail::ad::recording(); }

/// Runs its body without recording: everything computed inside is a constant for the gradient.
using no_grad_guard = detail::ad::pause_guard;

// ---------------------------------------------------------------------------------------------------------
// Gradient checkpointing (rematerialisation)

namespace detail::ad {

template <class X>
void collect_outer_tracked(const X& x, bool& any) {
  if constexpr (is_named_array_v<X>) {
    if (tracked(x)) any = true;
  } else if constexpr (is_pair_like_v<X>) {
    std::apply([&](const auto&... e) { (collect_outer_tracked(e, any), ...); }, x);
  } else {
    tree::for_each_leaf(x, [&](const std::string&, const auto& leaf) {
      if (tracked(leaf)) any = true;
    });
  }
}

/// In a recomputation: gives each leaf of `x` that was tracked on the outer tape (id `outer`) a leaf node of
/// the inner tape, and queues the transfer of its inner gradient to the outer node.
template <class X>
void rebind_leaves(X& x, std::uint64_t outer, std::vector<std::function<void()>>& transfers) {
  auto one = [&](auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (FloatElement<typename L::value_type>) {
      auto outer_node = leaf.ad_node();
      if (!outer_node || outer_node->tape_id != outer) return;
      auto inner_node = make_leaf(leaf);
      transfers.push_back([outer_node, inner_node] {
        if (inner_node->grad.valid()) accumulate(*outer_node, inner_node->grad);
      });
    }
  };
  if constexpr (is_named_array_v<X>) {
    one(x);
  } else if constexpr (is_pair_like_v<X>) {
    std::apply([&](auto&... e) { (rebind_leaves(e, outer, transfers), ...); }, x);
  } else {
    tree::for_each_leaf(x, [&](const std::string&, auto& leaf) { one(leaf); });
  }
}

}  // namespace detail::ad

/// `checkpoint(f)(args...)` computes `f(args...)` (which returns one float array) without keeping anything
/// of its inside for the backward pass: only the arguments are saved, and backward recomputes `f` under its
/// own tape. The values and gradients are identical to those of `f`; peak memory falls by everything `f`
/// would have saved. Upstream `gradient_checkpointing: true` is `checkpoint` around each layer. The ambient value in
/// force (ambient.hpp) is saved too, and the recomputation runs with its rebound copy in force.
/// `f` must be deterministic (randomness from keys, as everywhere in haliax).
template <class F>
auto checkpoint(F f) {
  return [f = std::move(f)](const auto&... args) {
    using Out = std::remove_cvref_t<decltype(f(args...))>;
    static_assert(is_named_array_v<Out>, "haliax::checkpoint: the function must return one named array");
    bool any = false;
    if (detail::ad::recording()) (detail::ad::collect_outer_tracked(args, any), ...);
    if (!any) return f(args...);
    const std::uint64_t outer = detail::ad::thread_state().current->id;
    std::shared_ptr<const ambient> amb = current_ambient();  // what f reads besides its arguments (ambient.hpp)
    Out out;
    {
      detail::ad::pause_guard pause;
      out = f(args...);
    }
    if constexpr (FloatElement<typename Out::value_type>) {
      detail::ad::record_custom(out, [f, outer, amb, saved = std::make_tuple(args...)](const Out& g) {
        detail::ad::tape_scope inner;
        auto copies = saved;
        std::vector<std::function<void()>> transfers;
        std::apply([&](auto&... a) { (detail::ad::rebind_leaves(a, outer, transfers), ...); }, copies);
        ambient_scope in_force(amb ? amb->rebound(outer, transfers) : nullptr);
        auto y = std::apply(f, copies);
        detail::ad::backward(inner.t, y, g);
        for (auto& t : transfers) t();
      });
    }
    return out;
  };
}

}  // namespace haliax
