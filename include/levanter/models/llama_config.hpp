// levanter/models/llama_config.hpp: the Llama family's `model:` sections, upstream's LlamaConfig (`type: llama`),
// MistralConfig (`type: mistral`), QwenConfig (`type: qwen`, Qwen2) and Qwen3Config (`type: qwen3`), with their
// keys and defaults, and the `rope:` choice (upstream `RotaryEmbeddingsConfig`: default, linear, llama3, yarn).
//
// The four are one architecture (llama::LMHeadModel): RMSNorm pre-norm blocks, SwiGLU MLP, RoPE, grouped-query
// attention. What differs is recorded in `family` and read by the model and its Hugging Face adapter:
//   mistral  sliding-window attention on every layer (sliding_window, default 4096); the LM head is never tied
//   qwen     bias on the q/k/v projections, none on o_proj; with use_sliding_window, a window on the layers from
//            max_window_layers on
//   qwen3    RMSNorm of each query and key head (QK norm); the same sliding-window keys as qwen
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <haliax/nn/rotary.hpp>
#include <levanter/config/section.hpp>
#include <levanter/config/types.hpp>
#include <levanter/models/matmul_shape.hpp>

namespace levanter::config {
struct validator;
}  // namespace levanter::config

namespace levanter {

// ---- rope: ------------------------------------------------------------------------------------------------

/// `rope: {type: default}` (upstream DefaultRotaryEmbeddingsConfig): theta, and `factor` dividing the frequencies.
struct DefaultRopeConfig {
  static constexpr std::string_view type_name = "default";
  double theta = 10000.0;
  double factor = 1.0;
};
/// `rope: {type: linear}`: upstream registers the same class as `default` under this name.
struct LinearRopeConfig {
  static constexpr std::string_view type_name = "linear";
  double theta = 10000.0;
  double factor = 1.0;
};
/// `rope: {type: llama3}` (Llama 3.1 frequency scaling).
struct Llama3RopeConfig {
  static constexpr std::string_view type_name = "llama3";
  double theta = 500000.0;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
};
/// `rope: {type: yarn}` (YaRN; frequencies and attention factor as transformers computes them).
struct YarnRopeConfig {
  static constexpr std::string_view type_name = "yarn";
  double theta = 10000.0;
  double factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int original_max_position_embeddings = 2048;
  double mscale = 1.0;
};

using RopeChoice = config::Choice<DefaultRopeConfig, LinearRopeConfig, Llama3RopeConfig, YarnRopeConfig>;

/// The haliax RoPE description of a `rope:` section.
haliax::nn::rope_spec rope_spec_of(const RopeChoice& r);

// ---- model: -----------------------------------------------------------------------------------------------

/// Which member of the family a config describes (see the header comment).
enum class llama_family { llama, mistral, qwen2, qwen3 };

/// `model: {type: llama, ...}`, upstream LlamaConfig; the base of the other three.
struct LlamaConfig {
  static constexpr std::string_view type_name = "llama";
  static constexpr std::string_view hf_model_type = "llama";
  llama_family family = llama_family::llama;

  int seq_len = 2048;
  int hidden_dim = 4096;
  int intermediate_dim = 11008;
  int num_layers = 32;
  int num_heads = 32;
  std::optional<int> head_dim;
  int num_kv_heads = 32;
  std::string activation_function = "silu";
  double initializer_range = 0.02;
  double layer_norm_epsilon = 1e-5;
  bool tie_word_embeddings = false;
  bool hybrid_norm = false;
  bool input_embedding_norm = false;
  bool upcast_attn = false;
  std::optional<std::string> attn_backend;
  std::optional<int> flash_attention_block_size;
  bool gradient_checkpointing = true;
  bool scan_layers = true;
  bool use_bias = false;
  bool use_layer_norm_weight = true;
  bool use_qk_norm = false;
  RopeChoice rope;
  std::string reference_checkpoint = "NousResearch/Llama-2-7b-hf";
  std::optional<std::string> tokenizer;
  std::optional<int> cross_entropy_block_size;
  // sliding windows (mistral: sliding_window on every layer; qwen/qwen3: use_sliding_window from max_window_layers)
  bool use_sliding_window = false;
  std::optional<int> sliding_window;
  int max_window_layers = 0;

  /// The head size: head_dim when set, else hidden_dim / num_heads.
  int head_size() const { return head_dim ? *head_dim : (num_heads > 0 ? hidden_dim / num_heads : 0); }
  /// Query heads per key/value head.
  int q_heads_per_group() const { return num_kv_heads > 0 ? num_heads / num_kv_heads : 0; }
  /// Whether the q/k/v projections and o_proj have biases.
  bool qkv_bias() const { return family == llama_family::qwen2 || use_bias; }
  bool o_bias() const { return family != llama_family::qwen2 && use_bias; }
  /// Whether queries and keys are RMS-normalised per head.
  bool qk_norm() const { return family == llama_family::qwen3 || use_qk_norm; }
  /// Whether the LM head is the token embedding table.
  bool tied() const { return family != llama_family::mistral && tie_word_embeddings; }
  /// The sliding window of layer `i` (0 for full causal attention).
  std::int64_t window_of_layer(std::int64_t i) const {
    if (!sliding_window) return 0;
    if (family == llama_family::mistral) return *sliding_window;
    if ((family == llama_family::qwen2 || family == llama_family::qwen3) && use_sliding_window &&
        i >= max_window_layers)
      return *sliding_window;
    return 0;
  }

  /// Parameters with a vocabulary of `vocab` tokens, as upstream `total_trainable_params` (plus the biases and
  /// QK norms the variants have).
  std::int64_t parameter_count(std::int64_t vocab) const;

  /// Forward FLOPs per token as upstream `lm_flops_per_token` (glu=True; Mistral upstream counts glu=False and
  /// num_kv_heads = num_heads, which we follow for that type).
  double flops_per_token(std::int64_t vocab) const;

  /// The forward pass's matrix products: q, k, v and o, gate, up and down per layer, and the LM head.
  std::vector<matmul_shape> matmul_shapes(std::int64_t vocab) const;
};

/// `model: {type: mistral}` (upstream MistralConfig's defaults).
struct MistralConfig : LlamaConfig {
  static constexpr std::string_view type_name = "mistral";
  static constexpr std::string_view hf_model_type = "mistral";
  MistralConfig() {
    family = llama_family::mistral;
    seq_len = 8192;
    intermediate_dim = 14336;
    num_kv_heads = 8;
    layer_norm_epsilon = 1e-6;
    sliding_window = 4096;
    reference_checkpoint = "mistralai/Mistral-7B-v0.1";
  }
};

/// `model: {type: qwen}` (Qwen2; upstream QwenConfig).
struct QwenConfig : LlamaConfig {
  static constexpr std::string_view type_name = "qwen";
  static constexpr std::string_view hf_model_type = "qwen2";
  QwenConfig() { family = llama_family::qwen2; }
};

/// `model: {type: qwen3}` (upstream Qwen3Config).
struct Qwen3Config : LlamaConfig {
  static constexpr std::string_view type_name = "qwen3";
  static constexpr std::string_view hf_model_type = "qwen3";
  Qwen3Config() {
    family = llama_family::qwen3;
    sliding_window = 4096;
  }
};

/// Adds every problem of a Llama-family `model:` section to `v` (keys under `model.`).
void validate(config::validator& v, const LlamaConfig& m);

/// The `type:` name of a family member.
std::string_view family_type_name(llama_family f);

}  // namespace levanter

// ---- schemas ----------------------------------------------------------------------------------------------

template <>
struct levanter::config::schema<levanter::DefaultRopeConfig> {
  using T = levanter::DefaultRopeConfig;
  static constexpr auto fields = std::make_tuple(field("theta", &T::theta, "RoPE base"),
                                                 field("factor", &T::factor, "frequencies divided by this factor"));
};
template <>
struct levanter::config::schema<levanter::LinearRopeConfig> {
  using T = levanter::LinearRopeConfig;
  static constexpr auto fields = std::make_tuple(field("theta", &T::theta, "RoPE base"),
                                                 field("factor", &T::factor, "positions divided by this factor"));
};
template <>
struct levanter::config::schema<levanter::Llama3RopeConfig> {
  using T = levanter::Llama3RopeConfig;
  static constexpr auto fields = std::make_tuple(
      field("theta", &T::theta, "RoPE base"), field("factor", &T::factor, "scaling of the low frequencies"),
      field("low_freq_factor", &T::low_freq_factor, "wavelengths above original / this are scaled"),
      field("high_freq_factor", &T::high_freq_factor, "wavelengths below original / this are kept"),
      field("original_max_position_embeddings", &T::original_max_position_embeddings,
            "context length the model was pretrained with"));
};
template <>
struct levanter::config::schema<levanter::YarnRopeConfig> {
  using T = levanter::YarnRopeConfig;
  static constexpr auto fields = std::make_tuple(
      field("theta", &T::theta, "RoPE base"), field("factor", &T::factor, "context extension factor"),
      field("beta_fast", &T::beta_fast, "rotations bounding the extrapolated dimensions"),
      field("beta_slow", &T::beta_slow, "rotations bounding the interpolated dimensions"),
      field("original_max_position_embeddings", &T::original_max_position_embeddings,
            "context length the model was pretrained with"),
      field("mscale", &T::mscale, "attention temperature: cos/sin scaled by 0.1 * mscale * ln(factor) + 1"));
};

#define LEVANTER_LLAMA_COMMON_FIELDS_(T)                                                                           \
  field("seq_len", &T::seq_len, "context length (the position axis)"),                                             \
      field("hidden_dim", &T::hidden_dim, "width of the residual stream (embed axis)"),                            \
      field("intermediate_dim", &T::intermediate_dim, "width of the SwiGLU MLP (mlp axis)"),                       \
      field("num_layers", &T::num_layers, "number of decoder layers"),                                             \
      field("num_heads", &T::num_heads, "query heads"),                                                            \
      field("head_dim", &T::head_dim, "head size (default hidden_dim / num_heads)"),                               \
      field("num_kv_heads", &T::num_kv_heads, "key/value heads: num_heads for MHA, 1 for MQA, else GQA"),          \
      field("activation_function", &T::activation_function, "MLP gate activation (silu, gelu_new, ...)"),          \
      field("initializer_range", &T::initializer_range, "kept for Hugging Face config.json (init is upstream's)"), \
      field("layer_norm_epsilon", &T::layer_norm_epsilon, "RMSNorm epsilon"),                                      \
      field("tie_word_embeddings", &T::tie_word_embeddings, "LM head tied to the token embeddings"),               \
      field("hybrid_norm", &T::hybrid_norm, "extra RMSNorms after attention and after the MLP"),                   \
      field("input_embedding_norm", &T::input_embedding_norm, "RMSNorm after the token embeddings"),               \
      field("upcast_attn", &T::upcast_attn, "attention scores in f32 under mixed precision"),                      \
      field("attn_backend", &T::attn_backend, "attention kernel: default/jax_flash (blocked) or vanilla (plain)"), \
      field("flash_attention_block_size", &T::flash_attention_block_size, "block size of the blocked attention"),  \
      field("gradient_checkpointing", &T::gradient_checkpointing, "recompute each layer in the backward pass"),    \
      field("scan_layers", &T::scan_layers, "layers stacked along one axis (the only layout here)"),               \
      field("use_bias", &T::use_bias, "biases in the projections and norms"),                                      \
      field("use_layer_norm_weight", &T::use_layer_norm_weight, "RMSNorms have a weight"),                         \
      field("rope", &T::rope, "rotary position embeddings (type: default, linear, llama3, yarn)"),                 \
      field("reference_checkpoint", &T::reference_checkpoint, "Hugging Face checkpoint the config refers to"),     \
      field("tokenizer", &T::tokenizer, "tokenizer for Hugging Face export"),                                      \
      field("cross_entropy_block_size", &T::cross_entropy_block_size, "vocabulary block of the fused LM-head loss")

template <>
struct levanter::config::schema<levanter::LlamaConfig> {
  using T = levanter::LlamaConfig;
  static constexpr auto fields =
      std::make_tuple(LEVANTER_LLAMA_COMMON_FIELDS_(T),
                      field("use_qk_norm", &T::use_qk_norm, "RMSNorm of each query and key head (ours; qwen3 has it)"));
};
template <>
struct levanter::config::schema<levanter::MistralConfig> {
  using T = levanter::MistralConfig;
  static constexpr auto fields = std::make_tuple(
      LEVANTER_LLAMA_COMMON_FIELDS_(T), field("sliding_window", &T::sliding_window, "attention window of every layer"));
};
template <>
struct levanter::config::schema<levanter::QwenConfig> {
  using T = levanter::QwenConfig;
  static constexpr auto fields = std::make_tuple(
      LEVANTER_LLAMA_COMMON_FIELDS_(T), field("use_sliding_window", &T::use_sliding_window, "windowed attention"),
      field("sliding_window", &T::sliding_window, "attention window"),
      field("max_window_layers", &T::max_window_layers, "layers before this one attend in full"));
};
template <>
struct levanter::config::schema<levanter::Qwen3Config> {
  using T = levanter::Qwen3Config;
  static constexpr auto fields = std::make_tuple(
      LEVANTER_LLAMA_COMMON_FIELDS_(T), field("use_sliding_window", &T::use_sliding_window, "windowed attention"),
      field("sliding_window", &T::sliding_window, "attention window"),
      field("max_window_layers", &T::max_window_layers, "layers before this one attend in full"));
};

// The YAML machinery of these sections is compiled once, in src/models/llama_config.cpp.
LEVANTER_CONFIG_SECTION_EXTERN(levanter::LlamaConfig)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::MistralConfig)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::QwenConfig)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::Qwen3Config)
