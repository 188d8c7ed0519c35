// haliax/nn/attention.hpp: attention masks and scaled dot-product attention (upstream `haliax.nn.attention`),
// plus a blocked ("flash") causal attention that never materialises the score matrix.
//
//   auto mask = causal_mask(q.sized(Pos), k.sized(KPos)) && segment_mask(seg_ids, Pos, KPos);
//   auto y  = haliax::nn::dot_product_attention(q, k, v, KPos, Key, mask);    // plain: scores in memory
//   auto y2 = haliax::nn::flash_attention(q, k, v, Pos, KPos, Key, seg_ids, rename(seg_ids, Pos, KPos));
//
// Axes. The query `q` has the query position axis (Pos) and the head axis `Key`; the key `k` has the key
// position axis (KPos, a different name, as upstream's `Pos.alias("key_position")`) and `Key`; the value `v`
// has KPos and its own head axes (often `Key` again). Every other axis (batch, heads) is a batch axis. The
// result has q's axes with `Key` replaced by v's head axes: {batch, pos, head, key} for the usual layout.
//
// Masks are bool arrays, true where a query may attend to a key. They combine with `&&` (or
// `combine_masks_and`) and broadcast by name against the scores, so an explicit mask may have any subset of
// the score axes ({pos, key_position}, {batch, pos, key_position}, ...).
//
// `dot_product_attention` is written on haliax ops (`*`, `dot`, `where`, `softmax`), so its gradient is the
// composition of theirs; it keeps the scores ([batch, head, pos, key_position]) and the weights for backward.
// `flash_attention` computes the same function block by block with an online softmax (running max and sum per
// query row) and records one autodiff node with its own backward, which recomputes the score tiles from q, k
// and the saved per-row log-sum-exp (FlashAttention-2 style). It supports the structured masks: causal (with
// start offsets), sliding window and segment ids. On host memory it runs host kernels (OpenBLAS tiles on the
// haliax thread pool); every task writes its own outputs, so results do not depend on the thread count. A device
// build (and a host build under HALIAX_PORTABLE_KERNELS=1, haliax/detail/portable.hpp) runs portable Kokkos
// kernels instead: a team per tile of query rows (forward, dQ) or key rows (dK, dV) that stages the partner
// tiles in team scratch (shared memory on a GPU), each output summed over its visible partners in index order
// by one thread; they agree with the host kernels to rounding and do not depend on the thread count or the team
// size either. Head sizes too large for team scratch take the row kernels (a work item per row, no staging).
//
// Grouped-query attention (GQA; MQA when there is one key/value head). k and v may lack some of q's batch
// axes: those q-only axes are query groups that share one key/value head, as Llama's layout
//   q {batch, position, kv_head, q_heads_per_group, head_size}, k and v {batch, key_position, kv_head, head_size}
//   -> {batch, position, kv_head, q_heads_per_group, head_size}
// Both functions accept it. The plain one broadcasts k and v by name inside its `dot`s; the flash one never
// copies k or v per query head: the task that owns a (batch, kv_head) query block runs its query groups
// against each shared key/value tile in turn, and in backward the task that owns a (batch, kv_head) key block
// sums dK and dV over the query blocks and groups in a fixed order (so GQA results, too, do not depend on the
// thread count).
#pragma once

#if defined(HALIAX_HAVE_HOST_BLAS)
#include <cblas.h>
#endif

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../core.hpp"
#include "../detail/ad.hpp"
#include "../detail/axis_algebra.hpp"
#include "../detail/gemm.hpp"
#include "../detail/math.hpp"
#include "../detail/portable.hpp"
#include "../detail/profile.hpp"
#include "../detail/row_team.hpp"
#include "../detail/thread_pool.hpp"
#include "../ops/dot.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/layout.hpp"
#include "functions.hpp"

namespace haliax::nn {

// ---------------------------------------------------------------------------------------------------------
// Masks

namespace detail::attn {

namespace mp = haliax::detail::mp;
template <class Axes>
using list_of = haliax::detail::to_list<Axes>;
template <class L>
using axes_of = haliax::detail::to_axes<L>;
template <class L1, class L2>
using minus = haliax::detail::difference<L1, L2>;
template <class L, class T>
inline constexpr bool has_v = haliax::detail::contains_v<L, std::remove_cvref_t<T>>;
template <class L1, class L2>
inline constexpr bool subset_v = haliax::detail::subset_v<L1, L2>;
/// How many axes of the list `AxA` are not axes of `AxB`.
template <class AxA, class AxB>
inline constexpr std::size_t only_in_v = mp::mp_size<minus<list_of<AxA>, list_of<AxB>>>::value;

/// Which keys a query sees, as functors (not lambdas: the kernel below must not be named after an axis list).
struct causal_allowed {
  std::int64_t off;
  KOKKOS_INLINE_FUNCTION bool operator()(std::int64_t i, std::int64_t j) const { return j <= i + off; }
};
struct window_allowed {
  std::int64_t off, window;
  KOKKOS_INLINE_FUNCTION bool operator()(std::int64_t i, std::int64_t j) const {
    return j <= i + off && j > i + off - window;
  }
};

/// p[i * nk + j] = allowed(i, j) (an axis-free function, for nvcc: see haliax::detail::fill_raw).
template <class F>
void position_mask_kernel(const char* label, bool* p, std::int64_t nq, std::int64_t nk, F allowed) {
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(0, nq * nk), KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t i = idx / nk, j = idx - (idx / nk) * nk;
        p[idx] = allowed(i, j);
      });
}

/// A [QPos, KPos] bool array with element (i, j) = allowed(i, j).
template <class QP, class KP, class F>
array_for<bool, sized_axis<QP>, sized_axis<KP>> position_mask(const char* label, std::int64_t nq, std::int64_t nk, F allowed) {
  auto m = array_for<bool, sized_axis<QP>, sized_axis<KP>>::allocate({nq, nk}, label);
  position_mask_kernel(label, m.data(), nq, nk, allowed);
  return m;
}

}  // namespace detail::attn

/// Causal mask (upstream `causal_mask(QPos, KPos, q_start, k_start)`): bool {QPos, KPos}, true where the key's
/// absolute position `k_start + j` is at most the query's `q_start + i`. QPos and KPos must be different axes.
///   auto m = causal_mask(4 * Pos, 4 * KPos);          // lower triangle (diagonal included)
///   auto d = causal_mask(1 * Pos, 8 * KPos, 7);       // decoding step 7: sees keys 0..7
template <AxisTag QP, AxisTag KP>
requires(!std::is_same_v<QP, KP>) array_for<bool, sized_axis<QP>, sized_axis<KP>> causal_mask(sized_axis<QP> qpos,
                                                                                  sized_axis<KP> kpos,
                                                                                  std::int64_t q_start = 0,
                                                                                  std::int64_t k_start = 0) {
  const std::int64_t off = q_start - k_start;
  return detail::attn::position_mask<QP, KP>(
      "haliax::nn::causal_mask", qpos.size, kpos.size, detail::attn::causal_allowed{off});
}

/// Sliding-window causal mask: bool {QPos, KPos}, true where the key's absolute position lies in
/// (q - window, q] for the query's absolute position q (so each query sees itself and the `window - 1` keys
/// before it, as Mistral's `sliding_window`). Throws `std::invalid_argument` if `window` < 1.
///   auto m = sliding_window_mask(6 * Pos, 6 * KPos, 2);   // row i: keys i-1 and i
template <AxisTag QP, AxisTag KP>
requires(!std::is_same_v<QP, KP>) array_for<bool, sized_axis<QP>, sized_axis<KP>> sliding_window_mask(
    sized_axis<QP> qpos, sized_axis<KP> kpos, std::int64_t window, std::int64_t q_start = 0, std::int64_t k_start = 0) {
  if (window < 1)
    throw std::invalid_argument("haliax::nn::sliding_window_mask: window must be at least 1, got " +
                                std::to_string(window));
  const std::int64_t off = q_start - k_start;
  return detail::attn::position_mask<QP, KP>(
      "haliax::nn::sliding_window_mask", qpos.size, kpos.size, detail::attn::window_allowed{off, window});
}

/// Query and key segment-id arrays that `segment_mask` accepts: exactly one axis of the key ids (the key
/// position) is not an axis of the query ids, and the query ids have at least one axis (the query position)
/// that the key ids lack; the remaining axes (batch) are shared or only on the query side.
template <class AxQ, class AxK>
concept SegmentIdAxes = (detail::attn::only_in_v<AxQ, AxK> >= 1) && (detail::attn::only_in_v<AxK, AxQ> == 1);

/// Segment-id mask for packed sequences: bool with the query ids' axes followed by the key position axis,
/// true where the query's and the key's segment ids are equal (documents packed into one row never attend
/// across their boundary). `q_ids` is int32 over {..., QPos} and `k_ids` over {..., KPos}; shared axes must
/// agree in size (else `shape_error`).
///   auto m = segment_mask(ids, rename(ids, Pos, KPos));   // {batch, pos} x {batch, key_pos} -> {batch, pos, key_pos}
template <class AxQ, class AxK>
requires SegmentIdAxes<AxQ, AxK>
auto segment_mask(const named_array<std::int32_t, AxQ>& q_ids, const named_array<std::int32_t, AxK>& k_ids) {
  using LQ = detail::attn::list_of<AxQ>;
  using KP = detail::attn::mp::mp_front<detail::attn::minus<detail::attn::list_of<AxK>, LQ>>;
  using LR = detail::attn::mp::mp_push_back<LQ, KP>;
  using AxR = detail::attn::axes_of<LR>;
  haliax::detail::check_shared_sizes("haliax::nn::segment_mask", q_ids, k_ids);
  std::array<std::int64_t, AxR::rank> rs{};
  for (std::size_t i = 0; i < AxQ::rank; ++i) rs[i] = q_ids.sizes()[i];
  rs[AxR::rank - 1] = k_ids.sizes()[haliax::detail::index_of_v<detail::attn::list_of<AxK>, KP>];
  auto qb = haliax::detail::broadcast_copy<AxR>("haliax::nn::segment_mask", q_ids, rs);
  return haliax::detail::zip<bool, AxR>("haliax::nn::segment_mask", qb, k_ids, haliax::detail::equal_fn{});
}

/// `segment_mask(ids, Pos, KPos)`: the mask for self-attention over one array of segment ids with axis `Pos`,
/// the key side being the same ids with Pos renamed to KPos.
///   auto m = segment_mask(ids, Pos, KPos);   // {batch, pos} -> {batch, pos, key_pos}
template <class Ax, AxisTag QP, AxisTag KP>
requires(AxisOf<QP, Ax> && !AxisOf<KP, Ax>) auto segment_mask(const named_array<std::int32_t, Ax>& ids, QP qpos,
                                                              KP kpos) {
  return segment_mask(ids, rename(ids, qpos, kpos));
}

/// Both masks (upstream `combine_masks_and`); the same as `a && b`: broadcasts by name.
///   auto m = combine_masks_and(causal_mask(n * Pos, n * KPos), segment_mask(ids, Pos, KPos));
template <class AxA, class AxB>
requires BroadcastCompatible<AxA, AxB>
auto combine_masks_and(const named_array<bool, AxA>& a, const named_array<bool, AxB>& b) { return a && b; }

/// Either mask (upstream `combine_masks_or`); the same as `a || b`.
///   auto m = combine_masks_or(causal_mask(n * Pos, n * KPos), prefix);
template <class AxA, class AxB>
requires BroadcastCompatible<AxA, AxB>
auto combine_masks_or(const named_array<bool, AxA>& a, const named_array<bool, AxB>& b) { return a || b; }

/// An additive bias from a mask (upstream `mask_to_bias(mask, -1e9)`): 0 where the mask is true, `masked`
/// where it is false. Element type `T` (default float).
///   auto bias = mask_to_bias(causal_mask(n * Pos, n * KPos));   // float {pos, key_pos}
template <FloatElement T = float, class Ax>
named_array<T, Ax> mask_to_bias(const named_array<bool, Ax>& mask, double masked = -1e9) {
  return where(mask, zeros_like<T>(mask), masked);
}

// ---------------------------------------------------------------------------------------------------------
// Plain (materialised) attention

/// Options of `dot_product_attention`: the score scale (default 1 / sqrt(size of Key), as upstream) and the
/// logit soft cap c (upstream `logits_soft_cap`, Gemma 2's `attn_logit_softcapping`): scaled scores s become
/// c * tanh(s / c) before the mask.
struct attention_options {
  std::optional<double> scale = std::nullopt;
  std::optional<double> logits_soft_cap = std::nullopt;
};

namespace detail::attn {

/// The value the plain attention gives masked scores (upstream uses -1e9, not -inf: a row with every key
/// masked then averages the values instead of producing NaN).
inline constexpr double masked_score = -1e9;

template <class AxQ, class AxK, class K>
using weights_list = typename haliax::detail::dot_layout<list_of<AxQ>, list_of<AxK>, mp::mp_list<K>>::canonical;

/// The output axes of attention: q's axes without Key, then v's head axes (v's axes that are neither q's batch
/// or position axes nor KPos), in v's order.
template <class AxQ, class AxV, class KP, class K>
using output_list = mp::mp_append<minus<list_of<AxQ>, mp::mp_list<K>>,
                                  minus<list_of<AxV>, mp::mp_push_back<minus<list_of<AxQ>, mp::mp_list<K>>, KP>>>;

}  // namespace detail::attn

/// Axes for attention scores between `q` (axes AxQ) and `k` (axes AxK) over key positions `KP` and head axis
/// `K`: K is an axis of both, KP an axis of k but not of q, and k's other axes (batch, heads) are axes of q.
template <class AxQ, class AxK, class KP, class K>
concept AttentionScoreAxes =
    AxisTag<KP> && AxisTag<K> && !std::is_same_v<std::remove_cvref_t<KP>, std::remove_cvref_t<K>> &&
    detail::attn::has_v<detail::attn::list_of<AxQ>, K> && detail::attn::has_v<detail::attn::list_of<AxK>, K> &&
    detail::attn::has_v<detail::attn::list_of<AxK>, KP> && !detail::attn::has_v<detail::attn::list_of<AxQ>, KP> &&
    detail::attn::subset_v<
        detail::attn::minus<detail::attn::list_of<AxK>,
                            detail::attn::mp::mp_list<std::remove_cvref_t<K>, std::remove_cvref_t<KP>>>,
        detail::attn::list_of<AxQ>>;

/// Attention over `q`, `k`, `v`: the score axes as `AttentionScoreAxes`, and KP an axis of the value `v`.
template <class AxQ, class AxK, class AxV, class KP, class K>
concept AttentionAxes = AttentionScoreAxes<AxQ, AxK, KP, K> && detail::attn::has_v<detail::attn::list_of<AxV>, KP>;

/// The softmax-normalised attention weights (upstream `dot_product_attention_weights`): softmax over KPos of
/// (q * scale) . k contracted over `Key`, with masked scores set to -1e9 first. The result has the batch axes
/// q shares with k, then q's other axes (Pos), then KPos last. `mask` broadcasts by name against it.
///   auto w = dot_product_attention_weights(q, k, KPos, Key, causal_mask(n * Pos, n * KPos));
///   // {batch, pos, head, key} x {batch, key_pos, head, key} -> {batch, head, pos, key_pos}
template <FloatElement T, class AxQ, class AxK, class KP, class K, class AxM>
requires AttentionScoreAxes<AxQ, AxK, KP, K> &&
    detail::attn::subset_v<detail::attn::list_of<AxM>, detail::attn::weights_list<AxQ, AxK, std::remove_cvref_t<K>>>
auto dot_product_attention_weights(const named_array<T, AxQ>& q, const named_array<T, AxK>& k, KP kpos, K key,
                                   const named_array<bool, AxM>& mask, attention_options opts = {}) {
  using W = detail::attn::axes_of<detail::attn::weights_list<AxQ, AxK, std::remove_cvref_t<K>>>;
  const double scale = opts.scale ? *opts.scale : 1.0 / std::sqrt(static_cast<double>(q.size(key)));
  auto scores = dot<W>(q * scale, k, key);
  if (opts.logits_soft_cap) scores = tanh(scores / *opts.logits_soft_cap) * *opts.logits_soft_cap;
  auto masked = where(mask, scores, detail::attn::masked_score);
  scores = {};  // released before softmax allocates: two score-sized arrays live at once, not three
  return softmax(masked, kpos);
}

/// `dot_product_attention_weights` without a mask.
///   auto w = dot_product_attention_weights(q, k, KPos, Key);
template <FloatElement T, class AxQ, class AxK, class KP, class K>
requires AttentionScoreAxes<AxQ, AxK, KP, K>
auto dot_product_attention_weights(const named_array<T, AxQ>& q, const named_array<T, AxK>& k, KP kpos, K key,
                                   attention_options opts = {}) {
  using W = detail::attn::axes_of<detail::attn::weights_list<AxQ, AxK, std::remove_cvref_t<K>>>;
  const double scale = opts.scale ? *opts.scale : 1.0 / std::sqrt(static_cast<double>(q.size(key)));
  auto scores = dot<W>(q * scale, k, key);
  if (opts.logits_soft_cap) scores = tanh(scores / *opts.logits_soft_cap) * *opts.logits_soft_cap;
  return softmax(scores, kpos);
}

/// Scaled dot-product attention (upstream `dot_product_attention(KPos, Key, q, k, v, mask)`): the weights of
/// `dot_product_attention_weights` contracted with `v` over KPos. The result has q's axes with `Key` replaced
/// by v's head axes (v's axes other than its batch axes and KPos), in that order. Masked keys get score -1e9.
/// Gradients flow through the ops it is made of. Memory: the scores, masked scores and weights of every
/// (batch, head) are materialised; `flash_attention` avoids that for the structured masks. Grouped-query
/// attention needs nothing special: k and v lacking q's query-group axis broadcast by name (their gradients sum
/// over the groups).
///   auto y = dot_product_attention(q, k, v, KPos, Key, causal_mask(n * Pos, n * KPos));
///   // q {batch, pos, head, key}, k and v {batch, key_pos, head, key} -> {batch, pos, head, key}
template <FloatElement T, class AxQ, class AxK, class AxV, class KP, class K, class AxM>
requires AttentionAxes<AxQ, AxK, AxV, KP, K> &&
    detail::attn::subset_v<detail::attn::list_of<AxM>, detail::attn::weights_list<AxQ, AxK, std::remove_cvref_t<K>>>
auto dot_product_attention(const named_array<T, AxQ>& q, const named_array<T, AxK>& k, const named_array<T, AxV>& v,
                           KP kpos, K key, const named_array<bool, AxM>& mask, attention_options opts = {}) {
  using Out =
      detail::attn::axes_of<detail::attn::output_list<AxQ, AxV, std::remove_cvref_t<KP>, std::remove_cvref_t<K>>>;
  return dot<Out>(dot_product_attention_weights(q, k, kpos, key, mask, opts), v, kpos);
}

/// Attention weights with a learned sink per head (upstream `dot_product_attention_with_sink`): the softmax over
/// KPos takes one more logit, `sinks` (soft-capped as the scores are, never scaled or masked), whose value is zero,
/// so a row's weights sum to 1 - exp(sink - logsumexp of the row and the sink). Upstream appends a zero key and
/// value and puts the sink in the bias; the same function is computed here without the extra key, as
/// exp(s - logaddexp(logsumexp_KPos(s), sink)). `sinks` has some of the weights' axes besides KPos (the heads:
/// upstream's are {kv_head, q_heads_per_group}, float32, zeros at init) and broadcasts over the rest. Gradients
/// reach q, k and the sinks.
///   auto w = dot_product_attention_weights_with_sink(q, k, sinks, KPos, Key, causal_mask(n * Pos, n * KPos));
template <FloatElement T, class AxQ, class AxK, class AxS, class KP, class K, class AxM>
requires AttentionScoreAxes<AxQ, AxK, KP, K> &&
    detail::attn::subset_v<detail::attn::list_of<AxM>,
                           detail::attn::weights_list<AxQ, AxK, std::remove_cvref_t<K>>> &&
    detail::attn::subset_v<detail::attn::list_of<AxS>,
                           detail::attn::minus<detail::attn::weights_list<AxQ, AxK, std::remove_cvref_t<K>>,
                                               detail::attn::mp::mp_list<std::remove_cvref_t<KP>>>>
auto dot_product_attention_weights_with_sink(const named_array<T, AxQ>& q, const named_array<T, AxK>& k,
                                             const named_array<T, AxS>& sinks, KP kpos, K key,
                                             const named_array<bool, AxM>& mask, attention_options opts = {}) {
  using W = detail::attn::axes_of<detail::attn::weights_list<AxQ, AxK, std::remove_cvref_t<K>>>;
  const double scale = opts.scale ? *opts.scale : 1.0 / std::sqrt(static_cast<double>(q.size(key)));
  auto scores = dot<W>(q * scale, k, key);
  auto sink = sinks;
  if (opts.logits_soft_cap) {
    scores = tanh(scores / *opts.logits_soft_cap) * *opts.logits_soft_cap;
    sink = tanh(sink / *opts.logits_soft_cap) * *opts.logits_soft_cap;
  }
  auto masked = where(mask, scores, detail::attn::masked_score);
  scores = {};
  const auto normaliser = logaddexp(logsumexp(masked, kpos), sink);  // the weights' axes without KPos
  return exp(masked - normaliser);
}

/// `dot_product_attention` with a learned sink per head (upstream `dot_product_attention_with_sink`): the weights
/// of `dot_product_attention_weights_with_sink` contracted with `v` over KPos (the sink's value is zero).
///   auto y = dot_product_attention_with_sink(q, k, v, sinks, KPos, Key, causal_mask(n * Pos, n * KPos));
///   // q {batch, pos, kv_head, group, key}, sinks {kv_head, group} -> q's axes
template <FloatElement T, class AxQ, class AxK, class AxV, class AxS, class KP, class K, class AxM>
requires AttentionAxes<AxQ, AxK, AxV, KP, K> &&
    detail::attn::subset_v<detail::attn::list_of<AxM>, detail::attn::weights_list<AxQ, AxK, std::remove_cvref_t<K>>>
auto dot_product_attention_with_sink(const named_array<T, AxQ>& q, const named_array<T, AxK>& k,
                                     const named_array<T, AxV>& v, const named_array<T, AxS>& sinks, KP kpos, K key,
                                     const named_array<bool, AxM>& mask, attention_options opts = {}) {
  using Out =
      detail::attn::axes_of<detail::attn::output_list<AxQ, AxV, std::remove_cvref_t<KP>, std::remove_cvref_t<K>>>;
  return dot<Out>(dot_product_attention_weights_with_sink(q, k, sinks, kpos, key, mask, opts), v, kpos);
}

/// `dot_product_attention` without a mask (every query sees every key).
///   auto y = dot_product_attention(q, k, v, KPos, Key);
template <FloatElement T, class AxQ, class AxK, class AxV, class KP, class K>
requires AttentionAxes<AxQ, AxK, AxV, KP, K>
auto dot_product_attention(const named_array<T, AxQ>& q, const named_array<T, AxK>& k, const named_array<T, AxV>& v,
                           KP kpos, K key, attention_options opts = {}) {
  using Out =
      detail::attn::axes_of<detail::attn::output_list<AxQ, AxV, std::remove_cvref_t<KP>, std::remove_cvref_t<K>>>;
  return dot<Out>(dot_product_attention_weights(q, k, kpos, key, opts), v, kpos);
}

// ---------------------------------------------------------------------------------------------------------
// Blocked (flash) attention

/// Options of `flash_attention`. The mask is structural: causal (key position <= query position, with the
/// absolute positions `q_start + i` and `k_start + j`), optionally a sliding window (key position in
/// (q - window, q]; 0 = no window) and, through the overload that takes them, segment ids. `scale` defaults
/// to 1 / sqrt(size of Key). `block_q` x `block_k` is the tile size of the host kernels; results depend on it
/// (summation order) but never on the thread count. The portable kernels tile by their own plan, chosen from the
/// head sizes (detail::attn::plan_tiles), and ignore it.
struct flash_attention_options {
  bool causal = true;
  std::int64_t sliding_window = 0;
  std::int64_t q_start = 0;
  std::int64_t k_start = 0;
  std::optional<double> scale = std::nullopt;
  std::int64_t block_q = 128;
  std::int64_t block_k = 128;
  /// Scaled scores s become c * tanh(s / c) before the mask (upstream `logits_soft_cap`, Gemma 2); the backward
  /// multiplies their gradient by 1 - tanh(s / c)^2.
  std::optional<double> logits_soft_cap = std::nullopt;
};

namespace detail::attn {

/// Axis bookkeeping of flash attention: batch axes (q's axes other than Pos and Key, in q's order), k's batch
/// axes (k's axes other than KPos and Key), the query-group axes (q's batch axes that k lacks: grouped-query
/// attention), the shared batch axes (the others, in q's order), value head axes (v's axes other than q's batch
/// axes and KPos, in v's order), the output axes, and the packed layouts [batch..., Pos, Key],
/// [shared..., KPos, Key] and [shared..., KPos, value...] used for operands whose head axes are not innermost.
/// The kernels number q's batch elements in the order [shared..., group...] (row-major, groups innermost), so
/// the q elements of key/value element b are b * groups ... b * groups + groups - 1.
template <class AxQ, class AxK, class AxV, class P, class KP, class K>
struct flash_axes {
  using lq = list_of<AxQ>;
  using lk = list_of<AxK>;
  using lv = list_of<AxV>;
  using batch = minus<lq, mp::mp_list<P, K>>;
  using k_batch = minus<lk, mp::mp_list<KP, K>>;
  using group = minus<batch, k_batch>;
  using shared = minus<batch, group>;
  using canonical = mp::mp_append<shared, group>;
  using value = minus<lv, mp::mp_push_back<batch, KP>>;
  using v_batch = minus<lv, mp::mp_push_back<value, KP>>;  // v's axes that are q's batch axes
  using q_packed = mp::mp_append<batch, mp::mp_list<P, K>>;
  using k_packed = mp::mp_append<shared, mp::mp_list<KP, K>>;
  using v_packed = mp::mp_append<shared, mp::mp_list<KP>, value>;
  using out = output_list<AxQ, AxV, KP, K>;
  /// Pos, KPos and Key are three different axes; q has Pos and Key, k has KPos and Key, v has KPos; KPos is not
  /// an axis of q and Pos not one of k or v.
  static constexpr bool roles = !std::is_same_v<P, KP> && !std::is_same_v<P, K> && !std::is_same_v<KP, K> &&
                                has_v<lq, P> && has_v<lq, K> && has_v<lk, KP> && has_v<lk, K> && has_v<lv, KP> &&
                                !has_v<lq, KP> && !has_v<lk, P> && !has_v<lv, P>;
  /// k's batch axes are a subset of q's (equal for multi-head attention; q's extra ones are query groups).
  static constexpr bool k_batch_in_q = subset_v<k_batch, batch>;
  /// v has exactly k's batch axes among q's batch axes (so no query-group axis either).
  static constexpr bool v_batch_is_k_batch = haliax::detail::same_set_v<v_batch, k_batch>;
  /// v has at least one head axis of its own (the output's replacement for Key).
  static constexpr bool has_value_axes = !mp::mp_empty<value>::value;
  static constexpr bool valid = roles && k_batch_in_q && v_batch_is_k_batch && has_value_axes;
};

/// The layouts the kernels read each operand in: the operand's own when its head axes are innermost (rows are
/// then strided matrices that BLAS reads with a leading dimension, e.g. {batch, pos, head, key}), else packed.
template <class A>
struct flash_layouts {
  static constexpr std::size_t nv = mp::mp_size<typename A::value>::value;
  using q = std::conditional_t<std::is_same_v<mp::mp_back<typename A::lq>, mp::mp_back<typename A::q_packed>>,
                               typename A::lq, typename A::q_packed>;
  using k = std::conditional_t<std::is_same_v<mp::mp_back<typename A::lk>, mp::mp_back<typename A::k_packed>>,
                               typename A::lk, typename A::k_packed>;
  using v = std::conditional_t<
      std::is_same_v<mp::mp_drop_c<typename A::lv, mp::mp_size<typename A::lv>::value - nv>, typename A::value>,
      typename A::lv, typename A::v_packed>;
};

/// Where the rows of one operand are: the offset of each batch element's matrix (batch elements in the
/// canonical order, q's batch axes row-major) and the row stride (the stride of the position axis).
struct operand_layout {
  std::vector<std::int64_t> off;
  std::int64_t ld = 0;
};

/// The `operand_layout` of an array laid out as `L` with sizes `s`, for canonical batch axes `Batch` and the
/// position axis `Row`.
template <class Batch, class Row, class L, std::size_t N>
operand_layout describe(const std::array<std::int64_t, N>& s) {
  const auto st = haliax::detail::row_major_strides(s);
  constexpr std::size_t nb = mp::mp_size<Batch>::value;
  std::array<std::int64_t, nb> bs{}, bst{};
  std::size_t i = 0;
  mp::mp_for_each<Batch>([&]<class Tag>(Tag) {
    constexpr std::size_t k = haliax::detail::index_of_v<L, Tag>;
    bs[i] = s[k];
    bst[i] = st[k];
    ++i;
  });
  std::int64_t count = 1;
  for (auto n : bs) count *= n;
  operand_layout r;
  r.off.resize(static_cast<std::size_t>(count));
  for (std::int64_t b = 0; b < count; ++b) {
    std::int64_t rem = b, o = 0;
    for (std::size_t d = nb; d-- > 0;) {
      o += (rem % bs[d]) * bst[d];
      rem /= bs[d];
    }
    r.off[static_cast<std::size_t>(b)] = o;
  }
  r.ld = st[haliax::detail::index_of_v<L, Row>];
  return r;
}

/// One GEMM on a tile, single-threaded BLAS: C = alpha op(A) op(B) + beta C, row-major with leading dims.
/// Counted in `gemm_profile` when that is enabled, like every other haliax GEMM.
/// (The host kernels run only on host memory; a device build without a host BLAS never calls this, and gets a
/// plain loop in its place.)
template <class T>
void tile_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda,
               const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  auto call = [&] {
#if defined(HALIAX_HAVE_HOST_BLAS)
    const auto opa = ta ? CblasTrans : CblasNoTrans;
    const auto opb = tb ? CblasTrans : CblasNoTrans;
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemm(CblasRowMajor, opa, opb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    } else {
      cblas_dgemm(CblasRowMajor, opa, opb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
#else
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        T acc = 0;
        for (std::int64_t l = 0; l < k; ++l) acc += (ta ? a[l * lda + i] : a[i * lda + l]) * (tb ? b[j * ldb + l] : b[l * ldb + j]);
        c[i * ldc + j] = alpha * acc + (beta == T(0) ? T(0) : beta * c[i * ldc + j]);
      }
#endif
  };
  using profile = haliax::detail::gemm_profile;
  if (!profile::enabled.load(std::memory_order_relaxed)) return call();
  const auto t0 = std::chrono::steady_clock::now();
  call();
  const auto t1 = std::chrono::steady_clock::now();
  profile::nanoseconds += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
  profile::flops += 2 * m * n * k;
  profile::calls += 1;
}

/// Sizes, mask and operand layouts of one flash-attention call. Query i and key j are at absolute positions
/// q_start + i and k_start + j; `offset` = q_start - k_start. The output, its gradient and the gradients of
/// q, k, v share the layouts of out, q, k, v. `batch` counts q's batch elements, `kv_batch` those of k and v;
/// q element b reads key/value element b / q_per_kv (grouped-query attention; q_per_kv = 1 otherwise).
/// Segment ids and the log-sum-exp are per q element.
struct geometry {
  std::int64_t batch = 0, nq = 0, nk = 0, d = 0, e = 0;
  std::int64_t kv_batch = 0, q_per_kv = 1;
  std::int64_t bq = 128, bk = 128, nqb = 0, nkb = 0;
  bool causal = true;
  std::int64_t window = 0, offset = 0;
  double soft_cap = 0;  // scores c * tanh(s / c) when > 0
  operand_layout ql, kl, vl, ol;
  const std::int32_t* qseg = nullptr;  // [batch, nq] or null
  const std::int32_t* kseg = nullptr;  // [batch, nk] or null
  // Per (batch, block) min and max segment id, to skip tiles whose documents cannot meet.
  std::vector<std::int32_t> qseg_lo, qseg_hi, kseg_lo, kseg_hi;

  enum tile_kind { empty, partial, full };

  /// Whether the tile of query block ib and key block jb (of batch element b) is masked out entirely, visible
  /// entirely, or in part.
  tile_kind classify(std::int64_t b, std::int64_t ib, std::int64_t jb) const {
    const std::int64_t i0 = ib * bq, i1 = std::min(nq, i0 + bq), j0 = jb * bk, j1 = std::min(nk, j0 + bk);
    if (causal && j0 > i1 - 1 + offset) return empty;
    if (window > 0 && j1 - 1 <= i0 + offset - window) return empty;
    bool whole = (!causal || j1 - 1 <= i0 + offset) && (window == 0 || j0 > i1 - 1 + offset - window);
    if (qseg != nullptr) {
      const std::int32_t ql_ = qseg_lo[b * nqb + ib], qh = qseg_hi[b * nqb + ib];
      const std::int32_t kl_ = kseg_lo[b * nkb + jb], kh = kseg_hi[b * nkb + jb];
      if (qh < kl_ || kh < ql_) return empty;
      whole = whole && ql_ == qh && kl_ == kh && ql_ == kl_;
    }
    return whole ? full : partial;
  }

  /// Sets the masked entries of a score tile (rows x cols from query i0 and key j0, dense) to `value`.
  template <class T>
  void mask_tile(std::int64_t b, std::int64_t i0, std::int64_t j0, std::int64_t rows, std::int64_t cols, T* s,
                 T value) const {
    for (std::int64_t r = 0; r < rows; ++r) {
      T* sr = s + r * cols;
      // Visible keys of this row by position: [lo, hi) in tile columns.
      const std::int64_t i = i0 + r;
      std::int64_t lo = 0, hi = cols;
      if (causal) hi = std::clamp<std::int64_t>(i + offset + 1 - j0, 0, cols);
      if (window > 0) lo = std::clamp<std::int64_t>(i + offset - window + 1 - j0, 0, cols);
      if (hi < lo) hi = lo;
      std::fill(sr, sr + lo, value);
      std::fill(sr + hi, sr + cols, value);
      if (qseg != nullptr) {
        const std::int32_t id = qseg[b * nq + i];
        const std::int32_t* ks = kseg + b * nk + j0;
        for (std::int64_t c = lo; c < hi; ++c) sr[c] = ks[c] == id ? sr[c] : value;
      }
    }
  }

  void summarise_segments() {
    if (qseg == nullptr) return;
    auto summarise = [](const std::int32_t* ids, std::int64_t batch, std::int64_t n, std::int64_t bs, std::int64_t nb,
                        std::vector<std::int32_t>& lo, std::vector<std::int32_t>& hi) {
      lo.assign(static_cast<std::size_t>(batch * nb), 0);
      hi.assign(static_cast<std::size_t>(batch * nb), 0);
      for (std::int64_t b = 0; b < batch; ++b)
        for (std::int64_t blk = 0; blk < nb; ++blk) {
          std::int32_t l = std::numeric_limits<std::int32_t>::max(), h = std::numeric_limits<std::int32_t>::min();
          for (std::int64_t i = blk * bs; i < std::min(n, (blk + 1) * bs); ++i) {
            l = std::min(l, ids[b * n + i]);
            h = std::max(h, ids[b * n + i]);
          }
          lo[static_cast<std::size_t>(b * nb + blk)] = l;
          hi[static_cast<std::size_t>(b * nb + blk)] = h;
        }
    };
    summarise(qseg, batch, nq, bq, nqb, qseg_lo, qseg_hi);
    summarise(kseg, batch, nk, bk, nkb, kseg_lo, kseg_hi);
  }
};

// ---- tile kernels: element-wise work between the GEMMs, compiled per host ISA ------------------------------

inline constexpr int lanes = 16;

/// max of a row, in `lanes` independent lanes (vectorises without reassociation flags).
template <class T>
HALIAX_NN_INLINE T row_max(const T* x, std::int64_t n) {
  T acc[lanes];
  for (int t = 0; t < lanes; ++t) acc[t] = -std::numeric_limits<T>::infinity();
  std::int64_t j = 0;
  for (; j + lanes <= n; j += lanes) {
    HALIAX_NN_LANES
    for (int t = 0; t < lanes; ++t) acc[t] = x[j + t] > acc[t] ? x[j + t] : acc[t];
  }
  T m = -std::numeric_limits<T>::infinity();
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  for (int t = 0; t < lanes; ++t) m = acc[t] > m ? acc[t] : m;
  return m;
}

/// x_j = exp(x_j - shift) for a row whose entries are at most `shift` (or -inf); returns their sum, lane sums
/// added in a fixed order.
template <class T>
HALIAX_NN_INLINE T exp_row(T* x, std::int64_t n, T shift) {
  T acc[lanes] = {};
  std::int64_t j = 0;
  for (; j + lanes <= n; j += lanes) {
    HALIAX_NN_LANES
    for (int t = 0; t < lanes; ++t) {
      const T e = haliax::nn::detail::fast_exp_nonpos<T>(x[j + t] - shift);
      x[j + t] = e;
      acc[t] += e;
    }
  }
  T s = T(0);
  for (; j < n; ++j) {
    const T e = haliax::nn::detail::fast_exp_nonpos<T>(x[j] - shift);
    x[j] = e;
    s += e;
  }
  for (int t = 0; t < lanes; ++t) s += acc[t];
  return s;
}

/// Online-softmax step of the forward pass on a score tile s (rows x cols, dense, masked entries -inf): with
/// the running row max m and sum l, replaces s by exp(s - new max), rescales the running output rows o (e
/// values, row stride o_ld) by exp(old max - new max), and updates m and l.
template <class T>
HALIAX_NN_INLINE void online_softmax_body(T* s, std::int64_t rows, std::int64_t cols, T* m, T* l, T* o,
                                          std::int64_t o_ld, std::int64_t e) {
  constexpr T ninf = -std::numeric_limits<T>::infinity();
  for (std::int64_t r = 0; r < rows; ++r) {
    T* sr = s + r * cols;
    const T mx = row_max(sr, cols);
    const T m_old = m[r];
    const T m_new = mx > m_old ? mx : m_old;
    if (m_new == ninf) {  // nothing visible in this row yet: contributes nothing
      for (std::int64_t c = 0; c < cols; ++c) sr[c] = T(0);
      continue;
    }
    const T sum = exp_row(sr, cols, m_new);
    const T alpha = haliax::nn::detail::fast_exp_nonpos<T>(m_old - m_new);  // 0 when m_old is -inf
    l[r] = l[r] * alpha + sum;
    if (alpha != T(1)) {
      T* orow = o + r * o_ld;
      for (std::int64_t c = 0; c < e; ++c) orow[c] *= alpha;
    }
    m[r] = m_new;
  }
}

/// Backward: p = exp(s - lse_r) on a score tile (masked entries -inf give 0; a row with lse -inf is all 0).
template <class T>
HALIAX_NN_INLINE void probs_body(T* s, std::int64_t rows, std::int64_t cols, const T* lse) {
  for (std::int64_t r = 0; r < rows; ++r) {
    T* sr = s + r * cols;
    const T lr = lse[r];
    if (lr == -std::numeric_limits<T>::infinity()) {
      for (std::int64_t c = 0; c < cols; ++c) sr[c] = T(0);
      continue;
    }
    std::int64_t c = 0;
    for (; c + lanes <= cols; c += lanes) {
      HALIAX_NN_LANES
      for (int t = 0; t < lanes; ++t) sr[c + t] = haliax::nn::detail::fast_exp<T>(sr[c + t] - lr);
    }
    for (; c < cols; ++c) sr[c] = haliax::nn::detail::fast_exp<T>(sr[c] - lr);
  }
}

/// Backward: p = p * (dp - delta_r), turning the probabilities into the score gradient dS.
template <class T>
HALIAX_NN_INLINE void dscores_body(T* p, const T* dp, std::int64_t rows, std::int64_t cols, const T* delta) {
  for (std::int64_t r = 0; r < rows; ++r) {
    T* pr = p + r * cols;
    const T* dpr = dp + r * cols;
    const T dr = delta[r];
    for (std::int64_t c = 0; c < cols; ++c) pr[c] = pr[c] * (dpr[c] - dr);
  }
}

#ifdef HALIAX_NN_ISA_DISPATCH
#define HALIAX_ATTN_KERNEL(NAME, PARAMS, ARGS)                                                                     \
  template <class T>                                                                                               \
  void NAME##_generic PARAMS {                                                                                     \
    NAME##_body<T> ARGS;                                                                                           \
  }                                                                                                                \
  template <class T>                                                                                               \
  __attribute__((target("avx2,fma,bmi,bmi2,f16c"))) void NAME##_avx2 PARAMS {                                      \
    NAME##_body<T> ARGS;                                                                                           \
  }                                                                                                                \
  template <class T>                                                                                               \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,bmi,bmi2,f16c"))) void NAME##_avx512 PARAMS { \
    NAME##_body<T> ARGS;                                                                                           \
  }
#else
#define HALIAX_ATTN_KERNEL(NAME, PARAMS, ARGS) \
  template <class T>                           \
  void NAME##_generic PARAMS {                 \
    NAME##_body<T> ARGS;                       \
  }
#endif

HALIAX_ATTN_KERNEL(online_softmax,
                   (T * s, std::int64_t rows, std::int64_t cols, T* m, T* l, T* o, std::int64_t o_ld, std::int64_t e),
                   (s, rows, cols, m, l, o, o_ld, e))
HALIAX_ATTN_KERNEL(probs, (T * s, std::int64_t rows, std::int64_t cols, const T* lse), (s, rows, cols, lse))
HALIAX_ATTN_KERNEL(dscores, (T * p, const T* dp, std::int64_t rows, std::int64_t cols, const T* delta),
                   (p, dp, rows, cols, delta))
#undef HALIAX_ATTN_KERNEL

#ifdef HALIAX_NN_ISA_DISPATCH
#define HALIAX_ATTN_DISPATCH(NAME, ...)                                        \
  (isa == haliax::nn::detail::host_isa::avx512 ? NAME##_avx512<T>(__VA_ARGS__) \
   : isa == haliax::nn::detail::host_isa::avx2 ? NAME##_avx2<T>(__VA_ARGS__)   \
                                               : NAME##_generic<T>(__VA_ARGS__))
#else
#define HALIAX_ATTN_DISPATCH(NAME, ...) NAME##_generic<T>(__VA_ARGS__)
#endif

/// Per-thread scratch for the tile kernels.
template <class T>
T* scratch(std::size_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

/// Makes OpenBLAS single-threaded: tiles run in parallel on the haliax pool, one BLAS call per task.
inline void single_threaded_blas() {
#if defined(HALIAX_HAVE_HOST_BLAS)
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
#endif
}

/// Soft-caps n scores in place, s = c * tanh(s / c); with `dcap`, also writes 1 - tanh(s / c)^2 there (the
/// derivative, for the backward pass).
template <class T>
inline void soft_cap_tile(T* s, std::int64_t n, T c, T* dcap) {
  for (std::int64_t x = 0; x < n; ++x) {
    const T t = std::tanh(s[x] / c);
    s[x] = c * t;
    if (dcap) dcap[x] = T(1) - t * t;
  }
}

/// Forward of one query block of key/value element `kb`, for its query groups [h0, h1) (q elements
/// kb * q_per_kv + h): an online softmax over the visible key blocks, the groups taking each key and value
/// tile in turn (the tile stays in cache for all of them). Writes the groups' rows of `o` (normalised output)
/// and `lse` (log-sum-exp of the scaled scores, [batch, nq], -inf for a row that sees no key). Each group's
/// rows go through the same operations as they would without groups.
template <class T>
void forward_block(const geometry& g, const T* q, const T* k, const T* v, T* o, T* lse, T scale, std::int64_t kb,
                   std::int64_t ib, std::int64_t h0, std::int64_t h1) {
  [[maybe_unused]] const auto isa = haliax::nn::detail::detect_host_isa();
  const std::int64_t i0 = ib * g.bq, rows = std::min(g.nq, i0 + g.bq) - i0, e = g.e, ng = h1 - h0;
  T* s = scratch<T>(static_cast<std::size_t>(g.bq * g.bk + 2 * ng * g.bq));
  T* m = s + g.bq * g.bk;  // running row max, group h's rows at (h - h0) * bq
  T* l = m + ng * g.bq;    // running row sum, likewise
  constexpr T ninf = -std::numeric_limits<T>::infinity();
  for (std::int64_t h = h0; h < h1; ++h) {
    T* ob = o + g.ol.off[kb * g.q_per_kv + h] + i0 * g.ol.ld;
    for (std::int64_t r = 0; r < rows; ++r) {
      m[(h - h0) * g.bq + r] = ninf;
      l[(h - h0) * g.bq + r] = T(0);
      std::fill(ob + r * g.ol.ld, ob + r * g.ol.ld + e, T(0));
    }
  }
  for (std::int64_t jb = 0; jb < g.nkb; ++jb) {
    const std::int64_t j0 = jb * g.bk, cols = std::min(g.nk, j0 + g.bk) - j0;
    const T* kt = k + g.kl.off[kb] + j0 * g.kl.ld;
    const T* vt = v + g.vl.off[kb] + j0 * g.vl.ld;
    for (std::int64_t h = h0; h < h1; ++h) {
      const std::int64_t b = kb * g.q_per_kv + h;
      const auto kind = g.classify(b, ib, jb);
      if (kind == geometry::empty) continue;
      T* ob = o + g.ol.off[b] + i0 * g.ol.ld;
      tile_gemm<T>(false, true, rows, cols, g.d, scale, q + g.ql.off[b] + i0 * g.ql.ld, g.ql.ld, kt, g.kl.ld, T(0), s,
                   cols);
      if (g.soft_cap > 0) soft_cap_tile<T>(s, rows * cols, static_cast<T>(g.soft_cap), nullptr);
      if (kind == geometry::partial) g.mask_tile<T>(b, i0, j0, rows, cols, s, ninf);
      HALIAX_ATTN_DISPATCH(online_softmax, s, rows, cols, m + (h - h0) * g.bq, l + (h - h0) * g.bq, ob, g.ol.ld, e);
      tile_gemm<T>(false, false, rows, e, cols, T(1), s, cols, vt, g.vl.ld, T(1), ob, g.ol.ld);
    }
  }
  for (std::int64_t h = h0; h < h1; ++h) {
    const std::int64_t b = kb * g.q_per_kv + h;
    T* ob = o + g.ol.off[b] + i0 * g.ol.ld;
    const T* mh = m + (h - h0) * g.bq;
    const T* lh = l + (h - h0) * g.bq;
    for (std::int64_t r = 0; r < rows; ++r) {
      T* orow = ob + r * g.ol.ld;
      if (lh[r] > T(0)) {
        const T inv = T(1) / lh[r];
        for (std::int64_t c = 0; c < e; ++c) orow[c] *= inv;
        lse[b * g.nq + i0 + r] = mh[r] + std::log(lh[r]);
      } else {
        std::fill(orow, orow + e, T(0));
        lse[b * g.nq + i0 + r] = ninf;
      }
    }
  }
}

/// The forward pass: o and lse from q, k, v. Parallel over (key/value element, query block), each task running
/// all query groups of its element (grouped-query attention); when that gives too few tasks for the pool, the
/// groups are split into chunks of their own tasks. Each task writes only its own rows, and a row's result
/// does not depend on the chunking, so neither does the output. Tasks are handed out last query block first:
/// under a causal mask those see the most keys, so the long tasks start early and the pool finishes evenly.
template <class T>
void forward(const geometry& g, const T* q, const T* k, const T* v, T* o, T* lse, T scale) {
  haliax::detail::profile::region prof([] { return std::string("flash_attention forward"); },
                                       2.0 * double(g.batch) * double(g.nq) * double(g.nk) * double(g.d + g.e));
  single_threaded_blas();
  auto& pool = haliax::detail::thread_pool::instance();
  const std::int64_t base = g.kv_batch * g.nqb;
  const std::int64_t want = std::clamp<std::int64_t>((4 * std::int64_t{pool.size()} + base - 1) / base, 1, g.q_per_kv);
  const std::int64_t per = (g.q_per_kv + want - 1) / want;  // query groups per task
  const std::int64_t chunks = (g.q_per_kv + per - 1) / per;
  pool.run(base * chunks, [&](std::int64_t t) {
    const std::int64_t kb = t % g.kv_batch, rest = t / g.kv_batch, c = rest % chunks;
    forward_block<T>(g, q, k, v, o, lse, scale, kb, g.nqb - 1 - rest / chunks, c * per,
                     std::min(g.q_per_kv, (c + 1) * per));
  });
}

/// Number of key-block groups the backward pass splits each key/value element into (each group accumulates
/// its own partial dq, summed in group order afterwards). A function of the shape only, so that the summation
/// order never depends on the thread count: enough tasks for a many-core host, no more groups than blocks.
inline std::int64_t backward_groups(const geometry& g) {
  constexpr std::int64_t target_tasks = 16;
  const std::int64_t want = (target_tasks + g.kv_batch - 1) / std::max<std::int64_t>(g.kv_batch, 1);
  return std::max<std::int64_t>(1, std::min(want, g.nkb));
}

/// The backward pass (FlashAttention-2): with delta_i = sum(dO_i * O_i), P = exp(S - lse), dP = dO V^T and
/// dS = P * (dP - delta): dV = P^T dO, dK = scale dS^T Q, dQ = scale dS K. Parallel over (key/value element,
/// key block group): a task owns dK and dV of its key blocks and a partial dQ of its group. For each of its
/// key blocks it visits the query blocks in order and, for each, the query groups of its element in order
/// (grouped-query attention), so dK and dV sum over the groups in one fixed order; the partial dQs are added
/// in group order. No sum depends on the thread count. `qcount` is the element count of q (and dq).
template <class T>
void backward(const geometry& g, const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout, T scale,
              T* dq, std::int64_t qcount, T* dk, std::int64_t kcount, T* dv, std::int64_t vcount) {
  // Recomputes S and P, then dP, dV, dK, dQ: about 2.5x the forward's GEMM work.
  haliax::detail::profile::region prof([] { return std::string("flash_attention backward"); },
                                       5.0 * double(g.batch) * double(g.nq) * double(g.nk) * double(g.d + g.e));
  single_threaded_blas();
  [[maybe_unused]] const auto isa = haliax::nn::detail::detect_host_isa();
  const std::int64_t nq = g.nq, nk = g.nk, d = g.d, e = g.e;
  auto& pool = haliax::detail::thread_pool::instance();
  // delta[b, i] = sum_c dO[b, i, c] * O[b, i, c], accumulated in double.
  using buffer = Kokkos::View<T*, Kokkos::HostSpace>;
  buffer delta(Kokkos::view_alloc(Kokkos::WithoutInitializing, "haliax::nn::flash_attention(delta)"), g.batch * nq);
  pool.run(g.batch, [&](std::int64_t b) {
    for (std::int64_t i = 0; i < nq; ++i) {
      const T* dr = dout + g.ol.off[b] + i * g.ol.ld;
      const T* orow = o + g.ol.off[b] + i * g.ol.ld;
      double acc = 0;
      for (std::int64_t c = 0; c < e; ++c) acc += static_cast<double>(dr[c]) * static_cast<double>(orow[c]);
      delta(b * nq + i) = static_cast<T>(acc);
    }
  });
  // Group 0 accumulates into dq itself, groups 1.. into their own partial arrays.
  const std::int64_t groups = backward_groups(g);
  buffer partial("haliax::nn::flash_attention(partial dq)", (groups - 1) * qcount);  // zero-filled
  std::fill(dq, dq + qcount, T(0));
  std::fill(dk, dk + kcount, T(0));
  std::fill(dv, dv + vcount, T(0));
  const T* dl = delta.data();
  pool.run(g.kv_batch * groups, [&](std::int64_t t) {
    const std::int64_t kvb = t / groups, grp = t - kvb * groups;
    T* p = scratch<T>(static_cast<std::size_t>((g.soft_cap > 0 ? 3 : 2) * g.bq * g.bk));
    T* dp = p + g.bq * g.bk;
    T* dcap = g.soft_cap > 0 ? dp + g.bq * g.bk : nullptr;  // 1 - tanh(s / c)^2 of the tile
    T* dq0 = grp == 0 ? dq : partial.data() + (grp - 1) * qcount;
    for (std::int64_t jb = grp; jb < g.nkb; jb += groups) {
      const std::int64_t j0 = jb * g.bk, cols = std::min(nk, j0 + g.bk) - j0;
      const T* kb = k + g.kl.off[kvb] + j0 * g.kl.ld;
      const T* vb = v + g.vl.off[kvb] + j0 * g.vl.ld;
      T* dkb = dk + g.kl.off[kvb] + j0 * g.kl.ld;
      T* dvb = dv + g.vl.off[kvb] + j0 * g.vl.ld;
      for (std::int64_t ib = 0; ib < g.nqb; ++ib) {
        const std::int64_t i0 = ib * g.bq, rows = std::min(nq, i0 + g.bq) - i0;
        for (std::int64_t h = 0; h < g.q_per_kv; ++h) {
          const std::int64_t b = kvb * g.q_per_kv + h;
          const auto kind = g.classify(b, ib, jb);
          if (kind == geometry::empty) continue;
          const T* qb = q + g.ql.off[b] + i0 * g.ql.ld;
          const T* dob = dout + g.ol.off[b] + i0 * g.ol.ld;
          tile_gemm<T>(false, true, rows, cols, d, scale, qb, g.ql.ld, kb, g.kl.ld, T(0), p, cols);
          if (dcap) soft_cap_tile<T>(p, rows * cols, static_cast<T>(g.soft_cap), dcap);
          if (kind == geometry::partial) g.mask_tile<T>(b, i0, j0, rows, cols, p, -std::numeric_limits<T>::infinity());
          HALIAX_ATTN_DISPATCH(probs, p, rows, cols, lse + b * nq + i0);
          tile_gemm<T>(true, false, cols, e, rows, T(1), p, cols, dob, g.ol.ld, T(1), dvb, g.vl.ld);
          tile_gemm<T>(false, true, rows, cols, e, T(1), dob, g.ol.ld, vb, g.vl.ld, T(0), dp, cols);
          HALIAX_ATTN_DISPATCH(dscores, p, dp, rows, cols, dl + b * nq + i0);
          if (dcap)
            for (std::int64_t x = 0; x < rows * cols; ++x) p[x] *= dcap[x];
          tile_gemm<T>(true, false, cols, d, rows, scale, p, cols, qb, g.ql.ld, T(1), dkb, g.kl.ld);
          tile_gemm<T>(false, false, rows, d, cols, scale, p, cols, kb, g.kl.ld, T(1), dq0 + g.ql.off[b] + i0 * g.ql.ld,
                       g.ql.ld);
        }
      }
    }
  });
  if (groups > 1) {
    constexpr std::int64_t chunk = 4096;
    pool.run((qcount + chunk - 1) / chunk, [&](std::int64_t c) {
      const std::int64_t a = c * chunk, z = std::min(qcount, a + chunk);
      for (std::int64_t i = a; i < z; ++i) {
        T acc = dq[i];
        for (std::int64_t grp = 1; grp < groups; ++grp) acc += partial((grp - 1) * qcount + i);
        dq[i] = acc;
      }
    });
  }
}
#undef HALIAX_ATTN_DISPATCH

// ---- portable kernels: Kokkos kernels in the arrays' memory space (what a device build runs) ----------------
//
// The same function as `forward` and `backward`, written as Kokkos kernels that touch only the arrays' memory
// space: one team member per query row (forward, dQ) or key row (dK, dV), walking its visible partners in index
// order, its vector lanes splitting the head dimension (dot products are vector-level reductions over
// `row_lanes` lanes, a constant of the build (haliax/detail/row_team.hpp): lane l sums the columns l,
// l + lanes, ... in order, then the lane sums combine in the backend's fixed pattern). So every output's sums have one fixed order: no atomics,
// nothing depends on the thread count. On host backends (one lane) every sum runs in index order. The tiling of
// the host kernels is not reproduced: results agree with them to rounding, not bitwise. Segment ids are read
// per element inside the kernels (never on the host).

/// A scaled score soft-capped to c * tanh(s / c) when c > 0 (else s unchanged), with the cap's derivative in `dc`.
template <class T>
KOKKOS_INLINE_FUNCTION T soft_capped(T s, T c, T& dc) {
  dc = T(1);
  if (!(c > T(0))) return s;
  const T th = haliax::detail::math::tanh(s / c);
  dc = T(1) - th * th;
  return c * th;
}

/// The per-batch-element offsets of an operand (`operand_layout::off`), copied into the arrays' memory space.
using offset_table = Kokkos::View<std::int64_t*, memory_space>;

/// The offset table of `off` in the arrays' memory, kept by content (detail::content_memo): a training step meets
/// the same few geometries every step, so after the first step no table is allocated, copied or freed.
struct offset_memo_tag;
inline offset_table device_offsets(const std::vector<std::int64_t>& off, const char* label) {
  return haliax::detail::content_memo<offset_memo_tag, std::vector<std::int64_t>, offset_table, 512>::get(off, [&] {
    offset_table d(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), off.size());
    Kokkos::View<const std::int64_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> h(off.data(), off.size());
    Kokkos::deep_copy(d, h);
    return d;
  });
}

/// The positional mask by value, for kernels: query row i sees keys [key_lo(i), key_hi(i)); key j is seen by
/// query rows [row_lo(j), row_hi(j)) (causal: j <= i + offset; window w > 0: j > i + offset - w).
struct portable_mask {
  std::int64_t nq = 0, nk = 0, offset = 0, window = 0;
  bool causal = true;

  KOKKOS_INLINE_FUNCTION static std::int64_t clamp(std::int64_t x, std::int64_t lo, std::int64_t hi) {
    return x < lo ? lo : x > hi ? hi : x;
  }
  KOKKOS_INLINE_FUNCTION std::int64_t key_lo(std::int64_t i) const {
    return window > 0 ? clamp(i + offset - window + 1, 0, nk) : 0;
  }
  KOKKOS_INLINE_FUNCTION std::int64_t key_hi(std::int64_t i) const {
    return causal ? clamp(i + offset + 1, 0, nk) : nk;
  }
  KOKKOS_INLINE_FUNCTION std::int64_t row_lo(std::int64_t j) const { return causal ? clamp(j - offset, 0, nq) : 0; }
  KOKKOS_INLINE_FUNCTION std::int64_t row_hi(std::int64_t j) const {
    return window > 0 ? clamp(j - offset + window, 0, nq) : nq;
  }
};

inline portable_mask mask_of(const geometry& g) {
  portable_mask m;
  m.nq = g.nq;
  m.nk = g.nk;
  m.offset = g.offset;
  m.window = g.window;
  m.causal = g.causal;
  return m;
}

using portable_policy = Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>;
using portable_member = haliax::detail::row_member;
using haliax::detail::row_of;
using haliax::detail::row_policy;

/// sum_c a[c] b[c] over the member's vector lanes (each lane in index order, then the lanes' fixed pattern);
/// every lane gets the sum.
template <class T>
KOKKOS_INLINE_FUNCTION T lane_dot(const portable_member& t, const T* a, const T* b, std::int64_t n) {
  T r = T(0);
  Kokkos::parallel_reduce(
      Kokkos::ThreadVectorRange(t, n), [&](const std::int64_t c, T& acc) { acc += a[c] * b[c]; }, r);
  return r;
}

/// y[c] = alpha y[c] + beta x[c] over the member's vector lanes.
template <class T>
KOKKOS_INLINE_FUNCTION void lane_axpby(const portable_member& t, T* y, T alpha, const T* x, T beta, std::int64_t n) {
  Kokkos::parallel_for(Kokkos::ThreadVectorRange(t, n), [&](const std::int64_t c) { y[c] = alpha * y[c] + beta * x[c]; });
}

/// y[c] += beta x[c] over the member's vector lanes.
template <class T>
KOKKOS_INLINE_FUNCTION void lane_axpy(const portable_member& t, T* y, const T* x, T beta, std::int64_t n) {
  Kokkos::parallel_for(Kokkos::ThreadVectorRange(t, n), [&](const std::int64_t c) { y[c] += beta * x[c]; });
}

/// y[c] = alpha y[c] over the member's vector lanes (alpha 0: y = 0).
template <class T>
KOKKOS_INLINE_FUNCTION void lane_scale(const portable_member& t, T* y, T alpha, std::int64_t n) {
  Kokkos::parallel_for(Kokkos::ThreadVectorRange(t, n),
                       [&](const std::int64_t c) { y[c] = alpha == T(0) ? T(0) : alpha * y[c]; });
}

/// Sets n elements at p (arrays' memory) to zero.
template <class T>
void fill_zero_portable(T* p, std::int64_t n) {
  Kokkos::parallel_for(
      "haliax::nn::flash_attention(zero)", portable_policy(0, n), KOKKOS_LAMBDA(const std::int64_t i) { p[i] = T(0); });
}

/// The forward pass of the portable path: o and lse from q, k, v, as `forward`. One team member per (q element
/// b, query row i): an online softmax over the visible keys in order (running max m and sum l, the output row
/// accumulated in place and rescaled when m grows), then o /= l and lse = m + log(l); a row that sees no key
/// gives o = 0 and lse = -inf.
template <class T>
void forward_rows(const geometry& g, const T* q, const T* k, const T* v, T* o, T* lse, T scale) {
  haliax::detail::profile::region prof([] { return std::string("flash_attention forward"); },
                                       2.0 * double(g.batch) * double(g.nq) * double(g.nk) * double(g.d + g.e));
  const offset_table qt = device_offsets(g.ql.off, "haliax::nn::flash_attention(q offsets)");
  const offset_table kt = device_offsets(g.kl.off, "haliax::nn::flash_attention(k offsets)");
  const offset_table vt = device_offsets(g.vl.off, "haliax::nn::flash_attention(v offsets)");
  const offset_table ot = device_offsets(g.ol.off, "haliax::nn::flash_attention(o offsets)");
  const std::int64_t* qoff = qt.data();
  const std::int64_t* koff = kt.data();
  const std::int64_t* voff = vt.data();
  const std::int64_t* ooff = ot.data();
  const std::int64_t qld = g.ql.ld, kld = g.kl.ld, vld = g.vl.ld, old = g.ol.ld;
  const std::int64_t nq = g.nq, nk = g.nk, d = g.d, e = g.e, q_per_kv = g.q_per_kv, rows = g.batch * g.nq;
  const std::int32_t* qseg = g.qseg;
  const std::int32_t* kseg = g.kseg;
  const portable_mask mask = mask_of(g);
  const T ninf = -std::numeric_limits<T>::infinity();
  const T cap = static_cast<T>(g.soft_cap);
  Kokkos::parallel_for(
      "haliax::nn::flash_attention(forward)", row_policy(rows), KOKKOS_LAMBDA(const portable_member& t) {
        namespace math = haliax::detail::math;
        const std::int64_t idx = row_of(t);
        if (idx >= rows) return;
        const std::int64_t b = idx / nq, i = idx - b * nq, kb = b / q_per_kv;
        const T* qi = q + qoff[b] + i * qld;
        const T* kb0 = k + koff[kb];
        const T* vb0 = v + voff[kb];
        T* oi = o + ooff[b] + i * old;
        lane_scale<T>(t, oi, T(0), e);
        const std::int32_t id = qseg != nullptr ? qseg[idx] : 0;
        T m = ninf, l = T(0);
        const std::int64_t hi = mask.key_hi(i);
        for (std::int64_t j = mask.key_lo(i); j < hi; ++j) {
          if (qseg != nullptr && kseg[b * nk + j] != id) continue;
          const T* vj = vb0 + j * vld;
          T dc;
          const T s = soft_capped(lane_dot<T>(t, qi, kb0 + j * kld, d) * scale, cap, dc);
          if (s > m) {  // new running max: rescale what is there (alpha = 0 for the first visible key)
            const T alpha = math::exp(m - s);
            lane_axpby<T>(t, oi, alpha, vj, T(1), e);
            l = l * alpha + T(1);
            m = s;
          } else {
            const T p = math::exp(s - m);
            lane_axpy<T>(t, oi, vj, p, e);
            l += p;
          }
        }
        if (l > T(0)) {
          lane_scale<T>(t, oi, T(1) / l, e);
          Kokkos::single(Kokkos::PerThread(t), [&] { lse[idx] = m + math::log(l); });
        } else {
          Kokkos::single(Kokkos::PerThread(t), [&] { lse[idx] = ninf; });
        }
      });
}

/// The backward pass of the portable path, as `backward`: delta_i = sum(dO_i * O_i) (in double, in order),
/// then one team member per (q element, query row) for dQ_i = scale sum_j dS_ij K_j and one per (key/value
/// element, key row) for dK_j = scale sum_{h, i} dS_ij Q_i and dV_j = sum_{h, i} P_ij dO_i over the element's
/// query groups h in order and their visible rows i in order, with P = exp(S - lse), dP = dO_i . V_j and
/// dS = P (dP - delta_i). Scores and probabilities are recomputed in both kernels. Writes every element of dq,
/// dk and dv.
template <class T>
void backward_rows(const geometry& g, const T* q, const T* k, const T* v, const T* o, const T* lse,
                   const T* dout, T scale, T* dq, T* dk, T* dv) {
  haliax::detail::profile::region prof([] { return std::string("flash_attention backward"); },
                                       5.0 * double(g.batch) * double(g.nq) * double(g.nk) * double(g.d + g.e));
  const offset_table qt = device_offsets(g.ql.off, "haliax::nn::flash_attention(q offsets)");
  const offset_table kt = device_offsets(g.kl.off, "haliax::nn::flash_attention(k offsets)");
  const offset_table vt = device_offsets(g.vl.off, "haliax::nn::flash_attention(v offsets)");
  const offset_table ot = device_offsets(g.ol.off, "haliax::nn::flash_attention(o offsets)");
  const std::int64_t* qoff = qt.data();
  const std::int64_t* koff = kt.data();
  const std::int64_t* voff = vt.data();
  const std::int64_t* ooff = ot.data();
  const std::int64_t qld = g.ql.ld, kld = g.kl.ld, vld = g.vl.ld, old = g.ol.ld;
  const std::int64_t nq = g.nq, nk = g.nk, d = g.d, e = g.e, q_per_kv = g.q_per_kv;
  const std::int64_t qrows = g.batch * g.nq, krows = g.kv_batch * g.nk;
  const std::int32_t* qseg = g.qseg;
  const std::int32_t* kseg = g.kseg;
  const portable_mask mask = mask_of(g);
  const T ninf = -std::numeric_limits<T>::infinity();
  const T cap = static_cast<T>(g.soft_cap);

  // from the buffer cache, given back on return without a fence (later kernels run after these, in order)
  haliax::detail::buffer_lease<T> delta_lease;
  delta_lease.view = haliax::detail::buffer_cache<T>::take(static_cast<std::size_t>(qrows),
                                                           "haliax::nn::flash_attention(delta)");
  T* delta = delta_lease.view.data();
  Kokkos::parallel_for(
      "haliax::nn::flash_attention(delta)", portable_policy(0, qrows), KOKKOS_LAMBDA(const std::int64_t idx) {
        const std::int64_t b = idx / nq, i = idx - b * nq;
        const T* dr = dout + ooff[b] + i * old;
        const T* orow = o + ooff[b] + i * old;
        double acc = 0;
        for (std::int64_t c = 0; c < e; ++c) acc += static_cast<double>(dr[c]) * static_cast<double>(orow[c]);
        delta[idx] = static_cast<T>(acc);
      });

  Kokkos::parallel_for(
      "haliax::nn::flash_attention(dq)", row_policy(qrows), KOKKOS_LAMBDA(const portable_member& t) {
        namespace math = haliax::detail::math;
        const std::int64_t idx = row_of(t);
        if (idx >= qrows) return;
        const std::int64_t b = idx / nq, i = idx - b * nq, kb = b / q_per_kv;
        T* dqi = dq + qoff[b] + i * qld;
        lane_scale<T>(t, dqi, T(0), d);
        const T li = lse[idx];
        if (li == ninf) return;  // sees no key
        const T* qi = q + qoff[b] + i * qld;
        const T* doi = dout + ooff[b] + i * old;
        const T* kb0 = k + koff[kb];
        const T* vb0 = v + voff[kb];
        const T di = delta[idx];
        const std::int32_t id = qseg != nullptr ? qseg[idx] : 0;
        const std::int64_t hi = mask.key_hi(i);
        for (std::int64_t j = mask.key_lo(i); j < hi; ++j) {
          if (qseg != nullptr && kseg[b * nk + j] != id) continue;
          const T* kj = kb0 + j * kld;
          T dc;
          const T p = math::exp(soft_capped(lane_dot<T>(t, qi, kj, d) * scale, cap, dc) - li);
          const T ds = p * (lane_dot<T>(t, doi, vb0 + j * vld, e) - di) * dc;
          lane_axpy<T>(t, dqi, kj, ds, d);
        }
        lane_scale<T>(t, dqi, scale, d);
      });

  Kokkos::parallel_for(
      "haliax::nn::flash_attention(dk dv)", row_policy(krows), KOKKOS_LAMBDA(const portable_member& t) {
        namespace math = haliax::detail::math;
        const std::int64_t idx = row_of(t);
        if (idx >= krows) return;
        const std::int64_t kb = idx / nk, j = idx - kb * nk;
        T* dkj = dk + koff[kb] + j * kld;
        T* dvj = dv + voff[kb] + j * vld;
        lane_scale<T>(t, dkj, T(0), d);
        lane_scale<T>(t, dvj, T(0), e);
        const T* kj = k + koff[kb] + j * kld;
        const T* vj = v + voff[kb] + j * vld;
        const std::int64_t lo = mask.row_lo(j), hi = mask.row_hi(j);
        for (std::int64_t h = 0; h < q_per_kv; ++h) {
          const std::int64_t b = kb * q_per_kv + h;
          const std::int32_t id = qseg != nullptr ? kseg[b * nk + j] : 0;
          for (std::int64_t i = lo; i < hi; ++i) {
            if (qseg != nullptr && qseg[b * nq + i] != id) continue;
            const T li = lse[b * nq + i];
            if (li == ninf) continue;
            const T* qi = q + qoff[b] + i * qld;
            const T* doi = dout + ooff[b] + i * old;
            T dc;
            const T p = math::exp(soft_capped(lane_dot<T>(t, qi, kj, d) * scale, cap, dc) - li);
            const T ds = p * (lane_dot<T>(t, doi, vj, e) - delta[b * nq + i]) * dc;
            lane_axpy<T>(t, dvj, doi, p, e);
            lane_axpy<T>(t, dkj, qi, ds, d);
          }
        }
        lane_scale<T>(t, dkj, scale, d);
      });
}

// ---- tiled portable kernels: a team per tile of rows, the other operand's tiles staged in team scratch ------
//
// What a device build runs for flash attention when the tiles fit (`plan_tiles`). A team takes a tile of query
// rows (forward, dQ) or key rows (dK, dV) of one batch element, copies it into team scratch (level 0: shared
// memory on a GPU), and walks the partner tiles in index order, staging each in scratch too, so that every K/V
// (or Q/dO) row read from memory serves a whole tile instead of one row. Within a tile every score, every
// probability and every output element is computed by one thread as a sequential loop (products in index order,
// a row's maximum and sum over its columns in order), so no sum depends on which thread runs it, on the team size
// or on the thread count: the tile sizes come from the head sizes alone. Rows are padded by one element in
// scratch so that a warp reading one column of 32 rows touches 32 different banks. Scores, probabilities and
// sums are kept in the accumulation type (double for double, float for float and bfloat16).

template <class T>
using tile_acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;
using tile_policy = Kokkos::TeamPolicy<execution_space, Kokkos::IndexType<std::int64_t>>;
using tile_member = tile_policy::member_type;
/// Threads per team: one on host backends (the whole tile in order), 128 on a device.
inline constexpr int tile_threads = haliax::detail::host_memory ? 1 : 128;
/// The team scratch a plan may use: under the 48 KiB of shared memory a GPU block gets without opting in, with
/// room for Kokkos's own team buffers (about 1 KiB for 128 threads). 40 KiB is what ran on the H200 (2026-11-29);
/// 46 KiB would give dQ 32 x 32 and dK/dV 16 x 32 tiles at head size 64 (CPU-checked, not yet timed on a GPU).
inline constexpr std::size_t tile_scratch_limit = 40 * 1024;

enum class tile_kernel { forward, dq, dkdv };

/// A tile plan: query rows and key rows per tile, and the team scratch in bytes (0: no plan fits).
struct tile_plan {
  std::int64_t bq = 0, bk = 0;
  std::size_t bytes = 0;
};

/// Scratch elements of one team of `kind` with bq query rows and bk key rows per tile.
inline std::int64_t tile_elements(tile_kernel kind, std::int64_t bq, std::int64_t bk, std::int64_t d,
                                  std::int64_t e) {
  switch (kind) {
    case tile_kernel::forward:  // Q, K, V, scores, O, running max / sum / rescale
      return bq * (d + 1) + bk * (d + 1) + bk * e + bq * (bk + 1) + bq * e + 3 * bq;
    case tile_kernel::dq:  // Q, dO, K, V, dS, dQ, lse, delta
      return bq * (d + 1) + bq * (e + 1) + bk * (d + 1) + bk * (e + 1) + bq * (bk + 1) + bq * d + 2 * bq;
    case tile_kernel::dkdv:  // K, V, Q, dO, P, dS, dK, dV, lse, delta
      return bk * (d + 1) + bk * (e + 1) + bq * (d + 1) + bq * (e + 1) + 2 * bq * (bk + 1) + bk * d + bk * e +
             2 * bq;
  }
  return 0;
}

/// The first of the kernel's preferred tile shapes whose scratch fits `tile_scratch_limit`, for head sizes d
/// (query/key) and e (value) and accumulation type A. Depends on the shape only, never on the device.
template <class A>
tile_plan plan_tiles(tile_kernel kind, std::int64_t d, std::int64_t e) {
  // (bq, bk): the forward and dQ reuse key tiles across query rows, dK/dV query tiles across key rows.
  static constexpr std::int64_t rows_first[][2] = {{32, 32}, {32, 16}, {16, 16}, {16, 8}, {8, 8}};
  static constexpr std::int64_t keys_first[][2] = {{16, 32}, {8, 32}, {8, 16}, {16, 16}, {8, 8}};
  const auto try_list = [&](const auto& list) {
    for (const auto& c : list) {
      const std::size_t bytes = static_cast<std::size_t>(tile_elements(kind, c[0], c[1], d, e)) * sizeof(A);
      if (bytes <= tile_scratch_limit) return tile_plan{c[0], c[1], bytes};
    }
    return tile_plan{};
  };
  return kind == tile_kernel::dkdv ? try_list(keys_first) : try_list(rows_first);
}

inline tile_policy tile_teams(std::int64_t league, std::size_t bytes) {
  return tile_policy(league, tile_threads).set_scratch_size(0, Kokkos::PerTeam(bytes));
}

/// Whether query row i (of batch element b) sees key j: inside the positional mask and, with segment ids, in the
/// same segment.
KOKKOS_INLINE_FUNCTION bool tile_visible(const portable_mask& mask, const std::int32_t* qseg,
                                         const std::int32_t* kseg, std::int64_t b, std::int64_t i, std::int64_t j) {
  if (j < mask.key_lo(i) || j >= mask.key_hi(i)) return false;
  return qseg == nullptr || kseg[b * mask.nk + j] == qseg[b * mask.nq + i];
}

/// The forward pass on tiles: per query tile an online softmax over the key tiles in order (the tile's maximum
/// joins the running maximum, earlier sums and outputs are rescaled), then o = acc / l and lse = m + log(l); a
/// row that sees no key gives o = 0 and lse = -inf.
template <class T>
void forward_tiled(const geometry& g, const T* q, const T* k, const T* v, T* o, T* lse, T scale,
                   const tile_plan& plan) {
  using A = tile_acc_t<T>;
  haliax::detail::profile::region prof([] { return std::string("flash_attention forward"); },
                                       2.0 * double(g.batch) * double(g.nq) * double(g.nk) * double(g.d + g.e));
  const offset_table qt = device_offsets(g.ql.off, "haliax::nn::flash_attention(q offsets)");
  const offset_table kt = device_offsets(g.kl.off, "haliax::nn::flash_attention(k offsets)");
  const offset_table vt = device_offsets(g.vl.off, "haliax::nn::flash_attention(v offsets)");
  const offset_table ot = device_offsets(g.ol.off, "haliax::nn::flash_attention(o offsets)");
  const std::int64_t* qoff = qt.data();
  const std::int64_t* koff = kt.data();
  const std::int64_t* voff = vt.data();
  const std::int64_t* ooff = ot.data();
  const std::int64_t qld = g.ql.ld, kld = g.kl.ld, vld = g.vl.ld, old = g.ol.ld;
  const std::int64_t nq = g.nq, d = g.d, e = g.e, q_per_kv = g.q_per_kv;
  const std::int64_t bq = plan.bq, bk = plan.bk, dp = d + 1, sp = bk + 1, tiles = (nq + bq - 1) / bq;
  const std::size_t bytes = plan.bytes;
  const std::int32_t* qseg = g.qseg;
  const std::int32_t* kseg = g.kseg;
  const portable_mask mask = mask_of(g);
  const A ninf = -std::numeric_limits<A>::infinity();
  const A cap = static_cast<A>(g.soft_cap), sc = static_cast<A>(scale);
  Kokkos::parallel_for(
      "haliax::nn::flash_attention(forward tiles)", tile_teams(g.batch * tiles, bytes),
      KOKKOS_LAMBDA(const tile_member& t) {
        namespace math = haliax::detail::math;
        const std::int64_t b = t.league_rank() / tiles, i0 = (t.league_rank() - b * tiles) * bq;
        const std::int64_t rows = nq - i0 < bq ? nq - i0 : bq, kb = b / q_per_kv;
        A* qs = static_cast<A*>(t.team_scratch(0).get_shmem(bytes));
        A* ks = qs + bq * dp;
        A* vs = ks + bk * dp;
        A* ss = vs + bk * e;
        A* os = ss + bq * sp;
        A* ms = os + bq * e;
        A* ls = ms + bq;
        A* as = ls + bq;
        const T* qb = q + qoff[b] + i0 * qld;
        const T* kb0 = k + koff[kb];
        const T* vb0 = v + voff[kb];
        Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * d), [&](const std::int64_t x) {
          const std::int64_t r = x / d, c = x - r * d;
          qs[r * dp + c] = static_cast<A>(qb[r * qld + c]);
        });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * e), [&](const std::int64_t x) { os[x] = A(0); });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows), [&](const std::int64_t r) {
          ms[r] = ninf;
          ls[r] = A(0);
        });
        const std::int64_t jlo = mask.key_lo(i0), jhi = mask.key_hi(i0 + rows - 1);
        for (std::int64_t j0 = jlo; j0 < jhi; j0 += bk) {
          const std::int64_t cols = jhi - j0 < bk ? jhi - j0 : bk;
          t.team_barrier();  // the previous tile's readers are done
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, cols * d), [&](const std::int64_t x) {
            const std::int64_t c = x / d, y = x - c * d;
            ks[c * dp + y] = static_cast<A>(kb0[(j0 + c) * kld + y]);
          });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, cols * e), [&](const std::int64_t x) {
            const std::int64_t c = x / e, y = x - c * e;
            vs[x] = static_cast<A>(vb0[(j0 + c) * vld + y]);
          });
          t.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * bk), [&](const std::int64_t x) {
            const std::int64_t r = x / bk, c = x - r * bk;
            A s = ninf;
            if (c < cols && tile_visible(mask, qseg, kseg, b, i0 + r, j0 + c)) {
              A acc = A(0);
              for (std::int64_t y = 0; y < d; ++y) acc += qs[r * dp + y] * ks[c * dp + y];
              A dc;
              s = soft_capped(acc * sc, cap, dc);
            }
            ss[r * sp + c] = s;
          });
          t.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows), [&](const std::int64_t r) {
            A* sr = ss + r * sp;
            A mt = ms[r];
            for (std::int64_t c = 0; c < cols; ++c) mt = sr[c] > mt ? sr[c] : mt;
            if (mt == ninf) {  // nothing visible yet
              as[r] = A(1);
              for (std::int64_t c = 0; c < cols; ++c) sr[c] = A(0);
              return;
            }
            const A alpha = ms[r] == ninf ? A(0) : math::exp(ms[r] - mt);
            A sum = A(0);
            for (std::int64_t c = 0; c < cols; ++c) {
              const A p = sr[c] == ninf ? A(0) : math::exp(sr[c] - mt);
              sr[c] = p;
              sum += p;
            }
            ls[r] = ls[r] * alpha + sum;
            ms[r] = mt;
            as[r] = alpha;
          });
          t.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * e), [&](const std::int64_t x) {
            const std::int64_t r = x / e, y = x - r * e;
            const A* pr = ss + r * sp;
            A acc = os[x] * as[r];
            for (std::int64_t c = 0; c < cols; ++c) acc += pr[c] * vs[c * e + y];
            os[x] = acc;
          });
        }
        t.team_barrier();
        T* ob = o + ooff[b] + i0 * old;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * e), [&](const std::int64_t x) {
          const std::int64_t r = x / e, y = x - r * e;
          ob[r * old + y] = static_cast<T>(ls[r] > A(0) ? os[x] / ls[r] : A(0));
        });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows), [&](const std::int64_t r) {
          lse[b * nq + i0 + r] = static_cast<T>(ls[r] > A(0) ? ms[r] + math::log(ls[r]) : ninf);
        });
      });
}

/// The backward pass on tiles, as `backward_portable`: delta as there, then a team per query tile for dQ (the
/// key tiles in order) and a team per key tile for dK and dV (its element's query groups in order, each one's
/// query tiles in order), scores and probabilities recomputed in both. Writes every element of dq, dk and dv.
template <class T>
void backward_tiled(const geometry& g, const T* q, const T* k, const T* v, const T* o, const T* lse,
                    const T* dout, T scale, T* dq, T* dk, T* dv, const tile_plan& pq, const tile_plan& pk) {
  using A = tile_acc_t<T>;
  haliax::detail::profile::region prof([] { return std::string("flash_attention backward"); },
                                       5.0 * double(g.batch) * double(g.nq) * double(g.nk) * double(g.d + g.e));
  const offset_table qt = device_offsets(g.ql.off, "haliax::nn::flash_attention(q offsets)");
  const offset_table kt = device_offsets(g.kl.off, "haliax::nn::flash_attention(k offsets)");
  const offset_table vt = device_offsets(g.vl.off, "haliax::nn::flash_attention(v offsets)");
  const offset_table ot = device_offsets(g.ol.off, "haliax::nn::flash_attention(o offsets)");
  const std::int64_t* qoff = qt.data();
  const std::int64_t* koff = kt.data();
  const std::int64_t* voff = vt.data();
  const std::int64_t* ooff = ot.data();
  const std::int64_t qld = g.ql.ld, kld = g.kl.ld, vld = g.vl.ld, old = g.ol.ld;
  const std::int64_t nq = g.nq, nk = g.nk, d = g.d, e = g.e, q_per_kv = g.q_per_kv;
  const std::int64_t qrows = g.batch * g.nq, dp = d + 1, ep = e + 1;
  const std::int32_t* qseg = g.qseg;
  const std::int32_t* kseg = g.kseg;
  const portable_mask mask = mask_of(g);
  const A ninf = -std::numeric_limits<A>::infinity();
  const A cap = static_cast<A>(g.soft_cap), sc = static_cast<A>(scale);
  const T tninf = -std::numeric_limits<T>::infinity();

  haliax::detail::buffer_lease<T> delta_lease;
  delta_lease.view = haliax::detail::buffer_cache<T>::take(static_cast<std::size_t>(qrows),
                                                           "haliax::nn::flash_attention(delta)");
  T* delta = delta_lease.view.data();
  Kokkos::parallel_for(
      "haliax::nn::flash_attention(delta)", portable_policy(0, qrows), KOKKOS_LAMBDA(const std::int64_t idx) {
        const std::int64_t b = idx / nq, i = idx - b * nq;
        const T* dr = dout + ooff[b] + i * old;
        const T* orow = o + ooff[b] + i * old;
        double acc = 0;
        for (std::int64_t c = 0; c < e; ++c) acc += static_cast<double>(dr[c]) * static_cast<double>(orow[c]);
        delta[idx] = static_cast<T>(acc);
      });

  // dQ: a team per query tile.
  {
    const std::int64_t bq = pq.bq, bk = pq.bk, sp = bk + 1, tiles = (nq + bq - 1) / bq;
    const std::size_t bytes = pq.bytes;
    Kokkos::parallel_for(
        "haliax::nn::flash_attention(dq tiles)", tile_teams(g.batch * tiles, bytes),
        KOKKOS_LAMBDA(const tile_member& t) {
          namespace math = haliax::detail::math;
          const std::int64_t b = t.league_rank() / tiles, i0 = (t.league_rank() - b * tiles) * bq;
          const std::int64_t rows = nq - i0 < bq ? nq - i0 : bq, kb = b / q_per_kv;
          A* qs = static_cast<A*>(t.team_scratch(0).get_shmem(bytes));
          A* dos = qs + bq * dp;
          A* ks = dos + bq * ep;
          A* vs = ks + bk * dp;
          A* ss = vs + bk * ep;
          A* dqs = ss + bq * sp;
          A* lses = dqs + bq * d;
          A* dels = lses + bq;
          const T* qb = q + qoff[b] + i0 * qld;
          const T* db = dout + ooff[b] + i0 * old;
          const T* kb0 = k + koff[kb];
          const T* vb0 = v + voff[kb];
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * d), [&](const std::int64_t x) {
            const std::int64_t r = x / d, c = x - r * d;
            qs[r * dp + c] = static_cast<A>(qb[r * qld + c]);
            dqs[x] = A(0);
          });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * e), [&](const std::int64_t x) {
            const std::int64_t r = x / e, c = x - r * e;
            dos[r * ep + c] = static_cast<A>(db[r * old + c]);
          });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows), [&](const std::int64_t r) {
            const T l = lse[b * nq + i0 + r];
            lses[r] = l == tninf ? ninf : static_cast<A>(l);
            dels[r] = static_cast<A>(delta[b * nq + i0 + r]);
          });
          const std::int64_t jlo = mask.key_lo(i0), jhi = mask.key_hi(i0 + rows - 1);
          for (std::int64_t j0 = jlo; j0 < jhi; j0 += bk) {
            const std::int64_t cols = jhi - j0 < bk ? jhi - j0 : bk;
            t.team_barrier();
            Kokkos::parallel_for(Kokkos::TeamThreadRange(t, cols * d), [&](const std::int64_t x) {
              const std::int64_t c = x / d, y = x - c * d;
              ks[c * dp + y] = static_cast<A>(kb0[(j0 + c) * kld + y]);
            });
            Kokkos::parallel_for(Kokkos::TeamThreadRange(t, cols * e), [&](const std::int64_t x) {
              const std::int64_t c = x / e, y = x - c * e;
              vs[c * ep + y] = static_cast<A>(vb0[(j0 + c) * vld + y]);
            });
            t.team_barrier();
            Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * bk), [&](const std::int64_t x) {
              const std::int64_t r = x / bk, c = x - r * bk;
              A ds = A(0);
              if (c < cols && lses[r] != ninf && tile_visible(mask, qseg, kseg, b, i0 + r, j0 + c)) {
                A s = A(0), dpv = A(0);
                for (std::int64_t y = 0; y < d; ++y) s += qs[r * dp + y] * ks[c * dp + y];
                for (std::int64_t y = 0; y < e; ++y) dpv += dos[r * ep + y] * vs[c * ep + y];
                A dc;
                const A p = math::exp(soft_capped(s * sc, cap, dc) - lses[r]);
                ds = p * (dpv - dels[r]) * dc;
              }
              ss[r * sp + c] = ds;
            });
            t.team_barrier();
            Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * d), [&](const std::int64_t x) {
              const std::int64_t r = x / d, y = x - r * d;
              const A* sr = ss + r * sp;
              A acc = dqs[x];
              for (std::int64_t c = 0; c < cols; ++c) acc += sr[c] * ks[c * dp + y];
              dqs[x] = acc;
            });
          }
          t.team_barrier();
          T* dqb = dq + qoff[b] + i0 * qld;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * d), [&](const std::int64_t x) {
            const std::int64_t r = x / d, y = x - r * d;
            dqb[r * qld + y] = static_cast<T>(dqs[x] * sc);
          });
        });
  }

  // dK and dV: a team per key tile of a key/value element.
  {
    const std::int64_t bq = pk.bq, bk = pk.bk, sp = bk + 1, tiles = (nk + bk - 1) / bk;
    const std::size_t bytes = pk.bytes;
    Kokkos::parallel_for(
        "haliax::nn::flash_attention(dk dv tiles)", tile_teams(g.kv_batch * tiles, bytes),
        KOKKOS_LAMBDA(const tile_member& t) {
          namespace math = haliax::detail::math;
          const std::int64_t kb = t.league_rank() / tiles, j0 = (t.league_rank() - kb * tiles) * bk;
          const std::int64_t cols = nk - j0 < bk ? nk - j0 : bk;
          A* ks = static_cast<A*>(t.team_scratch(0).get_shmem(bytes));
          A* vs = ks + bk * dp;
          A* qs = vs + bk * ep;
          A* dos = qs + bq * dp;
          A* ps = dos + bq * ep;
          A* dss = ps + bq * sp;
          A* dks = dss + bq * sp;
          A* dvs = dks + bk * d;
          A* lses = dvs + bk * e;
          A* dels = lses + bq;
          const T* kb0 = k + koff[kb] + j0 * kld;
          const T* vb0 = v + voff[kb] + j0 * vld;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, cols * d), [&](const std::int64_t x) {
            const std::int64_t c = x / d, y = x - c * d;
            ks[c * dp + y] = static_cast<A>(kb0[c * kld + y]);
            dks[x] = A(0);
          });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, cols * e), [&](const std::int64_t x) {
            const std::int64_t c = x / e, y = x - c * e;
            vs[c * ep + y] = static_cast<A>(vb0[c * vld + y]);
            dvs[x] = A(0);
          });
          const std::int64_t ilo = mask.row_lo(j0), ihi = mask.row_hi(j0 + cols - 1);
          for (std::int64_t h = 0; h < q_per_kv; ++h) {
            const std::int64_t b = kb * q_per_kv + h;
            const T* qb0 = q + qoff[b];
            const T* db0 = dout + ooff[b];
            for (std::int64_t i0 = ilo; i0 < ihi; i0 += bq) {
              const std::int64_t rows = ihi - i0 < bq ? ihi - i0 : bq;
              t.team_barrier();
              Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * d), [&](const std::int64_t x) {
                const std::int64_t r = x / d, y = x - r * d;
                qs[r * dp + y] = static_cast<A>(qb0[(i0 + r) * qld + y]);
              });
              Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * e), [&](const std::int64_t x) {
                const std::int64_t r = x / e, y = x - r * e;
                dos[r * ep + y] = static_cast<A>(db0[(i0 + r) * old + y]);
              });
              Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows), [&](const std::int64_t r) {
                const T l = lse[b * nq + i0 + r];
                lses[r] = l == tninf ? ninf : static_cast<A>(l);
                dels[r] = static_cast<A>(delta[b * nq + i0 + r]);
              });
              t.team_barrier();
              Kokkos::parallel_for(Kokkos::TeamThreadRange(t, rows * bk), [&](const std::int64_t x) {
                const std::int64_t r = x / bk, c = x - r * bk;
                A p = A(0), ds = A(0);
                if (c < cols && lses[r] != ninf && tile_visible(mask, qseg, kseg, b, i0 + r, j0 + c)) {
                  A s = A(0), dpv = A(0);
                  for (std::int64_t y = 0; y < d; ++y) s += qs[r * dp + y] * ks[c * dp + y];
                  for (std::int64_t y = 0; y < e; ++y) dpv += dos[r * ep + y] * vs[c * ep + y];
                  A dc;
                  p = math::exp(soft_capped(s * sc, cap, dc) - lses[r]);
                  ds = p * (dpv - dels[r]) * dc;
                }
                ps[r * sp + c] = p;
                dss[r * sp + c] = ds;
              });
              t.team_barrier();
              Kokkos::parallel_for(Kokkos::TeamThreadRange(t, cols * e), [&](const std::int64_t x) {
                const std::int64_t c = x / e, y = x - c * e;
                A acc = dvs[x];
                for (std::int64_t r = 0; r < rows; ++r) acc += ps[r * sp + c] * dos[r * ep + y];
                dvs[x] = acc;
              });
              Kokkos::parallel_for(Kokkos::TeamThreadRange(t, cols * d), [&](const std::int64_t x) {
                const std::int64_t c = x / d, y = x - c * d;
                A acc = dks[x];
                for (std::int64_t r = 0; r < rows; ++r) acc += dss[r * sp + c] * qs[r * dp + y];
                dks[x] = acc;
              });
            }
          }
          t.team_barrier();
          T* dkb = dk + koff[kb] + j0 * kld;
          T* dvb = dv + voff[kb] + j0 * vld;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, cols * d), [&](const std::int64_t x) {
            const std::int64_t c = x / d, y = x - c * d;
            dkb[c * kld + y] = static_cast<T>(dks[x] * sc);
          });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, cols * e), [&](const std::int64_t x) {
            const std::int64_t c = x / e, y = x - c * e;
            dvb[c * vld + y] = static_cast<T>(dvs[x]);
          });
        });
  }
}

/// Whether the portable path runs the tiled kernels (the default) or the row kernels (`HALIAX_ATTENTION_TILES=0`,
/// or `tiles_scope`), for A/B checks; a shape whose tiles do not fit in team scratch runs the row kernels anyway.
inline std::atomic<int>& tiles_override() {
  static std::atomic<int> v{-1};
  return v;
}
inline bool tiles_enabled() {
  const int o = tiles_override().load();
  if (o >= 0) return o != 0;
  static const bool env = [] {
    const char* e = std::getenv("HALIAX_ATTENTION_TILES");
    return e == nullptr || std::string_view(e) != "0";
  }();
  return env;
}

/// Runs the portable path's tiled kernels (on) or its row kernels (off) until the scope ends.
struct tiles_scope {
  explicit tiles_scope(bool on) : saved_(tiles_override().exchange(on ? 1 : 0)) {}
  ~tiles_scope() { tiles_override().store(saved_); }
  tiles_scope(const tiles_scope&) = delete;
  tiles_scope& operator=(const tiles_scope&) = delete;

 private:
  int saved_;
};

/// The forward pass of the portable path: the tiled kernels where a plan fits, else the row kernels.
template <class T>
void forward_portable(const geometry& g, const T* q, const T* k, const T* v, T* o, T* lse, T scale) {
  const tile_plan plan = plan_tiles<tile_acc_t<T>>(tile_kernel::forward, g.d, g.e);
  if (tiles_enabled() && plan.bytes > 0) {
    forward_tiled<T>(g, q, k, v, o, lse, scale, plan);
  } else {
    forward_rows<T>(g, q, k, v, o, lse, scale);
  }
}

/// The backward pass of the portable path: the tiled kernels where both plans fit, else the row kernels.
template <class T>
void backward_portable(const geometry& g, const T* q, const T* k, const T* v, const T* o, const T* lse,
                       const T* dout, T scale, T* dq, T* dk, T* dv) {
  const tile_plan pq = plan_tiles<tile_acc_t<T>>(tile_kernel::dq, g.d, g.e);
  const tile_plan pk = plan_tiles<tile_acc_t<T>>(tile_kernel::dkdv, g.d, g.e);
  if (tiles_enabled() && pq.bytes > 0 && pk.bytes > 0) {
    backward_tiled<T>(g, q, k, v, o, lse, dout, scale, dq, dk, dv, pq, pk);
  } else {
    backward_rows<T>(g, q, k, v, o, lse, dout, scale, dq, dk, dv);
  }
}

/// Segment ids (axes a subset of batch + position, with the position) packed into [batch..., pos].
template <class Packed, class Ax>
named_array<std::int32_t, axes_of<Packed>> pack_ids(const char* label, const named_array<std::int32_t, Ax>& ids,
                                                    const std::array<std::int64_t, mp::mp_size<Packed>::value>& sizes) {
  haliax::detail::check_shared_sizes_raw<Ax, axes_of<Packed>>(label, ids.sizes(), sizes);
  return haliax::detail::broadcast_copy<axes_of<Packed>>(label, ids, sizes);
}

/// Flash attention on typed arrays: lays operands out for the kernels, runs the forward, records the backward.
/// `q_ids`/`k_ids` are null or the segment ids.
template <class T, class AxQ, class AxK, class AxV, class P, class KP, class K, class AxQS, class AxKS>
auto flash(const named_array<T, AxQ>& q, const named_array<T, AxK>& k, const named_array<T, AxV>& v,
           const flash_attention_options& opts, const named_array<std::int32_t, AxQS>* q_ids,
           const named_array<std::int32_t, AxKS>* k_ids) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "haliax::nn::flash_attention: float or double arrays only (convert bf16 with astype)");
  using A = flash_axes<AxQ, AxK, AxV, P, KP, K>;
  static_assert(A::valid,
                "haliax::nn::flash_attention: q needs Pos and Key, k KPos and Key, v KPos and a head axis of its own; "
                "k's and v's other axes (their batch axes) must be the same, and a subset of q's batch axes (q's "
                "axes other than Pos and Key): q's extra batch axes are query groups sharing one k/v head (GQA)");
  using LY = flash_layouts<A>;
  using batch = typename A::canonical;  // q's batch axes, shared (k and v's) first, then the query groups
  using shared = typename A::shared;
  using Out = axes_of<typename A::out>;
  constexpr const char* label = "haliax::nn::flash_attention";
  haliax::detail::check_shared_sizes(label, q, k);
  haliax::detail::check_shared_sizes(label, k, v);
  haliax::detail::check_shared_sizes(label, q, v);
  if (opts.block_q < 1 || opts.block_k < 1)
    throw std::invalid_argument(std::string(label) + ": block sizes must be positive, got " +
                                std::to_string(opts.block_q) + " x " + std::to_string(opts.block_k));
  if (opts.sliding_window < 0)
    throw std::invalid_argument(std::string(label) + ": sliding_window must be >= 0 (0: none), got " +
                                std::to_string(opts.sliding_window));

  auto qk = haliax::detail::as_layout<typename LY::q>(q);
  auto kk = haliax::detail::as_layout<typename LY::k>(k);
  auto vk = haliax::detail::as_layout<typename LY::v>(v);
  auto out = named_array<T, Out>::allocate(
      [&] {
        typename named_array<T, Out>::shape_type s{};
        std::size_t i = 0;
        mp::mp_for_each<typename A::out>([&]<class Tag>(Tag) {
          if constexpr (has_v<typename A::lq, Tag>) {
            s[i++] = q.sizes()[haliax::detail::index_of_v<typename A::lq, Tag>];
          } else {
            s[i++] = v.sizes()[haliax::detail::index_of_v<typename A::lv, Tag>];
          }
        });
        return s;
      }(),
      "haliax::nn::flash_attention");

  constexpr std::size_t nb = mp::mp_size<batch>::value;
  geometry g;
  g.ql = describe<batch, P, typename LY::q>(qk.sizes());
  g.kl = describe<shared, KP, typename LY::k>(kk.sizes());
  g.vl = describe<shared, KP, typename LY::v>(vk.sizes());
  g.ol = describe<batch, P, typename A::out>(out.sizes());
  g.batch = static_cast<std::int64_t>(g.ql.off.size());
  g.kv_batch = static_cast<std::int64_t>(g.kl.off.size());
  mp::mp_for_each<typename A::group>(
      [&]<class Tag>(Tag) { g.q_per_kv *= q.sizes()[haliax::detail::index_of_v<typename A::lq, Tag>]; });
  g.nq = q.size(P{});
  g.nk = k.size(KP{});
  g.d = q.size(K{});
  g.e = 1;
  mp::mp_for_each<typename A::value>(
      [&]<class Tag>(Tag) { g.e *= v.sizes()[haliax::detail::index_of_v<typename A::lv, Tag>]; });
  g.bq = opts.block_q;
  g.bk = opts.block_k;
  g.nqb = (g.nq + g.bq - 1) / g.bq;
  g.nkb = (g.nk + g.bk - 1) / g.bk;
  g.causal = opts.causal;
  g.window = opts.sliding_window;
  g.offset = opts.q_start - opts.k_start;
  if (opts.logits_soft_cap) {
    if (!(*opts.logits_soft_cap > 0))
      throw std::invalid_argument(std::string(label) + ": logits_soft_cap must be positive, got " +
                                  std::to_string(*opts.logits_soft_cap));
    g.soft_cap = *opts.logits_soft_cap;
  }

  // Segment ids, packed to [batch..., Pos] and [batch..., KPos] with q's batch axes in the kernels' order
  // (missing batch axes broadcast: the key ids too are per q element); the log-sum-exp is kept in the first
  // of these layouts.
  using QSP = mp::mp_push_back<batch, P>;
  using KSP = mp::mp_push_back<batch, KP>;
  std::array<std::int64_t, nb + 1> qs{}, ks{};
  std::size_t bi = 0;
  mp::mp_for_each<batch>([&]<class Tag>(Tag) {
    qs[bi] = ks[bi] = q.sizes()[haliax::detail::index_of_v<typename A::lq, Tag>];
    ++bi;
  });
  qs[nb] = g.nq;
  ks[nb] = g.nk;
  named_array<std::int32_t, axes_of<QSP>> qsp;
  named_array<std::int32_t, axes_of<KSP>> ksp;
  // The attention family's dispatch (haliax/kernels.hpp) for the forward; the gradient dispatches again.
  const bool host_path = haliax::detail::use_host_kernels(haliax::kernels::family::attention);
  if (q_ids != nullptr) {
    qsp = pack_ids<QSP>(label, *q_ids, qs);
    ksp = pack_ids<KSP>(label, *k_ids, ks);
    g.qseg = qsp.data();
    g.kseg = ksp.data();
    // The host kernels skip tiles by per-block id ranges, read on the host; the portable ones test ids per
    // element on the device.
    if (host_path) g.summarise_segments();
  }
  auto lse = named_array<T, axes_of<QSP>>::allocate(qs, "haliax::nn::flash_attention(lse)");
  const T scale = static_cast<T>(opts.scale ? *opts.scale : 1.0 / std::sqrt(static_cast<double>(g.d)));
  if (out.element_count() > 0) {
    if (host_path) {
      if constexpr (haliax::detail::host_memory)
        forward<T>(g, qk.data(), kk.data(), vk.data(), out.data(), lse.data(), scale);
    } else {
      forward_portable<T>(g, qk.data(), kk.data(), vk.data(), out.data(), lse.data(), scale);
    }
  }

  if (haliax::detail::ad::any_tracked(q, k, v)) {
    haliax::detail::ad::record(
        out,
        [g = std::move(g), qk, kk, vk, o = out, lse, qsp, ksp, scale](const named_array<T, Out>& grad, auto) {
          using QL = axes_of<typename LY::q>;
          using KL = axes_of<typename LY::k>;
          using VL = axes_of<typename LY::v>;
          auto dqk = named_array<T, QL>::allocate(qk.sizes(), "haliax::nn::flash_attention(dq)");
          auto dkk = named_array<T, KL>::allocate(kk.sizes(), "haliax::nn::flash_attention(dk)");
          auto dvk = named_array<T, VL>::allocate(vk.sizes(), "haliax::nn::flash_attention(dv)");
          if (!haliax::detail::use_host_kernels(haliax::kernels::family::attention)) {
            if (o.element_count() > 0) {
              backward_portable<T>(g, qk.data(), kk.data(), vk.data(), o.data(), lse.data(), grad.data(), scale,
                                   dqk.data(), dkk.data(), dvk.data());
            } else {
              fill_zero_portable<T>(dqk.data(), dqk.element_count());
              fill_zero_portable<T>(dkk.data(), dkk.element_count());
              fill_zero_portable<T>(dvk.data(), dvk.element_count());
            }
          } else if constexpr (haliax::detail::host_memory) {
            if (o.element_count() > 0) {
              // If the forward ran the portable kernels (a scope changed in between), it skipped the segment
              // summaries that the host kernels need.
              std::optional<geometry> summarised;
              if (g.qseg != nullptr && g.qseg_lo.empty()) {
                summarised.emplace(g);
                summarised->summarise_segments();
              }
              backward<T>(summarised ? *summarised : g, qk.data(), kk.data(), vk.data(), o.data(), lse.data(),
                          grad.data(), scale, dqk.data(), dqk.element_count(), dkk.data(), dkk.element_count(),
                          dvk.data(), dvk.element_count());
            } else {
              std::fill(dqk.data(), dqk.data() + dqk.element_count(), T(0));
              std::fill(dkk.data(), dkk.data() + dkk.element_count(), T(0));
              std::fill(dvk.data(), dvk.data() + dvk.element_count(), T(0));
            }
          }
          return std::tuple{haliax::detail::as_layout<list_of<AxQ>>(dqk), haliax::detail::as_layout<list_of<AxK>>(dkk),
                            haliax::detail::as_layout<list_of<AxV>>(dvk)};
        },
        q, k, v);
  }
  return out;
}

/// `flash_axes` of the entry points' deduced axis types.
template <class AxQ, class AxK, class AxV, class P, class KP, class K>
using flash_axes_of =
    flash_axes<AxQ, AxK, AxV, std::remove_cvref_t<P>, std::remove_cvref_t<KP>, std::remove_cvref_t<K>>;

}  // namespace detail::attn

/// Axes `flash_attention` accepts: q has Pos and Key, k has KPos and Key, v has KPos (three different axes);
/// Pos is not an axis of k or v and KPos not an axis of q. k's other axes (its batch axes) are a subset of q's
/// batch axes (q's axes other than Pos and Key): all of them for multi-head attention; q's batch axes that k
/// lacks are query groups sharing one key/value head (grouped-query attention, e.g. q {batch, pos, kv_head,
/// q_heads_per_group, key} with k {batch, key_pos, kv_head, key}). v has exactly k's batch axes among q's
/// batch axes, and at least one head axis of its own. A call that breaks a rule names it in the compiler's
/// message: `roles`, `k_batch_in_q`, `v_batch_is_k_batch` or `has_value_axes` of `flash_axes`.
template <class AxQ, class AxK, class AxV, class P, class KP, class K>
concept FlashAttentionAxes =
    AxisTag<P> && AxisTag<KP> && AxisTag<K> && detail::attn::flash_axes_of<AxQ, AxK, AxV, P, KP, K>::roles &&
    detail::attn::flash_axes_of<AxQ, AxK, AxV, P, KP, K>::k_batch_in_q &&
    detail::attn::flash_axes_of<AxQ, AxK, AxV, P, KP, K>::v_batch_is_k_batch &&
    detail::attn::flash_axes_of<AxQ, AxK, AxV, P, KP, K>::has_value_axes;

/// Segment-id arrays for `flash_attention`: int32 with Pos (query side) or KPos (key side) and otherwise only
/// batch axes of q.
template <class AxS, class AxQ, class P, class K, class Pos>
concept FlashSegmentAxes = detail::attn::has_v<detail::attn::list_of<AxS>, Pos> && detail::attn::subset_v<
    detail::attn::list_of<AxS>,
    detail::attn::mp::mp_push_back<
        detail::attn::minus<detail::attn::list_of<AxQ>,
                            detail::attn::mp::mp_list<std::remove_cvref_t<P>, std::remove_cvref_t<K>>>,
        std::remove_cvref_t<Pos>>>;

/// Blocked causal attention (FlashAttention-2): the same function as `dot_product_attention` with
/// the mask `causal_mask(Pos, KPos, q_start, k_start)` (and `sliding_window_mask` when `opts.sliding_window`
/// > 0; no mask when `opts.causal` is false and there is no window), computed tile by tile with an online
/// softmax so that no [Pos, KPos] score matrix exists: memory is the output plus one log-sum-exp per query.
/// Tiles wholly masked out are skipped (about half the work for causal attention). Its gradient is one node
/// with a hand-written backward that recomputes score tiles. Result axes as `dot_product_attention`'s. A
/// query that sees no key gives zeros (the plain version averages the values there). float/double; host kernels
/// on host memory, portable Kokkos kernels on a device build (or under HALIAX_PORTABLE_KERNELS=1).
/// Grouped-query attention: k and v may lack some of q's batch axes (see `FlashAttentionAxes`); every query
/// group then reads the one shared key/value head, which is never copied per group.
///   auto y = flash_attention(q, k, v, Pos, KPos, Key);                          // causal
///   auto w = flash_attention(q, k, v, Pos, KPos, Key, {.sliding_window = 256});  // Mistral-style window
///   // GQA: q {batch, pos, kv_head, q_heads_per_group, key}, k and v {batch, key_pos, kv_head, key}
///   auto g = flash_attention(q, k, v, Pos, KPos, Key);   // -> {batch, pos, kv_head, q_heads_per_group, key}
template <FloatElement T, class AxQ, class AxK, class AxV, class P, class KP, class K>
requires FlashAttentionAxes<AxQ, AxK, AxV, P, KP, K>
auto flash_attention(const named_array<T, AxQ>& q, const named_array<T, AxK>& k, const named_array<T, AxV>& v, P, KP, K,
                     const flash_attention_options& opts = {}) {
  return detail::attn::flash<T, AxQ, AxK, AxV, std::remove_cvref_t<P>, std::remove_cvref_t<KP>, std::remove_cvref_t<K>>(
      q, k, v, opts, static_cast<const named_array<std::int32_t, axes<>>*>(nullptr),
      static_cast<const named_array<std::int32_t, axes<>>*>(nullptr));
}

/// `flash_attention` for packed sequences: additionally, query i attends to key j only where
/// `q_segment_ids[i] == k_segment_ids[j]` (the mask `segment_mask(q_segment_ids, k_segment_ids)`). The ids are
/// int32 over Pos (resp. KPos) and any of q's batch axes (missing ones broadcast).
///   auto y = flash_attention(q, k, v, Pos, KPos, Key, seg, rename(seg, Pos, KPos));   // seg: int32 {batch, pos}
template <FloatElement T, class AxQ, class AxK, class AxV, class P, class KP, class K, class AxQS, class AxKS>
requires FlashAttentionAxes<AxQ, AxK, AxV, P, KP, K> && FlashSegmentAxes<AxQS, AxQ, P, K, P> &&
    FlashSegmentAxes<AxKS, AxQ, P, K, KP>
auto flash_attention(const named_array<T, AxQ>& q, const named_array<T, AxK>& k, const named_array<T, AxV>& v, P, KP, K,
                     const named_array<std::int32_t, AxQS>& q_segment_ids,
                     const named_array<std::int32_t, AxKS>& k_segment_ids, const flash_attention_options& opts = {}) {
  return detail::attn::flash<T, AxQ, AxK, AxV, std::remove_cvref_t<P>, std::remove_cvref_t<KP>, std::remove_cvref_t<K>>(
      q, k, v, opts, &q_segment_ids, &k_segment_ids);
}

}  // namespace haliax::nn
