// Gemma, Gemma 2 and Gemma 3 (levanter/models/gemma_config.hpp): their checks and their config sections' YAML (their
// config.json is gemma_hf_config.cpp).
#include <levanter/models/gemma_config.hpp>

#include <string>

#include <levanter/config/validate.hpp>
#include <levanter/models/config_checks.hpp>

namespace levanter {

void validate_variant(config::validator& v, const GemmaConfig& m) {
  // upstream's GemmaRMSNorm has a weight and no bias; the Gemma layer has no hybrid_norm.
  if (!m.use_layer_norm_weight)
    v.refuse("model.use_layer_norm_weight", "Gemma's RMSNorm always has a weight (it scales by 1 + weight)",
             "remove the key");
  if (m.use_bias) v.refuse("model.use_bias", "Gemma's RMSNorm has no bias (as upstream's GemmaRMSNorm)", "remove the key");
  if (m.hybrid_norm)
    v.refuse("model.hybrid_norm", "Gemma has no hybrid_norm (Gemma 2 and 3 have their own four norms per layer)",
             "remove the key, or use type: gemma2");
  if (m.query_pre_attn_scalar)
    config::check_real(v, "model.query_pre_attn_scalar", *m.query_pre_attn_scalar, 0, 1e12, true, false);
  if (m.attn_logit_softcapping)
    config::check_real(v, "model.attn_logit_softcapping", *m.attn_logit_softcapping, 0, 1e12, true, false);
  if (m.final_logit_softcapping)
    config::check_real(v, "model.final_logit_softcapping", *m.final_logit_softcapping, 0, 1e12, true, false);
  if (m.final_logit_softcapping && m.cross_entropy_block_size)
    v.note("model.cross_entropy_block_size",
           "final_logit_softcapping needs the whole logits; the loss is computed unblocked (as upstream's "
           "default) and the block size is not used");
  if (m.sliding_window_pattern)
    config::check_int(v, "model.sliding_window_pattern", *m.sliding_window_pattern, 1, config::bounds::max_layers);
  config::check_real(v, "model.rope_local_base_freq", m.rope_local_base_freq, 0, 1e12, true, false);
}

}  // namespace levanter

LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::GemmaConfig)
LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::Gemma2Config)
LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::Gemma3Config)
