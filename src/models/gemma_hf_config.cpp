// Gemma, Gemma 2 and Gemma 3's config.json (levanter/models/gemma_config.hpp): the hooks the Llama family's adapter
// (src/models/llama_hf_config.cpp) calls for these config types.
#include <levanter/models/gemma_config.hpp>

#include <cmath>
#include <string>
#include <variant>
#include <vector>

#include <levanter/config/validate.hpp>
#include <levanter/models/hf_config_json.hpp>

namespace levanter::hf {

void hf_config_prepare(const Gemma3Config&, nlohmann::json& j, const std::string& where) {
  // transformers 5 keys Gemma 3's RoPE by layer type: the full layers' becomes the model's, the sliding layers' theta
  // its rope_local_base_freq (transformers 4's flat form).
  if (!j.contains("rope_parameters") || !j["rope_parameters"].is_object() ||
      !j["rope_parameters"].contains("full_attention"))
    return;
  const nlohmann::json rp = j["rope_parameters"];
  const nlohmann::json full = {{"rope_parameters", rp["full_attention"]}};
  rope_from_hf(full, 2, where + " (rope_parameters.full_attention)");  // its own messages, under its own name
  if (rp.contains("sliding_attention") && !rp["sliding_attention"].is_null()) {
    const nlohmann::json local = {{"rope_parameters", rp["sliding_attention"]}};
    const RopeChoice lr = rope_from_hf(local, 2, where + " (rope_parameters.sliding_attention)");
    const auto* d = std::get_if<DefaultRopeConfig>(&lr.value);
    if (!d || d->factor != 1.0)
      throw error(where + ": rope_parameters.sliding_attention must be a default RoPE (only its rope_theta is "
                  "supported for Gemma 3's local layers)");
    j["rope_local_base_freq"] = d->theta;
  }
  j["rope_parameters"] = rp["full_attention"];
  j.erase("rope_scaling");
  j.erase("rope_theta");
}

void hf_config_in(GemmaConfig& c, const nlohmann::json& j, const std::string& where) {
  namespace b = config::bounds;
  // Gemma 2 and 3 name it hidden_activation; Gemma 1 hidden_act. gelu_pytorch_tanh is our gelu_new.
  std::string act = detail::get_or<std::string>(j, "hidden_act", "gelu_pytorch_tanh");
  if (j.contains("hidden_activation") && !j["hidden_activation"].is_null())
    act = detail::get_or<std::string>(j, "hidden_activation", act);
  c.activation_function = act == "gelu_pytorch_tanh" ? "gelu_new" : act;
  c.tie_word_embeddings = detail::get_or<bool>(j, "tie_word_embeddings", true);
  c.query_pre_attn_scalar.reset();
  c.attn_logit_softcapping = c.final_logit_softcapping = std::nullopt;
  c.sliding_window.reset();
  c.sliding_window_pattern.reset();
  if (c.sandwich_norms()) {
    c.query_pre_attn_scalar = positive_or_null(j, "query_pre_attn_scalar", where);
    c.attn_logit_softcapping = positive_or_null(j, "attn_logit_softcapping", where);
    c.final_logit_softcapping = positive_or_null(j, "final_logit_softcapping", where);
    if (j.contains("sliding_window") && !j["sliding_window"].is_null()) {
      const int w = detail::get_int_in(j, "sliding_window", where, 1, b::max_seq_len);
      if (w < c.seq_len) c.sliding_window = w;  // a window as long as the context masks nothing
    }
  }
  if (c.family == &llama_family::gemma3) {
    c.rope_local_base_freq = detail::get_or<double>(j, "rope_local_base_freq", 10000.0);
    c.use_qk_norm = true;
    if (detail::get_or<bool>(j, "use_bidirectional_attention", false))
      throw error(where + ": use_bidirectional_attention true is not supported (causal language models only)");
    // the local layers: from layer_types, else sliding_window_pattern (transformers' default 6)
    std::vector<bool> sliding;
    if (j.contains("layer_types") && !j["layer_types"].is_null()) {
      sliding = sliding_layers_of(j, c.num_layers, where);
    } else {
      const int p = j.contains("sliding_window_pattern") && !j["sliding_window_pattern"].is_null()
                        ? detail::get_int_in(j, "sliding_window_pattern", where, 1, b::max_layers)
                        : 6;
      for (int i = 0; i < c.num_layers; ++i) sliding.push_back((i + 1) % p != 0);
    }
    int first_full = 0;
    while (first_full < c.num_layers && sliding[first_full]) ++first_full;
    if (first_full > 0) c.sliding_window_pattern = first_full + 1;  // all sliding: a pattern past the end
    for (int i = 0; i < c.num_layers; ++i)
      if (sliding[i] != c.local_layer(i))
        throw error(where + ": layer_types[" + std::to_string(i) + "] breaks the pattern of one full_attention " +
                    "layer every " + std::to_string(first_full + 1) + " (other layouts are not supported)");
  } else if (c.family == &llama_family::gemma2 && j.contains("layer_types") && !j["layer_types"].is_null()) {
    const auto sliding = sliding_layers_of(j, c.num_layers, where);
    for (int i = 0; i < c.num_layers; ++i)
      if (sliding[i] != c.local_layer(i))
        throw error(where + ": layer_types[" + std::to_string(i) + "] is not Gemma 2's layout (sliding_attention "
                    "on even layers, full_attention on odd ones; other layouts are not supported)");
  }
}

void hf_config_out(const GemmaConfig& c, nlohmann::json& j) {
  const std::string who(family_type_name(c.family));
  if (c.family == &llama_family::gemma3 && !c.use_qk_norm)
    throw error(who + ": use_qk_norm false has no Hugging Face form (transformers' Gemma 3 always normalises "
                "queries and keys)");
  if (c.family == &llama_family::gemma) {
    if (c.attn_logit_softcapping || c.final_logit_softcapping)
      throw error(who + ": soft-capping has no Hugging Face form for a Gemma 1 model (use type: gemma2)");
    if (c.query_pre_attn_scalar && *c.query_pre_attn_scalar != c.head_size())
      throw error(who + ": query_pre_attn_scalar other than the head size has no Hugging Face form for a Gemma 1 "
                  "model (use type: gemma2)");
  }
  j["attention_bias"] = false;
  // transformers' name of gelu_new is gelu_pytorch_tanh; Gemma 2 and 3 call the key hidden_activation
  const std::string act = c.activation_function == "gelu_new" ? "gelu_pytorch_tanh" : c.activation_function;
  j.erase("hidden_act");
  j[c.sandwich_norms() ? "hidden_activation" : "hidden_act"] = act;
  if (c.sandwich_norms()) {
    const double qs = c.query_pre_attn_scalar ? *c.query_pre_attn_scalar : double(c.head_size());
    // an integer as transformers writes it (256, not 256.0)
    j["query_pre_attn_scalar"] =
        qs == std::floor(qs) && std::fabs(qs) < 1e15 ? nlohmann::json(std::int64_t(qs)) : nlohmann::json(qs);
    j["attn_logit_softcapping"] = number_or_null(c.attn_logit_softcapping);
    j["final_logit_softcapping"] = number_or_null(c.final_logit_softcapping);
    // upstream writes the context length for "no window", which masks nothing
    j["sliding_window"] = c.sliding_window ? *c.sliding_window : c.seq_len;
    nlohmann::json types = nlohmann::json::array();
    for (int i = 0; i < c.num_layers; ++i) types.push_back(c.local_layer(i) ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
  }
  if (c.family == &llama_family::gemma3) {
    nlohmann::json local = {{"rope_type", "default"}, {"rope_theta", c.rope_local_base_freq}};
    j["rope_parameters"] = {{"full_attention", rope_to_hf(c.rope)}, {"sliding_attention", local}};
    j["use_bidirectional_attention"] = false;
  }
}

}  // namespace levanter::hf

