// haliax/nn/loss.hpp: cross-entropy losses (upstream `haliax.nn.cross_entropy_loss`, and levanter's next-token
// loss with its z-loss and its block-wise form over the vocabulary, `cross_entropy_block_size`).
//
//   auto loss = haliax::nn::cross_entropy_loss(logits, Vocab, targets);                  // mean over tokens
//   auto per_token = haliax::nn::cross_entropy_loss(logits, Vocab, targets, reduce_none);
//   auto masked = haliax::nn::cross_entropy_loss(logits, Vocab, targets, where_mask{keep}, reduce_mean, 1e-4);
//   auto sum = haliax::nn::cross_entropy_loss<haliax::nn::reduce_sum_t>(logits, Vocab, targets);
//   auto big_vocab = haliax::nn::blockwise_cross_entropy_loss(h, lm_head, Embed, Vocab, targets, 4096);
//
// Per token (a row of the label axis) the loss is logsumexp(x) - x[target] for class-id targets, or
// sum_j t_j (logsumexp(x) - x_j) for a target distribution t (upstream's dot of the targets with the negative
// log-softmax), plus `z_loss_weight * logsumexp(x)^2` (levanter's z-loss). A `where_mask` drops tokens: they
// contribute nothing and do not count in the mean. Both are fused kernels: the forward reads each row once
// (an online log-sum-exp, chunk by chunk, that picks up the target logit on the way) and the backward writes
// (softmax - onehot) * g in one pass, recomputing the softmax from the saved log-normaliser.
//
// The block-wise form takes the hidden states and the lm-head weight instead of logits and never holds the
// [tokens, vocab] logits: the forward loops over vocabulary blocks, one GEMM per block into a [tokens, block]
// buffer, keeping the online log-sum-exp and the target logit; the backward recomputes each block's logits
// and accumulates d(hidden) and d(weight) block by block.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../core.hpp"
#include "../detail/ad.hpp"
#include "../detail/gemm.hpp"
#include "../detail/row_team.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/reduction.hpp"
#include "functions.hpp"

namespace haliax::nn {

/// Reduction tags for the losses (upstream `reduction=`): the mean over the kept tokens (the default), their
/// sum, or none (the per-token losses, zero where masked).
struct reduce_mean_t {};
struct reduce_sum_t {};
struct reduce_none_t {};
inline constexpr reduce_mean_t reduce_mean{};
inline constexpr reduce_sum_t reduce_sum{};
inline constexpr reduce_none_t reduce_none{};

/// One of `reduce_mean`, `reduce_sum`, `reduce_none`.
template <class R>
concept LossReduction =
    std::is_same_v<R, reduce_mean_t> || std::is_same_v<R, reduce_sum_t> || std::is_same_v<R, reduce_none_t>;

namespace detail {

/// Whether two axis lists hold the same axes (in any order).
template <class AxA, class AxB>
inline constexpr bool same_axis_set_v =
    (AxA::rank == AxB::rank) && haliax::detail::subset_v<haliax::detail::to_list<AxA>, haliax::detail::to_list<AxB>>;

/// Whether AxA's axes are all axes of AxB.
template <class AxA, class AxB>
inline constexpr bool axis_subset_v =
    haliax::detail::subset_v<haliax::detail::to_list<AxA>, haliax::detail::to_list<AxB>>;

/// sum over r in [0, n) of what `f(r, acc)` adds to acc, in double, with an order fixed by n alone on every
/// backend and thread count (Kokkos::parallel_reduce's order depends on both): blocks of 4096 terms are summed
/// in order, one block per work item, then the block sums in order by one work item, which writes the total to
/// `out[0]` in the arrays' memory. Nothing is read back: a loss stays on the device until the caller reads it
/// (once per step), where reading back the block sums cost a GPU a synchronisation per sum.
template <class F>
void ordered_sum(const char* label, std::int64_t n, const F& f, double* out) {
  constexpr std::int64_t block = 4096;
  const std::int64_t blocks = (n + block - 1) / block;
  // the partial sums in a cached buffer (given back without a fence: the total's kernel runs after, in order)
  haliax::detail::buffer_lease<double> part;
  part.view = haliax::detail::buffer_cache<double>::take(static_cast<std::size_t>(blocks > 0 ? blocks : 1), label);
  double* pp = part.view.data();
  if (blocks > 0)
    Kokkos::parallel_for(
        label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, blocks), KOKKOS_LAMBDA(std::int64_t b) {
          double acc = 0;
          const std::int64_t end = (b + 1) * block < n ? (b + 1) * block : n;
          for (std::int64_t r = b * block; r < end; ++r) f(r, acc);
          pp[b] = acc;
        });
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, 1), KOKKOS_LAMBDA(std::int64_t) {
        double total = 0;
        for (std::int64_t b = 0; b < blocks; ++b) total += pp[b];
        out[0] = total;
      });
}

/// How many tokens a reduction kept: all `tokens`, or with a mask the count in `kept` (a device scalar, so that
/// neither the loss nor its gradient reads it back).
struct kept_tokens {
  std::int64_t tokens = 0;
  named_array<double, axes<>> kept;  // valid with a mask
};

/// The result of a loss with reduction R over token axes Tok.
template <class R, class T, class Tok>
using loss_result_t = std::conditional_t<std::is_same_v<R, reduce_none_t>, named_array<T, Tok>, named_array<T, axes<>>>;

/// `x` laid out in the order `To` (a permutation of its axes): itself, or a permuted copy (no autodiff node).
template <class To, class T, class Ax>
named_array<T, To> in_order(const named_array<T, Ax>& x) {
  if constexpr (std::is_same_v<To, Ax>) {
    return x;
  } else {
    return haliax::detail::broadcast_copy<To>("haliax::nn::loss(permute)", x,
                                              haliax::detail::sizes_in<To, Ax>(x.sizes()));
  }
}

/// The bool mask `m` (axes a subset of Tok) broadcast to the token axes Tok with sizes `tok`.
template <class Tok, class AxM>
named_array<bool, Tok> mask_to_tokens(const named_array<bool, AxM>& m, const std::array<std::int64_t, Tok::rank>& tok) {
  if constexpr (std::is_same_v<AxM, Tok>) {
    return m;
  } else {
    return haliax::detail::broadcast_copy<Tok>("haliax::nn::loss(mask)", m, tok);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Row kernels. A row is one token's logits along the label axis.

/// Running state of an online log-sum-exp over a row: max m and sum of exp(x - m); for target distributions
/// also sum(t * x) and sum(t). `bad` is set by a NaN or +inf (the row then takes the two-pass general form).
template <class V>
struct lse_acc {
  V m, s, tx, ts;
  bool bad;
};

template <class V>
HALIAX_NN_INLINE lse_acc<V> lse_start() {
  return {neg_inf<V>(), V(0), V(0), V(0), false};
}

/// Folds a contiguous span of n logits (and, when Dense, the matching targets t) into `acc`, chunk by chunk:
/// the chunk's max is taken from memory, then its exps from L1, so the span is read from memory once.
/// `acc.m` only grows, and the sum is rescaled when it does.
template <int VB, bool Dense, class T>
HALIAX_NN_INLINE void lse_fold(const T* x, const T* t, std::int64_t n, lse_acc<compute_t<T>>& acc) {
  using V = compute_t<T>;
  constexpr int R = reduce_lanes<V, VB>;
  constexpr int E = exp_lanes<V, VB>;
  constexpr std::int64_t chunk = 4096;
  for (std::int64_t c0 = 0; c0 < n && !acc.bad; c0 += chunk) {
    const std::int64_t cn = n - c0 < chunk ? n - c0 : chunk;
    bool has_nan = false;
    const V cm = row_max<VB>(x + c0, cn, has_nan);
    if (has_nan || cm == -neg_inf<V>()) {
      acc.bad = true;
      return;
    }
    if constexpr (Dense) {
      acc.tx += row_sum2_of<R>(x + c0, t + c0, cn, prod_fn{});
      acc.ts += row_sum_of<R>(t + c0, cn, identity_fn{});
    }
    if (cm == neg_inf<V>()) continue;  // an all -inf chunk adds nothing
    if (cm > acc.m) {
      acc.s = acc.s * fast_exp_nonpos(acc.m - cm);
      acc.m = cm;
    }
    // The exps run from L1 while the next chunk (of this row, or the next row's first: rows are contiguous)
    // streams in, so the compute overlaps the memory traffic. Prefetching past the array's end is harmless.
    acc.s += row_sum_of<E>(x + c0, cn, exp_shift_fn<V, true>{acc.m}, prefetch_rows<T>{x + c0 + cn, nullptr});
  }
}

/// log(s) + m of a finished accumulator whose row had no NaN or +inf (-inf for an empty or all -inf row).
template <class V>
HALIAX_NN_INLINE V lse_finish(const lse_acc<V>& acc) {
  return acc.m == neg_inf<V>() ? acc.m : acc.m + haliax::detail::math::log(acc.s);
}

/// The two-pass log-sum-exp with `logsumexp`'s semantics for rows holding NaN (NaN) or +inf (+inf).
template <int VB, class T>
HALIAX_NN_INLINE compute_t<T> lse_general(const T* x, std::int64_t n) {
  using V = compute_t<T>;
  bool has_nan = false;
  const V shift = safe_shift(row_max<VB>(x, n, has_nan));
  return shift + haliax::detail::math::log(row_sum_of<exp_lanes<V, VB>>(x, n, exp_shift_fn<V, false>{shift}));
}

/// y_j = f(y_j) for a row, in place.
template <int L, class T, class F>
HALIAX_NN_INLINE void row_apply(T* y, std::int64_t n, F f) {
  std::int64_t j = 0;
  for (; j + L <= n; j += L) {
    T* q = y + j;
    HALIAX_NN_LANES
    for (int k = 0; k < L; ++k) st(q, k, f(ld(q, k)));
  }
  for (; j < n; ++j) st(y, j, f(ld(y, j)));
}

/// (x, t) -> ca * exp(x - lse) - c * t: the logits' gradient for a target distribution.
template <class V, bool NonPos>
struct dense_grad_fn {
  V lse, ca, c;
  HALIAX_NN_INLINE V operator()(V x, V t) const { return exp_shift_fn<V, NonPos>{lse}(x)*ca - c * t; }
};

/// f(x) as a function of two arguments (the second ignored), for the two-input row writers.
template <class F>
struct first_arg_fn {
  F f;
  template <class V>
  HALIAX_NN_INLINE V operator()(V x, V) const {
    return f(x);
  }
};

/// One row of the backward: dx_j = ca * exp(x_j - lse) - c * onehot_j (class id `target`, relative to the row;
/// outside [0, n) for none) or - c * t_j (Dense). With Dense and `dt`, also dt_j = c * (lse - x_j). `stream`
/// writes dx with streaming stores (large float outputs on x86 hosts).
template <int VB, bool Dense, class T>
HALIAX_NN_INLINE void ce_grad_row(const T* x, const T* t, std::int64_t target, T* dx, T* dt, std::int64_t n,
                                  compute_t<T> lse, compute_t<T> ca, compute_t<T> c, bool stream) {
  using V = compute_t<T>;
  constexpr int R = reduce_lanes<V, VB>;
  constexpr int E = exp_lanes<V, VB>;
  const bool finite = haliax::detail::math::isfinite(lse);
  if constexpr (Dense) {
    if (ca == V(0) && c == V(0)) {
      row_map<R>(x, dx, n, zero_fn{});
    } else if (finite) {
      row_grad_write<VB, E>(x, t, dx, n, dense_grad_fn<V, true>{lse, ca, c}, prefetch_rows<T>{}, stream);
    } else {
      row_map2<E>(x, t, dx, n, dense_grad_fn<V, false>{lse, ca, c});
    }
    if (dt) {
      if (c == V(0)) {
        row_map<R>(x, dt, n, zero_fn{});
      } else {
        row_map<R>(x, dt, n, affine_fn<V>{lse, -c, V(0)});
      }
    }
  } else {
    if (ca == V(0)) {
      row_map<R>(x, dx, n, zero_fn{});
    } else if (finite) {
      row_grad_write<VB, E>(x, x, dx, n, first_arg_fn<exp_scale_fn<V, true>>{{lse, ca}}, prefetch_rows<T>{}, stream);
    } else {
      row_map<E>(x, dx, n, exp_scale_fn<V, false>{lse, ca});
    }
    if (target >= 0 && target < n) st(dx, target, ca * fast_exp(ld(x, target) - lse) - c);
  }
}

/// The class-id backward of one row in place: x_j <- ca * exp(x_j - lse) - c * onehot_j (`target` relative to
/// the row). One pointer, no restrict: each element is read before it is written.
template <int VB, class T>
HALIAX_NN_INLINE void ce_grad_row_inplace(T* x, std::int64_t target, std::int64_t n, compute_t<T> lse, compute_t<T> ca,
                                          compute_t<T> c) {
  using V = compute_t<T>;
  constexpr int E = exp_lanes<V, VB>;
  const bool valid = target >= 0 && target < n;
  const V xt = valid ? ld(x, target) : V(0);
  if (ca == V(0)) {
    for (std::int64_t j = 0; j < n; ++j) st(x, j, V(0));
  } else if (haliax::detail::math::isfinite(lse)) {
    row_apply<E>(x, n, exp_scale_fn<V, true>{lse, ca});
  } else {
    row_apply<E>(x, n, exp_scale_fn<V, false>{lse, ca});
  }
  if (valid) st(x, target, ca * fast_exp(xt - lse) - c);
}

#ifdef HALIAX_NN_ISA_DISPATCH
#define HALIAX_NN_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,bmi,bmi2,f16c")))
#define HALIAX_NN_AVX2 __attribute__((target("avx2,fma,bmi,bmi2,f16c")))
template <bool Dense, class T>
HALIAX_NN_AVX512 void lse_fold_avx512(const T* x, const T* t, std::int64_t n, lse_acc<compute_t<T>>& acc) {
  lse_fold<64, Dense>(x, t, n, acc);
}
template <bool Dense, class T>
HALIAX_NN_AVX2 void lse_fold_avx2(const T* x, const T* t, std::int64_t n, lse_acc<compute_t<T>>& acc) {
  lse_fold<32, Dense>(x, t, n, acc);
}
template <class T>
HALIAX_NN_AVX512 compute_t<T> lse_general_avx512(const T* x, std::int64_t n) {
  return lse_general<64>(x, n);
}
template <class T>
HALIAX_NN_AVX2 compute_t<T> lse_general_avx2(const T* x, std::int64_t n) {
  return lse_general<32>(x, n);
}
template <bool Dense, class T>
HALIAX_NN_AVX512 void ce_grad_row_avx512(const T* x, const T* t, std::int64_t target, T* dx, T* dt, std::int64_t n,
                                         compute_t<T> lse, compute_t<T> ca, compute_t<T> c, bool stream) {
  ce_grad_row<64, Dense>(x, t, target, dx, dt, n, lse, ca, c, stream);
}
template <bool Dense, class T>
HALIAX_NN_AVX2 void ce_grad_row_avx2(const T* x, const T* t, std::int64_t target, T* dx, T* dt, std::int64_t n,
                                     compute_t<T> lse, compute_t<T> ca, compute_t<T> c, bool stream) {
  ce_grad_row<32, Dense>(x, t, target, dx, dt, n, lse, ca, c, stream);
}
template <class T>
HALIAX_NN_AVX512 void ce_grad_row_inplace_avx512(T* x, std::int64_t target, std::int64_t n, compute_t<T> lse,
                                                 compute_t<T> ca, compute_t<T> c) {
  ce_grad_row_inplace<64>(x, target, n, lse, ca, c);
}
template <class T>
HALIAX_NN_AVX2 void ce_grad_row_inplace_avx2(T* x, std::int64_t target, std::int64_t n, compute_t<T> lse,
                                             compute_t<T> ca, compute_t<T> c) {
  ce_grad_row_inplace<32>(x, target, n, lse, ca, c);
}
#undef HALIAX_NN_AVX512
#undef HALIAX_NN_AVX2
#endif

// The row kernels for the ISA picked at run time.
template <bool Dense, class T>
HALIAX_NN_INLINE void lse_fold_isa(host_isa isa, const T* x, const T* t, std::int64_t n, lse_acc<compute_t<T>>& acc) {
#ifdef HALIAX_NN_ISA_DISPATCH
  if (isa == host_isa::avx512) return lse_fold_avx512<Dense>(x, t, n, acc);
  if (isa == host_isa::avx2) return lse_fold_avx2<Dense>(x, t, n, acc);
#endif
  lse_fold<16, Dense>(x, t, n, acc);
}
template <class T>
HALIAX_NN_INLINE compute_t<T> lse_general_isa(host_isa isa, const T* x, std::int64_t n) {
#ifdef HALIAX_NN_ISA_DISPATCH
  if (isa == host_isa::avx512) return lse_general_avx512(x, n);
  if (isa == host_isa::avx2) return lse_general_avx2(x, n);
#endif
  return lse_general<16>(x, n);
}
template <bool Dense, class T>
HALIAX_NN_INLINE void ce_grad_row_isa(host_isa isa, const T* x, const T* t, std::int64_t target, T* dx, T* dt,
                                      std::int64_t n, compute_t<T> lse, compute_t<T> ca, compute_t<T> c, bool stream) {
#ifdef HALIAX_NN_ISA_DISPATCH
  if (isa == host_isa::avx512) return ce_grad_row_avx512<Dense>(x, t, target, dx, dt, n, lse, ca, c, stream);
  if (isa == host_isa::avx2) return ce_grad_row_avx2<Dense>(x, t, target, dx, dt, n, lse, ca, c, stream);
#endif
  ce_grad_row<16, Dense>(x, t, target, dx, dt, n, lse, ca, c, stream);
}

// ---------------------------------------------------------------------------------------------------------
// Drivers over logits split as outer x n x inner around the label axis; token r = o * inner + i. `Tgt` is
// std::int32_t (class ids, one per token) or T (a distribution, logits-shaped).

/// Whether targets of type Tgt are a distribution (not class ids). A variable template, not a local constant:
/// nvcc counts a local used in a device lambda's `if constexpr` as a capture there, which it refuses.
template <class Tgt>
inline constexpr bool dense_targets_v = !std::is_same_v<Tgt, std::int32_t>;

/// The portable path's forward over contiguous rows (inner == 1): one team member per token, its lanes
/// splitting the row (haliax/detail/row_team.hpp); the strided path's formulas (shift, sum of exps, log).
template <class T, class Tgt>
void ce_forward_team(const T* x, const Tgt* tg, std::int64_t rows, std::int64_t n, compute_t<T>* lse,
                     compute_t<T>* ce, compute_t<T>* ts) {
  using V = compute_t<T>;
  namespace hd = haliax::detail;
  Kokkos::parallel_for(
      "haliax::nn::cross_entropy", hd::row_policy(rows), KOKKOS_LAMBDA(const hd::row_member& t) {
        HALIAX_CAPTURE(tg, lse, ce, ts, n);
        const std::int64_t r = hd::row_of(t);
        if (r >= rows) return;
        const T* xr = x + r * n;
        const V m = safe_shift(hd::lane_max<V>(t, n, [&](std::int64_t j) { return ld(xr, j); }));
        const V z = m + haliax::detail::math::log(
                            hd::lane_sum<V>(t, n, [&](std::int64_t j) { return fast_exp(ld(xr, j) - m); }));
        if constexpr (dense_targets_v<Tgt>) {
          const Tgt* tr = tg + r * n;
          const V tx = hd::lane_sum<V>(t, n, [&](std::int64_t j) { return ld(tr, j) * ld(xr, j); });
          const V tsum = hd::lane_sum<V>(t, n, [&](std::int64_t j) { return ld(tr, j); });
          Kokkos::single(Kokkos::PerThread(t), [&] {
            lse[r] = z;
            ce[r] = z * tsum - tx;
            ts[r] = tsum;
          });
        } else {
          Kokkos::single(Kokkos::PerThread(t), [&] {
            const std::int64_t c = tg[r];
            lse[r] = z;
            ce[r] = c >= 0 && c < n ? z - ld(xr, c) : V(0);
          });
        }
      });
}

/// d(logits) at one logit of value v: ca * exp(v - lse), less c at the target class.
template <class V>
HALIAX_NN_INLINE V ce_class_grad(V v, V lse, V ca, V c, bool target) {
  const V p = ca == V(0) ? V(0) : ca * fast_exp(v - lse);
  return target ? p - c : p;
}

/// The backward at logit e (token r, class j): dx, and dt for distributions when not null.
template <class T, class Tgt>
HALIAX_NN_INLINE void ce_grad_element(const T* x, const Tgt* tg, const compute_t<T>* lse, const compute_t<T>* ca,
                                      const compute_t<T>* c, T* dx, T* dt, std::int64_t e, std::int64_t r,
                                      std::int64_t j) {
  using V = compute_t<T>;
  const V v = ld(x, e);
  if constexpr (dense_targets_v<Tgt>) {
    st(dx, e, ce_class_grad(v, lse[r], ca[r], V(0), false) - c[r] * ld(tg, e));
    if (dt) st(dt, e, c[r] * (lse[r] - v));
  } else {
    st(dx, e, ce_class_grad(v, lse[r], ca[r], c[r], tg[r] == j));
  }
}

/// The portable path's backward: one work item per logit (coalesced on a GPU).
template <class T, class Tgt>
void ce_backward_flat(const T* x, const Tgt* tg, axis_split sp, const compute_t<T>* lse, const compute_t<T>* ca,
                      const compute_t<T>* c, T* dx, T* dt) {
  using V = compute_t<T>;
  const std::int64_t n = sp.n, inner = sp.inner, per = n * inner;
  Kokkos::parallel_for(
      "haliax::nn::cross_entropy_grad", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, sp.outer * per),
      KOKKOS_LAMBDA(std::int64_t e) {
        HALIAX_CAPTURE(tg, dx, dt, c);
        const std::int64_t o = e / per, rem = e - o * per, j = rem / inner, r = o * inner + (rem - j * inner);
        ce_grad_element(x, tg, lse, ca, c, dx, dt, e, r, j);
      });
}

/// Forward: per token the log-normaliser lse, the cross-entropy term ce (without z-loss) and, for
/// distributions, the targets' sum ts.
template <class T, class Tgt>
void ce_forward(const T* x, const Tgt* tg, axis_split sp, compute_t<T>* lse, compute_t<T>* ce, compute_t<T>* ts) {
  using V = compute_t<T>;
  const std::int64_t outer = sp.outer, n = sp.n, inner = sp.inner;
  if (outer == 0 || inner == 0) return;
  if (inner == 1 && !haliax::detail::use_host_kernels(haliax::kernels::family::cross_entropy)) {
    ce_forward_team(x, tg, outer, n, lse, ce, ts);
    return;
  }
  [[maybe_unused]] const host_isa isa = detect_host_isa();
  if (inner == 1) {
    Kokkos::parallel_for(
        "haliax::nn::cross_entropy", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, outer), KOKKOS_LAMBDA(std::int64_t r) {
          HALIAX_CAPTURE(tg, ce, ts, isa);
          const T* xr = x + r * n;
          auto acc = lse_start<V>();
          if constexpr (dense_targets_v<Tgt>) {
            lse_fold_isa<true>(isa, xr, tg + r * n, n, acc);
          } else {
            lse_fold_isa<false>(isa, xr, static_cast<const T*>(nullptr), n, acc);
          }
          const V z = acc.bad ? lse_general_isa(isa, xr, n) : lse_finish(acc);
          lse[r] = z;
          if constexpr (dense_targets_v<Tgt>) {
            if (acc.bad) {  // the sums were cut short: redo them (rare)
              acc.tx = row_sum2_of<4>(xr, tg + r * n, n, prod_fn{});
              acc.ts = row_sum_of<4>(tg + r * n, n, identity_fn{});
            }
            ce[r] = z * acc.ts - acc.tx;
            ts[r] = acc.ts;
          } else {
            const std::int64_t t = tg[r];
            ce[r] = t >= 0 && t < n ? z - ld(xr, t) : V(0);
          }
        });
    return;
  }
  constexpr int B = block_width;
  const std::int64_t nb = (inner + B - 1) / B;
  Kokkos::parallel_for(
      "haliax::nn::cross_entropy", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, outer * nb), KOKKOS_LAMBDA(std::int64_t w) {
        HALIAX_CAPTURE(tg, ce, ts);
        const std::int64_t o = w / nb;
        const std::int64_t i0 = (w - o * nb) * B;
        const int b = inner - i0 < B ? static_cast<int>(inner - i0) : B;
        const T* xb = x + o * n * inner + i0;
        V m[B], s[B], tx[B], tsum[B];
        for (int k = 0; k < b; ++k) {
          m[k] = neg_inf<V>();
          s[k] = tx[k] = tsum[k] = V(0);
        }
        for (std::int64_t j = 0; j < n; ++j)
          for (int k = 0; k < b; ++k) {
            const V v = ld(xb + j * inner, k);
            m[k] = v > m[k] ? v : m[k];
          }
        for (int k = 0; k < b; ++k) m[k] = safe_shift(m[k]);
        for (std::int64_t j = 0; j < n; ++j)
          for (int k = 0; k < b; ++k) {
            const V v = ld(xb + j * inner, k);
            s[k] += fast_exp(v - m[k]);
            if constexpr (dense_targets_v<Tgt>) {
              const V tv = ld(tg + o * n * inner + i0 + j * inner, k);
              tx[k] += tv * v;
              tsum[k] += tv;
            }
          }
        for (int k = 0; k < b; ++k) {
          const std::int64_t r = o * inner + i0 + k;
          const V z = m[k] + haliax::detail::math::log(s[k]);
          lse[r] = z;
          if constexpr (dense_targets_v<Tgt>) {
            ce[r] = z * tsum[k] - tx[k];
            ts[r] = tsum[k];
          } else {
            const std::int64_t t = tg[r];
            ce[r] = t >= 0 && t < n ? z - ld(xb + t * inner, k) : V(0);
          }
        }
      });
}

/// Backward: dx (and dt for distributions, when not null) from the per-token lse and coefficients ca, c.
template <class T, class Tgt>
void ce_backward(const T* x, const Tgt* tg, axis_split sp, const compute_t<T>* lse, const compute_t<T>* ca,
                 const compute_t<T>* c, T* dx, T* dt) {
  using V = compute_t<T>;
  const std::int64_t outer = sp.outer, n = sp.n, inner = sp.inner;
  if (outer == 0 || inner == 0 || n == 0) return;
  if (!haliax::detail::use_host_kernels(haliax::kernels::family::cross_entropy)) {
    ce_backward_flat(x, tg, sp, lse, ca, c, dx, dt);
    return;
  }
  [[maybe_unused]] const host_isa isa = detect_host_isa();
  if (inner == 1) {
    bool stream = false;  // large float outputs skip the cache, as in the softmax family
#ifdef HALIAX_NN_ISA_DISPATCH
    stream = std::is_same_v<T, float> && outer * n * static_cast<std::int64_t>(sizeof(T)) >= stream_min_bytes;
#endif
    Kokkos::parallel_for(
        "haliax::nn::cross_entropy_grad", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, outer),
        KOKKOS_LAMBDA(std::int64_t r) {
          HALIAX_CAPTURE(x, tg, dx, dt, lse, ca, c, isa, stream, n);
          if constexpr (dense_targets_v<Tgt>) {
            ce_grad_row_isa<true>(isa, x + r * n, tg + r * n, -1, dx + r * n, dt ? dt + r * n : nullptr, n, lse[r],
                                  ca[r], c[r], stream);
          } else {
            ce_grad_row_isa<false>(isa, x + r * n, static_cast<const T*>(nullptr), tg[r], dx + r * n,
                                   static_cast<T*>(nullptr), n, lse[r], ca[r], c[r], stream);
          }
        });
    return;
  }
  constexpr int B = block_width;
  const std::int64_t nb = (inner + B - 1) / B;
  Kokkos::parallel_for(
      "haliax::nn::cross_entropy_grad", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, outer * nb),
      KOKKOS_LAMBDA(std::int64_t w) {
        const std::int64_t o = w / nb;
        const std::int64_t i0 = (w - o * nb) * B;
        const int b = inner - i0 < B ? static_cast<int>(inner - i0) : B;
        const std::int64_t base = o * n * inner + i0, r0 = o * inner + i0;
        HALIAX_CAPTURE(tg, dx, dt, c);
        for (std::int64_t j = 0; j < n; ++j)
          for (int k = 0; k < b; ++k) {
            const std::int64_t e = base + j * inner + k, r = r0 + k;
            ce_grad_element(x, tg, lse, ca, c, dx, dt, e, r, j);
          }
      });
}

// reduce_tokens's and ce_coefficients's kernels (axis-free functions, for nvcc: see haliax::detail::fill_raw).
template <class T, class V>
void token_losses(T* po, const V* pl, const V* pc, const bool* mask, V wv, std::int64_t tokens) {
  Kokkos::parallel_for(
      "haliax::nn::cross_entropy(tokens)", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, tokens),
      KOKKOS_LAMBDA(std::int64_t r) {
        st(po, r, mask && !mask[r] ? V(0) : pc[r] + (wv != V(0) ? wv * pl[r] * pl[r] : V(0)));
      });
}
template <class V>
void token_loss_sum(const V* pl, const V* pc, const bool* mask, double w, std::int64_t tokens, double* out) {
  ordered_sum(
      "haliax::nn::cross_entropy(sum)", tokens,
      KOKKOS_LAMBDA(std::int64_t r, double& acc) {
        if (mask && !mask[r]) return;
        acc += static_cast<double>(pc[r]) + (w != 0.0 ? w * static_cast<double>(pl[r]) * pl[r] : 0.0);
      },
      out);
}
inline void mask_count(const bool* mask, std::int64_t tokens, double* out) {
  ordered_sum(  // exact below 2^53 tokens
      "haliax::nn::cross_entropy(count)", tokens, KOKKOS_LAMBDA(std::int64_t r, double& acc) { acc += mask[r] ? 1.0 : 0.0; },
      out);
}
/// The reduced loss from the device total (and kept count): total, or total / count (NaN when nothing is kept).
template <class T>
void finish_loss(T* out, const double* total, const double* kept, double tokens, bool mean) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Kokkos::parallel_for(
      "haliax::nn::cross_entropy(reduce)", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, 1), KOKKOS_LAMBDA(std::int64_t) {
        double t = total[0];
        if (mean) {
          const double c = kept != nullptr ? kept[0] : tokens;
          t = c > 0 ? t / c : nan;
        }
        out[0] = static_cast<T>(t);
      });
}
template <class T, class V, class Tgt>
void ce_coefficients_kernel(const T* pg, const bool* mask, const Tgt* ids, const V* ts, const V* pl, V* pc, V* pca,
                            std::int64_t count_tokens, std::int64_t n, V wv, const double* kept, bool mean,
                            bool per_token) {
  const double tokens = static_cast<double>(count_tokens);
  Kokkos::parallel_for(
      "haliax::nn::cross_entropy_grad(coefficients)", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, count_tokens),
      KOKKOS_LAMBDA(std::int64_t r) {
        HALIAX_CAPTURE(ids, ts, n, kept, tokens);
        // the mean's 1 / count, from the device count (as the host computed it from the count before)
        V scale = V(1);
        if (mean) {
          const double c = kept != nullptr ? kept[0] : tokens;
          scale = c > 0 ? V(1) / static_cast<V>(c) : V(0);
        }
        const V gv = per_token ? ld(pg, r) : ld(pg, 0) * scale;
        const V cv = mask && !mask[r] ? V(0) : gv;
        V base;
        if constexpr (std::is_same_v<Tgt, std::int32_t>) {
          base = ids[r] >= 0 && ids[r] < n ? V(1) : V(0);
        } else {
          base = ts[r];
        }
        pc[r] = cv;
        pca[r] = cv == V(0) ? V(0) : cv * (base + (wv != V(0) ? V(2) * wv * pl[r] : V(0)));
      });
}

/// Per-token losses ce + w * lse^2 (zero where masked) reduced by R, on the device (nothing read back); `count`
/// receives the number of kept tokens (the mean's denominator; with a mask a device scalar).
template <class R, class T, class Tok>
loss_result_t<R, T, Tok> reduce_tokens(const named_array<compute_t<T>, Tok>& lse,
                                       const named_array<compute_t<T>, Tok>& ce, const bool* mask, double w,
                                       kept_tokens& count) {
  using V = compute_t<T>;
  const V* pl = lse.data();
  const V* pc = ce.data();
  const V wv = static_cast<V>(w);
  const std::int64_t tokens = lse.element_count();
  if constexpr (std::is_same_v<R, reduce_none_t>) {
    auto out = named_array<T, Tok>::allocate(lse.sizes(), "haliax::nn::cross_entropy");
    token_losses<T, V>(out.data(), pl, pc, mask, wv, tokens);
    count.tokens = tokens;
    return out;
  } else {
    auto total = named_array<double, axes<>>::allocate({}, "haliax::nn::cross_entropy(sum)");
    token_loss_sum<V>(pl, pc, mask, w, tokens, total.data());
    count.tokens = tokens;
    if (mask) {
      count.kept = named_array<double, axes<>>::allocate({}, "haliax::nn::cross_entropy(count)");
      mask_count(mask, tokens, count.kept.data());
    }
    auto out = named_array<T, axes<>>::allocate({}, "haliax::nn::cross_entropy");
    finish_loss<T>(out.data(), total.data(), mask ? count.kept.data() : nullptr, static_cast<double>(tokens),
                   std::is_same_v<R, reduce_mean_t>);
    return out;
  }
}

/// The backward's per-token coefficients from the loss gradient g (rank 0, or per token for reduce_none):
/// c = dloss/dloss_token (0 where masked) and ca = c * (base + 2 w lse), where base is 1 for a valid class id,
/// 0 for an invalid one, and sum(t) for a distribution (`ts`).
template <class R, class T, class Tok, class G, class Tgt>
std::pair<named_array<compute_t<T>, Tok>, named_array<compute_t<T>, Tok>> ce_coefficients(
    const G& g, const bool* mask, const kept_tokens& count, const named_array<compute_t<T>, Tok>& lse, const Tgt* ids,
    const compute_t<T>* ts, std::int64_t n, double w) {
  using V = compute_t<T>;
  auto c = named_array<V, Tok>::allocate(lse.sizes(), "haliax::nn::cross_entropy_grad(c)");
  auto ca = named_array<V, Tok>::allocate(lse.sizes(), "haliax::nn::cross_entropy_grad(ca)");
  const T* pg = g.data();
  const V* pl = lse.data();
  V* pc = c.data();
  V* pca = ca.data();
  const V wv = static_cast<V>(w);
  constexpr bool per_token = std::is_same_v<R, reduce_none_t>;
  ce_coefficients_kernel<T, V, Tgt>(pg, mask, ids, ts, pl, pc, pca, lse.element_count(), n, wv,
                                    count.kept.valid() ? count.kept.data() : nullptr,
                                    std::is_same_v<R, reduce_mean_t>, per_token);
  return {c, ca};
}

/// Cross-entropy of logits along A against targets already in the logits' token order (class ids, Tok) or
/// axis order (a distribution, Axes). `orig` is the caller's targets array (for a distribution's gradient).
template <class R, class A, class T, class Axes, class Tgt, class TgtAxes, class OrigAxes>
auto cross_entropy(const named_array<T, Axes>& logits, const named_array<Tgt, TgtAxes>& tg,
                   const named_array<Tgt, OrigAxes>& orig, const named_array<bool, without_t<Axes, A>>* mask,
                   double w) {
  using V = compute_t<T>;
  using Tok = without_t<Axes, A>;
  constexpr bool dense = !std::is_same_v<Tgt, std::int32_t>;
  const axis_split sp = split_at<Axes, A>(logits.sizes());
  const auto tok_sizes = haliax::detail::sizes_in<Tok, Axes>(logits.sizes());
  auto lse = named_array<V, Tok>::allocate(tok_sizes, "haliax::nn::cross_entropy(lse)");
  auto ce = named_array<V, Tok>::allocate(tok_sizes, "haliax::nn::cross_entropy(ce)");
  named_array<V, Tok> ts;
  if constexpr (dense_targets_v<Tgt>) ts = named_array<V, Tok>::allocate(tok_sizes, "haliax::nn::cross_entropy(ts)");
  ce_forward(logits.data(), tg.data(), sp, lse.data(), ce.data(), dense ? ts.data() : static_cast<V*>(nullptr));
  kept_tokens count;
  const bool* pm = mask ? mask->data() : nullptr;
  auto out = reduce_tokens<R, T>(lse, ce, pm, w, count);

  bool track_targets = false;
  if constexpr (dense_targets_v<Tgt>) track_targets = haliax::detail::ad::tracked(orig);
  if (haliax::detail::ad::any_tracked(logits) || track_targets) {
    named_array<bool, Tok> m;
    if (mask) m = *mask;
    auto bwd = [x = untracked(logits), tg = untracked(tg), m, lse, ts, count, w, sp](const auto& g, auto needs) {
      const bool* pm = m.valid() ? m.data() : nullptr;
      auto [c, ca] =
          ce_coefficients<R, T>(g, pm, count, lse, tg.data(), dense ? ts.data() : static_cast<V*>(nullptr), sp.n, w);
      // dx is written even when only the targets need a gradient (the kernel computes both in one pass).
      auto dx = named_array<T, Axes>::allocate(x.sizes(), "haliax::nn::cross_entropy_grad");
      if constexpr (dense_targets_v<Tgt>) {
        named_array<T, TgtAxes> dt;
        if (needs[1]) dt = named_array<T, TgtAxes>::allocate(tg.sizes(), "haliax::nn::cross_entropy_grad(targets)");
        ce_backward(x.data(), tg.data(), sp, lse.data(), ca.data(), c.data(), dx.data(),
                    needs[1] ? dt.data() : static_cast<T*>(nullptr));
        named_array<T, OrigAxes> dto;
        if (needs[1]) dto = in_order<OrigAxes>(dt);
        if (!needs[0]) dx = {};
        return std::tuple{dx, dto};
      } else {
        ce_backward(x.data(), tg.data(), sp, lse.data(), ca.data(), c.data(), dx.data(), static_cast<T*>(nullptr));
        return std::tuple{dx};
      }
    };
    if constexpr (dense_targets_v<Tgt>) {
      haliax::detail::ad::record(out, std::move(bwd), logits, orig);
    } else {
      haliax::detail::ad::record(out, std::move(bwd), logits);
    }
  }
  return out;
}

/// The token axes of logits `Axes` with label axis A.
template <class Axes, class A>
using token_axes_t = without_t<Axes, A>;

}  // namespace detail

// ---------------------------------------------------------------------------------------------------------
// cross_entropy_loss

/// Class-id targets for logits with axes `Axes` and label axis `A`: int32, with the logits' other axes in any
/// order.
template <class AxT, class Axes, class A>
concept ClassTargetsFor = detail::same_axis_set_v<AxT, detail::token_axes_t<Axes, A>>;

/// A target distribution for logits with axes `Axes`: the same element type and axes, in any order.
template <class AxT, class Axes>
concept DistributionTargetsFor = detail::same_axis_set_v<AxT, Axes>;

/// A mask over (some of) the token axes of logits `Axes` with label axis `A`.
template <class AxM, class Axes, class A>
concept TokenMaskFor = detail::axis_subset_v<AxM, detail::token_axes_t<Axes, A>>;

/// Cross-entropy of `logits` along the label axis against class ids (upstream `cross_entropy_loss` with
/// one-hot targets; levanter's next-token loss): per token logsumexp(logits) - logits[target], plus
/// `z_loss_weight * logsumexp(logits)^2`. The label axis is contracted; the other axes are the token axes,
/// which `reduction` averages (default), sums, or keeps (`reduce_none`). A target outside [0, size) (e.g. an
/// ignore id of -100) has a zero cross-entropy term, as upstream's all-zero one-hot row, but still counts in
/// the mean: mask it out with the `where_mask` form. Differentiable in the logits with one fused backward
/// kernel, (softmax * (1 + 2 w lse) - onehot) * g.
///   auto loss = haliax::nn::cross_entropy_loss(logits, Vocab, ids);   // {batch, pos, vocab}, int {batch, pos} -> {}
///   auto per_token = haliax::nn::cross_entropy_loss(logits, Vocab, ids, haliax::nn::reduce_none);   // {batch, pos}
template <LossReduction R = reduce_mean_t, FloatElement T, class Axes, AxisOf<Axes> A, class AxT>
requires ClassTargetsFor<AxT, Axes, A>
auto cross_entropy_loss(const named_array<T, Axes>& logits, A label, const named_array<std::int32_t, AxT>& targets,
                        R reduction = {}, double z_loss_weight = 0.0) {
  haliax::detail::check_shared_sizes("haliax::nn::cross_entropy_loss", logits, targets);
  auto tg = detail::in_order<detail::token_axes_t<Axes, A>>(targets);
  return detail::cross_entropy<R, A>(logits, tg, targets, nullptr, z_loss_weight);
}

/// `cross_entropy_loss` over the tokens where `where` is true (upstream `where=`): the others contribute
/// nothing, count nowhere (the mean divides by the number of kept tokens; NaN when none is kept, as upstream)
/// and get a zero gradient; with `reduce_none` their loss is 0. The mask's axes are token axes (it broadcasts
/// over the ones it lacks).
///   auto loss = haliax::nn::cross_entropy_loss(logits, Vocab, ids, haliax::where_mask{haliax::not_equal(ids, -100)});
///   auto zl = haliax::nn::cross_entropy_loss(logits, Vocab, ids, haliax::where_mask{keep}, haliax::nn::reduce_mean,
///                                            1e-4);   // with z-loss
template <LossReduction R = reduce_mean_t, FloatElement T, class Axes, AxisOf<Axes> A, class AxT, class AxM>
requires ClassTargetsFor<AxT, Axes, A> && TokenMaskFor<AxM, Axes, A>
auto cross_entropy_loss(const named_array<T, Axes>& logits, A label, const named_array<std::int32_t, AxT>& targets,
                        const where_mask<AxM>& where, R reduction = {}, double z_loss_weight = 0.0) {
  using Tok = detail::token_axes_t<Axes, A>;
  haliax::detail::check_shared_sizes("haliax::nn::cross_entropy_loss", logits, targets);
  haliax::detail::check_shared_sizes("haliax::nn::cross_entropy_loss", logits, where.mask);
  auto tg = detail::in_order<Tok>(targets);
  auto m = detail::mask_to_tokens<Tok>(where.mask, haliax::detail::sizes_in<Tok, Axes>(logits.sizes()));
  return detail::cross_entropy<R, A>(logits, tg, targets, &m, z_loss_weight);
}

/// Cross-entropy of `logits` along the label axis against a target distribution (upstream
/// `cross_entropy_loss` with float targets, e.g. one-hot or smoothed labels): per token
/// sum_j t_j (logsumexp(logits) - logits_j), plus `z_loss_weight * logsumexp(logits)^2`. The label axis is
/// contracted; the token axes are reduced as `reduction` says. Differentiable in the logits and the targets.
///   auto t = haliax::nn::one_hot<float>(ids, 50257 * Vocab);
///   auto loss = haliax::nn::cross_entropy_loss(logits, Vocab, t);   // == cross_entropy_loss(logits, Vocab, ids)
template <LossReduction R = reduce_mean_t, FloatElement T, class Axes, AxisOf<Axes> A, class AxT>
requires DistributionTargetsFor<AxT, Axes>
auto cross_entropy_loss(const named_array<T, Axes>& logits, A label, const named_array<T, AxT>& targets,
                        R reduction = {}, double z_loss_weight = 0.0) {
  haliax::detail::check_shared_sizes("haliax::nn::cross_entropy_loss", logits, targets);
  auto tg = detail::in_order<Axes>(targets);
  return detail::cross_entropy<R, A>(logits, tg, targets, nullptr, z_loss_weight);
}

/// The target-distribution `cross_entropy_loss` over the tokens where `where` is true (see the class-id form).
///   auto loss = haliax::nn::cross_entropy_loss(logits, Vocab, soft_targets, haliax::where_mask{keep});
template <LossReduction R = reduce_mean_t, FloatElement T, class Axes, AxisOf<Axes> A, class AxT, class AxM>
requires DistributionTargetsFor<AxT, Axes> && TokenMaskFor<AxM, Axes, A>
auto cross_entropy_loss(const named_array<T, Axes>& logits, A label, const named_array<T, AxT>& targets,
                        const where_mask<AxM>& where, R reduction = {}, double z_loss_weight = 0.0) {
  using Tok = detail::token_axes_t<Axes, A>;
  haliax::detail::check_shared_sizes("haliax::nn::cross_entropy_loss", logits, targets);
  haliax::detail::check_shared_sizes("haliax::nn::cross_entropy_loss", logits, where.mask);
  auto tg = detail::in_order<Axes>(targets);
  auto m = detail::mask_to_tokens<Tok>(where.mask, haliax::detail::sizes_in<Tok, Axes>(logits.sizes()));
  return detail::cross_entropy<R, A>(logits, tg, targets, &m, z_loss_weight);
}

/// Upstream `cross_entropy_loss_and_log_normalizers`: the unreduced per-token cross-entropy (label axis
/// contracted, token axes kept) and the per-token log-normaliser logsumexp(logits, label). Both are
/// differentiable.
///   auto [loss, log_z] = haliax::nn::cross_entropy_loss_and_log_normalizers(logits, Vocab, ids);   // {batch, pos} x 2
template <FloatElement T, class Axes, AxisOf<Axes> A, class Targets>
auto cross_entropy_loss_and_log_normalizers(const named_array<T, Axes>& logits, A label, const Targets& targets) {
  return std::pair{cross_entropy_loss(logits, label, targets, reduce_none), logsumexp(logits, label)};
}

// ---------------------------------------------------------------------------------------------------------
// Block-wise cross-entropy over the vocabulary

namespace detail {

/// Peak number of logits elements one block-wise cross-entropy call held at once (forward or backward), for
/// tests and diagnostics: tokens x min(block_size, vocab), never tokens x vocab for a smaller block.
inline std::int64_t& blockwise_peak_logits() {
  static std::int64_t peak = 0;
  return peak;
}

/// Scratch of `n` elements from haliax's buffer cache (a steady-state step allocates nothing), given back when the
/// lease goes (without a fence: kernels that reuse the buffer run after those that used it, in order).
template <class T>
void lease_scratch(haliax::detail::buffer_lease<T>& lease, std::int64_t n, const char* label) {
  lease.view = haliax::detail::buffer_cache<T>::take(static_cast<std::size_t>(n > 0 ? n : 1), label);
}

/// The portable path's fold: one team member per token, its lanes splitting the block's row
/// (haliax/detail/row_team.hpp). The block's max (NaN counting as +inf, which marks the token bad as the host
/// fold does), the running max raised to it with the sum rescaled, then the block's exps added.
template <class T>
void blockwise_fold_team(const T* logits, std::int64_t tokens, std::int64_t nb, std::int64_t v0,
                         const std::int32_t* ids, lse_acc<compute_t<T>>* acc, compute_t<T>* xt) {
  using V = compute_t<T>;
  namespace hd = haliax::detail;
  Kokkos::parallel_for(
      "haliax::nn::blockwise_cross_entropy(block)", hd::row_policy(tokens), KOKKOS_LAMBDA(const hd::row_member& t) {
        const std::int64_t r = hd::row_of(t);
        if (r >= tokens) return;
        const T* row = logits + r * nb;
        const std::int64_t c = ids[r] - v0;
        if (!acc[r].bad) {
          const V bm = hd::lane_max<V>(t, nb, [&](std::int64_t j) {
            const V v = ld(row, j);
            return v != v ? -neg_inf<V>() : v;
          });
          const bool bad = bm == -neg_inf<V>();
          // lane_max gives the lowest finite value for an all -inf block, which adds nothing.
          const bool empty = !(bm > std::numeric_limits<V>::lowest());
          const V m = !bad && !empty && bm > acc[r].m ? bm : acc[r].m;
          const V s = bad || empty ? V(0) : hd::lane_sum<V>(t, nb, [&](std::int64_t j) {
            return fast_exp_nonpos(ld(row, j) - m);
          });
          Kokkos::single(Kokkos::PerThread(t), [&] {
            if (bad) {
              acc[r].bad = true;
            } else if (!empty) {
              if (m > acc[r].m) {
                acc[r].s = acc[r].s * fast_exp_nonpos(acc[r].m - m);
                acc[r].m = m;
              }
              acc[r].s += s;
            }
          });
        }
        Kokkos::single(Kokkos::PerThread(t), [&] {
          if (c >= 0 && c < nb) xt[r] = ld(row, c);
        });
      });
}

/// Folds a [tokens, nb] logits block (columns v0..v0+nb of the vocabulary) into the per-token online
/// log-sum-exp, and picks up each token's target logit when it falls in the block.
template <class T>
void blockwise_fold(const T* logits, std::int64_t tokens, std::int64_t nb, std::int64_t v0, const std::int32_t* ids,
                    lse_acc<compute_t<T>>* acc, compute_t<T>* xt) {
  if (!haliax::detail::use_host_kernels(haliax::kernels::family::cross_entropy))
    return blockwise_fold_team<T>(logits, tokens, nb, v0, ids, acc, xt);
  [[maybe_unused]] const host_isa isa = detect_host_isa();
  Kokkos::parallel_for(
      "haliax::nn::blockwise_cross_entropy(block)", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, tokens),
      KOKKOS_LAMBDA(std::int64_t r) {
        const T* row = logits + r * nb;
        lse_fold_isa<false>(isa, row, static_cast<const T*>(nullptr), nb, acc[r]);
        const std::int64_t t = ids[r] - v0;
        if (t >= 0 && t < nb) xt[r] = ld(row, t);
      });
}

/// Overwrites a [tokens, nb] logits block with its part of d(logits): ca * softmax - c * onehot.
template <class T>
void blockwise_grad_block(T* logits, std::int64_t tokens, std::int64_t nb, std::int64_t v0, const std::int32_t* ids,
                          const compute_t<T>* lse, const compute_t<T>* ca, const compute_t<T>* c) {
  if (!haliax::detail::use_host_kernels(haliax::kernels::family::cross_entropy)) {
    // The portable path: one work item per logit (coalesced on a GPU), the class-id formula of ce_grad_element.
    Kokkos::parallel_for(
        "haliax::nn::blockwise_cross_entropy_grad(block)", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, tokens * nb),
        KOKKOS_LAMBDA(std::int64_t e) {
          const std::int64_t r = e / nb, j = e - r * nb;
          st(logits, e, ce_class_grad(ld(logits, e), lse[r], ca[r], c[r], ids[r] - v0 == j));
        });
    return;
  }
  [[maybe_unused]] const host_isa isa = detect_host_isa();
  Kokkos::parallel_for(
      "haliax::nn::blockwise_cross_entropy_grad(block)", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, tokens),
      KOKKOS_LAMBDA(std::int64_t r) {
        T* row = logits + r * nb;
#ifdef HALIAX_NN_ISA_DISPATCH
        if (isa == host_isa::avx512) return ce_grad_row_inplace_avx512(row, ids[r] - v0, nb, lse[r], ca[r], c[r]);
        if (isa == host_isa::avx2) return ce_grad_row_inplace_avx2(row, ids[r] - v0, nb, lse[r], ca[r], c[r]);
#endif
        ce_grad_row_inplace<16>(row, ids[r] - v0, nb, lse[r], ca[r], c[r]);
      });
}

template <class T>
void add_into(compute_t<T>* acc, const T* x, std::int64_t n) {
  Kokkos::parallel_for(
      "haliax::nn::blockwise_cross_entropy_grad(accumulate)", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { acc[i] += ld(x, i); });
}

// The block-wise loss's small kernels, as named functions: nvcc allows no device lambda in a function with a
// deduced return type or in the generic lambda that records the backward.
template <class V>
void blockwise_init(lse_acc<V>* pa, V* pxt, std::int64_t tokens) {
  Kokkos::parallel_for(
      "haliax::nn::blockwise_cross_entropy(init)", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, tokens),
      KOKKOS_LAMBDA(std::int64_t r) {
        pa[r] = lse_start<V>();
        pxt[r] = V(0);
      });
}
template <class V>
void blockwise_finish(const lse_acc<V>* pa, const V* pxt, const std::int32_t* pid, V* pl, V* pc, std::int64_t tokens,
                      std::int64_t vocab) {
  Kokkos::parallel_for(
      "haliax::nn::blockwise_cross_entropy(finish)", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, tokens),
      KOKKOS_LAMBDA(std::int64_t r) {
        const V z = pa[r].bad ? std::numeric_limits<V>::quiet_NaN() : lse_finish(pa[r]);
        pl[r] = z;
        pc[r] = pid[r] >= 0 && pid[r] < vocab ? z - pxt[r] : V(0);
      });
}
template <class T>
void blockwise_zero(T* p, std::int64_t n) {
  Kokkos::parallel_for(
      "haliax::nn::blockwise_cross_entropy_grad(zero)", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { p[i] = T(0); });
}
template <class T, class V>
void blockwise_store(T* p, const V* a, std::int64_t n) {
  Kokkos::parallel_for(
      "haliax::nn::blockwise_cross_entropy_grad(hidden)", Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, n),
      KOKKOS_LAMBDA(std::int64_t i) { st(p, i, a[i]); });
}

/// The block-wise loss on hidden states `h` [tokens..., E] and weight `w` [V, E] (both already in that
/// layout), class ids `ids` in token order and an optional token mask; records one node whose inputs are the
/// caller's `hidden` and `lm_head`.
template <class R, class Tok, class T, class AxH, class AxW, class HL, class WL>
auto blockwise_cross_entropy(const named_array<T, AxH>& hidden, const named_array<T, AxW>& lm_head,
                             const named_array<T, HL>& h, const named_array<T, WL>& w,
                             const named_array<std::int32_t, Tok>& ids, const named_array<bool, Tok>* mask,
                             std::int64_t block_size, double zw) {
  using V = compute_t<T>;
  const std::int64_t E = h.sizes()[HL::rank - 1];
  const std::int64_t vocab = w.sizes()[0];
  const std::int64_t tokens = ids.element_count();
  if (block_size <= 0)
    throw std::invalid_argument("haliax::nn::blockwise_cross_entropy_loss: block_size must be positive, got " +
                                std::to_string(block_size));
  const std::int64_t B = block_size < vocab ? block_size : vocab;
  auto& peak = blockwise_peak_logits();
  peak = 0;

  auto lse = named_array<V, Tok>::allocate(ids.sizes(), "haliax::nn::blockwise_cross_entropy(lse)");
  auto ce = named_array<V, Tok>::allocate(ids.sizes(), "haliax::nn::blockwise_cross_entropy(ce)");
  {
    haliax::detail::buffer_lease<lse_acc<V>> acc;
    haliax::detail::buffer_lease<V> xt;
    lease_scratch(acc, tokens, "haliax::nn::blockwise_cross_entropy(acc)");
    lease_scratch(xt, tokens, "haliax::nn::blockwise_cross_entropy(xt)");
    lse_acc<V>* pa = acc.view.data();
    V* pxt = xt.view.data();
    blockwise_init<V>(pa, pxt, tokens);
    if (B > 0 && tokens > 0) {
      haliax::detail::buffer_lease<T> block;
      lease_scratch(block, tokens * B, "haliax::nn::blockwise_cross_entropy(logits)");
      peak = tokens * B;
      for (std::int64_t v0 = 0; v0 < vocab; v0 += B) {
        const std::int64_t nb = vocab - v0 < B ? vocab - v0 : B;
        haliax::detail::gemm_batched<T>(false, true, 1, tokens, nb, E, h.data(), w.data() + v0 * E, block.view.data());
        blockwise_fold<T>(block.view.data(), tokens, nb, v0, ids.data(), pa, pxt);
      }
    }
    blockwise_finish<V>(pa, pxt, ids.data(), lse.data(), ce.data(), tokens, vocab);
  }
  kept_tokens count;
  auto out = reduce_tokens<R, T>(lse, ce, mask ? mask->data() : nullptr, zw, count);

  if (haliax::detail::ad::any_tracked(hidden, lm_head)) {
    named_array<bool, Tok> m;
    if (mask) m = *mask;
    auto bwd = [h = untracked(h), w = untracked(w), ids, m, lse, count, zw, B, E, vocab, tokens](const auto& g,
                                                                                                 auto needs) {
      const bool* pm = m.valid() ? m.data() : nullptr;
      auto [c, ca] = ce_coefficients<R, T>(g, pm, count, lse, ids.data(), static_cast<const V*>(nullptr), vocab, zw);
      named_array<T, AxH> dhidden;
      named_array<T, AxW> dweight;
      named_array<T, WL> dw;
      if (needs[1]) dw = named_array<T, WL>::allocate(w.sizes(), "haliax::nn::blockwise_cross_entropy_grad(weight)");
      haliax::detail::buffer_lease<V> dh_acc;
      haliax::detail::buffer_lease<T> tmp;
      if (needs[0]) {
        lease_scratch(dh_acc, tokens * E, "haliax::nn::blockwise_cross_entropy_grad(hidden acc)");
        blockwise_zero<V>(dh_acc.view.data(), tokens * E);
        lease_scratch(tmp, tokens * E, "haliax::nn::blockwise_cross_entropy_grad(hidden block)");
      }
      if (B > 0 && tokens > 0) {
        haliax::detail::buffer_lease<T> block;
        lease_scratch(block, tokens * B, "haliax::nn::blockwise_cross_entropy_grad(logits)");
        auto& peak = blockwise_peak_logits();
        peak = peak > tokens * B ? peak : tokens * B;
        for (std::int64_t v0 = 0; v0 < vocab; v0 += B) {
          const std::int64_t nb = vocab - v0 < B ? vocab - v0 : B;
          const T* wb = w.data() + v0 * E;
          T* pb = block.view.data();
          haliax::detail::gemm_batched<T>(false, true, 1, tokens, nb, E, h.data(), wb, pb);
          blockwise_grad_block<T>(pb, tokens, nb, v0, ids.data(), lse.data(), ca.data(), c.data());
          if (needs[0]) {
            haliax::detail::gemm_batched<T>(false, false, 1, tokens, E, nb, pb, wb, tmp.view.data());
            add_into<T>(dh_acc.view.data(), tmp.view.data(), tokens * E);
          }
          if (needs[1])
            haliax::detail::gemm_batched<T>(true, false, 1, nb, E, tokens, pb, h.data(), dw.data() + v0 * E);
        }
      } else if (needs[1]) {
        blockwise_zero<T>(dw.data(), vocab * E);
      }
      if (needs[0]) {
        auto dh = named_array<T, HL>::allocate(h.sizes(), "haliax::nn::blockwise_cross_entropy_grad(hidden)");
        blockwise_store<T>(dh.data(), dh_acc.view.data(), tokens * E);
        dhidden = in_order<AxH>(dh);
      }
      if (needs[1]) dweight = in_order<AxW>(dw);
      return std::tuple{dhidden, dweight};
    };
    haliax::detail::ad::record(out, std::move(bwd), hidden, lm_head);
  }
  return out;
}

}  // namespace detail

/// Hidden states for a block-wise loss: they have the contracted axis `E` and not the label axis `Vc`.
template <class AxH, class E, class Vc>
concept HiddenFor = AxisOf<E, AxH> && !detail::has_axis_v<AxH, Vc>;

/// An lm-head weight with exactly the axes {Vc, E}, in either order.
template <class AxW, class E, class Vc>
concept LmHeadFor = detail::same_axis_set_v<AxW, axes<haliax::detail::tag_v<E>, haliax::detail::tag_v<Vc>>>;

/// Cross-entropy of the logits dot(hidden, lm_head, E) along the vocabulary axis `Vc` against class ids,
/// computed block by block over the vocabulary so that the [tokens, vocab] logits are never held (upstream
/// levanter `cross_entropy_block_size`, `fused_cross_entropy_loss_and_logsumexp_penalty`). `hidden` has the
/// contracted axis E and the token axes; `lm_head` is [Vc, E] (either order); `targets` has the token axes
/// (any order). The result equals `cross_entropy_loss(dot(hidden, lm_head, E), Vc, targets, reduction,
/// z_loss_weight)` up to float rounding, as do the gradients, which flow to `hidden` and `lm_head` through one
/// node whose backward recomputes each block's logits. Memory: one [tokens, block_size] logits block (plus
/// a [tokens, E] accumulator in the backward). `block_size` need not divide the vocabulary; it must be
/// positive. Non-finite logits give a NaN loss.
///   auto loss = haliax::nn::blockwise_cross_entropy_loss(h, lm_head, Embed, Vocab, ids, 4096);
///   // h {batch, pos, embed}, lm_head {vocab, embed}, ids int {batch, pos} -> {}
template <LossReduction R = reduce_mean_t, FloatElement T, class AxH, class AxW, AxisTag E, AxisTag Vc, class AxT>
requires HiddenFor<AxH, E, Vc> && LmHeadFor<AxW, E, Vc> && detail::same_axis_set_v<AxT, detail::without_t<AxH, E>>
auto blockwise_cross_entropy_loss(const named_array<T, AxH>& hidden, const named_array<T, AxW>& lm_head, E contract,
                                  Vc label, const named_array<std::int32_t, AxT>& targets, std::int64_t block_size,
                                  R reduction = {}, double z_loss_weight = 0.0) {
  using Tok = detail::without_t<AxH, E>;
  using HL = detail::with_last_t<Tok, E>;
  using WL = axes<haliax::detail::tag_v<Vc>, haliax::detail::tag_v<E>>;
  haliax::detail::check_shared_sizes("haliax::nn::blockwise_cross_entropy_loss", hidden, lm_head);
  haliax::detail::check_shared_sizes("haliax::nn::blockwise_cross_entropy_loss", hidden, targets);
  return detail::blockwise_cross_entropy<R, Tok>(hidden, lm_head, detail::in_order<HL>(hidden),
                                                 detail::in_order<WL>(lm_head), detail::in_order<Tok>(targets), nullptr,
                                                 block_size, z_loss_weight);
}

/// `blockwise_cross_entropy_loss` over the tokens where `where` is true: the others contribute nothing,
/// count nowhere in the mean and get no gradient (see `cross_entropy_loss`'s `where_mask` form).
///   auto loss = haliax::nn::blockwise_cross_entropy_loss(h, lm_head, Embed, Vocab, ids, haliax::where_mask{keep},
///                                                        4096, haliax::nn::reduce_mean, 1e-4);   // with z-loss
template <LossReduction R = reduce_mean_t, FloatElement T, class AxH, class AxW, AxisTag E, AxisTag Vc, class AxT,
          class AxM>
requires HiddenFor<AxH, E, Vc> && LmHeadFor<AxW, E, Vc> && detail::same_axis_set_v<AxT, detail::without_t<AxH, E>> &&
    detail::axis_subset_v<AxM, detail::without_t<AxH, E>>
auto blockwise_cross_entropy_loss(const named_array<T, AxH>& hidden, const named_array<T, AxW>& lm_head, E contract,
                                  Vc label, const named_array<std::int32_t, AxT>& targets, const where_mask<AxM>& where,
                                  std::int64_t block_size, R reduction = {}, double z_loss_weight = 0.0) {
  using Tok = detail::without_t<AxH, E>;
  using HL = detail::with_last_t<Tok, E>;
  using WL = axes<haliax::detail::tag_v<Vc>, haliax::detail::tag_v<E>>;
  haliax::detail::check_shared_sizes("haliax::nn::blockwise_cross_entropy_loss", hidden, lm_head);
  haliax::detail::check_shared_sizes("haliax::nn::blockwise_cross_entropy_loss", hidden, targets);
  haliax::detail::check_shared_sizes("haliax::nn::blockwise_cross_entropy_loss", hidden, where.mask);
  auto m = detail::mask_to_tokens<Tok>(where.mask, haliax::detail::sizes_in<Tok, AxH>(hidden.sizes()));
  return detail::blockwise_cross_entropy<R, Tok>(hidden, lm_head, detail::in_order<HL>(hidden),
                                                 detail::in_order<WL>(lm_head), detail::in_order<Tok>(targets), &m,
                                                 block_size, z_loss_weight);
}

}  // namespace haliax::nn
