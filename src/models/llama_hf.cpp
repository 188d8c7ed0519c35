// The Llama family <-> Hugging Face (levanter/models/llama_hf.hpp).
#include <levanter/models/llama_hf.hpp>

#include <cstring>
#include <optional>
#include <variant>

#include <haliax/nn/activation.hpp>
#include <levanter/config/validate.hpp>

namespace levanter::hf {

using adapter = hf_adapter<llama::LMHeadModel>;

namespace {

nlohmann::json rope_to_hf(const RopeChoice& r) {
  return std::visit(
      [](const auto& c) {
        using C = std::decay_t<decltype(c)>;
        nlohmann::json j;
        j["rope_theta"] = c.theta;
        if constexpr (std::is_same_v<C, Llama3RopeConfig>) {
          j["rope_type"] = "llama3";
          j["factor"] = c.factor;
          j["low_freq_factor"] = c.low_freq_factor;
          j["high_freq_factor"] = c.high_freq_factor;
          j["original_max_position_embeddings"] = c.original_max_position_embeddings;
        } else if constexpr (std::is_same_v<C, YarnRopeConfig>) {
          j["rope_type"] = "yarn";
          j["factor"] = c.factor;
          j["beta_fast"] = c.beta_fast;
          j["beta_slow"] = c.beta_slow;
          j["original_max_position_embeddings"] = c.original_max_position_embeddings;
        } else if constexpr (std::is_same_v<C, LinearRopeConfig>) {
          j["rope_type"] = "linear";
          j["factor"] = c.factor;
        } else {
          if (c.factor != 1.0) {
            j["rope_type"] = "linear";  // a default rope with a factor is transformers' linear scaling
            j["factor"] = c.factor;
          } else {
            j["rope_type"] = "default";
          }
        }
        return j;
      },
      r.value);
}

/// The rope of a config.json: transformers 5's `rope_parameters`, or transformers 4's `rope_theta` +
/// `rope_scaling`.
RopeChoice rope_from_hf(const nlohmann::json& j, std::int64_t max_positions, const std::string& where) {
  nlohmann::json p = nlohmann::json::object();
  auto given = [&](const char* k) {
    if (!j.contains(k) || j[k].is_null()) return false;
    if (!j[k].is_object())
      throw error(where + ": '" + std::string(k) + "' is " + j[k].dump() + ", not an object (a rope type and its "
                  "parameters, e.g. {\"rope_type\": \"llama3\", \"factor\": 8.0, ...})");
    return true;
  };
  const bool params = given("rope_parameters"), scaling = given("rope_scaling");
  if (params) {
    p = j["rope_parameters"];
    // transformers 5 writes rope_parameters; an older rope_scaling beside it must not say something else.
    if (scaling)
      for (const auto& [k, v] : j["rope_scaling"].items())
        if (k != "rope_theta" && (!p.contains(k) || p[k] != v) && !(k == "type" && p.value("rope_type", v) == v))
          throw error(where + ": rope_scaling's '" + k + "' (" + v.dump() + ") differs from rope_parameters (" +
                      (p.contains(k) ? p[k].dump() : std::string("absent")) + "); keep one of them");
  } else if (scaling) {
    p = j["rope_scaling"];
  }
  if (!p.contains("rope_theta") || p["rope_theta"].is_null())
    p["rope_theta"] = detail::get_or<double>(j, "rope_theta", 10000.0);
  for (const char* k : {"rope_type", "type"})
    if (p.contains(k) && !p[k].is_null() && !p[k].is_string())
      throw error(where + ": the rope's '" + std::string(k) + "' is " + p[k].dump() + ", not a name");
  for (const auto& [k, v] : p.items())
    if (k != "rope_type" && k != "type" && !v.is_null() && !v.is_number() && !v.is_boolean() && !v.is_array())
      throw error(where + ": the rope's '" + k + "' is " + v.dump() + ", not a number");
  std::string type = detail::get_or<std::string>(p, "rope_type", detail::get_or<std::string>(p, "type", "default"));
  const double theta = detail::get_or<double>(p, "rope_theta", 10000.0);
  RopeChoice r;
  if (type == "default") {
    r.value = DefaultRopeConfig{theta, detail::get_or<double>(p, "factor", 1.0)};
  } else if (type == "linear") {
    r.value = LinearRopeConfig{theta, detail::get_or<double>(p, "factor", 1.0)};
  } else if (type == "llama3") {
    Llama3RopeConfig c;
    c.theta = theta;
    c.factor = detail::get_or<double>(p, "factor", c.factor);
    c.low_freq_factor = detail::get_or<double>(p, "low_freq_factor", c.low_freq_factor);
    c.high_freq_factor = detail::get_or<double>(p, "high_freq_factor", c.high_freq_factor);
    if (p.contains("original_max_position_embeddings") && !p["original_max_position_embeddings"].is_null())
      c.original_max_position_embeddings =
          detail::get_int_in(p, "original_max_position_embeddings", where, 1, config::bounds::max_seq_len);
    r.value = c;
  } else if (type == "yarn") {
    YarnRopeConfig c;
    c.theta = theta;
    c.original_max_position_embeddings =
        p.contains("original_max_position_embeddings") && !p["original_max_position_embeddings"].is_null()
            ? detail::get_int_in(p, "original_max_position_embeddings", where, 1, config::bounds::max_seq_len)
            : static_cast<int>(max_positions);
    // transformers: without a factor, the ratio of the context lengths
    c.factor = detail::get_or<double>(p, "factor", double(max_positions) / c.original_max_position_embeddings);
    c.beta_fast = detail::get_or<double>(p, "beta_fast", c.beta_fast);
    c.beta_slow = detail::get_or<double>(p, "beta_slow", c.beta_slow);
    for (const char* k : {"attention_factor", "mscale_all_dim"})
      if (p.contains(k) && !p[k].is_null())
        throw error(where + ": yarn's '" + k + "' is not supported (only the default attention factor)");
    if (!detail::get_or<bool>(p, "truncate", true))
      throw error(where + ": yarn with truncate false is not supported");
    r.value = c;
  } else {
    throw error(where + ": rope_type '" + type + "' is not supported (use default, linear, llama3 or yarn; dynamic "
                "and longrope scaling are not implemented)");
  }
  if (detail::get_or<double>(p, "partial_rotary_factor", 1.0) != 1.0)
    throw error(where + ": partial_rotary_factor other than 1 is not supported");
  return r;
}

const char* architecture_of(llama_family f) {
  switch (f) {
    case llama_family::mistral:
      return "MistralForCausalLM";
    case llama_family::qwen2:
      return "Qwen2ForCausalLM";
    case llama_family::qwen3:
      return "Qwen3ForCausalLM";
    default:
      return "LlamaForCausalLM";
  }
}

bool windowed_family(llama_family f) { return f == llama_family::qwen2 || f == llama_family::qwen3; }

}  // namespace

std::string_view adapter::model_type_of(const LlamaConfig& c) {
  switch (c.family) {
    case llama_family::mistral:
      return "mistral";
    case llama_family::qwen2:
      return "qwen2";
    case llama_family::qwen3:
      return "qwen3";
    default:
      return "llama";
  }
}

nlohmann::json adapter::to_hf_config(const LlamaConfig& c, std::int64_t vocab) {
  const std::string who(family_type_name(c.family));
  if (c.hybrid_norm || c.input_embedding_norm)
    throw error(who + ": hybrid_norm and input_embedding_norm have no Hugging Face form; disable them to export");
  if (c.use_bias) throw error(who + ": use_bias true (biases in every projection and norm) has no Hugging Face form");
  if (c.use_qk_norm && c.family != llama_family::qwen3)
    throw error(who + ": use_qk_norm has no Hugging Face form for this model type (use type: qwen3)");
  if (!c.use_layer_norm_weight) throw error(who + ": use_layer_norm_weight false has no Hugging Face form");
  nlohmann::json j;
  j["architectures"] = {architecture_of(c.family)};
  j["model_type"] = std::string(model_type_of(c));
  j["vocab_size"] = vocab;
  j["max_position_embeddings"] = c.seq_len;
  j["hidden_size"] = c.hidden_dim;
  j["intermediate_size"] = c.intermediate_dim;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_size();
  j["hidden_act"] = c.activation_function;
  j["initializer_range"] = c.initializer_range;
  j["rms_norm_eps"] = c.layer_norm_epsilon;
  j["tie_word_embeddings"] = c.tied();
  j["attention_dropout"] = 0.0;
  j["use_cache"] = true;
  j["rope_parameters"] = rope_to_hf(c.rope);
  if (c.family == llama_family::llama) {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  } else if (c.family == llama_family::mistral) {
    j["sliding_window"] = c.sliding_window ? nlohmann::json(*c.sliding_window) : nlohmann::json(nullptr);
  } else {
    if (c.family == llama_family::qwen3) j["attention_bias"] = false;
    j["use_sliding_window"] = c.use_sliding_window;
    j["sliding_window"] = c.sliding_window ? nlohmann::json(*c.sliding_window) : nlohmann::json(nullptr);
    j["max_window_layers"] = c.max_window_layers;
    nlohmann::json types = nlohmann::json::array();
    for (int i = 0; i < c.num_layers; ++i)
      types.push_back(c.window_of_layer(i) > 0 ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
  }
  return j;
}

LlamaConfig adapter::from_hf_config(LlamaConfig base, const nlohmann::json& j, const std::string& where) {
  const std::string t = detail::get_or<std::string>(j, "model_type", "");
  if (t != model_type_of(base))
    throw error(where + ": the Hugging Face model is a '" + t +
                "' but the model config has type: " + std::string(family_type_name(base.family)) +
                " (set model.type: " + (t == "qwen2" ? std::string("qwen") : t) + ")");
  namespace b = config::bounds;
  base.seq_len = detail::get_int_in(j, "max_position_embeddings", where, 2, b::max_seq_len);
  base.hidden_dim = detail::get_int_in(j, "hidden_size", where, 1, b::max_model_dim);
  base.intermediate_dim = detail::get_int_in(j, "intermediate_size", where, 1, b::max_model_dim);
  base.num_layers = detail::get_int_in(j, "num_hidden_layers", where, 1, b::max_layers);
  base.num_heads = detail::get_int_in(j, "num_attention_heads", where, 1, b::max_heads);
  base.num_kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                          ? detail::get_int_in(j, "num_key_value_heads", where, 1, b::max_heads)
                          : base.num_heads;
  base.head_dim.reset();
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    const auto hd = detail::get_int_in(j, "head_dim", where, 1, b::max_model_dim);
    if (base.num_heads <= 0 || hd * base.num_heads != base.hidden_dim) base.head_dim = static_cast<int>(hd);
  }
  base.activation_function = detail::get_or<std::string>(j, "hidden_act", "silu");
  base.initializer_range = detail::get_or<double>(j, "initializer_range", base.initializer_range);
  base.layer_norm_epsilon = detail::get_or<double>(j, "rms_norm_eps", 1e-6);
  base.tie_word_embeddings = detail::get_or<bool>(j, "tie_word_embeddings", false);
  base.rope = rope_from_hf(j, base.seq_len, where);
  base.use_bias = false;
  base.hybrid_norm = base.input_embedding_norm = base.use_qk_norm = false;
  base.use_layer_norm_weight = true;
  for (const char* k : {"attention_bias", "mlp_bias"})
    if (detail::get_or<bool>(j, k, false))
      throw error(where + ": " + k + " true is not supported for model_type '" + t + "'");
  if (base.family == llama_family::mistral) {
    if (j.contains("sliding_window") && !j["sliding_window"].is_null())
      base.sliding_window = detail::get_int_in(j, "sliding_window", where, 1, b::max_seq_len);
    else
      base.sliding_window.reset();
    if (base.tie_word_embeddings)
      throw error(where + ": tie_word_embeddings true is not supported for a Mistral (upstream unties its head)");
  } else if (windowed_family(base.family)) {
    base.use_sliding_window = detail::get_or<bool>(j, "use_sliding_window", false);
    if (j.contains("sliding_window") && !j["sliding_window"].is_null())
      base.sliding_window = detail::get_int_in(j, "sliding_window", where, 1, b::max_seq_len);
    else
      base.sliding_window.reset();
    base.max_window_layers = j.contains("max_window_layers") && !j["max_window_layers"].is_null()
                                 ? detail::get_int_in(j, "max_window_layers", where, 0, b::max_layers)
                                 : 0;
    if (base.use_sliding_window && !base.sliding_window)
      throw error(where + ": use_sliding_window is true but sliding_window is null");
    if (j.contains("layer_types") && !j["layer_types"].is_null() && !j["layer_types"].is_array())
      throw error(where + ": layer_types is " + j["layer_types"].dump() + ", not a list");
    if (j.contains("layer_types") && j["layer_types"].is_array()) {
      const auto& lt = j["layer_types"];
      if (static_cast<int>(lt.size()) != base.num_layers)
        throw error(where + ": layer_types has " + std::to_string(lt.size()) + " entries for " +
                    std::to_string(base.num_layers) + " layers");
      for (int i = 0; i < base.num_layers; ++i) {
        if (!lt[i].is_string() || (lt[i] != "sliding_attention" && lt[i] != "full_attention"))
          throw error(where + ": layer_types[" + std::to_string(i) + "] is " + lt[i].dump() +
                      ", not \"full_attention\" or \"sliding_attention\"");
        const bool sliding = lt[i].get<std::string>() == "sliding_attention";
        if (sliding != (base.window_of_layer(i) > 0))
          throw error(where + ": layer_types[" + std::to_string(i) + "] is '" + lt[i].get<std::string>() +
                      "', which use_sliding_window / max_window_layers do not give (only windows from "
                      "max_window_layers on are supported)");
      }
    }
  }
  if (!haliax::nn::find_activation(base.activation_function))
    throw error(where + ": hidden_act '" + base.activation_function + "' is not supported (use one of " +
                haliax::nn::activation_names() + ")");
  return base;
}

void adapter::check_matches(const LlamaConfig& c, const nlohmann::json& j, const std::string& where) {
  const LlamaConfig h = from_hf_config(c, j, where);
  auto differs = [&](const char* key, auto ours, auto theirs) {
    if (ours != theirs)
      throw error(where + ": the Hugging Face model has " + key + " " + nlohmann::json(theirs).dump() +
                  " but the model config says " + nlohmann::json(ours).dump() +
                  " (set use_hf_model_config: true to take the checkpoint's architecture)");
  };
  differs("max_position_embeddings", c.seq_len, h.seq_len);
  differs("hidden_size", c.hidden_dim, h.hidden_dim);
  differs("intermediate_size", c.intermediate_dim, h.intermediate_dim);
  differs("num_hidden_layers", c.num_layers, h.num_layers);
  differs("num_attention_heads", c.num_heads, h.num_heads);
  differs("num_key_value_heads", c.num_kv_heads, h.num_kv_heads);
  differs("head_dim", c.head_size(), h.head_size());
  differs("hidden_act", c.activation_function, h.activation_function);
  differs("tie_word_embeddings", c.tied(), h.tied());
  differs("rope_parameters", rope_to_hf(c.rope).dump(), rope_to_hf(h.rope).dump());
  for (int i = 0; i < c.num_layers; ++i)
    differs("a sliding window on this layer", c.window_of_layer(i), h.window_of_layer(i));
}

std::string adapter::hf_name(const std::string& ours) {
  static const std::pair<const char*, const char*> map[] = {
      {"transformer.layers.stacked.", "model.layers.{i}."},
      {"transformer.norm.", "model.norm."},
      {"embeddings.token_embeddings.", "model.embed_tokens."},
      {"lm_head.", "lm_head."},
  };
  for (const auto& [from, to] : map)
    if (ours.rfind(from, 0) == 0) {
      const std::string rest = ours.substr(std::strlen(from));
      if (rest.starts_with("post_attn_layernorm") || rest.starts_with("post_mlp_layernorm"))
        break;  // hybrid_norm: no Hugging Face form
      return std::string(to) + rest;
    }
  throw error("no Hugging Face name for parameter '" + ours +
              "' (hybrid_norm, input_embedding_norm and use_bias "
              "have no Hugging Face form)");
}

std::vector<std::pair<std::string, std::vector<std::int64_t>>> adapter::hf_layout(const LlamaConfig& c,
                                                                                  std::int64_t vocab) {
  const std::int64_t E = c.hidden_dim, M = c.intermediate_dim, D = c.head_size(), H = c.num_heads, K = c.num_kv_heads;
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  out.push_back({"model.embed_tokens.weight", {vocab, E}});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    out.push_back({l + "self_attn.q_proj.weight", {H * D, E}});
    if (c.qkv_bias()) out.push_back({l + "self_attn.q_proj.bias", {H * D}});
    out.push_back({l + "self_attn.k_proj.weight", {K * D, E}});
    if (c.qkv_bias()) out.push_back({l + "self_attn.k_proj.bias", {K * D}});
    out.push_back({l + "self_attn.v_proj.weight", {K * D, E}});
    if (c.qkv_bias()) out.push_back({l + "self_attn.v_proj.bias", {K * D}});
    out.push_back({l + "self_attn.o_proj.weight", {E, H * D}});
    if (c.o_bias()) out.push_back({l + "self_attn.o_proj.bias", {E}});
    if (c.qk_norm()) {
      out.push_back({l + "self_attn.q_norm.weight", {D}});
      out.push_back({l + "self_attn.k_norm.weight", {D}});
    }
    out.push_back({l + "mlp.gate_proj.weight", {M, E}});
    out.push_back({l + "mlp.up_proj.weight", {M, E}});
    out.push_back({l + "mlp.down_proj.weight", {E, M}});
    out.push_back({l + "input_layernorm.weight", {E}});
    out.push_back({l + "post_attention_layernorm.weight", {E}});
  }
  out.push_back({"model.norm.weight", {E}});
  if (!c.tied()) out.push_back({"lm_head.weight", {vocab, E}});
  return out;
}

std::string adapter::unused(const hf_dir& d, const std::string& n) {
  if (n.ends_with(".rotary_emb.inv_freq")) return "";  // a buffer older writers stored
  if (n == "lm_head.weight") {
    if (d.tensors.read_f32(n) != d.tensors.read_f32("model.embed_tokens.weight"))
      return "tensor lm_head.weight differs from model.embed_tokens.weight but config.json's tie_word_embeddings "
             "ties them (set tie_word_embeddings: false)";
    return "";
  }
  return "unknown";
}

}  // namespace levanter::hf
