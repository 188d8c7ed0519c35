// GPT-2's attention (one block): compiled on its own, beside the rest of the model (gpt2.cpp), so the two
// heaviest instantiations of the model build in parallel.
#include <cmath>

#include <haliax/haliax.hpp>
#include <levanter/models/gpt2.hpp>

namespace levanter::gpt2 {

/// Attention of one block over {batch, position, embed}: causal, within segments, optional attention dropout.
hidden attention(const Attention<>& a, const Gpt2Config& cfg, const hidden& x, const token_batch& segments,
                 std::int64_t layer, const forward_options& o) {
  auto qkv = a.c_attn(x);  // {batch, position, qkv, heads, head_size}
  auto q = hax::index(qkv, Qkv, 0);
  auto k = hax::rename(hax::index(qkv, Qkv, 1), Pos, KeyPos);
  auto v = hax::rename(hax::index(qkv, Qkv, 2), Pos, KeyPos);
  if (cfg.scale_attn_by_inverse_layer_idx) q = hax::divide(q, static_cast<float>(layer + 1));
  const bool vanilla = cfg.attn_backend && *cfg.attn_backend == "vanilla";
  const bool drop = !o.inference && cfg.attn_pdrop > 0.0;
  named_array<float, axes<Batch, Pos, Heads, HeadSize>> out;
  if (!vanilla && !drop) {
    nn::flash_attention_options fo;
    if (cfg.flash_attention_block_size) fo.block_q = fo.block_k = *cfg.flash_attention_block_size;
    out = nn::flash_attention(q, k, v, Pos, KeyPos, HeadSize, segments, hax::rename(segments, Pos, KeyPos), fo);
  } else {
    // The plain form (upstream "vanilla"): softmax(q·k / sqrt(d) masked) · v, with dropout on the weights.
    const auto n = x.size(Pos);
    auto mask = nn::causal_mask(n * Pos, n * KeyPos) && nn::segment_mask(segments, Pos, KeyPos);
    auto scores = hax::multiply(hax::dot(q, k, HeadSize), static_cast<float>(1.0 / std::sqrt(double(cfg.head_size()))));
    scores = hax::where(mask, scores, -1e9f);
    auto w = nn::softmax(scores, KeyPos);
    if (drop) w = nn::Dropout{cfg.attn_pdrop}(w, hax::random::fold_in(o.key, 3 * layer + 1), false);
    out = hax::rearrange<axes<Batch, Pos, Heads, HeadSize>>(hax::dot(w, v, KeyPos));
  }
  return a.c_proj(out);
}

}  // namespace levanter::gpt2
