// The Llama family's config.json (levanter/models/hf_config_json.hpp).
#include <levanter/models/hf_config_json.hpp>

#include <cmath>
#include <optional>
#include <type_traits>
#include <variant>

#include <haliax/nn/activation.hpp>
#include <levanter/config/validate.hpp>
#include <levanter/models/registry.hpp>

namespace levanter::hf {

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
    throw error(where + ": rope_type '" + type + "' is not supported (use default, linear, llama3 or yarn; we do "
                "not compute dynamic or longrope scaling)");
  }
  if (detail::get_or<double>(p, "partial_rotary_factor", 1.0) != 1.0)
    throw error(where + ": partial_rotary_factor other than 1 is not supported");
  return r;
}

std::optional<double> positive_or_null(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_number() || !(j[key].get<double>() > 0))
    throw error(where + ": '" + key + "' is " + j[key].dump() + ", not a positive number or null");
  return j[key].get<double>();
}

nlohmann::json number_or_null(const std::optional<double>& x) {
  return x ? nlohmann::json(*x) : nlohmann::json(nullptr);
}

std::vector<bool> sliding_layers_of(const nlohmann::json& j, int layers, const std::string& where) {
  const auto& lt = j["layer_types"];
  if (!lt.is_array()) throw error(where + ": layer_types is " + lt.dump() + ", not a list");
  if (static_cast<int>(lt.size()) != layers)
    throw error(where + ": layer_types has " + std::to_string(lt.size()) + " entries for " + std::to_string(layers) +
                " layers");
  std::vector<bool> out;
  for (int i = 0; i < layers; ++i) {
    if (!lt[i].is_string() || (lt[i] != "sliding_attention" && lt[i] != "full_attention"))
      throw error(where + ": layer_types[" + std::to_string(i) + "] is " + lt[i].dump() +
                  ", not \"full_attention\" or \"sliding_attention\"");
    out.push_back(lt[i].get<std::string>() == "sliding_attention");
  }
  return out;
}

namespace {

bool windowed_family(const llama_variant* f) { return f == &llama_family::qwen2 || f == &llama_family::qwen3; }

/// Calls `f(t)` with `c` as the config type of the model list whose variant it has (a GemmaConfig for a Gemma, ...),
/// then takes back what `f` changed: how a member in its own files gets its config.json hooks called.
template <class F>
void as_listed_type(LlamaConfig& c, F&& f) {
  ModelChoice m = as_model_choice(c);
  std::visit(
      [&](auto& t) {
        using T = std::remove_cvref_t<decltype(t)>;
        if constexpr (std::is_base_of_v<LlamaConfig, T>) {
          if (t.family != c.family) return;  // a variant no listed type has
          f(t);
          c = static_cast<const LlamaConfig&>(t);
        }
      },
      m.value);
}

/// The `type:` of the listed config type reading config.json's model_type `t` (t itself when none does).
std::string type_reading(const std::string& t) {
  std::string out = t;
  for_each_model_config([&]<class T>(std::type_identity<T>) {
    if constexpr (std::is_base_of_v<LlamaConfig, T>)
      if (T::hf_model_type == t) out = std::string(T::type_name);
  });
  return out;
}

}  // namespace

std::string_view llama_model_type_of(const LlamaConfig& c) { return c.family->hf_model_type; }

nlohmann::json llama_to_hf_config(const LlamaConfig& c, std::int64_t vocab) {
  const std::string who(family_type_name(c.family));
  if (c.hybrid_norm || c.input_embedding_norm)
    throw error(who + ": hybrid_norm and input_embedding_norm have no Hugging Face form; disable them to export");
  if (c.use_bias) throw error(who + ": use_bias true (biases in every projection and norm) has no Hugging Face form");
  if (c.use_qk_norm && !c.family->hf_qk_norm)
    throw error(who + ": use_qk_norm has no Hugging Face form for this model type (use type: qwen3 or gemma3)");
  if (!c.use_layer_norm_weight) throw error(who + ": use_layer_norm_weight false has no Hugging Face form");
  if (c.moe() && c.n_shared_experts > 0)
    throw error(who + ": n_shared_experts " + std::to_string(c.n_shared_experts) +
                " has no Hugging Face form (transformers' Mixtral has no shared experts)");
  nlohmann::json j;
  j["architectures"] = {std::string(c.family->hf_architecture)};
  j["model_type"] = std::string(llama_model_type_of(c));
  j["vocab_size"] = vocab;
  j["max_position_embeddings"] = c.seq_len;
  j["hidden_size"] = c.hidden_dim;
  j["intermediate_size"] = c.intermediate_dim;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  // transformers' Mixtral writes null for a head size implied by hidden_size / num_attention_heads
  j["head_dim"] = c.moe() && !c.head_dim ? nlohmann::json(nullptr) : nlohmann::json(c.head_size());
  j["hidden_act"] = c.activation_function;
  j["initializer_range"] = c.initializer_range;
  j["rms_norm_eps"] = c.layer_norm_epsilon;
  j["tie_word_embeddings"] = c.tied();
  j["attention_dropout"] = 0.0;
  j["use_cache"] = true;
  j["rope_parameters"] = rope_to_hf(c.rope);
  if (c.family == &llama_family::olmo2) {
    j["attention_bias"] = false;
  } else if (c.family == &llama_family::llama) {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  } else if (c.family == &llama_family::mistral) {
    j["sliding_window"] = c.sliding_window ? nlohmann::json(*c.sliding_window) : nlohmann::json(nullptr);
  } else if (c.moe()) {
    j["sliding_window"] = c.sliding_window ? nlohmann::json(*c.sliding_window) : nlohmann::json(nullptr);
    j["num_local_experts"] = c.n_routed_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    // upstream writes lbl_coef here (transformers' weight of its own, differently normalised, balancing loss)
    j["router_aux_loss_coef"] = c.lbl_coef ? *c.lbl_coef : 0.0;
    j["output_router_logits"] = false;
    j["router_jitter_noise"] = 0.0;
  } else if (windowed_family(c.family)) {
    if (c.family == &llama_family::qwen3) j["attention_bias"] = false;
    j["use_sliding_window"] = c.use_sliding_window;
    j["sliding_window"] = c.sliding_window ? nlohmann::json(*c.sliding_window) : nlohmann::json(nullptr);
    j["max_window_layers"] = c.max_window_layers;
    nlohmann::json types = nlohmann::json::array();
    for (int i = 0; i < c.num_layers; ++i)
      types.push_back(c.window_of_layer(i) > 0 ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
  }
  LlamaConfig listed = c;
  as_listed_type(listed, [&](const auto& t) {
    if constexpr (requires { hf_config_out(t, j); }) hf_config_out(t, j);
  });
  return j;
}

LlamaConfig llama_from_hf_config(LlamaConfig base, const nlohmann::json& given, const std::string& where) {
  const std::string t = detail::get_or<std::string>(given, "model_type", "");
  if (t != llama_model_type_of(base))
    throw error(where + ": the Hugging Face model is a '" + t + "' but the model config has type: " +
                std::string(family_type_name(base.family)) + " (set model.type: " + type_reading(t) + ")");
  nlohmann::json prepared;
  as_listed_type(base, [&](const auto& x) {
    if constexpr (requires { hf_config_prepare(x, prepared, where); }) {
      prepared = given;
      hf_config_prepare(x, prepared, where);
    }
  });
  const nlohmann::json& j = prepared.is_null() ? given : prepared;
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
  if (base.family == &llama_family::mistral) {
    if (j.contains("sliding_window") && !j["sliding_window"].is_null())
      base.sliding_window = detail::get_int_in(j, "sliding_window", where, 1, b::max_seq_len);
    else
      base.sliding_window.reset();
    if (base.tie_word_embeddings)
      throw error(where + ": tie_word_embeddings true is not supported for a Mistral (upstream unties its head)");
  } else if (base.moe()) {
    if (j.contains("sliding_window") && !j["sliding_window"].is_null())
      base.sliding_window = detail::get_int_in(j, "sliding_window", where, 1, b::max_seq_len);
    else
      base.sliding_window.reset();
    base.n_routed_experts = j.contains("num_local_experts") ? detail::get_int_in(j, "num_local_experts", where, 1, 4096)
                                                            : 8;
    base.num_experts_per_tok = j.contains("num_experts_per_tok")
                                   ? detail::get_int_in(j, "num_experts_per_tok", where, 1, base.n_routed_experts)
                                   : 2;
    base.n_shared_experts = 0;
    // as upstream's from_hf_config: lbl_coef from router_aux_loss_coef (rzl_coef stays the config's)
    if (j.contains("router_aux_loss_coef") && !j["router_aux_loss_coef"].is_null()) {
      if (!j["router_aux_loss_coef"].is_number() || j["router_aux_loss_coef"].get<double>() < 0)
        throw error(where + ": 'router_aux_loss_coef' is " + j["router_aux_loss_coef"].dump() +
                    ", not a non-negative number");
      base.lbl_coef = j["router_aux_loss_coef"].get<double>();
    }
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
    if (j.contains("layer_types") && !j["layer_types"].is_null()) {
      const auto sliding = sliding_layers_of(j, base.num_layers, where);
      for (int i = 0; i < base.num_layers; ++i)
        if (sliding[i] != (base.window_of_layer(i) > 0))
          throw error(where + ": layer_types[" + std::to_string(i) + "] is '" + j["layer_types"][i].get<std::string>() +
                      "', which use_sliding_window / max_window_layers do not give (only windows from "
                      "max_window_layers on are supported)");
    }
  }
  as_listed_type(base, [&](auto& x) {
    if constexpr (requires { hf_config_in(x, j, where); }) hf_config_in(x, j, where);
  });
  if (!haliax::nn::find_activation(base.activation_function))
    throw error(where + ": hidden_act '" + base.activation_function + "' is not supported (use one of " +
                haliax::nn::activation_names() + ")");
  return base;
}

std::vector<std::pair<std::string, std::string>> llama_hf_keys() {
  return {{"model.seq_len", "max_position_embeddings"}, {"model.hidden_dim", "hidden_size"},
          {"model.intermediate_dim", "intermediate_size"}, {"model.num_layers", "num_hidden_layers"},
          {"model.num_heads", "num_attention_heads"}, {"model.num_kv_heads", "num_key_value_heads"},
          {"model.head_dim", "head_dim"}, {"model.layer_norm_epsilon", "rms_norm_eps"},
          {"model.activation_function", "hidden_act"}, {"model.initializer_range", "initializer_range"},
          {"model.sliding_window", "sliding_window"}, {"model.max_window_layers", "max_window_layers"},
          {"model.use_sliding_window", "use_sliding_window"}, {"model.rope.theta", "rope_theta"},
          {"model.rope.", "rope_parameters."}, {"model.query_pre_attn_scalar", "query_pre_attn_scalar"},
          {"model.attn_logit_softcapping", "attn_logit_softcapping"},
          {"model.final_logit_softcapping", "final_logit_softcapping"},
          {"model.sliding_window_pattern", "layer_types"}, {"model.rope_local_base_freq", "rope_local_base_freq"},
          {"model.n_routed_experts", "num_local_experts"}, {"model.num_experts_per_tok", "num_experts_per_tok"},
          {"model.lbl_coef", "router_aux_loss_coef"}};
}

}  // namespace levanter::hf
