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
  std::ifstream in(cfg_path, std::ios::binary);
  if (!in) throw error(what + ": '" + cfg_path.string() + "' is missing");
  // At most one byte past the limit is read, so that parse_config_json names a file that is too large.
  const auto size = fs::file_size(cfg_path, ec);
  std::string text(ec ? max_config_json_bytes + 1 : std::min<std::uintmax_t>(size, max_config_json_bytes + 1), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) throw error(what + ": '" + cfg_path.string() + "' cannot be read");
  text.resize(static_cast<std::size_t>(in.gcount()));
  auto c = parse_config_json(text, cfg_path.string(), what);
  hf_dir d{path, std::move(c.config), c.vocab_size, safetensors::hf_dir(path), std::move(c.model_type)};
  return d;
}

}  // namespace levanter::hf
