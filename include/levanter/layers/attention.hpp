// levanter/layers/attention.hpp: the attention every model calls (upstream `layers/attention.py`'s
// `dot_product_attention` with an `AttentionMask`): queries against keys and values over the language-model axes
// (Pos, KeyPos, HeadSize; any head axes besides), a causal mask narrowed to a sliding window and to segments
// (packed documents), the score scale, logit soft-capping, attention dropout and learned sinks, on the backend the
// config names.
//
//   namespace layers = levanter::layers;
//   const layers::attention_spec spec{.backend = layers::attention_backend_of(cfg.attn_backend), .sliding_window = 64};
//   auto out = levanter::layers::attention(q, k, v, segments, spec);   // q's axes, v's head size
//
// The projections, QK norms and RoPE stay with each model (GPT-2 has one fused qkv projection, the Llama family
// four); what they feed in here is the same computation for all of them.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include <haliax/nn/attention.hpp>
#include <haliax/nn/dropout.hpp>
#include <haliax/random.hpp>
#include <levanter/models/lm.hpp>

namespace levanter::layers {

/// Upstream `AttentionBackend`, as far as it exists here: `blocked` is haliax's flash attention (upstream `default`
/// on a CPU, and `jax_flash`), `vanilla` the plain softmax(q·k) · v with every score materialised.
enum class attention_backend { blocked, vanilla };

/// The backend a model config's `attn_backend` names (unset, `default` and `jax_flash` are the blocked kernels).
/// Config validation refuses other names first (models/config_checks.hpp); this throws std::invalid_argument.
inline attention_backend attention_backend_of(const std::optional<std::string>& name) {
  if (!name || *name == "default" || *name == "jax_flash") return attention_backend::blocked;
  if (*name == "vanilla") return attention_backend::vanilla;
  throw std::invalid_argument("attn_backend '" + *name + "' is not supported (use default, jax_flash or vanilla)");
}

/// What one attention call computes besides q, k and v.
struct attention_spec {
  attention_backend backend = attention_backend::blocked;
  std::optional<double> scale;            ///< score scale; default 1 / sqrt(head size)
  std::optional<double> logits_soft_cap;  ///< scores c * tanh(s / c) before the mask (Gemma 2)
  std::int64_t sliding_window = 0;        ///< keys k with q - w < k <= q; 0: every earlier key
  std::optional<int> block_size;          ///< query and key block of the blocked kernels
  double dropout = 0;                     ///< attention dropout on the weights (training only)
  hax::random::key dropout_key{};
  /// Decoding over a kv_cache: the queries are positions [q_start, q_start + n) and the keys positions from 0 (more
  /// keys than queries); one sequence per batch row, so the segments are not read.
  std::int64_t q_start = 0;
};

namespace detail {
/// The causal mask, narrowed to the spec's window and to the segments, of the plain form: `nq` queries from
/// position `s.q_start` against `nk` keys from 0 (decoding reads no segments: every key is the row's).
inline auto plain_mask(std::int64_t nq, std::int64_t nk, const token_batch& segments, const attention_spec& s) {
  namespace nn = haliax::nn;
  auto m = s.sliding_window > 0 ? nn::sliding_window_mask(nq * Pos, nk * KeyPos, s.sliding_window, s.q_start)
                                : nn::causal_mask(nq * Pos, nk * KeyPos, s.q_start);
  if (nq == nk && s.q_start == 0) return m && nn::segment_mask(segments, hax::rename(segments, Pos, KeyPos));
  const auto rows = segments.sized(Batch);
  return m && nn::segment_mask(hax::zeros<std::int32_t>(rows, nq * Pos), hax::zeros<std::int32_t>(rows, nk * KeyPos));
}
}  // namespace detail

/// Causal attention of `q` {batch, position, heads..., head_size} over `k` and `v` {batch, key_position, heads...,
/// head_size} within the segments of `segments` {batch, position}. Keys and values may lack query head axes
/// (grouped-query attention: they are shared). The result has q's axes. The blocked kernels serve the default
/// backend, soft-capping included; dropout and the vanilla backend take the plain form (which the kernels do not do
/// yet).
template <class AxQ, class AxK, class AxV>
hax::named_array<float, AxQ> attention(const hax::named_array<float, AxQ>& q, const hax::named_array<float, AxK>& k,
                                       const hax::named_array<float, AxV>& v, const token_batch& segments,
                                       const attention_spec& s) {
  namespace nn = haliax::nn;
  const bool decoding = s.q_start != 0 || k.size(KeyPos) != q.size(Pos);
  if (s.backend == attention_backend::blocked && s.dropout == 0) {
    nn::flash_attention_options fo;
    fo.scale = s.scale;
    fo.logits_soft_cap = s.logits_soft_cap;
    fo.sliding_window = s.sliding_window;
    fo.q_start = s.q_start;
    if (s.block_size) fo.block_q = fo.block_k = *s.block_size;
    if (decoding) {  // one segment per row (the same kernels as training: segment ids all 0)
      const auto rows = q.sized(Batch);
      return nn::flash_attention(q, k, v, Pos, KeyPos, HeadSize, hax::zeros<std::int32_t>(rows, q.sized(Pos)),
                                 hax::zeros<std::int32_t>(rows, k.sized(KeyPos)), fo);
    }
    return nn::flash_attention(q, k, v, Pos, KeyPos, HeadSize, segments, hax::rename(segments, Pos, KeyPos), fo);
  }
  const auto mask = detail::plain_mask(q.size(Pos), k.size(KeyPos), segments, s);
  const nn::attention_options opts{.scale = s.scale, .logits_soft_cap = s.logits_soft_cap};
  if (s.dropout > 0) {
    auto w = nn::dot_product_attention_weights(q, k, KeyPos, HeadSize, mask, opts);
    w = nn::Dropout{s.dropout}(w, s.dropout_key, false);
    return hax::rearrange<AxQ>(hax::dot(w, v, KeyPos));
  }
  return hax::rearrange<AxQ>(nn::dot_product_attention(q, k, v, KeyPos, HeadSize, mask, opts));
}

/// `attention` with a learned sink per head (upstream `AttentionWithSink`): `sinks` (the query's head axes, e.g.
/// {KVHeads, QHeadsPerGroup}; a parameter, zeros at init as upstream) is one more logit in every row's softmax,
/// with a zero value, so that a query can put weight on nothing. Every backend takes the plain form here (the
/// blocked kernels do not carry a sink yet); the mask, scale, soft cap (which caps the sink too) and dropout are
/// the spec's.
///   auto out = levanter::layers::attention(q, k, v, segments, spec, sinks);
template <class AxQ, class AxK, class AxV, class AxS>
hax::named_array<float, AxQ> attention(const hax::named_array<float, AxQ>& q, const hax::named_array<float, AxK>& k,
                                       const hax::named_array<float, AxV>& v, const token_batch& segments,
                                       const attention_spec& s, const hax::named_array<float, AxS>& sinks) {
  namespace nn = haliax::nn;
  const auto mask = detail::plain_mask(q.size(Pos), k.size(KeyPos), segments, s);
  const nn::attention_options opts{.scale = s.scale, .logits_soft_cap = s.logits_soft_cap};
  auto w = nn::dot_product_attention_weights_with_sink(q, k, sinks, KeyPos, HeadSize, mask, opts);
  if (s.dropout > 0) w = nn::Dropout{s.dropout}(w, s.dropout_key, false);
  return hax::rearrange<AxQ>(hax::dot(w, v, KeyPos));
}

}  // namespace levanter::layers
