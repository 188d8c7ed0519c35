// levanter/compat/hf.hpp: the parts of Hugging Face directory I/O that do not depend on the model.
#include <levanter/compat/hf.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>

#include <levanter/config/validate.hpp>
#include <levanter/io/atomic_file.hpp>

namespace levanter::hf {

safetensors::dtype dtype_from_config(const std::optional<std::string>& name) {
  if (!name || *name == "float32" || *name == "f32" || *name == "fp32") return safetensors::dtype::F32;
  if (*name == "bfloat16" || *name == "bf16") return safetensors::dtype::BF16;
  if (*name == "float16" || *name == "f16" || *name == "fp16") return safetensors::dtype::F16;
  throw error("unknown dtype '" + *name + "': use float32, bfloat16 or float16");
}

std::string torch_dtype_name(safetensors::dtype t) {
  switch (t) {
    case safetensors::dtype::BF16:
      return "bfloat16";
    case safetensors::dtype::F16:
      return "float16";
    default:
      return "float32";
  }
}

namespace detail {

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

std::string layer_name(const std::string& pattern, std::int64_t i) {
  const auto pos = pattern.find("{i}");
  if (pos == std::string::npos) return pattern;
  return pattern.substr(0, pos) + std::to_string(i) + pattern.substr(pos + 3);
}

void write_config_json(const std::string& dir, const std::string& json_text) {
  try {
    io::write_file_atomic(std::filesystem::path(dir) / "config.json", json_text);
  } catch (const io::io_error& e) {
    throw error(e.what());
  }
}

void check_model_type(const hf_dir& d, std::string_view want) {
  if (d.model_type != want)
    throw error("'" + d.dir + "/config.json' has model_type '" + d.model_type + "', but the model is a " +
                std::string(want) + " (choose the matching model.type, or a directory holding a " + std::string(want) +
                ")");
}

void host_copy(const std::string& name, const float* data, std::size_t n, const std::string& pattern,
               std::int64_t layers, std::map<std::string, std::vector<float>>& out) {
  if (pattern.find("{i}") == std::string::npos) {
    out[pattern].assign(data, data + n);
    return;
  }
  if (layers <= 0 || n % static_cast<std::size_t>(layers) != 0)
    throw error("hf::save: the stacked parameter '" + name + "' cannot be split into " + std::to_string(layers) +
                " layers");
  const std::size_t per = n / static_cast<std::size_t>(layers);
  for (std::int64_t i = 0; i < layers; ++i)
    out[layer_name(pattern, i)].assign(data + per * static_cast<std::size_t>(i),
                                       data + per * static_cast<std::size_t>(i + 1));
}

}  // namespace detail

hf_dir open_dir(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec))
    throw error(what + ": '" + path + "' is not a local directory. Downloading from the Hugging Face Hub is not " +
                "possible here: download it first (e.g. `huggingface-cli download " + path +
                " --local-dir DIR`) and give DIR");
  const fs::path cfg_path = fs::path(path) / "config.json";
  std::ifstream in(cfg_path);
  if (!in) throw error(what + ": '" + cfg_path.string() + "' is missing");
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw error(what + ": '" + cfg_path.string() + "' is not valid JSON (" + e.what() + ")");
  }
  if (!config.is_object()) throw error(what + ": '" + cfg_path.string() + "' is not a JSON object");
  std::string model_type;
  try {
    model_type = detail::get_or<std::string>(config, "model_type", "");
  } catch (const detail::value_error& e) {
    throw error(what + ": '" + cfg_path.string() + "': " + e.what());
  }
  hf_dir d{path, config, 0, safetensors::hf_dir(path), model_type};
  try {
    d.vocab_size = detail::get_int_in(d.config, "vocab_size", cfg_path.string(), 1, config::bounds::max_vocab);
  } catch (const error& e) {
    throw error(what + ": " + e.what());
  }
  return d;
}

}  // namespace levanter::hf
