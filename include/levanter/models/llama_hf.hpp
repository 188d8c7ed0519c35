// levanter/models/llama_hf.hpp: the Llama family to and from Hugging Face (`transformers`' LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, GemmaForCausalLM, Gemma2ForCausalLM, the text-only
// Gemma3ForCausalLM (model_type gemma3_text), Olmo2ForCausalLM and MixtralForCausalLM), as an adapter for
// compat/hf.hpp. Gemma's norm weights are stored as Hugging Face stores them (the scale is 1 + weight), so they move
// unchanged.
//
// Names follow upstream's state-dict key map: `transformer.` -> `model.`, `embeddings.` dropped,
// `token_embeddings` -> `embed_tokens`, stacked layers unstacked to `model.layers.0.`, ...; the untied head is
// `lm_head.weight`. Every Linear is stored out-first, torch's [out, in], so no transposes are needed; the query
// projection's rows are (kv_head, q_heads_per_group, head_size) flattened, which is Hugging Face's head order.
//
// config.json is written as transformers 5 writes it (`rope_parameters` with `rope_theta` inside); reading also
// accepts transformers 4's `rope_theta` + `rope_scaling`. The config's `type:` decides which model_type a
// directory must have (its variant's: llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, olmo2, mixtral).
// OLMo 2's whole-projection QK norms (our q_proj_norm / k_proj_norm) are its self_attn.q_norm / k_norm.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <levanter/compat/hf.hpp>
#include <levanter/models/hf_config_json.hpp>
#include <levanter/models/llama.hpp>
#include <nlohmann/json.hpp>

namespace levanter::hf {

template <>
struct hf_adapter<llama::LMHeadModel> {
  static constexpr std::string_view model_type = "llama";
  /// Every model_type of the family (its listed config types' hf_model_type) is read; from_hf_config then checks it
  /// against the config's `type:`.
  static bool reads_model_type(std::string_view t);
  /// The config.json model_type of a config.
  static std::string_view model_type_of(const LlamaConfig& c);
  static nlohmann::json to_hf_config(const LlamaConfig& c, std::int64_t vocab);
  static LlamaConfig from_hf_config(LlamaConfig base, const nlohmann::json& j, const std::string& where);
  static void check_matches(const LlamaConfig& c, const nlohmann::json& j, const std::string& where);
  static std::string hf_name(const std::string& ours);
  static std::vector<std::pair<std::string, std::vector<std::int64_t>>> hf_layout(const LlamaConfig& c,
                                                                                  std::int64_t vocab);
  static bool missing_ok(const std::string&) { return false; }
  /// A gemma3 wrapper's language model is stored under a prefix: model.language_model.* (transformers 5) or
  /// language_model.model.* (4.5x, the released checkpoints); a plain directory's names are ours.
  static std::string full_name(const hf_dir& d, const std::string& hf_name);
  static std::string unused(const hf_dir& d, const std::string& name);
  /// Our model keys and the config.json keys they come from, for messages about an imported config.
  static std::vector<std::pair<std::string, std::string>> hf_keys() { return llama_hf_keys(); }
};

}  // namespace levanter::hf
