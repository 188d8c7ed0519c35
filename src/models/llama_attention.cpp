// The Llama family's attention (one layer): projections, QK norms and RoPE, then the shared attention
// (levanter/layers/attention.hpp). Compiled on its own, beside the rest of the model (llama.cpp), so the
// two heaviest instantiations build in parallel.
#include <cstddef>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include <haliax/haliax.hpp>
#include <levanter/layers/attention.hpp>
#include <levanter/models/llama.hpp>

namespace levanter::llama {

namespace {

/// nn::rope_tables(pos, head, s), kept by what determines them (positions, head size, inverse frequencies, scaling;
/// haliax::detail::content_memo): every layer of every step asks for the same few, and a table built on the host
/// and copied to the arrays' memory would be a device synchronisation per layer per step on a GPU (two of a small
/// two-layer Llama step's nine).
template <class Array>
struct rope_memo_tag;
template <class SP, class SH>
auto rope_tables_of(SP pos, SH head, const nn::rope_spec& s) {
  using table = decltype(nn::rope_tables(pos, head, s));
  using array = decltype(table::cos);
  using view = typename array::view_type;
  using key = std::tuple<std::int64_t, std::int64_t, std::vector<float>, double>;
  using memo = hax::detail::content_memo<rope_memo_tag<array>, key, std::pair<view, view>, 64>;
  const auto tables = memo::get(key{pos.size, head.size, nn::rope_inv_freq(s, head.size), nn::rope_attention_scaling(s)}, [&] {
    const table t = nn::rope_tables(pos, head, s);
    const auto n = static_cast<std::size_t>(t.cos.element_count());
    view c(Kokkos::view_alloc(Kokkos::WithoutInitializing, "levanter::llama(rope cos)"), n);
    view sn(Kokkos::view_alloc(Kokkos::WithoutInitializing, "levanter::llama(rope sin)"), n);
    Kokkos::deep_copy(c, Kokkos::subview(t.cos.view(), std::pair<std::size_t, std::size_t>(0, n)));
    Kokkos::deep_copy(sn, Kokkos::subview(t.sin.view(), std::pair<std::size_t, std::size_t>(0, n)));
    return std::pair{c, sn};
  });
  return table{array(tables.first, {pos.size, head.size}), array(tables.second, {pos.size, head.size})};
}

}  // namespace

hidden attention(const Attention<>& a, const LlamaConfig& cfg, const hidden& x, const token_batch& segments,
                 std::int64_t layer, kv_cache* cache) {
  auto q = a.q_proj(x);  // {batch, position, kv_head, q_heads_per_group, head_size}
  auto k = a.k_proj(x);  // {batch, position, kv_head, head_size}
  auto v = a.v_proj(x);
  if (a.q_norm) q = (*a.q_norm)(q);
  if (a.k_norm) k = (*a.k_norm)(k);
  if (a.q_proj_norm) {  // OLMo 2: one RMSNorm over every query feature, one over every key feature
    q = hax::unflatten_axis(
        (*a.q_proj_norm)(hax::flatten_axes(q, axes<KVHeads, QHeadsPerGroup, HeadSize>{}, QFeatures)), QFeatures,
        q.sized(KVHeads), q.sized(QHeadsPerGroup), q.sized(HeadSize));
    k = hax::unflatten_axis((*a.k_proj_norm)(hax::flatten_axes(k, axes<KVHeads, HeadSize>{}, KFeatures)), KFeatures,
                            k.sized(KVHeads), k.sized(HeadSize));
  }
  layers::attention_spec spec;
  spec.backend = layers::attention_backend_of(cfg.attn_backend);
  spec.scale = cfg.attention_scale();
  spec.logits_soft_cap = cfg.attn_logit_softcapping;
  spec.sliding_window = cfg.window_of_layer(layer);
  spec.block_size = cfg.flash_attention_block_size;
  const auto rope_spec = rope_spec_of(cfg.rope_of_layer(layer));
  const auto n = x.size(Pos);
  if (cache) {  // decoding: row r holds positions cache->length(r), ...; it attends over its own keys alone
    // One table of every position the model has (the same table every step), rows taken per sequence: a position's
    // angles do not depend on the table's length.
    const auto table = rope_tables_of(cfg.seq_len * Pos, q.sized(HeadSize), rope_spec);
    const auto rows = x.size(Batch);
    std::vector<decltype(q)> out;
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto start = cache->length(r);
      const decltype(table) rope{hax::slice(table.cos, Pos, start, n), hax::slice(table.sin, Pos, start, n)};
      const auto qr = nn::apply_rotary(hax::slice(q, Batch, r, 1), rope, Pos, HeadSize);
      const auto kr = hax::rename(nn::apply_rotary(hax::slice(k, Batch, r, 1), rope, Pos, HeadSize), Pos, KeyPos);
      const auto vr = hax::rename(hax::slice(v, Batch, r, 1), Pos, KeyPos);
      const auto [kc, vc] = cache->append(r, layer, hax::rename(kr, KVHeads, Heads), hax::rename(vr, KVHeads, Heads));
      spec.q_start = start;
      out.push_back(layers::attention(qr, hax::rename(kc, Heads, KVHeads), hax::rename(vc, Heads, KVHeads),
                                      hax::slice(segments, Batch, r, 1), spec));
    }
    return a.o_proj(hax::flatten_axes(rows == 1 ? out.front() : hax::concatenate(Batch, out),
                                      axes<KVHeads, QHeadsPerGroup>{}, Heads));
  }
  const auto rope = rope_tables_of(n * Pos, q.sized(HeadSize), rope_spec);
  q = nn::apply_rotary(q, rope, Pos, HeadSize);
  const auto kr = hax::rename(nn::apply_rotary(k, rope, Pos, HeadSize), Pos, KeyPos);
  const auto vr = hax::rename(v, Pos, KeyPos);
  return a.o_proj(
      hax::flatten_axes(layers::attention(q, kr, vr, segments, spec), axes<KVHeads, QHeadsPerGroup>{}, Heads));
}

}  // namespace levanter::llama
