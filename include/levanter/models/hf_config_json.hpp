// levanter/models/hf_config_json.hpp: the built-in models' configs to and from a Hugging Face config.json, without
// the models (the adapters of gpt2_hf.hpp and llama_hf.hpp delegate here; so does the config.json fuzz target).
//
//   from_hf_config(base, json, where)   the architecture from config.json, our own settings kept from `base`; throws
//                                       hf::error naming `where` and the key (hf::detail::value_error, without the
//                                       file, for a value of the wrong type: the caller adds it)
//   to_hf_config(config, vocab)         config.json as transformers writes it (without dtype and token ids)
//   hf_keys()                           our model keys and the config.json keys they come from, for messages
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <levanter/compat/hf_json.hpp>
#include <levanter/models/gpt2_config.hpp>
#include <levanter/models/llama_config.hpp>

namespace levanter::hf {

/// upstream `Gpt2Config.to_hf_config` / `from_hf_config`.
nlohmann::json gpt2_to_hf_config(const Gpt2Config& c, std::int64_t vocab);
Gpt2Config gpt2_from_hf_config(Gpt2Config base, const nlohmann::json& j, const std::string& where);
std::vector<std::pair<std::string, std::string>> gpt2_hf_keys();

/// The Llama family: `base.family` decides which model_type config.json must have (its variant's hf_model_type). A
/// member in its own files adds its keys through hooks (models/llama_config.hpp).
nlohmann::json llama_to_hf_config(const LlamaConfig& c, std::int64_t vocab);
LlamaConfig llama_from_hf_config(LlamaConfig base, const nlohmann::json& j, const std::string& where);
std::vector<std::pair<std::string, std::string>> llama_hf_keys();
/// The config.json model_type of a Llama-family config ("llama", "mistral", "qwen2", ...).
std::string_view llama_model_type_of(const LlamaConfig& c);
/// The rope as config.json's `rope_parameters` (transformers 5).
nlohmann::json rope_to_hf(const RopeChoice& r);
/// The rope of a config.json: transformers 5's `rope_parameters`, or transformers 4's `rope_theta` + `rope_scaling`.
RopeChoice rope_from_hf(const nlohmann::json& j, std::int64_t max_positions, const std::string& where);

// For the hooks of the family's members:
/// A positive number or null under `key`.
std::optional<double> positive_or_null(const nlohmann::json& j, const char* key, const std::string& where);
/// `x` or null.
nlohmann::json number_or_null(const std::optional<double>& x);
/// config.json's layer_types as booleans (true: sliding_attention), checked against the layer count.
std::vector<bool> sliding_layers_of(const nlohmann::json& j, int layers, const std::string& where);

}  // namespace levanter::hf
