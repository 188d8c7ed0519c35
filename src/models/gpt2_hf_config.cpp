// GPT-2's config.json (levanter/models/hf_config_json.hpp).
#include <levanter/models/hf_config_json.hpp>

#include <haliax/nn/activation.hpp>
#include <levanter/config/validate.hpp>

namespace levanter::hf {

nlohmann::json gpt2_to_hf_config(const Gpt2Config& c, std::int64_t vocab) {
  nlohmann::json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = vocab;
  j["n_positions"] = c.seq_len;
  j["n_ctx"] = c.seq_len;
  j["n_embd"] = c.hidden_dim;
  j["n_layer"] = c.num_layers;
  j["n_head"] = c.num_heads;
  j["n_inner"] = c.mlp_scale == 4 ? nlohmann::json(nullptr) : nlohmann::json(c.mlp_dim());
  j["activation_function"] = c.activation_function;
  j["resid_pdrop"] = c.resid_pdrop;
  j["embd_pdrop"] = c.embed_pdrop;
  j["attn_pdrop"] = c.attn_pdrop;
  j["layer_norm_epsilon"] = c.layer_norm_epsilon;
  j["initializer_range"] = c.initializer_range;
  j["scale_attn_by_inverse_layer_idx"] = c.scale_attn_by_inverse_layer_idx;
  j["reorder_and_upcast_attn"] = c.upcast_attn;
  j["scale_attn_weights"] = true;
  j["tie_word_embeddings"] = true;
  j["use_cache"] = true;
  return j;
}

Gpt2Config gpt2_from_hf_config(Gpt2Config base, const nlohmann::json& j, const std::string& where) {
  namespace b = config::bounds;
  base.seq_len = detail::get_int_in(j, "n_positions", where, 2, b::max_seq_len);
  base.num_layers = detail::get_int_in(j, "n_layer", where, 1, b::max_layers);
  base.num_heads = detail::get_int_in(j, "n_head", where, 1, b::max_heads);
  base.hidden_dim = detail::get_int_in(j, "n_embd", where, 1, b::max_model_dim);
  const std::int64_t n_inner = j.contains("n_inner") && !j["n_inner"].is_null()
                                   ? detail::get_int_in(j, "n_inner", where, 1, b::max_model_dim * 64)
                                   : 4 * std::int64_t(base.hidden_dim);
  if (base.hidden_dim <= 0 || n_inner % base.hidden_dim != 0)
    throw error(where + ": n_inner " + std::to_string(n_inner) + " is not a multiple of n_embd " +
                std::to_string(base.hidden_dim) + " (our GPT-2 has mlp = mlp_scale * hidden_dim)");
  base.mlp_scale = static_cast<int>(n_inner / base.hidden_dim);
  base.initializer_range = detail::get_or<double>(j, "initializer_range", base.initializer_range);
  base.attn_pdrop = detail::get_or<double>(j, "attn_pdrop", base.attn_pdrop);
  base.embed_pdrop = detail::get_or<double>(j, "embd_pdrop", base.embed_pdrop);
  base.resid_pdrop = detail::get_or<double>(j, "resid_pdrop", base.resid_pdrop);
  base.layer_norm_epsilon = detail::get_or<double>(j, "layer_norm_epsilon", base.layer_norm_epsilon);
  base.activation_function = detail::get_or<std::string>(j, "activation_function", base.activation_function);
  base.scale_attn_by_inverse_layer_idx =
      detail::get_or<bool>(j, "scale_attn_by_inverse_layer_idx", base.scale_attn_by_inverse_layer_idx);
  base.upcast_attn = detail::get_or<bool>(j, "reorder_and_upcast_attn", base.upcast_attn);
  base.use_bias = true;
  if (!detail::get_or<bool>(j, "scale_attn_weights", true))
    throw error(where + ": scale_attn_weights false is not supported (our attention divides by sqrt(head_size))");
  if (!haliax::nn::find_activation(base.activation_function))
    throw error(where + ": activation_function '" + base.activation_function + "' is not supported (use one of " +
                haliax::nn::activation_names() + ")");
  return base;
}

std::vector<std::pair<std::string, std::string>> gpt2_hf_keys() {
  return {{"model.seq_len", "n_positions"},        {"model.hidden_dim", "n_embd"},
          {"model.num_layers", "n_layer"},         {"model.num_heads", "n_head"},
          {"model.mlp_scale", "n_inner"},          {"model.layer_norm_epsilon", "layer_norm_epsilon"},
          {"model.activation_function", "activation_function"}, {"model.initializer_range", "initializer_range"},
          {"model.attn_pdrop", "attn_pdrop"},      {"model.embed_pdrop", "embd_pdrop"},
          {"model.resid_pdrop", "resid_pdrop"}};
}

}  // namespace levanter::hf
