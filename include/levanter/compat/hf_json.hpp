// levanter/compat/hf_json.hpp: reading a Hugging Face config.json's values, each checked before use (integers in
// range before they are narrowed, numbers finite, types as expected), and the model checks train_lm makes, applied
// to a config made from config.json. Light (nlohmann/json and the config validator only): the model adapters'
// config.json conversions (models/hf_config_json.hpp) and the config.json fuzz target use it without the models.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <levanter/config/validate.hpp>

namespace levanter::hf {

/// A Hugging Face checkpoint that cannot be used; the message names the directory or tensor and what to do.
struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A config.json as open_dir reads it: a JSON object, `model_type` (a string, "" when absent) and `vocab_size`.
/// A multimodal wrapper whose language model is one of ours (`gemma3`: Gemma3ForConditionalGeneration) is read as
/// that language model: `config` is its `text_config` with the wrapper's token ids and transformers' defaults
/// filled in, `model_type` the text model's, and `wrapper` the wrapper's model_type ("" for a plain config.json).
struct config_json {
  nlohmann::json config;
  std::string model_type;
  std::int64_t vocab_size = 0;
  std::string wrapper;
};
/// The largest config.json read (transformers' are a few kilobytes) and its deepest nesting.
inline constexpr std::size_t max_config_json_bytes = 16u << 20;
inline constexpr std::size_t max_config_json_depth = 64;
/// Parses config.json's `text` (read from `file`) and checks what every model needs: a JSON object nested at most
/// max_config_json_depth deep, model_type a string, vocab_size an integer in [1, config::bounds::max_vocab].
/// `what` (the setting that named the directory) starts every message. Throws error.
config_json parse_config_json(std::string_view text, const std::string& file, const std::string& what);

namespace detail {
std::int64_t get_int(const nlohmann::json& j, const char* key, const std::string& where);
/// config.json's integer `key` when it lies in [lo, hi] (checked before it is narrowed to int), else an error naming
/// the file (`where`), the key, the value and the range.
int get_int_in(const nlohmann::json& j, const char* key, const std::string& where, std::int64_t lo, std::int64_t hi);
/// A config.json value of the wrong type (get_or); the callers that know the file add its name.
struct value_error : error {
  using error::error;
};
template <class T>
T get_or(const nlohmann::json& j, const char* key, T fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const auto& v = j[key];
  const bool ok = std::is_same_v<T, bool>          ? v.is_boolean()
                  : std::is_same_v<T, std::string> ? v.is_string()
                  : std::is_integral_v<T>          ? v.is_number_integer()
                                                   : v.is_number();
  if (!ok) {
    const char* want = std::is_same_v<T, bool>          ? "true or false"
                       : std::is_same_v<T, std::string> ? "a string"
                       : std::is_integral_v<T>          ? "an integer"
                                                        : "a number";
    throw value_error("'" + std::string(key) + "' is " + v.dump() + ", not " + want);
  }
  if constexpr (std::is_floating_point_v<T>) {
    const T x = v.get<T>();
    if (!std::isfinite(x)) throw value_error("'" + std::string(key) + "' is " + v.dump() + ", not a finite number");
    return x;
  } else {
    return v.get<T>();
  }
}
}  // namespace detail

/// The model checks train_lm makes (`validate(validator&, const C&)`, next to each config), on a config made from
/// config.json `where`; throws error listing what is wrong, each under config.json's key (`hf_keys` maps our
/// key prefixes to config.json's: rms_norm_eps is model.layer_norm_epsilon, max_position_embeddings model.seq_len).
template <class C>
void check_model_config(const C& c, const std::string& where,
                        const std::vector<std::pair<std::string, std::string>>& hf_keys) {
  if constexpr (requires(config::validator& v) { validate(v, c); }) {
    const config::source_map none;
    config::validator v{none, {}};
    validate(v, c);
    if (!v.result.errors.empty()) {
      std::string all;
      for (auto e : v.result.errors) {
        // Name config.json's key first: "rms_norm_eps (model.layer_norm_epsilon): must be ...".
        std::size_t best = 0;
        std::string theirs;
        for (const auto& [ours, hf] : hf_keys)
          if (e.rfind(ours, 0) == 0 && ours.size() > best) best = ours.size(), theirs = hf;
        if (best) {
          const auto end = e.find_first_of(" :", best);
          const std::string ours = e.substr(0, end);
          e = theirs + ours.substr(best) + " (our " + ours + ")" + e.substr(end == std::string::npos ? e.size() : end);
        }
        all += (all.empty() ? "" : "; ") + e;
      }
      throw error(where + " describes a model that cannot be used: " + all);
    }
  }
}

}  // namespace levanter::hf
