// models/gpt2_config.hpp: checks of `model: {type: gpt2}`.
#include <levanter/models/gpt2_config.hpp>

#include <utility>

#include <haliax/nn/activation.hpp>
#include <levanter/config/validate.hpp>
#include <levanter/models/config_checks.hpp>

namespace levanter {

using config::fmt_num;

void validate(config::validator& v, const Gpt2Config& m) {
  namespace bounds = config::bounds;
  using config::check_int;
  check_int(v, "model.seq_len", m.seq_len, 2, bounds::max_seq_len,
            "the next-token loss needs a token and the one after it");
  check_int(v, "model.hidden_dim", m.hidden_dim, 1, bounds::max_model_dim);
  check_int(v, "model.num_layers", m.num_layers, 1, bounds::max_layers);
  check_int(v, "model.num_heads", m.num_heads, 1, bounds::max_heads);
  check_int(v, "model.mlp_scale", m.mlp_scale, 1, 64, "the MLP is mlp_scale x hidden_dim wide");
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
