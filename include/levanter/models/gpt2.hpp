// levanter/models/gpt2.hpp: GPT-2 as upstream Levanter's Gpt2LMHeadModel: learned token and position embeddings,
// pre-norm blocks (LayerNorm → causal self-attention → residual, LayerNorm → MLP → residual) stacked over a
// `layers` axis, a final LayerNorm and the LM head tied to the token embedding. Field names follow upstream's
// modules, so parameter paths read `transformer.blocks.stacked.attn.c_attn.weight`,
// `embeddings.token_embeddings.weight`, … (the optimizer's masks and the checkpoints use these paths).
//
// The model satisfies `levanter::LmModel`; its forward pass is compiled once, in src/models/gpt2.cpp, so a
// program that uses GPT-2 parses these declarations and links the levanter library.
//
//   levanter::Gpt2Config cfg;  cfg.hidden_dim = 64; ...
//   auto model = levanter::gpt2::LMHeadModel::init(cfg, vocab, haliax::random::make_key(0));
//   auto loss = levanter::compute_next_token_loss(model, cfg, example);
#pragma once

#include <cstdint>
#include <string_view>

#include <boost/hana/define_struct.hpp>
#include <haliax/nn/embedding.hpp>
#include <haliax/nn/linear.hpp>
#include <haliax/nn/mlp.hpp>
#include <haliax/nn/normalization.hpp>
#include <haliax/nn/stacked.hpp>
#include <levanter/models/gpt2_config.hpp>
#include <levanter/models/lm.hpp>

namespace levanter {

namespace gpt2 {

namespace nn = haliax::nn;
using hax::axes;
using hax::named_array;
using hidden = lm_hidden;

/// GPT-2's fused query/key/value axis (c_attn's output {qkv, heads, head_size}).
inline constexpr struct Qkv final : hax::axis<"qkv"> {
} Qkv;

/// Upstream Gpt2Attention: c_attn {embed} -> {qkv, heads, head_size}, c_proj {heads, head_size} -> {embed}.
template <class Pre = axes<>>
struct Attention {
  static constexpr std::string_view class_name = "Gpt2Attention";
  using c_attn_t = nn::Linear<axes<Embed>, axes<Qkv, Heads, HeadSize>, Pre>;
  using c_proj_t = nn::Linear<axes<Heads, HeadSize>, axes<Embed>, Pre>;
  BOOST_HANA_DEFINE_STRUCT(Attention, (c_attn_t, c_attn), (c_proj_t, c_proj));
};

/// Upstream Gpt2Block.
template <class Pre = axes<>>
struct Block {
  static constexpr std::string_view class_name = "Gpt2Block";
  using ln_t = nn::LayerNorm<Embed, Pre>;
  using mlp_t = nn::Mlp<Embed, Mlp, Pre>;
  BOOST_HANA_DEFINE_STRUCT(Block, (ln_t, ln_1), (Attention<Pre>, attn), (ln_t, ln_2), (mlp_t, mlp));
};

/// Upstream Gpt2Transformer: the stacked blocks and the final LayerNorm.
struct Transformer {
  static constexpr std::string_view class_name = "Gpt2Transformer";
  using blocks_t = nn::Stacked<Layers, Block>;
  BOOST_HANA_DEFINE_STRUCT(Transformer, (blocks_t, blocks), (nn::LayerNorm<Embed>, ln_f));
};

/// Upstream Gpt2Embeddings: token embeddings (also the LM head) and learned position embeddings.
struct Embeddings {
  static constexpr std::string_view class_name = "Gpt2Embeddings";
  BOOST_HANA_DEFINE_STRUCT(Embeddings, (nn::Embedding<Vocab, Embed>, token_embeddings),
                           (nn::Embedding<Pos, Embed>, position_embeddings));
};

/// Attention of one block over {batch, position, embed}: causal, within segments, optional attention dropout.
hidden attention(const Attention<>& a, const Gpt2Config& cfg, const hidden& x, const token_batch& segments,
                 std::int64_t layer, const forward_options& o);

/// Upstream Gpt2LMHeadModel.
struct LMHeadModel {
  using config_type = Gpt2Config;
  static constexpr std::string_view class_name = "Gpt2LMHeadModel";
  BOOST_HANA_DEFINE_STRUCT(LMHeadModel, (Transformer, transformer), (Embeddings, embeddings));

  /// Upstream init: Linear weights truncated_normal(-3, 3) / sqrt(fan_in) with zero biases, LayerNorms at 1/0,
  /// token embeddings normal * initializer_range, positions normal * initializer_range / 2. Keys are split as
  /// upstream (model → transformer/embeddings → per-layer keys → attention/MLP).
  static LMHeadModel init(const Gpt2Config& cfg, std::int64_t vocab, hax::random::key key);

  /// Throws std::invalid_argument naming the first impossible setting.
  static void check(const Gpt2Config& cfg, std::int64_t vocab);

  std::int64_t vocab_size() const { return embeddings.token_embeddings.weight.size(Vocab); }

  /// Hidden states {batch, position, embed} after the final LayerNorm (upstream `activations`).
  hidden activations(const Gpt2Config& cfg, const token_batch& tokens, const token_batch& segments,
                     const forward_options& o = {}) const;

  /// The LM head: the token embedding table {vocab, embed} (GPT-2's head is tied).
  const named_array<float, axes<Vocab, Embed>>& get_lm_head() const { return embeddings.token_embeddings.weight; }

  /// Logits {batch, position, vocab} (the tied head: hidden · token embeddings).
  lm_logits_array logits(const Gpt2Config& cfg, const token_batch& tokens, const token_batch& segments,
                         const forward_options& o = {}) const {
    return lm_head_logits(activations(cfg, tokens, segments, o), get_lm_head());
  }
};

/// Upstream `compute_next_token_loss` for GPT-2 (see levanter::compute_next_token_loss).
inline scalar next_token_loss(const LMHeadModel& m, const Gpt2Config& cfg, const lm_example& ex,
                              double z_loss_weight = 0.0, const forward_options& o = {}) {
  return compute_next_token_loss(m, cfg, ex, z_loss_weight, o);
}

}  // namespace gpt2

template <>
struct model_of<Gpt2Config> {
  using type = gpt2::LMHeadModel;
};

}  // namespace levanter
