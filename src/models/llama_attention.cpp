// The Llama family's attention (one layer): compiled on its own, beside the rest of the model (llama.cpp), so the
// two heaviest instantiations build in parallel.
#include <cmath>
#include <haliax/haliax.hpp>
#include <levanter/models/llama.hpp>

namespace levanter::llama {

hidden attention(const Attention<>& a, const LlamaConfig& cfg, const hidden& x, const token_batch& segments,
                 std::int64_t layer) {
  auto q = a.q_proj(x);  // {batch, position, kv_head, q_heads_per_group, head_size}
  auto k = a.k_proj(x);  // {batch, position, kv_head, head_size}
  auto v = a.v_proj(x);
  if (a.q_norm) q = (*a.q_norm)(q);
  if (a.k_norm) k = (*a.k_norm)(k);
  if (a.q_proj_norm) {  // OLMo 2: one RMSNorm over every query feature, one over every key feature
    q = hax::unflatten_axis((*a.q_proj_norm)(hax::flatten_axes(q, axes<KVHeads, QHeadsPerGroup, HeadSize>{}, QFeatures)),
                            QFeatures, q.sized(KVHeads), q.sized(QHeadsPerGroup), q.sized(HeadSize));
    k = hax::unflatten_axis((*a.k_proj_norm)(hax::flatten_axes(k, axes<KVHeads, HeadSize>{}, KFeatures)), KFeatures,
                            k.sized(KVHeads), k.sized(HeadSize));
  }
  const auto rope = nn::rope_tables(x.sized(Pos), q.sized(HeadSize), rope_spec_of(cfg.rope_of_layer(layer)));
  q = nn::apply_rotary(q, rope, Pos, HeadSize);
  auto kr = hax::rename(nn::apply_rotary(k, rope, Pos, HeadSize), Pos, KeyPos);
  auto vr = hax::rename(v, Pos, KeyPos);
  const std::int64_t window = cfg.window_of_layer(layer);
  // The blocked kernels do not soft-cap scores: capped attention (Gemma 2) takes the plain form.
  const bool vanilla = (cfg.attn_backend && *cfg.attn_backend == "vanilla") || cfg.attn_logit_softcapping;
  named_array<float, axes<Batch, Pos, KVHeads, QHeadsPerGroup, HeadSize>> out;
  if (!vanilla) {
    nn::flash_attention_options fo;
    fo.scale = cfg.attention_scale();
    fo.sliding_window = window;
    if (cfg.flash_attention_block_size) fo.block_q = fo.block_k = *cfg.flash_attention_block_size;
    out = nn::flash_attention(q, kr, vr, Pos, KeyPos, HeadSize, segments, hax::rename(segments, Pos, KeyPos), fo);
  } else {
    // The plain form (upstream "vanilla"): softmax(q·k / sqrt(d) masked) · v, keys shared by each group.
    const auto n = x.size(Pos);
    auto mask =
        (window > 0 ? nn::sliding_window_mask(n * Pos, n * KeyPos, window) : nn::causal_mask(n * Pos, n * KeyPos)) &&
        nn::segment_mask(segments, Pos, KeyPos);
    out = hax::rearrange<axes<Batch, Pos, KVHeads, QHeadsPerGroup, HeadSize>>(nn::dot_product_attention(
        q, kr, vr, KeyPos, HeadSize, mask, {.scale = cfg.attention_scale(), .logits_soft_cap = cfg.attn_logit_softcapping}));
  }
  return a.o_proj(hax::flatten_axes(out, axes<KVHeads, QHeadsPerGroup>{}, Heads));
}

}  // namespace levanter::llama
