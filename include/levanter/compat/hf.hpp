// levanter/compat/hf.hpp: Hugging Face model directories (`config.json` plus `model.safetensors`, or shards with
// `model.safetensors.index.json`) to and from any model that has an `hf_adapter` (upstream HFCheckpointConverter):
//
//   auto dir = levanter::hf::open_dir("hf/gpt2", "initialize_from_hf");
//   auto cfg = levanter::hf::config_from_hf<M>(base_cfg, dir.config, "hf/gpt2/config.json");
//   auto model = M::init(cfg, dir.vocab_size, key);
//   levanter::hf::load(dir, model, config);                           // names and layers as the adapter maps them
//   levanter::hf::save(model, cfg, vocab, "out", {.bos = 0, .eos = 0}); // config.json + safetensors
//
// An adapter (`template <> struct hf_adapter<M>`, next to the model) says, for one model type:
//   model_type                                the config.json `model_type` it reads and writes
//   to_hf_config(config, vocab, tokens)       config.json (without dtype and token ids, which are added here)
//   from_hf_config(base, json, where)         the architecture from config.json, our own settings kept from base
//   check_matches(config, json, where)        throws hf::error when config.json describes another architecture
//   hf_name(our leaf path)                    the HF tensor name, "{i}" standing for the layer of a stacked leaf
//   hf_layout(config, vocab)                  every HF tensor with its shape, in the order they are written
//   missing_ok(hf name)                       a tensor the model lacks that is written as zeros (a bias when
//                                             use_bias is false)
//   full_name(dir, hf name)                   the name as stored in that directory (prefixes some writers add)
//   unused(dir, hf name)                      for a tensor in the directory that no leaf read: "" when harmless
//                                             (buffers, a tied head), "unknown" for a tensor the model lacks,
//                                             else the reason it is refused
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <haliax/tree.hpp>
#include <levanter/compat/hf_json.hpp>
#include <levanter/compat/safetensors.hpp>
#include <levanter/config/validate.hpp>

namespace levanter::hf {

/// upstream `max_shard_size` default: 10e9 bytes per safetensors shard.
inline constexpr std::uint64_t default_max_shard_bytes = 10'000'000'000ULL;

/// `hf_save_dtype` / `save_dtype`: float32 (default), bfloat16 or float16. Throws error for other names.
safetensors::dtype dtype_from_config(const std::optional<std::string>& name);
/// The torch name of a dtype ("float32", "bfloat16", "float16").
std::string torch_dtype_name(safetensors::dtype t);

/// The special tokens config.json records (`bos_token_id`, `eos_token_id`), from the tokenizer the model was
/// trained with; unset ones are written as null.
struct token_ids {
  std::optional<std::int64_t> bos;
  std::optional<std::int64_t> eos;
  /// config.json's own values, written as they were read (an imported model without a tokenizer keeps its ids,
  /// lists included: Llama 3 has two EOS ids); null: use `bos` / `eos`.
  nlohmann::json bos_json = nullptr, eos_json = nullptr;
};

/// An opened Hugging Face directory.
struct hf_dir {
  std::string dir;
  nlohmann::json config;
  std::int64_t vocab_size = 0;
  safetensors::hf_dir tensors;
  std::string model_type;
  /// The multimodal wrapper the language model was read from (config_json::wrapper); "" for a plain one.
  std::string wrapper;
};

/// Opens a local Hugging Face directory: config.json (an object with an integer vocab_size) and its safetensors.
/// `what` names the setting in messages. Throws error.
hf_dir open_dir(const std::string& path, const std::string& what);

/// The adapter of a model type (specialised next to the model).
template <class M>
struct hf_adapter;

/// Whether model type `M` has a Hugging Face adapter.
template <class M>
concept HfConvertible = requires { hf_adapter<M>::model_type; };

namespace detail {
/// `pattern` with "{i}" replaced by layer i and "{e}" by expert e.
std::string layer_name(const std::string& pattern, std::int64_t i, std::int64_t e = 0);
/// Writes `json_text` as config.json in `dir` atomically. Throws error.
void write_config_json(const std::string& dir, const std::string& json_text);
/// Refuses a directory whose model_type is not `want`.
void check_model_type(const hf_dir& d, std::string_view want);
/// Puts a leaf's host copy into `out` by HF name; a stacked leaf (`pattern` with "{i}", `layers` its first axis)
/// becomes one tensor per layer, and one per layer and expert with "{e}" too (`experts` its second axis).
void host_copy(const std::string& name, const float* data, std::size_t n, const std::string& pattern,
               std::int64_t layers, std::map<std::string, std::vector<float>>& out, std::int64_t experts = 1);
/// A leaf's second axis (the experts of a stacked expert weight), 1 for a leaf of rank below 2.
template <class L>
std::int64_t second_axis(const L& leaf) {
  if constexpr (L::rank >= 2)
    return leaf.sizes()[1];
  else
    return 1;
}
/// check_model_config (compat/hf_json.hpp) with adapter `A`'s key names (`A::hf_keys()`, when it has them).
template <class A, class C>
void check_hf_model_config(const C& c, const std::string& where) {
  if constexpr (requires { A::hf_keys(); })
    check_model_config(c, where, A::hf_keys());
  else
    check_model_config(c, where, {});
}

/// Refuses a directory whose model_type adapter `A` does not read (an adapter for a family of model types says
/// which with `reads_model_type`; its from_hf_config then matches the type to the config).
template <class A>
void check_adapter_type(const hf_dir& d) {
  if constexpr (requires { A::reads_model_type(std::string_view{}); }) {
    if (!A::reads_model_type(d.model_type)) check_model_type(d, A::model_type);
  } else {
    check_model_type(d, A::model_type);
  }
}
}  // namespace detail

/// The config.json model_type that config type `C` reads and writes: `C::hf_model_type` for a config type of a
/// family sharing one model (the Llama family), else the adapter's.
template <class C, class M>
constexpr std::string_view hf_model_type_for() {
  if constexpr (requires { C::hf_model_type; })
    return C::hf_model_type;
  else
    return hf_adapter<M>::model_type;
}

/// Throws error when a tensor of `d` that the model of config `c` reads has another shape than the model needs
/// (vocab_size from config.json): checked before a model is allocated, so that a config.json that does not match
/// its weights (or asks for an absurd size) is named at once, not after minutes of initialisation.
template <HfConvertible M>
void check_tensors(const hf_dir& d, const typename M::config_type& c) {
  using A = hf_adapter<M>;
  for (const auto& [name, shape] : A::hf_layout(c, d.vocab_size)) {
    const std::string full = A::full_name(d, name);
    const auto* info = d.tensors.find(full);
    if (!info) continue;  // a missing tensor is load's to name (some are written as zeros: missing_ok)
    if (info->shape != shape) {
      auto text = [](const std::vector<std::int64_t>& v) {
        std::string t = "[";
        for (std::size_t i = 0; i < v.size(); ++i) t += (i ? ", " : "") + std::to_string(v[i]);
        return t + "]";
      };
      throw error("'" + d.dir + "': tensor '" + full + "' has shape " + text(info->shape) + ", but config.json (" +
                  "vocab_size " + std::to_string(d.vocab_size) + ") describes a model that needs " + text(shape) +
                  " (does config.json match the weights?)");
    }
  }
}

/// The model config of an HF directory's config.json, starting from `base` (our own settings are kept), checked
/// as train_lm checks a model section (the same ranges and rules), so that a directory it refuses is refused at
/// import, naming config.json, not later by another program.
template <HfConvertible M>
typename M::config_type config_from_hf(const typename M::config_type& base, const hf_dir& d) {
  detail::check_adapter_type<hf_adapter<M>>(d);
  const std::string where = d.dir + "/config.json";
  typename M::config_type c;
  try {
    c = hf_adapter<M>::from_hf_config(base, d.config, where);
  } catch (const detail::value_error& e) {
    throw error(where + ": " + e.what() + " (model_type '" + d.model_type + "')");
  } catch (const error& e) {
    throw error(std::string(e.what()) + " (model_type '" + d.model_type + "')");
  }
  detail::check_hf_model_config<hf_adapter<M>>(c, where);
  check_tensors<M>(d, c);
  return c;
}

/// Throws error when `d` holds another architecture than `c` (set use_hf_model_config to take the checkpoint's).
template <HfConvertible M>
void check_matches(const typename M::config_type& c, const hf_dir& d, const std::string& where) {
  detail::check_adapter_type<hf_adapter<M>>(d);
  try {
    hf_adapter<M>::check_matches(c, d.config, where);
  } catch (const detail::value_error& e) {
    throw error(d.dir + "/config.json: " + e.what());
  }
  check_tensors<M>(d, c);
}

/// The config.json of model config `c` as `transformers` writes it, with the dtype and the tokenizer's ids.
template <HfConvertible M>
nlohmann::json hf_config_json(const typename M::config_type& c, std::int64_t vocab, safetensors::dtype dt,
                              const token_ids& ids) {
  auto j = hf_adapter<M>::to_hf_config(c, vocab);
  j["bos_token_id"] = !ids.bos_json.is_null()   ? ids.bos_json
                      : ids.bos && *ids.bos < vocab ? nlohmann::json(*ids.bos)
                                                    : nlohmann::json(nullptr);
  j["eos_token_id"] = !ids.eos_json.is_null()   ? ids.eos_json
                      : ids.eos && *ids.eos < vocab ? nlohmann::json(*ids.eos)
                                                    : nlohmann::json(nullptr);
  j["torch_dtype"] = torch_dtype_name(dt);  // transformers 4
  j["dtype"] = torch_dtype_name(dt);        // transformers 5
  return j;
}

/// Loads the weights of `d` into `m` (of config `c`, which must have the directory's architecture: see
/// check_matches). Throws error naming the tensor for a missing tensor, a shape that differs from the model's
/// (a transposed or flattened tensor of the right size included), or a tensor the model lacks.
template <HfConvertible M>
void load(const hf_dir& d, M& m, const typename M::config_type& c) {
  using A = hf_adapter<M>;
  detail::check_adapter_type<A>(d);
  std::map<std::string, std::vector<std::int64_t>> layout;
  for (auto& [name, shape] : A::hf_layout(c, m.vocab_size())) layout.emplace(name, std::move(shape));
  auto shape_text = [](const std::vector<std::int64_t>& s) {
    std::string t = "[";
    for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
  };
  std::set<std::string> used;
  auto read = [&](const std::string& name, std::size_t want) {
    const std::string full = A::full_name(d, name);
    const auto* info = d.tensors.find(full);
    if (!info) throw error("'" + d.dir + "' has no tensor '" + full + "' (does config.json match the weights?)");
    if (const auto it = layout.find(name); it != layout.end() && info->shape != it->second)
      throw error("'" + d.dir + "': tensor '" + full + "' has shape " + shape_text(info->shape) +
                  ", the model expects " + shape_text(it->second) + " (does config.json match the weights?)");
    auto v = d.tensors.read_f32(full);
    if (v.size() != want)
      throw error("'" + d.dir + "': tensor '" + full + "' has " + std::to_string(v.size()) +
                  " elements, the model expects " + std::to_string(want) + " (does config.json match the weights?)");
    // A weight that is NaN or infinite makes every later loss NaN; say which tensor, and where, now.
    for (std::size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i]))
        throw error("'" + d.dir + "': tensor '" + full + "' holds " + (std::isnan(v[i]) ? "NaN" : "an infinite value") +
                    " (element " + std::to_string(i) + "); the checkpoint is damaged or its training diverged");
    used.insert(full);
    return v;
  };
  haliax::tree::for_each_leaf(m, [&](const std::string& name, auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (std::is_same_v<typename L::value_type, float>) {
      const std::string pattern = A::hf_name(name);
      const auto n = static_cast<std::size_t>(leaf.element_count());
      std::vector<float> all;
      if (pattern.find("{i}") == std::string::npos) {
        all = read(pattern, n);
      } else {
        all.reserve(n);
        const std::int64_t layers = leaf.sizes()[0];  // a stacked leaf's first axis is its layers
        // with "{e}", its second axis is its experts: one tensor per layer and expert
        const std::int64_t experts = pattern.find("{e}") == std::string::npos ? 1 : detail::second_axis(leaf);
        for (std::int64_t i = 0; i < layers; ++i)
          for (std::int64_t e = 0; e < experts; ++e) {
            auto part = read(detail::layer_name(pattern, i, e), n / static_cast<std::size_t>(layers * experts));
            all.insert(all.end(), part.begin(), part.end());
          }
      }
      auto fresh = L::allocate(leaf.sizes(), "hf::load");
      Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged> host(all.data(), all.size());
      Kokkos::deep_copy(Kokkos::subview(fresh.view(), Kokkos::make_pair(std::size_t{0}, all.size())), host);
      leaf = fresh;
    }
  });
  std::vector<std::string> unknown;
  for (const auto& n : d.tensors.names()) {
    if (used.count(n)) continue;
    const std::string why = A::unused(d, n);
    if (why.empty()) continue;
    if (why == "unknown")
      unknown.push_back(n);
    else
      throw error("'" + d.dir + "': " + why + " (does config.json match the weights?)");
  }
  if (!unknown.empty()) {
    std::string list;
    for (const auto& u : unknown) list += (list.empty() ? "" : ", ") + u;
    throw error("'" + d.dir + "' holds tensors a " + std::string(A::model_type) +
                " model does not have (does config.json match the weights?): " + list);
  }
}

/// Writes `m` as a Hugging Face directory (`config.json` + safetensors, sharded above `max_shard_bytes`). Returns
/// the files written.
template <HfConvertible M>
std::vector<std::string> save(const M& m, const typename M::config_type& c, std::int64_t vocab, const std::string& dir,
                              const token_ids& ids, safetensors::dtype dt = safetensors::dtype::F32,
                              std::uint64_t max_shard_bytes = default_max_shard_bytes) {
  using A = hf_adapter<M>;
  std::map<std::string, std::vector<float>> ours;
  haliax::tree::for_each_leaf(m, [&](const std::string& name, const auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (std::is_same_v<typename L::value_type, float>) {
      const auto host = leaf.to_host();
      detail::host_copy(name, host.data(), host.size(), A::hf_name(name), leaf.sizes()[0], ours,
                        detail::second_axis(leaf));
    }
  });
  std::vector<safetensors::tensor_to_write> tensors;
  for (const auto& [name, shape] : A::hf_layout(c, vocab)) {
    std::int64_t n = 1;
    for (auto s : shape) n *= s;
    std::vector<float> values;
    if (auto it = ours.find(name); it != ours.end()) {
      values = std::move(it->second);
      if (static_cast<std::int64_t>(values.size()) != n)
        throw error("hf::save: '" + name + "' has " + std::to_string(values.size()) + " elements, expected " +
                    std::to_string(n));
    } else if (A::missing_ok(name)) {
      values.assign(static_cast<std::size_t>(n), 0.0f);
    } else {
      throw error("hf::save: the model has no '" + name + "'");
    }
    tensors.push_back({name, dt, shape, safetensors::encode_floats(values, dt)});
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw error("cannot create '" + dir + "': " + ec.message());
  auto files = safetensors::write_hf_dir(dir, tensors, max_shard_bytes);
  detail::write_config_json(dir, hf_config_json<M>(c, vocab, dt, ids).dump(2) + "\n");
  files.push_back("config.json");
  return files;
}

}  // namespace levanter::hf
