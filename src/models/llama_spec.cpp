// models/llama_config.hpp: the Llama family's names, counts and RoPE description (what a training step needs of the
// config; its checks and YAML are in llama_config.cpp).
#include <levanter/models/llama_config.hpp>

#include <string>
#include <variant>

namespace levanter {

haliax::nn::rope_spec rope_spec_of(const RopeChoice& r) {
  namespace nn = haliax::nn;
  return std::visit(
      [](const auto& c) {
        using C = std::decay_t<decltype(c)>;
        nn::rope_spec s;
        s.theta = c.theta;
        s.factor = c.factor;
        if constexpr (std::is_same_v<C, Llama3RopeConfig>) {
          s.kind = nn::rope_kind::llama3;
          s.low_freq_factor = c.low_freq_factor;
          s.high_freq_factor = c.high_freq_factor;
          s.original_max_position_embeddings = c.original_max_position_embeddings;
        } else if constexpr (std::is_same_v<C, YarnRopeConfig>) {
          s.kind = nn::rope_kind::yarn;
          s.beta_fast = c.beta_fast;
          s.beta_slow = c.beta_slow;
          s.original_max_position_embeddings = c.original_max_position_embeddings;
          s.mscale = c.mscale;
        }
        return s;
      },
      r.value);
}

RopeChoice LlamaConfig::rope_of_layer(std::int64_t i) const {
  if (family->local_rope && local_layer(i)) {
    RopeChoice r;
    r.value = DefaultRopeConfig{rope_local_base_freq, 1.0};
    return r;
  }
  return rope;
}

std::int64_t LlamaConfig::parameter_count(std::int64_t vocab) const {
  const std::int64_t E = hidden_dim, M = intermediate_dim, D = head_size(), H = num_heads, K = num_kv_heads;
  const std::int64_t norm = (use_layer_norm_weight ? E : 0) + (use_bias ? E : 0);
  std::int64_t attn = E * D * H + 2 * E * D * K + D * H * E;
  if (qkv_bias()) attn += D * H + 2 * D * K;
  if (o_bias()) attn += E;
  if (qk_norm()) attn += 2 * ((use_layer_norm_weight ? D : 0) + (use_bias ? D : 0));
  // OLMo 2: over all query and all key features (upstream counts 2 x hidden_dim, which is this for MHA)
  if (projection_qk_norm()) attn += (H + K) * ((use_layer_norm_weight ? D : 0) + (use_bias ? D : 0));
  std::int64_t mlp = 3 * E * M + (use_bias ? 2 * M + E : 0);
  // Mixtral: the router, the routed experts and the shared ones (upstream total_trainable_params)
  if (moe()) mlp = E * n_routed_experts + 3 * std::int64_t(n_routed_experts + n_shared_experts) * E * M;
  std::int64_t layer = attn + mlp + 2 * norm + (hybrid_norm || sandwich_norms() ? 2 * norm : 0);
  std::int64_t total = num_layers * layer + norm + (input_embedding_norm ? norm : 0) + vocab * E;
  if (!tied()) total += vocab * E;
  return total;
}

double LlamaConfig::flops_per_token(std::int64_t vocab) const {
  // Upstream counts Mistral with glu=False and num_kv_heads = num_heads, and Gemma with glu=False.
  const bool no_glu = family->flops_without_glu;
  const double E = hidden_dim, M = intermediate_dim, L = num_layers, S = seq_len, H = num_heads;
  const double K = family->flops_kv_as_heads ? H : num_kv_heads;
  const double D = E / H;  // upstream uses hidden_dim / num_heads here even when head_dim is set
  // Mixtral: each token runs num_experts_per_tok routed experts and the shared ones, plus the router (upstream
  // lm_flops_per_token with num_experts)
  const double mlp = moe() ? 2.0 * 3 * E * M * (num_experts_per_tok + n_shared_experts) + 2.0 * E * n_routed_experts
                           : 2.0 * (no_glu ? 2 : 3) * E * M;
  const double qkv = 2.0 * E * (H * D + 2 * K * D);
  const double dense = 2.0 * E * E;
  const double attn = (2.0 * S * S * H * D + 3.0 * S * S * H + 2.0 * S * S * D * H) / S;
  return L * (mlp + qkv + dense + attn) + 2.0 * E * double(vocab);
}

std::vector<matmul_shape> LlamaConfig::matmul_shapes(std::int64_t vocab) const {
  const std::int64_t E = hidden_dim, M = intermediate_dim, D = head_size(), H = num_heads, K = num_kv_heads;
  const double L = num_layers;
  if (moe()) {  // per expert, the rows routed to it on average: the shape of one expert's product is not fixed
    const double active = num_experts_per_tok + n_shared_experts;
    return {{H * D, E, L}, {K * D, E, 2 * L}, {E, H * D, L}, {M, E, 2 * L * active}, {E, M, L * active},
            {n_routed_experts, E, L}, {vocab, E, 1}};
  }
  return {{H * D, E, L}, {K * D, E, 2 * L}, {E, H * D, L}, {M, E, 2 * L}, {E, M, L}, {vocab, E, 1}};
}

}  // namespace levanter
