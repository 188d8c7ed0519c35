// levanter/compat/hf_json.hpp: config.json integers, checked before they are narrowed.
#include <levanter/compat/hf_json.hpp>

#include <cstdint>

#include <levanter/io/json_limits.hpp>

namespace levanter::hf {

namespace {

/// Gemma3ForConditionalGeneration's config.json (model_type gemma3) holds the language model in `text_config`, written
/// by transformers as a difference from Gemma3TextConfig's defaults (a released checkpoint's lists a handful of keys).
/// It becomes a gemma3_text config: its own keys, then the wrapper's token ids and tie_word_embeddings, then
/// Gemma3TextConfig's defaults (transformers 5.23; rope_local_base_freq and sliding_window_pattern as 4.5x named
/// them). The vision tower is not read.
void unwrap_gemma3(config_json& c, const std::string& file, const std::string& what) {
  nlohmann::json text = nlohmann::json::object();
  if (c.config.contains("text_config") && !c.config["text_config"].is_null()) {
    if (!c.config["text_config"].is_object())
      throw error(what + ": '" + file + "' has model_type 'gemma3' but its text_config is " +
                  c.config["text_config"].dump() + ", not an object");
    text = c.config["text_config"];
  }
  if (text.contains("model_type") && text["model_type"] != "gemma3_text")
    throw error(what + ": '" + file + "' has model_type 'gemma3' but text_config.model_type " +
                text["model_type"].dump() + " (a gemma3_text language model is expected)");
  text["model_type"] = "gemma3_text";
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings"})
    if (!text.contains(k) && c.config.contains(k)) text[k] = c.config[k];
  static const nlohmann::json defaults = {
      {"vocab_size", 262208},
      {"hidden_size", 2304},
      {"intermediate_size", 9216},
      {"num_hidden_layers", 26},
      {"num_attention_heads", 8},
      {"num_key_value_heads", 4},
      {"head_dim", 256},
      {"hidden_activation", "gelu_pytorch_tanh"},
      {"max_position_embeddings", 131072},
      {"initializer_range", 0.02},
      {"rms_norm_eps", 1e-6},
      {"pad_token_id", 0},
      {"eos_token_id", 1},
      {"bos_token_id", 2},
      {"tie_word_embeddings", true},
      {"rope_theta", 1000000.0},
      {"rope_local_base_freq", 10000.0},
      {"attention_bias", false},
      {"query_pre_attn_scalar", 256},
      {"sliding_window", 4096},
      {"sliding_window_pattern", 6},
      {"final_logit_softcapping", nullptr},
      {"attn_logit_softcapping", nullptr},
  };
  for (const auto& [k, v] : defaults.items())
    if (!text.contains(k)) text[k] = v;
  c.config = std::move(text);
  c.model_type = "gemma3_text";
  c.wrapper = "gemma3";
}

}  // namespace

config_json parse_config_json(std::string_view text, const std::string& file, const std::string& what) {
  if (text.size() > max_config_json_bytes)
    throw error(what + ": '" + file + "' is " + std::to_string(text.size()) + " bytes; a config.json is at most " +
                std::to_string(max_config_json_bytes) + " (is this the right file?)");
  // nlohmann's parser recurses once per level: a file of '[' must not overflow the stack.
  if (io::json_depth(text, max_config_json_depth) > max_config_json_depth)
    throw error(what + ": '" + file + "' nests arrays or objects more than " + std::to_string(max_config_json_depth) +
                " deep; it is not a model's config.json");
  config_json c;
  try {
    c.config = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw error(what + ": '" + file + "' is not valid JSON (" + e.what() + ")");
  }
  if (!c.config.is_object()) throw error(what + ": '" + file + "' is not a JSON object");
  try {
    c.model_type = detail::get_or<std::string>(c.config, "model_type", "");
  } catch (const detail::value_error& e) {
    throw error(what + ": '" + file + "': " + e.what());
  }
  if (c.model_type == "gemma3") unwrap_gemma3(c, file, what);
  try {
    c.vocab_size = detail::get_int_in(c.config, "vocab_size", file, 1, config::bounds::max_vocab);
  } catch (const error& e) {
    throw error(what + ": " + e.what());
  }
  return c;
}

}  // namespace levanter::hf

namespace levanter::hf::detail {

std::int64_t get_int(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_number_integer())
    throw error(where + ": config.json has no integer '" + std::string(key) + "'");
  return j[key].get<std::int64_t>();
}

int get_int_in(const nlohmann::json& j, const char* key, const std::string& where, std::int64_t lo, std::int64_t hi) {
  if (!j.contains(key) || !j[key].is_number_integer())
    throw error(where + ": config.json has no integer '" + std::string(key) + "'");
  // Checked before narrowing: 4294967328 must not become 32. An unsigned 64-bit value above 2^63 is out of range too.
  const bool huge = j[key].is_number_unsigned() && j[key].get<std::uint64_t>() > std::uint64_t(INT64_MAX);
  const std::int64_t v = huge ? INT64_MAX : j[key].get<std::int64_t>();
  if (huge || v < lo || v > hi)
    throw error(where + ": '" + std::string(key) + "' is " + j[key].dump() + "; it must be an integer in [" +
                config::fmt_bound(lo) + ", " + config::fmt_bound(hi) + "]");
  return static_cast<int>(v);
}

}  // namespace levanter::hf::detail
