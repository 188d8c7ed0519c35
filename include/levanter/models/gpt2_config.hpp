// levanter/models/gpt2_config.hpp: `model: {type: gpt2, ...}`, upstream's Gpt2Config with its keys and defaults.
#pragma once

#include <tuple>
#include <vector>

#include <levanter/config/section.hpp>
#include <levanter/config/types.hpp>
#include <levanter/models/matmul_shape.hpp>

namespace levanter::config {
struct validator;
}  // namespace levanter::config

namespace levanter {

struct Gpt2Config {
  static constexpr std::string_view type_name = "gpt2";

  int seq_len = 1024;
  int hidden_dim = 768;
  int num_layers = 12;
  int num_heads = 12;
  int mlp_scale = 4;
  double initializer_range = 0.02;
  double embed_pdrop = 0.0;
  double resid_pdrop = 0.0;
  double attn_pdrop = 0.0;
  double layer_norm_epsilon = 1e-5;
  std::string activation_function = "gelu_new";
  bool scale_attn_by_inverse_layer_idx = false;
  bool upcast_attn = false;
  bool gradient_checkpointing = true;
  bool use_bias = true;
  std::optional<bool> use_flash_attention;
  std::optional<std::string> attn_backend;
  std::optional<int> flash_attention_block_size;
  std::optional<int> cross_entropy_block_size;

  int head_size() const { return hidden_dim / num_heads; }
  int mlp_dim() const { return hidden_dim * mlp_scale; }

  /// Parameters of the model with a vocabulary of `vocab` tokens (tied head counted once), as upstream.
  int64_t parameter_count(int64_t vocab) const {
    const int64_t E = hidden_dim, M = mlp_dim(), L = num_layers;
    const int64_t b = use_bias ? 1 : 0;
    const int64_t per_layer = 2 * 2 * E                // ln_1, ln_2 (weight + bias)
                              + E * 3 * E + b * 3 * E  // c_attn
                              + E * E + b * E          // attn c_proj
                              + E * M + b * M          // c_fc
                              + M * E + b * E;         // mlp c_proj
    return vocab * E + int64_t(seq_len) * E + L * per_layer + 2 * E;
  }

  /// The forward pass's matrix products (c_attn, attention c_proj, c_fc, mlp c_proj per layer; the tied LM head).
  std::vector<matmul_shape> matmul_shapes(int64_t vocab) const {
    const int64_t E = hidden_dim, M = mlp_dim();
    const double L = num_layers;
    return {{3 * E, E, L}, {E, E, L}, {M, E, L}, {E, M, L}, {vocab, E, 1}};
  }

  /// Forward FLOPs per token (a multiply-add counts 2) as upstream `lm_flops_per_token` (glu=False): the
  /// projections, the full attention map over seq_len (scores, mask, weighted values), and the LM head.
  double flops_per_token(int64_t vocab) const {
    const double E = hidden_dim, M = mlp_dim(), L = num_layers, S = seq_len, H = num_heads;
    const double D = E / H;
    const double mlp = 2.0 * 2 * E * M;
    const double qkv = 2.0 * E * (H * D + 2 * H * D);
    const double dense = 2.0 * E * E;
    const double attn = (2.0 * S * S * H * D + 3.0 * S * S * H + 2.0 * S * S * D * H) / S;
    return L * (mlp + qkv + dense + attn) + 2.0 * E * double(vocab);
  }
};

/// Adds every problem of `model: {type: gpt2}` to `v` (keys under `model.`).
void validate(config::validator& v, const Gpt2Config& m);

}  // namespace levanter

template <>
struct levanter::config::schema<levanter::Gpt2Config> {
  using T = levanter::Gpt2Config;
  static constexpr auto fields = std::make_tuple(
      field("seq_len", &T::seq_len, "context length (the position axis)"),
      field("hidden_dim", &T::hidden_dim, "width of the residual stream (embed axis)"),
      field("num_layers", &T::num_layers, "number of transformer blocks"),
      field("num_heads", &T::num_heads, "attention heads; hidden_dim must divide by it"),
      field("mlp_scale", &T::mlp_scale, "MLP width as a multiple of hidden_dim"),
      field("initializer_range", &T::initializer_range, "standard deviation of the normal init of embeddings and projections"),
      field("embed_pdrop", &T::embed_pdrop, "dropout on the embeddings"),
      field("resid_pdrop", &T::resid_pdrop, "dropout on each residual branch"),
      field("attn_pdrop", &T::attn_pdrop, "dropout on attention weights"),
      field("layer_norm_epsilon", &T::layer_norm_epsilon, "LayerNorm epsilon"),
      field("activation_function", &T::activation_function, "MLP activation (gelu_new, gelu, relu, silu, quick_gelu, ...)"),
      field("scale_attn_by_inverse_layer_idx", &T::scale_attn_by_inverse_layer_idx, "divide attention scores by (layer index + 1)"),
      field("upcast_attn", &T::upcast_attn, "compute attention scores in f32 under mixed precision"),
      field("gradient_checkpointing", &T::gradient_checkpointing, "recompute each block in the backward pass (saves memory)"),
      field("use_bias", &T::use_bias, "biases in the linear layers"),
      field("use_flash_attention", &T::use_flash_attention, "deprecated upstream switch; blocked attention is always used here"),
      field("attn_backend", &T::attn_backend, "attention kernel: default/jax_flash (blocked) or vanilla (plain softmax)"),
      field("flash_attention_block_size", &T::flash_attention_block_size, "block size of the blocked (flash) attention"),
      field("cross_entropy_block_size", &T::cross_entropy_block_size, "vocabulary block of the fused LM-head cross-entropy (unset: plain)"));
};

// The YAML machinery of this section is compiled once, in src/models/gpt2_config.cpp.
LEVANTER_CONFIG_SECTION_EXTERN(levanter::Gpt2Config)
