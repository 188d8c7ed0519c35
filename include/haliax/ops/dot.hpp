// haliax/ops/dot.hpp: contraction over named axes (upstream `haliax.dot`).
//
//   auto y  = dot(x, w, Embed);               // {batch, embed} . {embed, mlp} -> {batch, mlp}
//   auto s  = dot(q, k, HeadDim);             // shared {batch, head} batch; {pos} and {kpos} are kept
//   auto yo = dot<axes<Mlp, ellipsis>>(x, w, Embed);   // choose the output order
//
// Contracted axes must be axes of both arguments. Other shared axes are batched over; the rest are kept.
// The default output order is the first occurrence in (a's axes, b's axes) minus the contracted ones.
// Every dot is one GEMM per batch element, fed without copies when the operands are already laid out as
// [batch..., M..., K...] or [batch..., K..., M...] (and likewise for b); otherwise an operand is permuted
// into that layout first.
//
// Gradient (float types): a's is dot(g, b) contracted over b's kept axes, b's is dot(a, g) contracted over a's
// kept axes, each produced directly in its operand's axis order. They reuse the operands as the forward laid
// them out for the GEMM (so an operand the forward had to permute keeps its permuted copy until backward, and
// only when the other operand needs a gradient), and each backward dot takes its operands in whichever order
// needs the fewest copies: with the usual layouts both are plain GEMMs with transpose flags, no copy at all.
#pragma once

#include <type_traits>

#include "../detail/gemm.hpp"
#include "../detail/profile.hpp"
#include "elementwise.hpp"

namespace haliax {

namespace detail {
template <class AxA, class AxB, class... C>
struct dot_name_clash;
template <class Out, class AxA, class AxB, class... C>
struct dot_valid_order;
}  // namespace detail

/// `C...` can be contracted between arrays with axes `AxA` and `AxB`: each is an axis of both, listed once,
/// and the axes the result keeps have distinct names. A failure names the axes:
/// `[with Missing = haliax::axis_types<Mlp>]`, `[with NameClash = haliax::same_axis_name<{"embed"}, ...>]`.
template <class AxA, class AxB, class... C>
concept DotContractible = (AxisTag<C> && ...) && DistinctAxisNames<std::remove_cvref_t<C>...> &&
    HasAxes<axis_types_of<AxA>, axis_types<std::remove_cvref_t<C>...>> &&
    HasAxes<axis_types_of<AxB>, axis_types<std::remove_cvref_t<C>...>> &&
    NoAxisNameClash<typename detail::dot_name_clash<AxA, AxB, C...>::type>;

/// `Out` is `void` (the default order) or a valid full or partial (`ellipsis`) order of the axes a `dot` of
/// `AxA` and `AxB` over `C...` keeps.
template <class Out, class AxA, class AxB, class... C>
concept DotOutputOrder = std::is_void_v<Out> || detail::dot_valid_order<Out, AxA, AxB, C...>::value;

namespace detail {

template <class LA, class LB, class LC>
struct dot_layout {
  using bat = difference<intersection<LA, LB>, LC>;
  using m = difference<difference<LA, LB>, LC>;
  using n = difference<difference<LB, LA>, LC>;
  using k = intersection<LA, LC>;  // contraction order follows a
  using a_nt = mp::mp_append<bat, m, k>;
  using a_t = mp::mp_append<bat, k, m>;
  using b_nt = mp::mp_append<bat, k, n>;
  using b_t = mp::mp_append<bat, n, k>;
  static constexpr bool a_as_is = std::is_same_v<LA, a_nt> || std::is_same_v<LA, a_t>;
  static constexpr bool a_trans = !std::is_same_v<LA, a_nt> && std::is_same_v<LA, a_t>;
  static constexpr bool b_as_is = std::is_same_v<LB, b_nt> || std::is_same_v<LB, b_t>;
  static constexpr bool b_trans = !std::is_same_v<LB, b_nt> && std::is_same_v<LB, b_t>;
  using canonical = mp::mp_append<bat, m, n>;
  using default_out = mp::mp_append<difference<LA, LC>, n>;
};

template <class AxA, class AxB, class... C>
struct dot_name_clash {
  using layout = dot_layout<to_list<AxA>, to_list<AxB>, mp::mp_list<std::remove_cvref_t<C>...>>;
  using type = name_clash_in<typename layout::default_out>;
};
template <class Out, class AxA, class AxB, class... C>
struct dot_valid_order
    : std::bool_constant<valid_order_v<
          typename dot_layout<to_list<AxA>, to_list<AxB>, mp::mp_list<std::remove_cvref_t<C>...>>::default_out,
          to_list<Out>>> {};

/// Size of each axis in list `L`, looked up in `a` first, then `b`.
template <class L, class TA, class AxA, class TB, class AxB>
std::array<std::int64_t, mp::mp_size<L>::value> sizes_from(const named_array<TA, AxA>& a,
                                                           const named_array<TB, AxB>& b) {
  std::array<std::int64_t, mp::mp_size<L>::value> out{};
  std::size_t i = 0;
  mp::mp_for_each<L>([&]<class Tag>(Tag) {
    if constexpr (contains_v<to_list<AxA>, Tag>) {
      out[i++] = a.sizes()[index_of_v<to_list<AxA>, Tag>];
    } else {
      out[i++] = b.sizes()[index_of_v<to_list<AxB>, Tag>];
    }
  });
  return out;
}

template <class L, std::size_t N>
std::int64_t count_of(const std::array<std::int64_t, N>& s, std::size_t begin) {
  std::int64_t p = 1;
  for (std::size_t i = begin; i < begin + mp::mp_size<L>::value; ++i) p *= s[i];
  return p;
}

/// `x` laid out as list `To` (a permutation of its axes): itself if already so, otherwise a permuted copy.
template <class To, class T, class Ax>
named_array<T, to_axes<To>> as_layout(const named_array<T, Ax>& x) {
  if constexpr (std::is_same_v<to_list<Ax>, To>) {
    return x;
  } else {
    return broadcast_copy<to_axes<To>>("haliax::dot(permute operand)", x, sizes_in<to_axes<To>, Ax>(x.sizes()));
  }
}

/// Copies a `dot<R>` of operands with axes LP, LQ contracted over LC makes: operand permutes plus the final
/// reordering of the output.
template <class R, class LP, class LQ, class LC>
inline constexpr int dot_copies = [] {
  using L = dot_layout<LP, LQ, LC>;
  return int(!L::a_as_is) + int(!L::b_as_is) + int(!std::is_same_v<typename L::canonical, R>);
}();

template <class R, class T, class AxP, class AxQ, class... C>
named_array<T, R> dot_into(const named_array<T, AxP>& p, const named_array<T, AxQ>& q, mp::mp_list<C...>);

template <class Default, class Out>
struct dot_out_order {
  using type = resolve_order<Default, to_list<Out>>;
};
template <class Default>
struct dot_out_order<Default, void> {
  using type = Default;
};

}  // namespace detail

/// Contracts `c...` between `a` and `b`, batching over their other shared axes and keeping the rest.
/// `Out` (optional) is the output order, a full list or a partial one with `ellipsis`.
/// `dot(x {batch, embed}, w {embed, mlp}, Embed)` -> {batch, mlp}. Gradient (float types): g . b to a and
/// a . g to b, contracted over the other operand's kept axes (see above).
template <class Out = void, class T, class AxA, class AxB, class... C>
requires NumericElement<T> && DotContractible<AxA, AxB, C...> && DotOutputOrder<Out, AxA, AxB, C...>
auto dot(const named_array<T, AxA>& a, const named_array<T, AxB>& b, C...) {
  using LA = detail::to_list<AxA>;
  using LB = detail::to_list<AxB>;
  using L = detail::dot_layout<LA, LB, detail::mp::mp_list<std::remove_cvref_t<C>...>>;
  detail::check_shared_sizes("haliax::dot", a, b);

  using a_layout = std::conditional_t<L::a_as_is, LA, typename L::a_nt>;
  using b_layout = std::conditional_t<L::b_as_is, LB, typename L::b_nt>;
  auto ap = detail::as_layout<a_layout>(a);
  auto bp = detail::as_layout<b_layout>(b);

  using canon = typename L::canonical;
  auto csizes = detail::sizes_from<canon>(a, b);
  auto all =
      detail::sizes_from<detail::mp::mp_append<typename L::bat, typename L::m, typename L::n, typename L::k>>(a, b);
  constexpr std::size_t nb = detail::mp::mp_size<typename L::bat>::value;
  constexpr std::size_t nm = detail::mp::mp_size<typename L::m>::value;
  constexpr std::size_t nn = detail::mp::mp_size<typename L::n>::value;
  const std::int64_t batch = detail::count_of<typename L::bat>(all, 0);
  const std::int64_t m = detail::count_of<typename L::m>(all, nb);
  const std::int64_t n = detail::count_of<typename L::n>(all, nb + nm);
  const std::int64_t k = detail::count_of<typename L::k>(all, nb + nm + nn);

  auto result = named_array<T, detail::to_axes<canon>>::allocate(csizes, "haliax::dot");
  const T* pa = ap.data();
  const T* pb = bp.data();
  T* pc = result.data();
  {
    detail::profile::region prof(
        [&] {
          std::string s = "dot ";
          auto names = [&](const auto& arr) {
            std::string r = "{";
            for (auto nm : arr) r += (r.size() > 1 ? "," : "") + std::string(nm);
            return r + "}";
          };
          s += names(named_array<T, AxA>::axis_names()) + " x " + names(named_array<T, AxB>::axis_names());
          return s;
        },
        2.0 * double(batch) * double(m) * double(n) * double(k));
    detail::gemm_batched<T>(L::a_as_is && L::a_trans, L::b_as_is && L::b_trans, batch, m, n, k, pa, pb, pc);
  }

  using out_list = typename detail::dot_out_order<typename L::default_out, Out>::type;
  auto out = detail::as_layout<out_list>(result);
  if constexpr (FloatElement<T>) {
    if (detail::ad::any_tracked(a, b))
      detail::ad::record(
          out,
          [ap = detail::ad::tracked(b) ? ap : decltype(ap){}, bp = detail::ad::tracked(a) ? bp : decltype(bp){}](
              const auto& g, auto needs) {
            named_array<T, AxA> ga;
            named_array<T, AxB> gb;
            // da = g . b over n (b's kept axes); db = a . g over m (a's kept axes)
            if (needs[0]) ga = detail::dot_into<AxA>(g, bp, typename L::n{});
            if (needs[1]) gb = detail::dot_into<AxB>(ap, g, typename L::m{});
            return std::tuple{ga, gb};
          },
          a, b);
  }
  return out;
}

namespace detail {
/// `dot<R>(p, q, C...)` (C... the tags of list LC), taking p and q in the order that needs fewer copies.
template <class R, class T, class AxP, class AxQ, class... C>
named_array<T, R> dot_into(const named_array<T, AxP>& p, const named_array<T, AxQ>& q, mp::mp_list<C...>) {
  using LR = to_list<R>;
  using LC = mp::mp_list<C...>;
  if constexpr (dot_copies<LR, to_list<AxQ>, to_list<AxP>, LC> < dot_copies<LR, to_list<AxP>, to_list<AxQ>, LC>) {
    return dot<R>(q, p, C{}...);
  } else {
    return dot<R>(p, q, C{}...);
  }
}
}  // namespace detail

}  // namespace haliax
