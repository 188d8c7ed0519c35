// levanter/compat/hf_json.hpp: config.json integers, checked before they are narrowed.
#include <levanter/compat/hf_json.hpp>

#include <cstdint>

#include <levanter/io/json_limits.hpp>

namespace levanter::hf {

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
