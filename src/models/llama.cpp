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

hidden sparse_moe(const SparseMoeBlock<>& m, const LlamaConfig& cfg, const hidden& x, std::int64_t layer,
                  lm_aux* aux) {
  const auto B = x.size(Batch) * Batch;
  const auto P = x.size(Pos) * Pos;
  const auto xf = hax::flatten_axes<axes<Batch, Pos>>(x, Token);  // {token, embed}
  const auto r = layers::route(m.gate(xf), cfg.num_experts_per_tok, cfg.lbl_coef, cfg.rzl_coef);
  if (aux) aux->set(layer, cfg.num_layers, r.load_balancing, r.router_z, r.loads);
  const auto xs = hax::take(xf, Token, r.token_of_row);  // {token_repeat, embed}, sorted by expert
  const auto act = nn::activation_from_name(cfg.activation_function);
  const auto& e = m.experts;
  const auto hs = nn::apply_activation(act, e.w1(xs, r.group_sizes)) * e.w3(xs, r.group_sizes);
  const auto ys = e.w2(hs, r.group_sizes);                 // {token_repeat, embed}
  const auto yt = hax::take(ys, TokenRepeat, r.row_of);   // {token, top_experts, embed}
  const auto y = hax::sum(yt * r.weights, TopExperts);    // {token, embed}
  return hax::unflatten_axis(y, Token, B, P);
}

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
    const auto F = cfg.intermediate_dim * levanter::Mlp;
    const auto make_mlp = [&](hax::random::key key, hax::sized_axis<std::remove_cvref_t<decltype(levanter::Mlp)>> width) {
      auto km = hax::random::split(key, 3);
      LlamaMlp<> mlp;
      mlp.gate_proj = LlamaMlp<>::in_t::init(km[0], E, width, cfg.use_bias);
      mlp.up_proj = LlamaMlp<>::in_t::init(km[1], E, width, cfg.use_bias);
      mlp.down_proj = LlamaMlp<>::out_t::init(km[2], width, E, cfg.use_bias);
      return mlp;
    };
    if (cfg.moe()) {  // upstream MixtralDecoderLayer: keys (attention, moe, shared mlp); moe -> (gate, experts)
      auto km = hax::random::split(kb[1], 3);
      SparseMoeBlock<> moe;
      const auto X = cfg.n_routed_experts * Experts;
      moe.gate = SparseMoeBlock<>::gate_t::init(km[0], E, X, false);
      auto kx = hax::random::split(km[1], 3);
      moe.experts.w1 = MoeMlp<>::in_t::init(kx[0], X, E, F);
      moe.experts.w2 = MoeMlp<>::out_t::init(kx[1], X, F, E);
      moe.experts.w3 = MoeMlp<>::in_t::init(kx[2], X, E, F);
      b.block_sparse_moe = std::move(moe);
      if (cfg.n_shared_experts > 0)
        b.shared_mlp = make_mlp(km[2], std::int64_t(cfg.n_shared_experts) * cfg.intermediate_dim * levanter::Mlp);
    } else {
      b.mlp = make_mlp(kb[1], F);
    }
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
  if (o.cache)  // decoding: row r's tokens are positions cache->length(r), ... (each row at its own length)
    o.cache->begin(tokens.size(Batch), n, cfg.seq_len, std::string(family_type_name(cfg.family)));
  else if (n > cfg.seq_len)
    throw std::invalid_argument(std::string(family_type_name(cfg.family)) + ": sequence of " + std::to_string(n) +
                                " tokens is longer than seq_len " + std::to_string(cfg.seq_len));
  hidden x = embeddings.token_embeddings.embed(tokens);
  if (cfg.family->scaled_embeddings) x = x * cfg.embedding_scale();
  if (embeddings.norm) x = (*embeddings.norm)(x);
  x = transformer.layers.fold(
      x,
      [&cfg, &segments, aux = o.aux, cache = o.cache](const DecoderLayer<>& b, const hidden& h,
                                                      std::int64_t i) -> hidden {
        const auto act = nn::activation_from_name(cfg.activation_function);
        const auto swiglu = [&](const LlamaMlp<>& m, const hidden& u) {
          return m.down_proj(nn::apply_activation(act, m.gate_proj(u)) * m.up_proj(u));
        };
        const auto mlp = [&](const hidden& u) -> hidden {
          if (!b.block_sparse_moe) return swiglu(*b.mlp, u);
          hidden y = sparse_moe(*b.block_sparse_moe, cfg, u, i, aux.get());
          if (b.shared_mlp) y = y + swiglu(*b.shared_mlp, u);
          return y;
        };
        if (!b.input_layernorm) {  // OLMo 2: the norms follow the sublayers
          const hidden h2 = h + b.post_attention_layernorm(attention(b.self_attn, cfg, h, segments, i, cache));
          return h2 + (*b.post_feedforward_layernorm)(mlp(h2));
        }
        hidden a = attention(b.self_attn, cfg, (*b.input_layernorm)(h), segments, i, cache);
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
  if (o.cache) o.cache->advance(n);
  return transformer.norm(x);
}

}  // namespace levanter::llama
