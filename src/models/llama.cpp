// The Llama family (levanter/models/llama.hpp): init and the forward pass to hidden states, compiled once for every
// program and test that uses the model. The attention of a layer is in llama_attention.cpp.
#include <stdexcept>
#include <string>

#include <haliax/haliax.hpp>
#include <levanter/models/llama.hpp>

namespace levanter::llama {

namespace {

/// upstream `config.mk_LayerNorm`: an RmsNorm with a weight when use_layer_norm_weight, a bias when use_bias;
/// Gemma's scales by (1 + weight), the weight starting at 0.
template <class Norm, class A>
Norm make_norm(const LlamaConfig& cfg, A axis) {
  return Norm::init(axis, cfg.layer_norm_epsilon, cfg.use_layer_norm_weight, cfg.use_bias, cfg.unit_offset_norms());
}

}  // namespace

LMHeadModel LMHeadModel::init(const LlamaConfig& cfg, std::int64_t vocab, hax::random::key key) {
  check(cfg, vocab);
  auto k = hax::random::split(key, 2);  // transformer, embeddings (and the untied head)
  LMHeadModel m;
  const auto E = cfg.hidden_dim * Embed;
  const auto D = cfg.head_size() * HeadSize;
  const auto KV = cfg.num_kv_heads * KVHeads;
  const auto G = cfg.q_heads_per_group() * QHeadsPerGroup;
  using L = DecoderLayer<>;
  m.transformer.layers = Transformer::layers_t::init(cfg.num_layers * Layers, k[0], [&](hax::random::key kl) {
    auto kb = hax::random::split(kl, 2);  // attention, mlp
    L b;
    auto ka = hax::random::split(kb[0], 4);
    using A = Attention<>;
    b.self_attn.q_proj = A::q_proj_t::init(ka[0], E, KV, G, D, cfg.qkv_bias());
    b.self_attn.k_proj = A::kv_proj_t::init(ka[1], E, KV, D, cfg.qkv_bias());
    b.self_attn.v_proj = A::kv_proj_t::init(ka[2], E, KV, D, cfg.qkv_bias());
    b.self_attn.o_proj = A::o_proj_t::init(ka[3], cfg.num_heads * Heads, D, E, cfg.o_bias());
    if (cfg.qk_norm()) {
      b.self_attn.q_norm = make_norm<A::qk_norm_t>(cfg, D);
      b.self_attn.k_norm = make_norm<A::qk_norm_t>(cfg, D);
    }
    if (cfg.projection_qk_norm()) {
      b.self_attn.q_proj_norm = make_norm<A::q_proj_norm_t>(cfg, cfg.num_heads * cfg.head_size() * QFeatures);
      b.self_attn.k_proj_norm = make_norm<A::k_proj_norm_t>(cfg, cfg.num_kv_heads * cfg.head_size() * KFeatures);
    }
    auto km = hax::random::split(kb[1], 3);
    const auto F = cfg.intermediate_dim * levanter::Mlp;
    b.mlp.gate_proj = LlamaMlp<>::in_t::init(km[0], E, F, cfg.use_bias);
    b.mlp.up_proj = LlamaMlp<>::in_t::init(km[1], E, F, cfg.use_bias);
    b.mlp.down_proj = LlamaMlp<>::out_t::init(km[2], F, E, cfg.use_bias);
    if (!cfg.post_norms_only()) b.input_layernorm = make_norm<L::norm_t>(cfg, E);
    b.post_attention_layernorm = make_norm<L::norm_t>(cfg, E);
    if (cfg.post_norms_only()) b.post_feedforward_layernorm = make_norm<L::norm_t>(cfg, E);
    if (cfg.hybrid_norm) {
      b.post_attn_layernorm = make_norm<L::norm_t>(cfg, E);
      b.post_mlp_layernorm = make_norm<L::norm_t>(cfg, E);
    }
    if (cfg.sandwich_norms()) {
      b.pre_feedforward_layernorm = make_norm<L::norm_t>(cfg, E);
      b.post_feedforward_layernorm = make_norm<L::norm_t>(cfg, E);
    }
    return b;
  });
  m.transformer.norm = make_norm<nn::RmsNorm<Embed>>(cfg, E);
  m.embeddings.token_embeddings = nn::Embedding<Vocab, Embed>::init(k[1], vocab * Vocab, E);
  if (cfg.input_embedding_norm) m.embeddings.norm = make_norm<nn::RmsNorm<Embed>>(cfg, E);
  if (!cfg.tied()) m.lm_head = head_t::init(k[1], E, vocab * Vocab, false);
  return m;
}

void LMHeadModel::check(const LlamaConfig& cfg, std::int64_t vocab) {
  const std::string who(family_type_name(cfg.family));
  auto fail = [&](const std::string& m) { throw std::invalid_argument(who + ": " + m); };
  if (cfg.hidden_dim <= 0 || cfg.num_heads <= 0 || cfg.num_kv_heads <= 0 || cfg.num_layers <= 0 || cfg.seq_len <= 0 ||
      cfg.intermediate_dim <= 0)
    fail("seq_len, hidden_dim, intermediate_dim, num_layers, num_heads and num_kv_heads must be positive");
  if (cfg.num_heads % cfg.num_kv_heads != 0)
    fail("num_heads " + std::to_string(cfg.num_heads) + " is not divisible by num_kv_heads " +
         std::to_string(cfg.num_kv_heads));
  if (!cfg.head_dim && cfg.hidden_dim % cfg.num_heads != 0)
    fail("hidden_dim " + std::to_string(cfg.hidden_dim) + " is not divisible by num_heads " +
         std::to_string(cfg.num_heads) + " (set head_dim)");
  if (cfg.head_size() <= 0 || cfg.head_size() % 2 != 0)
    fail("the head size " + std::to_string(cfg.head_size()) + " must be positive and even (rotary embeddings)");
  if (vocab <= 0) fail("the vocabulary must not be empty");
}

hidden LMHeadModel::activations(const LlamaConfig& cfg, const token_batch& tokens, const token_batch& segments,
                                const forward_options& o) const {
  const auto n = tokens.size(Pos);
  if (n > cfg.seq_len)
    throw std::invalid_argument(std::string(family_type_name(cfg.family)) + ": sequence of " + std::to_string(n) +
                                " tokens is longer than seq_len " + std::to_string(cfg.seq_len));
  hidden x = embeddings.token_embeddings.embed(tokens);
  if (cfg.gemma()) x = x * cfg.embedding_scale();
  if (embeddings.norm) x = (*embeddings.norm)(x);
  x = transformer.layers.fold(
      x,
      [&cfg, &segments](const DecoderLayer<>& b, const hidden& h, std::int64_t i) -> hidden {
        const auto mlp = [&](const hidden& u) {
          return b.mlp.down_proj(
              nn::apply_activation(nn::activation_from_name(cfg.activation_function), b.mlp.gate_proj(u)) *
              b.mlp.up_proj(u));
        };
        if (!b.input_layernorm) {  // OLMo 2: the norms follow the sublayers
          const hidden h2 = h + b.post_attention_layernorm(attention(b.self_attn, cfg, h, segments, i));
          return h2 + (*b.post_feedforward_layernorm)(mlp(h2));
        }
        hidden a = attention(b.self_attn, cfg, (*b.input_layernorm)(h), segments, i);
        if (b.pre_feedforward_layernorm) {  // Gemma 2 and 3
          const hidden h2 = h + b.post_attention_layernorm(a);
          return h2 + (*b.post_feedforward_layernorm)(mlp((*b.pre_feedforward_layernorm)(h2)));
        }
        if (b.post_attn_layernorm) a = (*b.post_attn_layernorm)(a);
        hidden h2 = h + a;
        hidden f = mlp(b.post_attention_layernorm(h2));
        if (b.post_mlp_layernorm) f = (*b.post_mlp_layernorm)(f);
        return h2 + f;
      },
      o.checkpointing);
  return transformer.norm(x);
}

}  // namespace levanter::llama
