// models/gpt2_config.hpp: checks of `model: {type: gpt2}`.
#include <levanter/models/gpt2_config.hpp>

#include <utility>

#include <haliax/nn/activation.hpp>
#include <levanter/config/validate.hpp>
#include <levanter/models/config_checks.hpp>

namespace levanter {

using config::fmt_num;

void validate(config::validator& v, const Gpt2Config& m) {
  const std::pair<const char*, int> positive[] = {{"model.seq_len", m.seq_len},
                                                  {"model.hidden_dim", m.hidden_dim},
                                                  {"model.num_layers", m.num_layers},
                                                  {"model.num_heads", m.num_heads},
                                                  {"model.mlp_scale", m.mlp_scale}};
  for (const auto& [k, val] : positive)
    if (val <= 0) v.error(k, "must be positive (got " + std::to_string(val) + ")");
  if (m.hidden_dim > 0 && m.num_heads > 0 && m.hidden_dim % m.num_heads != 0)
    v.error("model.num_heads", "hidden_dim " + std::to_string(m.hidden_dim) + " is not divisible by num_heads " +
                                   std::to_string(m.num_heads) + "; choose num_heads dividing hidden_dim");
  const std::pair<const char*, double> drops[] = {
      {"model.embed_pdrop", m.embed_pdrop}, {"model.resid_pdrop", m.resid_pdrop}, {"model.attn_pdrop", m.attn_pdrop}};
  for (const auto& [k, p] : drops)
    if (!(p >= 0 && p < 1)) v.error(k, "a dropout probability must be in [0, 1) (got " + fmt_num(p) + ")");
  validate_shared_model_keys(v, m);
}

}  // namespace levanter

LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::Gpt2Config)
