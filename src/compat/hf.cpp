// levanter/compat/hf.hpp: the parts of Hugging Face directory I/O that do not depend on the model.
#include <levanter/compat/hf.hpp>

#include <cstdint>
#include <algorithm>
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

std::string layer_name(const std::string& pattern, std::int64_t i, std::int64_t e) {
  std::string s = pattern;
  if (const auto pos = s.find("{i}"); pos != std::string::npos) s = s.substr(0, pos) + std::to_string(i) + s.substr(pos + 3);
  if (const auto pos = s.find("{e}"); pos != std::string::npos) s = s.substr(0, pos) + std::to_string(e) + s.substr(pos + 3);
  return s;
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
               std::int64_t layers, std::map<std::string, std::vector<float>>& out, std::int64_t experts) {
  if (pattern.find("{i}") == std::string::npos) {
    out[pattern].assign(data, data + n);
    return;
  }
  if (pattern.find("{e}") == std::string::npos) experts = 1;
  const std::int64_t parts = layers * experts;
  if (layers <= 0 || experts <= 0 || n % static_cast<std::size_t>(parts) != 0)
    throw error("hf::save: the stacked parameter '" + name + "' cannot be split into " + std::to_string(layers) +
                " layers of " + std::to_string(experts) + " experts");
  const std::size_t per = n / static_cast<std::size_t>(parts);
  for (std::int64_t i = 0; i < layers; ++i)
    for (std::int64_t e = 0; e < experts; ++e) {
      const auto at = static_cast<std::size_t>(i * experts + e);
      out[layer_name(pattern, i, e)].assign(data + per * at, data + per * (at + 1));
    }
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
  std::ifstream in(cfg_path, std::ios::binary);
  if (!in) throw error(what + ": '" + cfg_path.string() + "' is missing");
  // At most one byte past the limit is read, so that parse_config_json names a file that is too large.
  const auto size = fs::file_size(cfg_path, ec);
  std::string text(ec ? max_config_json_bytes + 1 : std::min<std::uintmax_t>(size, max_config_json_bytes + 1), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) throw error(what + ": '" + cfg_path.string() + "' cannot be read");
  text.resize(static_cast<std::size_t>(in.gcount()));
  auto c = parse_config_json(text, cfg_path.string(), what);
  hf_dir d{path,      std::move(c.config), c.vocab_size, safetensors::hf_dir(path), std::move(c.model_type),
           c.wrapper};
  return d;
}

}  // namespace levanter::hf
