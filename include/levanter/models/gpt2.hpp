// levanter/models/gpt2.hpp: GPT-2 as upstream Levanter's Gpt2LMHeadModel: learned token and position embeddings,
// pre-norm blocks (LayerNorm → causal self-attention → residual, LayerNorm → MLP → residual) stacked over a
// `layers` axis, a final LayerNorm and the LM head tied to the token embedding. Field names follow upstream's
// modules, so parameter paths read `transformer.blocks.stacked.attn.c_attn.weight`,
// `embeddings.token_embeddings.weight`, … (the optimizer's masks and the checkpoints use these paths).
//
//   levanter::Gpt2Config cfg;  cfg.hidden_dim = 64; ...
//   auto model = levanter::gpt2::LMHeadModel::init(cfg, vocab, haliax::random::make_key(0));
//   auto loss = levanter::gpt2::next_token_loss(model, cfg, tokens, segment_ids, loss_opts);
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <haliax/autodiff.hpp>
#include <haliax/haliax.hpp>
#include <levanter/models/gpt2_config.hpp>

namespace levanter {

namespace hax = haliax;

// The logical axes of the language models (upstream names).
inline constexpr struct Batch final : hax::axis<"batch"> {
} Batch;
inline constexpr struct Pos final : hax::axis<"position"> {
} Pos;
inline constexpr struct KeyPos final : hax::axis<"key_position"> {
} KeyPos;
inline constexpr struct Embed final : hax::axis<"embed"> {
} Embed;
inline constexpr struct Heads final : hax::axis<"heads"> {
} Heads;
inline constexpr struct HeadSize final : hax::axis<"head_size"> {
} HeadSize;
inline constexpr struct Qkv final : hax::axis<"qkv"> {
} Qkv;
inline constexpr struct Mlp final : hax::axis<"mlp"> {
} Mlp;
inline constexpr struct Vocab final : hax::axis<"vocab"> {
} Vocab;
inline constexpr struct Layers final : hax::axis<"layers"> {
} Layers;

/// Token ids {batch, position} and the per-token int32 arrays that go with them.
using token_batch = hax::named_array<std::int32_t, hax::axes<Batch, Pos>>;

/// Upstream `LmExample.causal(tokens, ignore_id, eos_id)` for a batch: the tokens, the loss mask (every position but
/// the last, and not where the next token is `ignore_id`) and segment ids (a new segment starts after each EOS, so
/// packed documents never attend to each other).
struct lm_example {
  token_batch tokens;
  hax::named_array<bool, hax::axes<Batch, Pos>> loss_mask;
  token_batch segment_ids;

  static lm_example causal(const token_batch& tokens, std::int64_t eos_id, std::int64_t ignore_id = -100) {
    const auto B = tokens.size(Batch), P = tokens.size(Pos);
    auto host = tokens.to_host();
    std::vector<std::int32_t> seg(host.size());
    std::vector<bool> keep(host.size());
    for (std::int64_t b = 0; b < B; ++b) {
      std::int32_t s = 0;
      for (std::int64_t p = 0; p < P; ++p) {
        const auto i = static_cast<std::size_t>(b * P + p);
        if (p > 0 && host[i - 1] == eos_id) ++s;
        seg[i] = s;
        keep[i] = p + 1 < P && host[i + 1] != ignore_id;
      }
    }
    return {tokens, hax::from_host(keep, B * Batch, P * Pos), hax::from_host<std::int32_t>(seg, B * Batch, P * Pos)};
  }
};

namespace gpt2 {

namespace nn = haliax::nn;
using hax::axes;
using hax::named_array;
using hidden = named_array<float, axes<Batch, Pos, Embed>>;

/// What a forward pass needs besides the parameters.
struct forward_options {
  bool inference = true;           // dropout off
  hax::random::key key{};          // dropout key (training)
  nn::checkpoint_policy checkpointing = nn::checkpoint_policy::none;
};

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
inline hidden attention(const Attention<>& a, const Gpt2Config& cfg, const hidden& x, const token_batch& segments,
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

/// Upstream Gpt2LMHeadModel.
struct LMHeadModel {
  static constexpr std::string_view class_name = "Gpt2LMHeadModel";
  BOOST_HANA_DEFINE_STRUCT(LMHeadModel, (Transformer, transformer), (Embeddings, embeddings));

  /// Upstream init: Linear weights truncated_normal(-3, 3) / sqrt(fan_in) with zero biases, LayerNorms at 1/0,
  /// token embeddings normal * initializer_range, positions normal * initializer_range / 2. Keys are split as
  /// upstream (model → transformer/embeddings → per-layer keys → attention/MLP).
  static LMHeadModel init(const Gpt2Config& cfg, std::int64_t vocab, hax::random::key key) {
    check(cfg, vocab);
    auto k = hax::random::split(key, 2);
    LMHeadModel m;
    const auto E = cfg.hidden_dim * Embed;
    m.transformer.blocks = Transformer::blocks_t::init(cfg.num_layers * Layers, k[0], [&](hax::random::key kl) {
      auto kb = hax::random::split(kl, 2);
      Block<> b;
      b.ln_1 = Block<>::ln_t::init(E, cfg.layer_norm_epsilon, true, cfg.use_bias);
      auto ka = hax::random::split(kb[0], 2);
      b.attn.c_attn = Attention<>::c_attn_t::init(ka[0], E, 3 * Qkv, cfg.num_heads * Heads, cfg.head_size() * HeadSize,
                                                  cfg.use_bias);
      b.attn.c_proj = Attention<>::c_proj_t::init(ka[1], cfg.num_heads * Heads, cfg.head_size() * HeadSize, E,
                                                  cfg.use_bias);
      b.ln_2 = Block<>::ln_t::init(E, cfg.layer_norm_epsilon, true, cfg.use_bias);
      b.mlp = Block<>::mlp_t::init(kb[1], E, cfg.mlp_dim() * Mlp, nn::activation_from_name(cfg.activation_function),
                                   cfg.use_bias);
      return b;
    });
    m.transformer.ln_f = nn::LayerNorm<Embed>::init(E, cfg.layer_norm_epsilon, true, cfg.use_bias);
    auto ke = hax::random::split(k[1], 3);
    m.embeddings.token_embeddings = nn::Embedding<Vocab, Embed>::init(ke[0], vocab * Vocab, E, cfg.initializer_range);
    m.embeddings.position_embeddings =
        nn::Embedding<Pos, Embed>::init(ke[1], cfg.seq_len * Pos, E, cfg.initializer_range / 2);
    return m;
  }

  /// Throws std::invalid_argument naming the first impossible setting.
  static void check(const Gpt2Config& cfg, std::int64_t vocab) {
    auto fail = [](const std::string& m) { throw std::invalid_argument("gpt2: " + m); };
    if (cfg.hidden_dim <= 0 || cfg.num_heads <= 0 || cfg.num_layers <= 0 || cfg.seq_len <= 0 || cfg.mlp_scale <= 0)
      fail("seq_len, hidden_dim, num_layers, num_heads and mlp_scale must be positive");
    if (cfg.hidden_dim % cfg.num_heads != 0)
      fail("hidden_dim " + std::to_string(cfg.hidden_dim) + " is not divisible by num_heads " +
           std::to_string(cfg.num_heads));
    if (vocab <= 0) fail("the vocabulary must not be empty");
  }

  std::int64_t vocab_size() const { return embeddings.token_embeddings.weight.size(Vocab); }

  /// Hidden states {batch, position, embed} after the final LayerNorm (upstream `activations`).
  hidden activations(const Gpt2Config& cfg, const token_batch& tokens, const token_batch& segments,
                     const forward_options& o = {}) const {
    const auto n = tokens.size(Pos);
    if (n > cfg.seq_len)
      throw std::invalid_argument("gpt2: sequence of " + std::to_string(n) + " tokens is longer than seq_len " +
                                  std::to_string(cfg.seq_len));
    const auto& wpe = embeddings.position_embeddings.weight;
    hidden x = embeddings.token_embeddings.embed(tokens) + (n == cfg.seq_len ? wpe : hax::slice(wpe, Pos, 0, n));
    if (!o.inference && cfg.embed_pdrop > 0) x = nn::Dropout{cfg.embed_pdrop}(x, hax::random::fold_in(o.key, 0), false);
    const nn::Dropout resid{cfg.resid_pdrop};
    const bool resid_drop = !o.inference && cfg.resid_pdrop > 0;
    x = transformer.blocks.fold(
        x,
        [&cfg, &segments, &o, resid, resid_drop](const Block<>& b, const hidden& h, std::int64_t i) -> hidden {
          const auto kl = hax::random::fold_in(o.key, i + 1);
          hidden a = attention(b.attn, cfg, b.ln_1(h), segments, i, o);
          if (resid_drop) a = resid(a, hax::random::fold_in(kl, 2), false);
          hidden h2 = h + a;
          hidden f = b.mlp(b.ln_2(h2));
          if (resid_drop) f = resid(f, hax::random::fold_in(kl, 3), false);
          return h2 + f;
        },
        o.checkpointing);
    return transformer.ln_f(x);
  }

  /// Logits {batch, position, vocab} (the tied head: hidden · token embeddings).
  named_array<float, axes<Batch, Pos, Vocab>> logits(const Gpt2Config& cfg, const token_batch& tokens,
                                                     const token_batch& segments, const forward_options& o = {}) const {
    return hax::rearrange<axes<Batch, Pos, Vocab>>(embeddings.token_embeddings.unembed(activations(cfg, tokens, segments, o)));
  }
};

/// Upstream `compute_next_token_loss` (mean over the kept tokens): targets are the tokens rolled by one,
/// the loss mask drops the last position (and ignored ids), optional z-loss, and the fused blockwise
/// cross-entropy when `cross_entropy_block_size` is set.
inline named_array<float, axes<>> next_token_loss(const LMHeadModel& m, const Gpt2Config& cfg, const lm_example& ex,
                                                  double z_loss_weight = 0.0, const forward_options& o = {}) {
  auto h = m.activations(cfg, ex.tokens, ex.segment_ids, o);
  auto targets = hax::roll(ex.tokens, -1, Pos);
  const hax::where_mask keep{ex.loss_mask};
  if (cfg.cross_entropy_block_size)
    return nn::blockwise_cross_entropy_loss(h, m.embeddings.token_embeddings.weight, Embed, Vocab, targets, keep,
                                            *cfg.cross_entropy_block_size, nn::reduce_mean, z_loss_weight);
  auto logits = m.embeddings.token_embeddings.unembed(h);
  return nn::cross_entropy_loss(logits, Vocab, targets, keep, nn::reduce_mean, z_loss_weight);
}

}  // namespace gpt2
}  // namespace levanter
