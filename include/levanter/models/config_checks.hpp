// levanter/models/config_checks.hpp: the checks of the `model:` keys that GPT-2 and the Llama family share
// (layer_norm_epsilon, initializer_range, activation_function, attn_backend, flash_attention_block_size,
// cross_entropy_block_size), used by each model's validate() in src/models/.
#pragma once

#include <haliax/nn/activation.hpp>
#include <levanter/config/validate.hpp>
#include <string>

namespace levanter {

template <class C>
void validate_shared_model_keys(config::validator& v, const C& m) {
  config::check_real(v, "model.layer_norm_epsilon", m.layer_norm_epsilon, 0, 1, true, false);
  config::check_real(v, "model.initializer_range", m.initializer_range, 0, 10);
  if (!haliax::nn::find_activation(m.activation_function))
    v.error("model.activation_function",
            "unknown activation '" + m.activation_function + "'; use one of " + haliax::nn::activation_names());
  if (m.attn_backend && *m.attn_backend != "default" && *m.attn_backend != "jax_flash" && *m.attn_backend != "vanilla")
    v.refuse("model.attn_backend", "attention backend '" + *m.attn_backend + "' is not supported",
             "use default or jax_flash (blocked attention) or vanilla");
  if (m.flash_attention_block_size)
    config::check_int(v, "model.flash_attention_block_size", *m.flash_attention_block_size, 1, config::bounds::max_seq_len);
  if (m.cross_entropy_block_size)
    config::check_int(v, "model.cross_entropy_block_size", *m.cross_entropy_block_size, 1, config::bounds::max_vocab);
}

}  // namespace levanter
