// levanter/models/gemma_config.hpp: Gemma, Gemma 2 and Gemma 3 as members of the Llama family (upstream gemma.py:
// GemmaConfig, Gemma2Config, Gemma3Config), with their keys and defaults. What they fix beyond their keys is their
// llama_variant (models/llama_config.hpp):
//   gemma    RMSNorms scale by (1 + weight), embeddings multiplied by sqrt(hidden_dim), tied head, gelu_new GeGLU,
//            MQA and head_dim 256 by default
//   gemma2   gemma plus four norms per layer (a norm after attention and after the MLP, another before the MLP),
//            attention and final logit soft-capping, query_pre_attn_scalar, a sliding window on even layers
//   gemma3   gemma2's layer, QK norm, no soft-capping; with sliding_window_pattern p, every layer but each p-th is
//            local (windowed, RoPE base rope_local_base_freq), as transformers' Gemma3 (upstream treats every
//            layer as global)
// Their checks and YAML are in src/models/gemma_config.cpp, their config.json hooks in gemma_hf_config.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>

#include <nlohmann/json_fwd.hpp>

#include <levanter/config/section.hpp>
#include <levanter/models/llama_config.hpp>

namespace levanter {

namespace detail {
inline bool gemma2_local_layer(const LlamaConfig&, std::int64_t i) { return i % 2 == 0; }
inline bool gemma3_local_layer(const LlamaConfig& c, std::int64_t i) {
  return c.sliding_window_pattern && (i + 1) % *c.sliding_window_pattern != 0;
}
}  // namespace detail

namespace llama_family {
inline constexpr llama_variant gemma{.type_name = "gemma",
                                     .hf_model_type = "gemma",
                                     .hf_architecture = "GemmaForCausalLM",
                                     .unit_offset_norms = true,
                                     .scaled_embeddings = true,
                                     .flops_without_glu = true};
inline constexpr llama_variant gemma2{.type_name = "gemma2",
                                      .hf_model_type = "gemma2",
                                      .hf_architecture = "Gemma2ForCausalLM",
                                      .norms = llama_norms::sandwich,
                                      .unit_offset_norms = true,
                                      .scaled_embeddings = true,
                                      .local_layer = detail::gemma2_local_layer,
                                      .flops_without_glu = true};
inline constexpr llama_variant gemma3{.type_name = "gemma3",
                                      .hf_model_type = "gemma3_text",
                                      .hf_architecture = "Gemma3ForCausalLM",
                                      .norms = llama_norms::sandwich,
                                      .unit_offset_norms = true,
                                      .scaled_embeddings = true,
                                      .hf_qk_norm = true,
                                      .local_layer = detail::gemma3_local_layer,
                                      .local_rope = true,
                                      .flops_without_glu = true};
}  // namespace llama_family

/// `model: {type: gemma}` (upstream GemmaConfig's defaults: Gemma 2B).
struct GemmaConfig : LlamaConfig {
  static constexpr std::string_view type_name = "gemma";
  static constexpr std::string_view hf_model_type = "gemma";
  GemmaConfig() {
    family = &llama_family::gemma;
    activation_function = "gelu_new";
    tie_word_embeddings = true;
    seq_len = 8192;
    hidden_dim = 2048;
    intermediate_dim = 16384;
    num_layers = 18;
    num_heads = 8;
    head_dim = 256;
    num_kv_heads = 1;
    reference_checkpoint = "google/gemma-2b";
  }
};

/// `model: {type: gemma2}` (upstream Gemma2Config).
struct Gemma2Config : GemmaConfig {
  static constexpr std::string_view type_name = "gemma2";
  static constexpr std::string_view hf_model_type = "gemma2";
  Gemma2Config() {
    family = &llama_family::gemma2;
    query_pre_attn_scalar = 256.0;
    final_logit_softcapping = 30.0;
    attn_logit_softcapping = 50.0;
    reference_checkpoint = "google/gemma-2-2b";
  }
};

/// `model: {type: gemma3}` (upstream Gemma3Config; transformers' Gemma3TextConfig on disk).
struct Gemma3Config : Gemma2Config {
  static constexpr std::string_view type_name = "gemma3";
  static constexpr std::string_view hf_model_type = "gemma3_text";
  Gemma3Config() {
    family = &llama_family::gemma3;
    use_qk_norm = true;
    final_logit_softcapping.reset();
    attn_logit_softcapping.reset();
    reference_checkpoint = "google/gemma-3-1b-pt";
  }
};

/// Adds the problems of Gemma's own keys to `v`; validate(v, const LlamaConfig&) calls it after the family's checks
/// for a config of these types (also one held as a LlamaConfig).
void validate_variant(config::validator& v, const GemmaConfig& m);

}  // namespace levanter

// config.json hooks of the Llama family's adapter (models/hf_config_json.hpp calls them for these types): Gemma 3's
// per-layer-type `rope_parameters` made flat before the common keys are read; Gemma's own keys read after them and
// written after them.
namespace levanter::hf {
void hf_config_prepare(const Gemma3Config& c, nlohmann::json& j, const std::string& where);
void hf_config_in(GemmaConfig& c, const nlohmann::json& j, const std::string& where);
void hf_config_out(const GemmaConfig& c, nlohmann::json& j);
}  // namespace levanter::hf

#define LEVANTER_GEMMA_FIELDS_(T)                                                                                 \
  LEVANTER_LLAMA_COMMON_FIELDS_(T),                                                                                \
      field("query_pre_attn_scalar", &T::query_pre_attn_scalar, "attention scale 1/sqrt(this) (default head size)")
#define LEVANTER_GEMMA2_FIELDS_(T)                                                                                 \
  LEVANTER_GEMMA_FIELDS_(T), field("final_logit_softcapping", &T::final_logit_softcapping, "logits c*tanh(z/c)"),  \
      field("attn_logit_softcapping", &T::attn_logit_softcapping, "attention scores c*tanh(s/c)"),                 \
      field("use_qk_norm", &T::use_qk_norm, "RMSNorm of each query and key head"),                                 \
      field("sliding_window", &T::sliding_window, "attention window of the local layers (none: every layer global)")

template <>
struct levanter::config::schema<levanter::GemmaConfig> {
  using T = levanter::GemmaConfig;
  static constexpr auto fields = std::make_tuple(LEVANTER_GEMMA_FIELDS_(T));
};
template <>
struct levanter::config::schema<levanter::Gemma2Config> {
  using T = levanter::Gemma2Config;
  static constexpr auto fields = std::make_tuple(LEVANTER_GEMMA2_FIELDS_(T));
};
template <>
struct levanter::config::schema<levanter::Gemma3Config> {
  using T = levanter::Gemma3Config;
  static constexpr auto fields = std::make_tuple(
      LEVANTER_GEMMA2_FIELDS_(T),
      field("sliding_window_pattern", &T::sliding_window_pattern, "every p-th layer global, the others local"),
      field("rope_local_base_freq", &T::rope_local_base_freq, "RoPE base of the local layers"));
};

// The YAML machinery of these sections is compiled once, in src/models/gemma_config.cpp.
LEVANTER_CONFIG_SECTION_EXTERN(levanter::GemmaConfig)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::Gemma2Config)
LEVANTER_CONFIG_SECTION_EXTERN(levanter::Gemma3Config)
