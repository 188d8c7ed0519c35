// models/llama_config.hpp: the Llama family's checks and its config sections' YAML (the counts and the RoPE
// description are in llama_spec.cpp).
#include <levanter/models/llama_config.hpp>

#include <cmath>
#include <string>
#include <utility>
#include <variant>

#include <haliax/nn/activation.hpp>
#include <levanter/config/validate.hpp>
#include <levanter/models/config_checks.hpp>
#include <levanter/models/registry.hpp>

namespace levanter {

using config::fmt_num;

void validate(config::validator& v, const LlamaConfig& m) {
  namespace bounds = config::bounds;
  using config::check_int;
  bool sizes_ok = true;
  sizes_ok &= check_int(v, "model.seq_len", m.seq_len, 2, bounds::max_seq_len,
                        "the next-token loss needs a token and the one after it");
  sizes_ok &= check_int(v, "model.hidden_dim", m.hidden_dim, 1, bounds::max_model_dim);
  sizes_ok &= check_int(v, "model.intermediate_dim", m.intermediate_dim, 1, bounds::max_model_dim);
  sizes_ok &= check_int(v, "model.num_layers", m.num_layers, 1, bounds::max_layers);
  sizes_ok &= check_int(v, "model.num_heads", m.num_heads, 1, bounds::max_heads);
  sizes_ok &= check_int(v, "model.num_kv_heads", m.num_kv_heads, 1, bounds::max_heads);
  if (m.head_dim) sizes_ok &= check_int(v, "model.head_dim", *m.head_dim, 1, bounds::max_model_dim);
  if (sizes_ok && m.num_heads % m.num_kv_heads != 0)
    v.error("model.num_kv_heads", "num_heads " + std::to_string(m.num_heads) + " is not divisible by num_kv_heads " +
                                      std::to_string(m.num_kv_heads) +
                                      "; use a divisor of num_heads (num_heads for MHA, 1 for MQA)");
  if (sizes_ok && !m.head_dim && m.hidden_dim % m.num_heads != 0)
    v.error("model.num_heads", "hidden_dim " + std::to_string(m.hidden_dim) + " is not divisible by num_heads " +
                                   std::to_string(m.num_heads) +
                                   "; choose num_heads dividing hidden_dim or set head_dim");
  if (sizes_ok && m.head_size() % 2 != 0)
    v.error(m.head_dim ? "model.head_dim" : "model.num_heads",
            "the head size " + std::to_string(m.head_size()) + " is odd; rotary embeddings need an even head size");
  validate_shared_model_keys(v, m);
  if (!m.scan_layers)
    v.note("model.scan_layers",
           "false selects upstream's unstacked BlockSeq; layers are always stacked here, which "
           "computes the same function");
  if (m.sliding_window) check_int(v, "model.sliding_window", *m.sliding_window, 1, bounds::max_seq_len);
  check_int(v, "model.max_window_layers", m.max_window_layers, 0, bounds::max_layers);
  if (m.use_sliding_window && !m.sliding_window)
    v.error("model.sliding_window", "use_sliding_window is true but no sliding_window is set; give the window size");
  if (m.family->untied_head && m.tie_word_embeddings)
    v.refuse("model.tie_word_embeddings", std::string(family_type_name(m.family)) + "'s LM head is never tied (as upstream)",
             "remove the key or use type: llama");
  if (m.family == &llama_family::olmo2) {
    if (m.hybrid_norm)
      v.refuse("model.hybrid_norm", "OLMo 2's layer already normalises after each sublayer", "remove the key");
    if (m.use_qk_norm)
      v.refuse("model.use_qk_norm", "OLMo 2 normalises the whole query and key projections already",
               "remove the key");
  }
  if (m.moe()) {
    const bool experts_ok = check_int(v, "model.n_routed_experts", m.n_routed_experts, 1, 4096);
    const bool k_ok = check_int(v, "model.num_experts_per_tok", m.num_experts_per_tok, 1, 4096);
    if (experts_ok && k_ok && m.num_experts_per_tok > m.n_routed_experts)
      v.error("model.num_experts_per_tok", "num_experts_per_tok " + std::to_string(m.num_experts_per_tok) +
                                               " is more than n_routed_experts " + std::to_string(m.n_routed_experts) +
                                               "; a token is routed to at most every expert");
    check_int(v, "model.n_shared_experts", m.n_shared_experts, 0, 4096);
    if (m.lbl_coef) config::check_real(v, "model.lbl_coef", *m.lbl_coef, 0, 1e6, false, false);
    if (m.rzl_coef) config::check_real(v, "model.rzl_coef", *m.rzl_coef, 0, 1e6, false, false);
    if (m.use_bias)
      v.refuse("model.use_bias", "biases in the router and experts are not supported here (Mixtral has none)",
               "remove the key");
    if (m.hybrid_norm) v.refuse("model.hybrid_norm", "not supported with a mixture of experts", "remove the key");
  }
  const auto check_rope = [&](const char* key, double x, bool strictly) {
    config::check_real(v, std::string("model.rope.") + key, x, 0, 1e12, strictly, false);
  };
  std::visit(
      [&](const auto& r) {
        using R = std::decay_t<decltype(r)>;
        check_rope("theta", r.theta, true);
        check_rope("factor", r.factor, true);
        if constexpr (std::is_same_v<R, Llama3RopeConfig>) {
          check_rope("low_freq_factor", r.low_freq_factor, true);
          check_rope("high_freq_factor", r.high_freq_factor, true);
          if (r.high_freq_factor <= r.low_freq_factor)
            v.error("model.rope.high_freq_factor", "must be larger than low_freq_factor");
          check_int(v, "model.rope.original_max_position_embeddings", r.original_max_position_embeddings, 1,
                    bounds::max_seq_len);
        } else if constexpr (std::is_same_v<R, YarnRopeConfig>) {
          check_rope("beta_fast", r.beta_fast, true);
          check_rope("beta_slow", r.beta_slow, true);
          check_rope("mscale", r.mscale, false);
          check_int(v, "model.rope.original_max_position_embeddings", r.original_max_position_embeddings, 1,
                    bounds::max_seq_len);
        }
      },
      m.rope.value);
  // the checks of a member in its own files, for the config type of the list its variant belongs to
  std::visit(
      [&](const auto& t) {
        if constexpr (requires { validate_variant(v, t); }) validate_variant(v, t);
      },
      as_model_choice(m).value);
}

void validate(config::validator& v, const Olmo2Config& m) {
  validate(v, static_cast<const LlamaConfig&>(m));
  if (m.attention_bias)
    v.refuse("model.attention_bias", "biases in OLMo 2's attention projections are not supported here",
             "remove the key (OLMo 2 checkpoints have none)");
}

}  // namespace levanter

LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::LlamaConfig)
LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::MistralConfig)
LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::QwenConfig)
LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::Qwen3Config)
LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::Olmo2Config)
LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::MixtralConfig)
