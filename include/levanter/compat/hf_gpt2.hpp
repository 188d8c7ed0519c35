// levanter/compat/hf_gpt2.hpp: GPT-2 to and from Hugging Face (`transformers`' GPT2LMHeadModel): `config.json`
// plus `model.safetensors` (or shards with `model.safetensors.index.json`).
//
// Names follow upstream's state-dict key map: `transformer.` and `embeddings.` dropped, `blocks` -> `h`,
// `token_embeddings` -> `wte`, `position_embeddings` -> `wpe`, stacked layers unstacked to `h.0.`, `h.1.`, ...
// (the layout of the `gpt2` hub checkpoint). Reading also accepts the `transformer.`-prefixed names that
// `save_pretrained` writes, ignores the attention-mask buffers (`attn.bias`, `attn.masked_bias`) and checks that
// an `lm_head.weight`, if present, is the tied `wte.weight`. GPT-2's Conv1D weights are stored [in, out], which
// is exactly our {In..., Out...} layout flattened, so no transposes are needed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <levanter/checkpoint/h5.hpp>
#include <levanter/compat/safetensors.hpp>
#include <levanter/models/gpt2.hpp>

namespace levanter::hf {

namespace fs = std::filesystem;

/// A Hugging Face checkpoint that cannot be used; the message names the directory or tensor and what to do.
struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// upstream `max_shard_size` default: 10e9 bytes per safetensors shard.
inline constexpr std::uint64_t default_max_shard_bytes = 10'000'000'000ULL;

/// `hf_save_dtype` / `dtype` of the export programs: float32 (default), bfloat16 or float16.
inline safetensors::dtype dtype_from_config(const std::optional<std::string>& name) {
  if (!name || *name == "float32" || *name == "f32" || *name == "fp32") return safetensors::dtype::F32;
  if (*name == "bfloat16" || *name == "bf16") return safetensors::dtype::BF16;
  if (*name == "float16" || *name == "f16" || *name == "fp16") return safetensors::dtype::F16;
  throw error("unknown dtype '" + *name + "': use float32, bfloat16 or float16");
}
inline std::string torch_dtype_name(safetensors::dtype t) {
  switch (t) {
    case safetensors::dtype::BF16: return "bfloat16";
    case safetensors::dtype::F16: return "float16";
    default: return "float32";
  }
}

/// An opened GPT-2 Hugging Face directory.
struct gpt2_dir {
  std::string dir;
  nlohmann::json config;
  std::int64_t vocab_size = 0;
  safetensors::hf_dir tensors;
  std::string prefix;  ///< "transformer." when the names carry it, else ""
};

namespace detail {

inline std::int64_t get_int(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_number_integer())
    throw error(where + ": config.json has no integer '" + std::string(key) + "'");
  return j[key].get<std::int64_t>();
}
template <class T>
T get_or(const nlohmann::json& j, const char* key, T fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  return j[key].get<T>();
}

/// Our leaf path -> HF name (with `{i}` standing for the layer of a stacked leaf).
inline std::string hf_name(const std::string& ours) {
  static const std::pair<const char*, const char*> map[] = {
      {"transformer.blocks.stacked.", "h.{i}."},
      {"transformer.ln_f.", "ln_f."},
      {"embeddings.token_embeddings.", "wte."},
      {"embeddings.position_embeddings.", "wpe."},
  };
  for (const auto& [from, to] : map)
    if (ours.rfind(from, 0) == 0) return std::string(to) + ours.substr(std::strlen(from));
  throw error("no Hugging Face name for parameter '" + ours + "'");
}
inline std::string layer_name(const std::string& pattern, std::int64_t i) {
  const auto pos = pattern.find("{i}");
  if (pos == std::string::npos) return pattern;
  return pattern.substr(0, pos) + std::to_string(i) + pattern.substr(pos + 3);
}

/// The HF tensor names and shapes of a GPT-2 (biases included: HF's GPT-2 always has them).
inline std::vector<std::pair<std::string, std::vector<std::int64_t>>> hf_layout(const Gpt2Config& c, std::int64_t vocab) {
  const std::int64_t E = c.hidden_dim, M = c.mlp_dim();
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  out.push_back({"wte.weight", {vocab, E}});
  out.push_back({"wpe.weight", {c.seq_len, E}});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    out.push_back({h + "ln_1.weight", {E}});
    out.push_back({h + "ln_1.bias", {E}});
    out.push_back({h + "attn.c_attn.weight", {E, 3 * E}});
    out.push_back({h + "attn.c_attn.bias", {3 * E}});
    out.push_back({h + "attn.c_proj.weight", {E, E}});
    out.push_back({h + "attn.c_proj.bias", {E}});
    out.push_back({h + "ln_2.weight", {E}});
    out.push_back({h + "ln_2.bias", {E}});
    out.push_back({h + "mlp.c_fc.weight", {E, M}});
    out.push_back({h + "mlp.c_fc.bias", {M}});
    out.push_back({h + "mlp.c_proj.weight", {M, E}});
    out.push_back({h + "mlp.c_proj.bias", {E}});
  }
  out.push_back({"ln_f.weight", {E}});
  out.push_back({"ln_f.bias", {E}});
  return out;
}

/// Host copies of our leaves by HF name (layers unstacked).
inline std::map<std::string, std::vector<float>> hf_tensors(const gpt2::LMHeadModel& m, std::int64_t layers) {
  std::map<std::string, std::vector<float>> out;
  haliax::tree::for_each_leaf(m, [&](const std::string& name, const auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (std::is_same_v<typename L::value_type, float>) {
      const auto host = leaf.to_host();
      const std::string pattern = hf_name(name);
      if (pattern.find("{i}") == std::string::npos) {
        out[pattern] = host;
      } else {
        const std::size_t per = host.size() / static_cast<std::size_t>(layers);
        for (std::int64_t i = 0; i < layers; ++i)
          out[layer_name(pattern, i)] =
              std::vector<float>(host.begin() + static_cast<std::ptrdiff_t>(per * i),
                                 host.begin() + static_cast<std::ptrdiff_t>(per * (i + 1)));
      }
    }
  });
  return out;
}

}  // namespace detail

/// The config.json of a GPT-2 as `transformers` writes it (upstream `Gpt2Config.to_hf_config`).
inline nlohmann::json hf_config_json(const Gpt2Config& c, std::int64_t vocab, safetensors::dtype dt,
                                     std::optional<std::int64_t> eos_id = std::nullopt) {
  nlohmann::json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = vocab;
  j["n_positions"] = c.seq_len;
  j["n_ctx"] = c.seq_len;
  j["n_embd"] = c.hidden_dim;
  j["n_layer"] = c.num_layers;
  j["n_head"] = c.num_heads;
  j["n_inner"] = c.mlp_scale == 4 ? nlohmann::json(nullptr) : nlohmann::json(c.mlp_dim());
  j["activation_function"] = c.activation_function;
  j["resid_pdrop"] = c.resid_pdrop;
  j["embd_pdrop"] = c.embed_pdrop;
  j["attn_pdrop"] = c.attn_pdrop;
  j["layer_norm_epsilon"] = c.layer_norm_epsilon;
  j["initializer_range"] = c.initializer_range;
  j["scale_attn_by_inverse_layer_idx"] = c.scale_attn_by_inverse_layer_idx;
  j["reorder_and_upcast_attn"] = c.upcast_attn;
  j["scale_attn_weights"] = true;
  j["tie_word_embeddings"] = true;
  j["use_cache"] = true;
  if (eos_id && *eos_id < vocab) {
    j["bos_token_id"] = *eos_id;
    j["eos_token_id"] = *eos_id;
  }
  j["torch_dtype"] = torch_dtype_name(dt);  // transformers 4
  j["dtype"] = torch_dtype_name(dt);        // transformers 5
  return j;
}

/// `base` with the architecture fields of an HF config.json (upstream `Gpt2Config.from_hf_config`); our own
/// settings (gradient checkpointing, attention backend, ...) are kept.
inline Gpt2Config merge_hf_config(Gpt2Config base, const nlohmann::json& j, const std::string& where = "config.json") {
  base.seq_len = static_cast<int>(detail::get_int(j, "n_positions", where));
  base.num_layers = static_cast<int>(detail::get_int(j, "n_layer", where));
  base.num_heads = static_cast<int>(detail::get_int(j, "n_head", where));
  base.hidden_dim = static_cast<int>(detail::get_int(j, "n_embd", where));
  const auto n_inner = detail::get_or<std::int64_t>(j, "n_inner", 4 * std::int64_t(base.hidden_dim));
  if (base.hidden_dim <= 0 || n_inner % base.hidden_dim != 0)
    throw error(where + ": n_inner " + std::to_string(n_inner) + " is not a multiple of n_embd " +
                std::to_string(base.hidden_dim) + " (our GPT-2 has mlp = mlp_scale * hidden_dim)");
  base.mlp_scale = static_cast<int>(n_inner / base.hidden_dim);
  base.initializer_range = detail::get_or<double>(j, "initializer_range", base.initializer_range);
  base.attn_pdrop = detail::get_or<double>(j, "attn_pdrop", base.attn_pdrop);
  base.embed_pdrop = detail::get_or<double>(j, "embd_pdrop", base.embed_pdrop);
  base.resid_pdrop = detail::get_or<double>(j, "resid_pdrop", base.resid_pdrop);
  base.layer_norm_epsilon = detail::get_or<double>(j, "layer_norm_epsilon", base.layer_norm_epsilon);
  base.activation_function = detail::get_or<std::string>(j, "activation_function", base.activation_function);
  base.scale_attn_by_inverse_layer_idx =
      detail::get_or<bool>(j, "scale_attn_by_inverse_layer_idx", base.scale_attn_by_inverse_layer_idx);
  base.upcast_attn = detail::get_or<bool>(j, "reorder_and_upcast_attn", base.upcast_attn);
  base.use_bias = true;
  if (!detail::get_or<bool>(j, "scale_attn_weights", true))
    throw error(where + ": scale_attn_weights false is not supported (our attention divides by sqrt(head_size))");
  try {
    haliax::nn::activation_from_name(base.activation_function);
  } catch (const std::exception&) {
    throw error(where + ": activation_function '" + base.activation_function + "' is not supported");
  }
  return base;
}

/// Throws when the architecture in `j` differs from the model config `c` (set use_hf_model_config to take it).
inline void check_matches(const Gpt2Config& c, const nlohmann::json& j, const std::string& where) {
  const Gpt2Config h = merge_hf_config(c, j, where);
  auto differs = [&](const char* key, auto ours, auto theirs) {
    if (ours != theirs)
      throw error(where + ": the Hugging Face model has " + key + " " + nlohmann::json(theirs).dump() +
                  " but the model config says " + nlohmann::json(ours).dump() +
                  " (set use_hf_model_config: true to take the checkpoint's architecture)");
  };
  differs("n_positions", c.seq_len, h.seq_len);
  differs("n_layer", c.num_layers, h.num_layers);
  differs("n_head", c.num_heads, h.num_heads);
  differs("n_embd", c.hidden_dim, h.hidden_dim);
  differs("mlp_scale (n_inner / n_embd)", c.mlp_scale, h.mlp_scale);
  differs("activation_function", c.activation_function, h.activation_function);
}

/// Opens a local Hugging Face GPT-2 directory. `what` names the setting in messages.
inline gpt2_dir open_gpt2_dir(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (!fs::is_directory(path, ec))
    throw error(what + ": '" + path + "' is not a local directory. Downloading from the Hugging Face Hub is not " +
                "possible here: download it first (e.g. `huggingface-cli download " + path +
                " --local-dir DIR`) and give DIR");
  const fs::path cfg_path = fs::path(path) / "config.json";
  std::ifstream in(cfg_path);
  if (!in) throw error(what + ": '" + cfg_path.string() + "' is missing");
  gpt2_dir d{path, {}, 0, safetensors::hf_dir(path), ""};
  try {
    d.config = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw error(what + ": '" + cfg_path.string() + "' is not valid JSON (" + e.what() + ")");
  }
  if (!d.config.is_object()) throw error(what + ": '" + cfg_path.string() + "' is not a JSON object");
  const auto type = detail::get_or<std::string>(d.config, "model_type", "");
  if (type != "gpt2")
    throw error(what + ": '" + cfg_path.string() + "' has model_type '" + type + "'; only gpt2 is supported");
  d.vocab_size = detail::get_int(d.config, "vocab_size", cfg_path.string());
  d.prefix = d.tensors.find("transformer.wte.weight") ? "transformer." : "";
  return d;
}

/// Loads the weights of `d` into `m`, whose config must have the HF architecture (see check_matches).
inline void load_gpt2(const gpt2_dir& d, gpt2::LMHeadModel& m) {
  const std::int64_t layers = m.transformer.blocks.stacked.attn.c_attn.weight.size(Layers);
  std::set<std::string> used;
  auto read = [&](const std::string& name, std::size_t want) {
    const std::string full = d.prefix + name;
    const auto* t = d.tensors.find(full);
    if (!t) throw error("'" + d.dir + "' has no tensor '" + full + "'");
    const auto v = d.tensors.read_f32(full);
    if (v.size() != want)
      throw error("'" + d.dir + "': tensor '" + full + "' has " + std::to_string(v.size()) + " elements, the model expects " +
                  std::to_string(want) + " (does config.json match the weights?)");
    used.insert(full);
    return v;
  };
  haliax::tree::for_each_leaf(m, [&](const std::string& name, auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (std::is_same_v<typename L::value_type, float>) {
      const std::string pattern = detail::hf_name(name);
      const auto n = static_cast<std::size_t>(leaf.element_count());
      std::vector<float> all;
      if (pattern.find("{i}") == std::string::npos) {
        all = read(pattern, n);
      } else {
        all.reserve(n);
        for (std::int64_t i = 0; i < layers; ++i) {
          auto part = read(detail::layer_name(pattern, i), n / static_cast<std::size_t>(layers));
          all.insert(all.end(), part.begin(), part.end());
        }
      }
      auto fresh = L::allocate(leaf.sizes(), "hf::load_gpt2");
      Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> host(all.data(), all.size());
      Kokkos::deep_copy(Kokkos::subview(fresh.view(), Kokkos::make_pair(std::size_t{0}, all.size())), host);
      leaf = fresh;
    }
  });
  // Whatever is left must be harmless: mask buffers, a tied lm_head, or zero biases our model does not have.
  const auto wte = d.tensors.read_f32(d.prefix + "wte.weight");
  std::vector<std::string> unknown;
  for (const auto& n : d.tensors.names()) {
    if (used.count(n)) continue;
    const bool buffer = n.size() > 9 && (n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias"));
    if (buffer) continue;
    if (n == "lm_head.weight") {
      if (d.tensors.read_f32(n) != wte)
        throw error("'" + d.dir + "': lm_head.weight differs from wte.weight; untied GPT-2 heads are not supported");
      continue;
    }
    if (n.ends_with(".bias")) {
      const auto b = d.tensors.read_f32(n);
      if (std::all_of(b.begin(), b.end(), [](float x) { return x == 0.0f; })) continue;
      throw error("'" + d.dir + "': tensor '" + n + "' is a non-zero bias but the model config has use_bias: false");
    }
    unknown.push_back(n);
  }
  if (!unknown.empty()) {
    std::string list;
    for (const auto& u : unknown) list += (list.empty() ? "" : ", ") + u;
    throw error("'" + d.dir + "' holds tensors a GPT-2 does not have: " + list);
  }
}

/// Writes `m` as a Hugging Face GPT-2 directory (`config.json` + safetensors). Returns the files written.
inline std::vector<std::string> save_gpt2(const gpt2::LMHeadModel& m, const Gpt2Config& c, std::int64_t vocab,
                                          const std::string& dir, safetensors::dtype dt = safetensors::dtype::F32,
                                          std::uint64_t max_shard_bytes = default_max_shard_bytes,
                                          std::optional<std::int64_t> eos_id = std::nullopt) {
  const auto ours = detail::hf_tensors(m, c.num_layers);
  std::vector<safetensors::tensor_to_write> tensors;
  for (const auto& [name, shape] : detail::hf_layout(c, vocab)) {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    std::vector<float> values;
    if (auto it = ours.find(name); it != ours.end()) {
      values = it->second;
      if (static_cast<std::int64_t>(values.size()) != n)
        throw error("save_gpt2: '" + name + "' has " + std::to_string(values.size()) + " elements, expected " +
                    std::to_string(n));
    } else if (name.ends_with(".bias")) {
      values.assign(static_cast<std::size_t>(n), 0.0f);  // use_bias: false
    } else {
      throw error("save_gpt2: the model has no '" + name + "'");
    }
    tensors.push_back({name, dt, shape, safetensors::encode_floats(values, dt)});
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw error("cannot create '" + dir + "': " + ec.message());
  auto files = safetensors::write_hf_dir(dir, tensors, max_shard_bytes);
  const auto cfg = hf_config_json(c, vocab, dt, eos_id).dump(2) + "\n";
  const fs::path tmp = fs::path(dir) / "config.json.tmp";
  {
    std::ofstream out(tmp);
    out << cfg;
    if (!out.flush()) throw error("writing '" + tmp.string() + "' failed (disk full?)");
  }
  fs::rename(tmp, fs::path(dir) / "config.json");
  files.push_back("config.json");
  return files;
}

}  // namespace levanter::hf
