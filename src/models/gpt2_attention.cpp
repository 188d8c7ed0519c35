// GPT-2's attention (one block): compiled on its own, beside the rest of the model (gpt2.cpp), so the two
// heaviest instantiations of the model build in parallel.
#include <vector>

#include <haliax/haliax.hpp>
#include <levanter/layers/attention.hpp>
#include <levanter/models/gpt2.hpp>

namespace levanter::gpt2 {

/// Attention of one block over {batch, position, embed}: the fused q/k/v projection, then the shared attention
/// (levanter/layers/attention.hpp: causal, within segments, optional attention dropout).
hidden attention(const Attention<>& a, const Gpt2Config& cfg, const hidden& x, const token_batch& segments,
                 std::int64_t layer, const forward_options& o) {
  auto qkv = a.c_attn(x);  // {batch, position, qkv, heads, head_size}
  auto q = hax::index(qkv, Qkv, 0);
  auto k = hax::rename(hax::index(qkv, Qkv, 1), Pos, KeyPos);
  auto v = hax::rename(hax::index(qkv, Qkv, 2), Pos, KeyPos);
  if (cfg.scale_attn_by_inverse_layer_idx) q = hax::divide(q, static_cast<float>(layer + 1));
  layers::attention_spec spec;
  spec.backend = layers::attention_backend_of(cfg.attn_backend);
  spec.block_size = cfg.flash_attention_block_size;
  if (!o.inference && cfg.attn_pdrop > 0.0) {
    spec.dropout = cfg.attn_pdrop;
    spec.dropout_key = hax::random::fold_in(o.key, 3 * layer + 1);
  }
  if (o.cache) {  // decoding: each row attends over its own cached positions and these (kv_cache)
    const auto rows = x.size(Batch);
    std::vector<decltype(q)> out;
    for (std::int64_t r = 0; r < rows; ++r) {
      spec.q_start = o.cache->length(r);
      const auto [kc, vc] = o.cache->append(r, layer, hax::slice(k, Batch, r, 1), hax::slice(v, Batch, r, 1));
      out.push_back(layers::attention(hax::slice(q, Batch, r, 1), kc, vc, hax::slice(segments, Batch, r, 1), spec));
    }
    return a.c_proj(rows == 1 ? out.front() : hax::concatenate(Batch, out));
  }
  return a.c_proj(layers::attention(q, k, v, segments, spec));
}

}  // namespace levanter::gpt2
