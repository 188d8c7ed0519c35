// levanter/models/llama.hpp: the Llama family as upstream Levanter's LlamaLMHeadModel (also Mistral, Qwen2 and
// Qwen3, see llama_config.hpp): token embeddings, decoder layers stacked over `layers` (RMSNorm → grouped-query
// attention with RoPE → residual, RMSNorm → SwiGLU MLP → residual), a final RMSNorm and an LM head (a Linear
// {vocab, embed}, or the embedding table when tied). Field names follow upstream's modules, so parameter paths
// read `transformer.layers.stacked.self_attn.q_proj.weight`, `embeddings.token_embeddings.weight`,
// `lm_head.weight`, … and every Linear is laid out out-first ({out..., in...}, torch's layout).
//
// Queries carry {kv_head, q_heads_per_group, head_size}; keys and values {kv_head, head_size}, so grouped-query
// attention never copies K/V per query head (haliax flash attention reads the shared heads). o_proj reads the
// flattened {heads, head_size} with heads = kv_head * q_heads_per_group + group, the order of Hugging Face's.
//
// Mixtral is this model with a mixture of experts in place of each MLP (upstream mixtral.py reuses Llama's attention
// and embedding).
//
// Gemma, Gemma 2, Gemma 3 and OLMo 2 are this model too (upstream's gemma.py and olmo.py reuse Llama's attention,
// MLP and embedding): their config's variant (llama_config.hpp, gemma_config.hpp) turns on (1 + weight) norms, the
// embedding scale, the four-norm layer and local layers (Gemma), post-norm layers and whole-projection QK norms
// (OLMo 2); soft-capping and the attention scale are keys.
//
// The bodies compile once, in src/models/llama*.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

#include <boost/hana/define_struct.hpp>
#include <haliax/nn/embedding.hpp>
#include <haliax/nn/linear.hpp>
#include <haliax/nn/moe.hpp>
#include <haliax/nn/normalization.hpp>
#include <haliax/nn/stacked.hpp>
#include <levanter/layers/moe.hpp>
#include <levanter/models/llama_config.hpp>
#include <levanter/models/lm.hpp>

namespace levanter {

namespace llama {

namespace nn = haliax::nn;
using hax::axes;
using hax::named_array;
using hidden = lm_hidden;

/// Key/value heads (upstream `kv_head`) and query heads per key/value head (`q_heads_per_group`).
inline constexpr struct KVHeads final : hax::axis<"kv_head"> {
} KVHeads;
inline constexpr struct QHeadsPerGroup final : hax::axis<"q_heads_per_group"> {
} QHeadsPerGroup;

template <class In, class Out, class Pre>
using Linear = nn::Linear<In, Out, Pre, float, true>;

/// The query and key projections' features flattened ({kv_head, q_heads_per_group, head_size} and {kv_head,
/// head_size}), the axes OLMo 2's QK norms run over.
inline constexpr struct QFeatures final : hax::axis<"q_features"> {
} QFeatures;
inline constexpr struct KFeatures final : hax::axis<"k_features"> {
} KFeatures;

/// Upstream `layers.attention.Attention`: q/k/v/o projections and the optional per-head QK RMSNorms; OLMo 2's
/// norms over the whole projections are q_proj_norm / k_proj_norm (Hugging Face's and upstream's q_norm / k_norm
/// of that model).
template <class Pre = axes<>>
struct Attention {
  static constexpr std::string_view class_name = "Attention";
  using q_proj_t = Linear<axes<Embed>, axes<KVHeads, QHeadsPerGroup, HeadSize>, Pre>;
  using kv_proj_t = Linear<axes<Embed>, axes<KVHeads, HeadSize>, Pre>;
  using o_proj_t = Linear<axes<Heads, HeadSize>, axes<Embed>, Pre>;
  using qk_norm_t = nn::RmsNorm<HeadSize, Pre>;
  using q_proj_norm_t = nn::RmsNorm<QFeatures, Pre>;
  using k_proj_norm_t = nn::RmsNorm<KFeatures, Pre>;
  BOOST_HANA_DEFINE_STRUCT(Attention, (q_proj_t, q_proj), (kv_proj_t, k_proj), (kv_proj_t, v_proj), (o_proj_t, o_proj),
                           (std::optional<qk_norm_t>, q_norm), (std::optional<qk_norm_t>, k_norm),
                           (std::optional<q_proj_norm_t>, q_proj_norm), (std::optional<k_proj_norm_t>, k_proj_norm));
};

/// Upstream LlamaMlp: down_proj(act(gate_proj(x)) * up_proj(x)). (Not named `Mlp`, which would hide the Mlp
/// axis inside it; nvcc's host pass cannot re-print such a hidden name.)
template <class Pre = axes<>>
struct LlamaMlp {
  static constexpr std::string_view class_name = "LlamaMlp";
  using in_t = Linear<axes<Embed>, levanter::mlp_axes, Pre>;
  using out_t = Linear<levanter::mlp_axes, axes<Embed>, Pre>;
  BOOST_HANA_DEFINE_STRUCT(LlamaMlp, (in_t, gate_proj), (in_t, up_proj), (out_t, down_proj));
};

/// Upstream MixtralMoEMlp: the routed experts' SwiGLU, w2(act(w1(x)) * w3(x)), each of w1 (gate), w3 (up) and w2
/// (down) one MoELinear over the experts (Hugging Face's experts.{e}.w1 / w3 / w2).
template <class Pre = axes<>>
struct MoeMlp {
  static constexpr std::string_view class_name = "MixtralMoEMlp";
  using in_t = nn::MoELinear<Experts, axes<Embed>, levanter::mlp_axes, Pre>;
  using out_t = nn::MoELinear<Experts, levanter::mlp_axes, axes<Embed>, Pre>;
  BOOST_HANA_DEFINE_STRUCT(MoeMlp, (in_t, w1), (out_t, w2), (in_t, w3));
};

/// Upstream MixtralSparseMoeBlock: the router (`gate`, {experts, embed}) and the experts.
template <class Pre = axes<>>
struct SparseMoeBlock {
  static constexpr std::string_view class_name = "MixtralSparseMoeBlock";
  using gate_t = Linear<axes<Embed>, axes<Experts>, Pre>;
  BOOST_HANA_DEFINE_STRUCT(SparseMoeBlock, (gate_t, gate), (MoeMlp<Pre>, experts));
};

/// Upstream LlamaDecoderLayer (hybrid_norm adds post_attn_layernorm and post_mlp_layernorm), Gemma2DecoderLayer
/// (Gemma 2 and 3: post_attention_layernorm follows attention, pre_feedforward_layernorm and
/// post_feedforward_layernorm surround the MLP) and Olmo2DecoderLayer (no input_layernorm: post_attention_layernorm
/// and post_feedforward_layernorm follow the sublayers); upstream's and Hugging Face's names. Mixtral's layer
/// (MixtralDecoderLayer) has block_sparse_moe and, with shared experts, shared_mlp in place of mlp.
template <class Pre = axes<>>
struct DecoderLayer {
  static constexpr std::string_view class_name = "LlamaDecoderLayer";
  using norm_t = nn::RmsNorm<Embed, Pre>;
  BOOST_HANA_DEFINE_STRUCT(DecoderLayer, (Attention<Pre>, self_attn), (std::optional<LlamaMlp<Pre>>, mlp),
                           (std::optional<SparseMoeBlock<Pre>>, block_sparse_moe),
                           (std::optional<LlamaMlp<Pre>>, shared_mlp),
                           (std::optional<norm_t>, input_layernorm),
                           (norm_t, post_attention_layernorm), (std::optional<norm_t>, post_attn_layernorm),
                           (std::optional<norm_t>, post_mlp_layernorm), (std::optional<norm_t>, pre_feedforward_layernorm),
                           (std::optional<norm_t>, post_feedforward_layernorm));
};

/// Upstream LlamaTransformer: the stacked layers and the final norm.
struct Transformer {
  static constexpr std::string_view class_name = "LlamaTransformer";
  using layers_t = nn::Stacked<Layers, DecoderLayer>;
  BOOST_HANA_DEFINE_STRUCT(Transformer, (layers_t, layers), (nn::RmsNorm<Embed>, norm));
};

/// Upstream LlamaEmbedding: the token embeddings and the optional input-embedding norm.
struct Embeddings {
  static constexpr std::string_view class_name = "LlamaEmbedding";
  BOOST_HANA_DEFINE_STRUCT(Embeddings, (nn::Embedding<Vocab, Embed>, token_embeddings),
                           (std::optional<nn::RmsNorm<Embed>>, norm));
};

/// Attention of one layer over {batch, position, embed}: RoPE, causal (within a window for windowed layers),
/// within segments; with a cache, over the cached positions and these (kv_cache).
hidden attention(const Attention<>& a, const LlamaConfig& cfg, const hidden& x, const token_batch& segments,
                 std::int64_t layer, kv_cache* cache = nullptr);

/// Mixtral's sparse mixture of experts over {batch, position, embed}: routing (layers/moe.hpp), the experts as grouped
/// matmuls over the tokens sorted by expert, the weighted sum back; records layer `layer`'s auxiliary losses in `aux`.
hidden sparse_moe(const SparseMoeBlock<>& m, const LlamaConfig& cfg, const hidden& x, std::int64_t layer,
                  lm_aux* aux);

/// Upstream LlamaLMHeadModel (and Mistral/Qwen/Qwen3LMHeadModel).
struct LMHeadModel {
  using config_type = LlamaConfig;
  static constexpr std::string_view class_name = "LlamaLMHeadModel";
  using head_t = Linear<axes<Embed>, axes<Vocab>, axes<>>;
  BOOST_HANA_DEFINE_STRUCT(LMHeadModel, (Transformer, transformer), (Embeddings, embeddings),
                           (std::optional<head_t>, lm_head));

  /// Upstream init: Linear weights truncated_normal(-3, 3) / sqrt(fan_in) drawn out-first, RMSNorms at 1 (0 bias),
  /// embeddings truncated_normal(-3, 3) / hidden_dim. Keys as upstream: model → (transformer, embeddings); the
  /// untied LM head reuses the embeddings' key; per layer (attention → q, k, v, o; MLP → gate, up, down).
  static LMHeadModel init(const LlamaConfig& cfg, std::int64_t vocab, hax::random::key key);

  /// Throws std::invalid_argument naming the first impossible setting.
  static void check(const LlamaConfig& cfg, std::int64_t vocab);

  std::int64_t vocab_size() const { return embeddings.token_embeddings.weight.size(Vocab); }

  /// Hidden states {batch, position, embed} after the final norm (upstream `activations`).
  hidden activations(const LlamaConfig& cfg, const token_batch& tokens, const token_batch& segments,
                     const forward_options& o = {}) const;

  /// The LM head {vocab, embed}: lm_head's weight, or the token embeddings when tied.
  const named_array<float, axes<Vocab, Embed>>& get_lm_head() const {
    return lm_head ? lm_head->weight : embeddings.token_embeddings.weight;
  }
};

}  // namespace llama

/// Every config type of the family (LlamaConfig and the types deriving from it, in their own files or not) makes this
/// model.
template <class C>
  requires std::is_base_of_v<LlamaConfig, C>
struct model_of<C> {
  using type = llama::LMHeadModel;
};

}  // namespace levanter
