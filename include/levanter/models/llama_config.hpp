// levanter/models/llama_config.hpp: the Llama family's `model:` sections, upstream's LlamaConfig (`type: llama`),
// MistralConfig (`type: mistral`), QwenConfig (`type: qwen`, Qwen2), Qwen3Config (`type: qwen3`), Olmo2Config
// (`type: olmo2`) and MixtralConfig (`type: mixtral`), with their keys and defaults, and the `rope:` choice (upstream
// `RotaryEmbeddingsConfig`: default, linear, llama3, yarn). The Gemma configs are their own files
// (models/gemma_config.hpp): a member of the family is a config type with a variant, below.
//
// They are one architecture (llama::LMHeadModel): RMSNorm pre-norm blocks, SwiGLU MLP, RoPE, grouped-query
// attention. What a member fixes beyond its keys is its `llama_variant` (`family`), which the model and its Hugging
// Face adapter read; the Llama files' own members:
//   mistral  sliding-window attention on every layer (sliding_window, default 4096); the LM head is never tied
//   qwen     bias on the q/k/v projections, none on o_proj; with use_sliding_window, a window on the layers from
//            max_window_layers on
//   qwen3    RMSNorm of each query and key head (QK norm); the same sliding-window keys as qwen
//   olmo2    (Olmo2Config, `type: olmo2`) post-norm sublayers: x + post_attention_layernorm(attn(x)), then
//            x + post_feedforward_layernorm(mlp(x)), no input norm; RMSNorms of the whole query and key projections
//            (over heads x head_dim, before RoPE)
//   mixtral  (MixtralConfig, `type: mixtral`) a sparse mixture-of-experts block in place of the MLP: a router
//            (`gate`) picks num_experts_per_tok of n_routed_experts SwiGLU experts per token, their outputs weighted
//            by the renormalised router probabilities; optional always-on shared experts; the load-balancing loss
//            (lbl_coef) and router z-loss (rzl_coef) are added to the loss
// A member in its own files (Gemma's: models/gemma_config.hpp, src/models/gemma_config.cpp, gemma_hf_config.cpp)
// defines its config type and variant, and may add checks (`validate_variant(v, const ItsConfig&)`) and config.json
// hooks (`hf::hf_config_prepare`, `hf_config_in`, `hf_config_out`), found for the config types of the model list
// (src/models/llama_config.cpp, llama_hf_config.cpp).
#pragma once

#include <cmath>
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

struct LlamaConfig;

/// Where a member of the family puts its RMSNorms: before each sublayer (Llama), before and after each (Gemma 2 and
/// 3's four norms per layer), or after each only (OLMo 2).
enum class llama_norms { pre, sandwich, post };

/// What a member of the family fixes beyond its keys: the layer's shape and its Hugging Face names. One constant per
/// `type:` (llama_family::llama, ...; a member in its own files defines its own), pointed to by `LlamaConfig::family`
/// and compared by address.
struct llama_variant {
  std::string_view type_name;        ///< `type:`
  std::string_view hf_model_type;    ///< config.json's model_type
  std::string_view hf_architecture;  ///< config.json's architectures
  llama_norms norms = llama_norms::pre;
  bool unit_offset_norms = false;   ///< RMSNorms scale by (1 + weight), the weight starting at 0
  bool scaled_embeddings = false;   ///< embeddings multiplied by sqrt(hidden_dim) (in float, as transformers)
  bool qkv_bias = false;            ///< biases on q/k/v and none on o_proj, whatever use_bias
  bool qk_norm = false;             ///< RMSNorm of each query and key head, whatever use_qk_norm
  bool projection_qk_norm = false;  ///< RMSNorms over the whole query and key projections (all heads at once)
  bool hf_qk_norm = false;          ///< use_qk_norm has a Hugging Face form
  bool untied_head = false;         ///< the LM head is never the embedding table
  bool moe = false;                 ///< a mixture-of-experts block in place of the MLP
  /// Whether layer i is local: windowed by sliding_window when set (null: no local layers).
  bool (*local_layer)(const LlamaConfig&, std::int64_t) = nullptr;
  bool local_rope = false;  ///< local layers use a default RoPE of base rope_local_base_freq, whatever the window
  bool flops_without_glu = false;  ///< upstream counts the MLP's FLOPs as two products, not three
  bool flops_kv_as_heads = false;  ///< upstream counts num_kv_heads = num_heads in the FLOPs
};

namespace detail {
bool every_layer_local(const LlamaConfig&, std::int64_t);
bool layers_from_max_window_local(const LlamaConfig&, std::int64_t);
}  // namespace detail

/// The Llama files' members of the family (see the header comment).
namespace llama_family {
inline constexpr llama_variant llama{.type_name = "llama", .hf_model_type = "llama", .hf_architecture = "LlamaForCausalLM"};
inline constexpr llama_variant mistral{.type_name = "mistral",
                                       .hf_model_type = "mistral",
                                       .hf_architecture = "MistralForCausalLM",
                                       .untied_head = true,
                                       .local_layer = detail::every_layer_local,
                                       .flops_without_glu = true,
                                       .flops_kv_as_heads = true};
inline constexpr llama_variant qwen2{.type_name = "qwen",
                                     .hf_model_type = "qwen2",
                                     .hf_architecture = "Qwen2ForCausalLM",
                                     .qkv_bias = true,
                                     .local_layer = detail::layers_from_max_window_local};
inline constexpr llama_variant qwen3{.type_name = "qwen3",
                                     .hf_model_type = "qwen3",
                                     .hf_architecture = "Qwen3ForCausalLM",
                                     .qk_norm = true,
                                     .hf_qk_norm = true,
                                     .local_layer = detail::layers_from_max_window_local};
inline constexpr llama_variant olmo2{.type_name = "olmo2",
                                     .hf_model_type = "olmo2",
                                     .hf_architecture = "Olmo2ForCausalLM",
                                     .norms = llama_norms::post,
                                     .projection_qk_norm = true,
                                     .hf_qk_norm = true};
inline constexpr llama_variant mixtral{
    .type_name = "mixtral", .hf_model_type = "mixtral", .hf_architecture = "MixtralForCausalLM", .moe = true};
}  // namespace llama_family

/// `model: {type: llama, ...}`, upstream LlamaConfig; the base of the other three.
struct LlamaConfig {
  static constexpr std::string_view type_name = "llama";
  static constexpr std::string_view hf_model_type = "llama";
  const llama_variant* family = &llama_family::llama;  ///< which member of the family (see llama_variant)

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
  // attention scale and soft-capping (Gemma 2's keys), local layers (Gemma 3's)
  std::optional<double> query_pre_attn_scalar;    ///< attention scale 1 / sqrt(this) (default 1 / sqrt(head size))
  std::optional<double> attn_logit_softcapping;   ///< attention scores c * tanh(s / c)
  std::optional<double> final_logit_softcapping;  ///< logits c * tanh(z / c)
  std::optional<int> sliding_window_pattern;      ///< every p-th layer global, the others local (where the variant says)
  double rope_local_base_freq = 10000.0;          ///< the RoPE base of local layers (where the variant says)
  // mixture of experts (mixtral)
  int num_experts_per_tok = 2;       ///< experts each token is routed to (top-k)
  int n_routed_experts = 8;          ///< routed experts per layer
  int n_shared_experts = 0;          ///< always-on experts (one SwiGLU of n_shared_experts x intermediate_dim)
  std::optional<double> lbl_coef;    ///< weight of the load-balancing loss (none: not computed)
  std::optional<double> rzl_coef;    ///< weight of the router z-loss (none: not computed)

  /// Whether the layers have a mixture-of-experts block in place of the MLP (Mixtral).
  bool moe() const { return family->moe; }
  /// Four norms per layer (input, post-attention, pre-feedforward, post-feedforward; Gemma 2 and 3).
  bool sandwich_norms() const { return family->norms == llama_norms::sandwich; }
  /// Norms after the sublayers only (post_attention_layernorm, post_feedforward_layernorm; OLMo 2).
  bool post_norms_only() const { return family->norms == llama_norms::post; }
  /// RMSNorms over the whole query and key projections (all heads at once; OLMo 2).
  bool projection_qk_norm() const { return family->projection_qk_norm; }
  /// The embeddings are multiplied by this (sqrt(hidden_dim) in float, as transformers does, where the variant
  /// scales them; else 1).
  double embedding_scale() const {
    return family->scaled_embeddings ? double(static_cast<float>(std::sqrt(double(hidden_dim)))) : 1.0;
  }
  /// The attention scale: 1 / sqrt(query_pre_attn_scalar) when set, else 1 / sqrt(head size).
  double attention_scale() const {
    return 1.0 / std::sqrt(query_pre_attn_scalar ? *query_pre_attn_scalar : double(head_size()));
  }
  /// Whether layer `i` is local: windowed by sliding_window when set, with the local RoPE where the variant has one.
  bool local_layer(std::int64_t i) const { return family->local_layer && family->local_layer(*this, i); }

  /// The head size: head_dim when set, else hidden_dim / num_heads.
  int head_size() const { return head_dim ? *head_dim : (num_heads > 0 ? hidden_dim / num_heads : 0); }
  /// Query heads per key/value head.
  int q_heads_per_group() const { return num_kv_heads > 0 ? num_heads / num_kv_heads : 0; }
  /// Whether the q/k/v projections and o_proj have biases.
  bool qkv_bias() const { return family->qkv_bias || use_bias; }
  bool o_bias() const { return !family->qkv_bias && use_bias; }
  /// Whether queries and keys are RMS-normalised per head.
  bool qk_norm() const { return family->qk_norm || use_qk_norm; }
  /// Whether the RMSNorms scale by (1 + weight) (Gemma).
  bool unit_offset_norms() const { return family->unit_offset_norms; }
  /// Whether the LM head is the token embedding table.
  bool tied() const { return !family->untied_head && tie_word_embeddings; }
  /// The sliding window of layer `i` (0 for full causal attention): sliding_window on the local layers.
  std::int64_t window_of_layer(std::int64_t i) const { return sliding_window && local_layer(i) ? *sliding_window : 0; }
  /// The RoPE of layer `i`: `rope`, except local layers of a variant with a local RoPE (default RoPE, base
  /// rope_local_base_freq).
  RopeChoice rope_of_layer(std::int64_t i) const;

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
    family = &llama_family::mistral;
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
  QwenConfig() { family = &llama_family::qwen2; }
};

/// `model: {type: qwen3}` (upstream Qwen3Config).
struct Qwen3Config : LlamaConfig {
  static constexpr std::string_view type_name = "qwen3";
  static constexpr std::string_view hf_model_type = "qwen3";
  Qwen3Config() {
    family = &llama_family::qwen3;
    sliding_window = 4096;
  }
};

/// `model: {type: olmo2}` (upstream Olmo2Config's defaults: OLMo 2 7B).
struct Olmo2Config : LlamaConfig {
  static constexpr std::string_view type_name = "olmo2";
  static constexpr std::string_view hf_model_type = "olmo2";
  bool attention_bias = false;  ///< upstream's key; biases in the attention projections are not supported
  Olmo2Config() {
    family = &llama_family::olmo2;
    seq_len = 4096;
    layer_norm_epsilon = 1e-6;
    reference_checkpoint = "allenai/OLMo-2-1124-7B";
  }
};

/// `model: {type: mixtral}` (upstream MixtralConfig's defaults: Mixtral 8x7B; no sliding window, as upstream's
/// attention).
struct MixtralConfig : LlamaConfig {
  static constexpr std::string_view type_name = "mixtral";
  static constexpr std::string_view hf_model_type = "mixtral";
  MixtralConfig() {
    family = &llama_family::mixtral;
    seq_len = 8192;
    intermediate_dim = 14336;
    num_kv_heads = 8;
    layer_norm_epsilon = 1e-6;
    flash_attention_block_size = 2048;
    lbl_coef = 0.01;
    rzl_coef = 0.001;
    reference_checkpoint = "mistralai/Mixtral-8x7B-v0.1";
  }
};

/// Adds every problem of a Llama-family `model:` section to `v` (keys under `model.`), with the checks of the
/// member's own files (`validate_variant` of its listed config type) when it has them.
void validate(config::validator& v, const LlamaConfig& m);

/// The same for `type: olmo2`, which adds attention_bias.
void validate(config::validator& v, const Olmo2Config& m);

/// The `type:` name of a family member.
inline std::string_view family_type_name(const llama_variant* f) { return f->type_name; }

namespace detail {
inline bool every_layer_local(const LlamaConfig&, std::int64_t) { return true; }
inline bool layers_from_max_window_local(const LlamaConfig& c, std::int64_t i) {
  return c.use_sliding_window && i >= c.max_window_layers;
}
}  // namespace detail

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

template <>
struct levanter::config::schema<levanter::Olmo2Config> {
  using T = levanter::Olmo2Config;
  static constexpr auto fields = std::make_tuple(
      LEVANTER_LLAMA_COMMON_FIELDS_(T),
      field("attention_bias", &T::attention_bias, "biases in the attention projections (false only here)"));
};

template <>
struct levanter::config::schema<levanter::MixtralConfig> {
  using T = levanter::MixtralConfig;
  static constexpr auto fields = std::make_tuple(
      LEVANTER_LLAMA_COMMON_FIELDS_(T), field("sliding_window", &T::sliding_window, "attention window of every layer"),
      field("num_experts_per_tok", &T::num_experts_per_tok, "experts each token is routed to (top-k)"),
      field("n_routed_experts", &T::n_routed_experts, "routed experts per layer"),
      field("n_shared_experts", &T::n_shared_experts, "always-on experts beside the routed ones"),
      field("lbl_coef", &T::lbl_coef, "weight of the load-balancing loss (null: none)"),
      field("rzl_coef", &T::rzl_coef, "weight of the router z-loss (null: none)"));
};

// The YAML machinery of these sections is compiled once, in src/models/llama_config.cpp.
LEVANTER_CONFIG_SECTION_EXTERN(levanter::LlamaConfig)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::MistralConfig)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::QwenConfig)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::Qwen3Config)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::Olmo2Config)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::MixtralConfig)
