// The Llama family's config.json (levanter/models/hf_config_json.hpp).
#include <levanter/models/hf_config_json.hpp>

#include <cmath>
#include <optional>
#include <variant>

#include <haliax/nn/activation.hpp>
#include <levanter/config/validate.hpp>

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

/// The rope of a config.json: transformers 5's `rope_parameters`, or transformers 4's `rope_theta` +
/// `rope_scaling`.
namespace {

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

const char* architecture_of(llama_family f) {
  switch (f) {
    case llama_family::mistral:
      return "MistralForCausalLM";
    case llama_family::qwen2:
      return "Qwen2ForCausalLM";
    case llama_family::qwen3:
      return "Qwen3ForCausalLM";
    case llama_family::gemma:
      return "GemmaForCausalLM";
    case llama_family::gemma2:
      return "Gemma2ForCausalLM";
    case llama_family::gemma3:
      return "Gemma3ForCausalLM";
    case llama_family::olmo2:
      return "Olmo2ForCausalLM";
    case llama_family::mixtral:
      return "MixtralForCausalLM";
    default:
      return "LlamaForCausalLM";
  }
}

/// transformers' name of a gated-MLP activation: gelu_new is `gelu_pytorch_tanh` in Gemma configs.
std::string hf_activation_name(const LlamaConfig& c) {
  return c.gemma() && c.activation_function == "gelu_new" ? "gelu_pytorch_tanh" : c.activation_function;
}

/// A positive number or null under `key`.
std::optional<double> positive_or_null(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  if (!j[key].is_number() || !(j[key].get<double>() > 0))
    throw error(where + ": '" + key + "' is " + j[key].dump() + ", not a positive number or null");
  return j[key].get<double>();
}

nlohmann::json number_or_null(const std::optional<double>& x) {
  return x ? nlohmann::json(*x) : nlohmann::json(nullptr);
}

/// layer_types as a list of booleans (true: sliding_attention), checked against the layer count.
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

bool windowed_family(llama_family f) { return f == llama_family::qwen2 || f == llama_family::qwen3; }

}  // namespace

std::string_view llama_model_type_of(const LlamaConfig& c) {
  switch (c.family) {
    case llama_family::mistral:
      return "mistral";
    case llama_family::qwen2:
      return "qwen2";
    case llama_family::qwen3:
      return "qwen3";
    case llama_family::gemma:
      return "gemma";
    case llama_family::gemma2:
      return "gemma2";
    case llama_family::gemma3:
      return "gemma3_text";
    case llama_family::olmo2:
      return "olmo2";
    case llama_family::mixtral:
      return "mixtral";
    default:
      return "llama";
  }
}

nlohmann::json llama_to_hf_config(const LlamaConfig& c, std::int64_t vocab) {
  const std::string who(family_type_name(c.family));
  if (c.hybrid_norm || c.input_embedding_norm)
    throw error(who + ": hybrid_norm and input_embedding_norm have no Hugging Face form; disable them to export");
  if (c.use_bias) throw error(who + ": use_bias true (biases in every projection and norm) has no Hugging Face form");
  if (c.use_qk_norm && c.family != llama_family::qwen3 && c.family != llama_family::gemma3 &&
      c.family != llama_family::olmo2)
    throw error(who + ": use_qk_norm has no Hugging Face form for this model type (use type: qwen3 or gemma3)");
  if (c.family == llama_family::gemma3 && !c.use_qk_norm)
    throw error(who + ": use_qk_norm false has no Hugging Face form (transformers' Gemma 3 always normalises "
                "queries and keys)");
  if ((c.family == llama_family::gemma || c.family == llama_family::gemma2) && c.use_qk_norm)
    throw error(who + ": use_qk_norm has no Hugging Face form for this model type (use type: gemma3)");
  if (c.family == llama_family::gemma && (c.attn_logit_softcapping || c.final_logit_softcapping))
    throw error(who + ": soft-capping has no Hugging Face form for a Gemma 1 model (use type: gemma2)");
  if (c.family == llama_family::gemma && c.query_pre_attn_scalar && *c.query_pre_attn_scalar != c.head_size())
    throw error(who + ": query_pre_attn_scalar other than the head size has no Hugging Face form for a Gemma 1 "
                "model (use type: gemma2)");
  if (!c.use_layer_norm_weight) throw error(who + ": use_layer_norm_weight false has no Hugging Face form");
  if (c.moe() && c.n_shared_experts > 0)
    throw error(who + ": n_shared_experts " + std::to_string(c.n_shared_experts) +
                " has no Hugging Face form (transformers' Mixtral has no shared experts)");
  nlohmann::json j;
  j["architectures"] = {architecture_of(c.family)};
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
  if (c.sandwich_norms())
    j["hidden_activation"] = hf_activation_name(c);
  else
    j["hidden_act"] = hf_activation_name(c);
  j["initializer_range"] = c.initializer_range;
  j["rms_norm_eps"] = c.layer_norm_epsilon;
  j["tie_word_embeddings"] = c.tied();
  j["attention_dropout"] = 0.0;
  j["use_cache"] = true;
  j["rope_parameters"] = rope_to_hf(c.rope);
  if (c.gemma()) {
    j["attention_bias"] = false;
    if (c.sandwich_norms()) {
      const double qs = c.query_pre_attn_scalar ? *c.query_pre_attn_scalar : double(c.head_size());
      // an integer as transformers writes it (256, not 256.0)
      j["query_pre_attn_scalar"] = qs == std::floor(qs) && std::fabs(qs) < 1e15 ? nlohmann::json(std::int64_t(qs))
                                                                                : nlohmann::json(qs);
      j["attn_logit_softcapping"] = number_or_null(c.attn_logit_softcapping);
      j["final_logit_softcapping"] = number_or_null(c.final_logit_softcapping);
      // upstream writes the context length for "no window", which masks nothing
      j["sliding_window"] = c.sliding_window ? *c.sliding_window : c.seq_len;
      nlohmann::json types = nlohmann::json::array();
      for (int i = 0; i < c.num_layers; ++i) types.push_back(c.local_layer(i) ? "sliding_attention" : "full_attention");
      j["layer_types"] = types;
    }
    if (c.family == llama_family::gemma3) {
      nlohmann::json local = {{"rope_type", "default"}, {"rope_theta", c.rope_local_base_freq}};
      j["rope_parameters"] = {{"full_attention", rope_to_hf(c.rope)}, {"sliding_attention", local}};
      j["use_bidirectional_attention"] = false;
    }
  } else if (c.family == llama_family::olmo2) {
    j["attention_bias"] = false;
  } else if (c.family == llama_family::llama) {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  } else if (c.family == llama_family::mistral) {
    j["sliding_window"] = c.sliding_window ? nlohmann::json(*c.sliding_window) : nlohmann::json(nullptr);
  } else if (c.moe()) {
    j["sliding_window"] = c.sliding_window ? nlohmann::json(*c.sliding_window) : nlohmann::json(nullptr);
    j["num_local_experts"] = c.n_routed_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    // upstream writes lbl_coef here (transformers' weight of its own, differently normalised, balancing loss)
    j["router_aux_loss_coef"] = c.lbl_coef ? *c.lbl_coef : 0.0;
    j["output_router_logits"] = false;
    j["router_jitter_noise"] = 0.0;
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

LlamaConfig llama_from_hf_config(LlamaConfig base, const nlohmann::json& j, const std::string& where) {
  const std::string t = detail::get_or<std::string>(j, "model_type", "");
  if (t != llama_model_type_of(base))
    throw error(where + ": the Hugging Face model is a '" + t +
                "' but the model config has type: " + std::string(family_type_name(base.family)) +
                " (set model.type: " +
                (t == "qwen2" ? std::string("qwen") : t == "gemma3_text" ? std::string("gemma3") : t) + ")");
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
  if (base.gemma()) {
    // Gemma 2 and 3 name it hidden_activation; Gemma 1 hidden_act. gelu_pytorch_tanh is our gelu_new.
    std::string act = detail::get_or<std::string>(j, "hidden_act", "gelu_pytorch_tanh");
    if (j.contains("hidden_activation") && !j["hidden_activation"].is_null())
      act = detail::get_or<std::string>(j, "hidden_activation", act);
    base.activation_function = act == "gelu_pytorch_tanh" ? "gelu_new" : act;
  } else {
    base.activation_function = detail::get_or<std::string>(j, "hidden_act", "silu");
  }
  base.initializer_range = detail::get_or<double>(j, "initializer_range", base.initializer_range);
  base.layer_norm_epsilon = detail::get_or<double>(j, "rms_norm_eps", 1e-6);
  base.tie_word_embeddings = detail::get_or<bool>(j, "tie_word_embeddings", base.gemma());
  if (base.family == llama_family::gemma3 && j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
      j["rope_parameters"].contains("full_attention")) {
    // transformers 5 keys Gemma 3's RoPE by layer type
    const auto& rp = j["rope_parameters"];
    nlohmann::json full = {{"rope_parameters", rp["full_attention"]}};
    base.rope = rope_from_hf(full, base.seq_len, where + " (rope_parameters.full_attention)");
    if (rp.contains("sliding_attention") && !rp["sliding_attention"].is_null()) {
      nlohmann::json local = {{"rope_parameters", rp["sliding_attention"]}};
      const RopeChoice lr = rope_from_hf(local, base.seq_len, where + " (rope_parameters.sliding_attention)");
      const auto* d = std::get_if<DefaultRopeConfig>(&lr.value);
      if (!d || d->factor != 1.0)
        throw error(where + ": rope_parameters.sliding_attention must be a default RoPE (only its rope_theta is "
                    "supported for Gemma 3's local layers)");
      base.rope_local_base_freq = d->theta;
    }
  } else {
    base.rope = rope_from_hf(j, base.seq_len, where);
    if (base.family == llama_family::gemma3)
      base.rope_local_base_freq = detail::get_or<double>(j, "rope_local_base_freq", 10000.0);
  }
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
  } else if (base.gemma()) {
    base.query_pre_attn_scalar.reset();
    base.attn_logit_softcapping = base.final_logit_softcapping = std::nullopt;
    base.sliding_window.reset();
    base.sliding_window_pattern.reset();
    if (base.sandwich_norms()) {
      base.query_pre_attn_scalar = positive_or_null(j, "query_pre_attn_scalar", where);
      base.attn_logit_softcapping = positive_or_null(j, "attn_logit_softcapping", where);
      base.final_logit_softcapping = positive_or_null(j, "final_logit_softcapping", where);
      if (j.contains("sliding_window") && !j["sliding_window"].is_null()) {
        const int w = detail::get_int_in(j, "sliding_window", where, 1, b::max_seq_len);
        if (w < base.seq_len) base.sliding_window = w;  // a window as long as the context masks nothing
      }
    }
    if (base.family == llama_family::gemma3) {
      base.use_qk_norm = true;
      if (detail::get_or<bool>(j, "use_bidirectional_attention", false))
        throw error(where + ": use_bidirectional_attention true is not supported (causal language models only)");
      // the local layers: from layer_types, else sliding_window_pattern (transformers' default 6)
      std::vector<bool> sliding;
      if (j.contains("layer_types") && !j["layer_types"].is_null()) {
        sliding = sliding_layers_of(j, base.num_layers, where);
      } else {
        const int p = j.contains("sliding_window_pattern") && !j["sliding_window_pattern"].is_null()
                          ? detail::get_int_in(j, "sliding_window_pattern", where, 1, b::max_layers)
                          : 6;
        for (int i = 0; i < base.num_layers; ++i) sliding.push_back((i + 1) % p != 0);
      }
      int first_full = 0;
      while (first_full < base.num_layers && sliding[first_full]) ++first_full;
      if (first_full > 0) base.sliding_window_pattern = first_full + 1;  // all sliding: a pattern past the end
      for (int i = 0; i < base.num_layers; ++i)
        if (sliding[i] != base.local_layer(i))
          throw error(where + ": layer_types[" + std::to_string(i) + "] breaks the pattern of one full_attention " +
                      "layer every " + std::to_string(first_full + 1) + " (other layouts are not supported)");
    } else if (base.family == llama_family::gemma2 && j.contains("layer_types") && !j["layer_types"].is_null()) {
      const auto sliding = sliding_layers_of(j, base.num_layers, where);
      for (int i = 0; i < base.num_layers; ++i)
        if (sliding[i] != base.local_layer(i))
          throw error(where + ": layer_types[" + std::to_string(i) + "] is not Gemma 2's layout (sliding_attention "
                      "on even layers, full_attention on odd ones; other layouts are not supported)");
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
