// GPT-2 (levanter/models/gpt2.hpp): init and the forward pass to hidden states, compiled once for every program
// and test that uses the model. The attention of a block is in gpt2_attention.cpp.
#include <cmath>
#include <stdexcept>
#include <string>

#include <haliax/haliax.hpp>
#include <levanter/models/gpt2.hpp>

namespace levanter::gpt2 {

/// Upstream init: Linear weights truncated_normal(-3, 3) / sqrt(fan_in) with zero biases, LayerNorms at 1/0,
/// token embeddings normal * initializer_range, positions normal * initializer_range / 2. Keys are split as
/// upstream (model → transformer/embeddings → per-layer keys → attention/MLP).
LMHeadModel LMHeadModel::init(const Gpt2Config& cfg, std::int64_t vocab, hax::random::key key) {
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
void LMHeadModel::check(const Gpt2Config& cfg, std::int64_t vocab) {
  auto fail = [](const std::string& m) { throw std::invalid_argument("gpt2: " + m); };
  if (cfg.hidden_dim <= 0 || cfg.num_heads <= 0 || cfg.num_layers <= 0 || cfg.seq_len <= 0 || cfg.mlp_scale <= 0)
    fail("seq_len, hidden_dim, num_layers, num_heads and mlp_scale must be positive");
  if (cfg.hidden_dim % cfg.num_heads != 0)
    fail("hidden_dim " + std::to_string(cfg.hidden_dim) + " is not divisible by num_heads " +
         std::to_string(cfg.num_heads));
  if (vocab <= 0) fail("the vocabulary must not be empty");
}

/// Hidden states {batch, position, embed} after the final LayerNorm (upstream `activations`).
hidden LMHeadModel::activations(const Gpt2Config& cfg, const token_batch& tokens, const token_batch& segments,
                                const forward_options& o) const {
  const auto n = tokens.size(Pos);
  const auto& wpe = embeddings.position_embeddings.weight;
  hidden x = embeddings.token_embeddings.embed(tokens);
  if (o.cache) {  // decoding: row r's tokens are positions cache->length(r), ... (each row at its own length)
    o.cache->begin(tokens.size(Batch), n, cfg.seq_len, "gpt2");
    const auto rows = tokens.size(Batch);
    std::vector<hidden> parts;
    for (std::int64_t r = 0; r < rows; ++r)
      parts.push_back(hax::slice(x, Batch, r, 1) + hax::slice(wpe, Pos, o.cache->length(r), n));
    x = rows == 1 ? parts.front() : hax::concatenate(Batch, parts);
  } else {
    if (n > cfg.seq_len)
      throw std::invalid_argument("gpt2: sequence of " + std::to_string(n) + " tokens is longer than seq_len " +
                                  std::to_string(cfg.seq_len) + " (the learned position embeddings end there)");
    x = x + (n == cfg.seq_len ? wpe : hax::slice(wpe, Pos, 0, n));
  }
  if (!o.inference && cfg.embed_pdrop > 0) x = nn::Dropout{cfg.embed_pdrop}(x, hax::random::fold_in(o.key, 0), false);
  const nn::Dropout resid{cfg.resid_pdrop};
  const bool resid_drop = !o.inference && cfg.resid_pdrop > 0;
  x = transformer.blocks.fold(
      x,
      // `o` by value: gradient checkpointing runs this again in the backward pass, after this call returned.
      [&cfg, &segments, o, resid, resid_drop](const Block<>& b, const hidden& h, std::int64_t i) -> hidden {
        const auto kl = hax::random::fold_in(o.key, i + 1);
        hidden a = attention(b.attn, cfg, b.ln_1(h), segments, i, o);
        if (resid_drop) a = resid(a, hax::random::fold_in(kl, 2), false);
        hidden h2 = h + a;
        hidden f = b.mlp(b.ln_2(h2));
        if (resid_drop) f = resid(f, hax::random::fold_in(kl, 3), false);
        return h2 + f;
      },
      o.checkpointing);
  if (o.cache) o.cache->advance(n);
  return transformer.ln_f(x);
}

}  // namespace levanter::gpt2
