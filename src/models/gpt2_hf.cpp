// GPT-2 <-> Hugging Face (levanter/models/gpt2_hf.hpp).
#include <levanter/models/gpt2_hf.hpp>

#include <levanter/config/validate.hpp>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <haliax/nn/activation.hpp>

namespace levanter::hf {

using adapter = hf_adapter<gpt2::LMHeadModel>;

nlohmann::json adapter::to_hf_config(const Gpt2Config& c, std::int64_t vocab) {
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

Gpt2Config adapter::from_hf_config(Gpt2Config base, const nlohmann::json& j, const std::string& where) {
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

void adapter::check_matches(const Gpt2Config& c, const nlohmann::json& j, const std::string& where) {
  const Gpt2Config h = from_hf_config(c, j, where);
  auto differs = [&](const char* key, auto ours, auto theirs) {
    if (ours != theirs)
      throw error(where + ": the Hugging Face model has " + key + " " + nlohmann::json(theirs).dump() +
                  " but the model config says " + nlohmann::json(ours).dump() +
                  " (set use_hf_model_config: true to take the checkpoint's architecture)");
  };
  differs("n_positions", c.seq_len, h.seq_len);
  differs("n_layer", c.num_layers, h.num_layers);
  differs("n_head", c.num_heads, h.num_heads);
  differs("n_embd", c.hidden_dim, h.hidden_dim);
  differs("mlp_scale (n_inner / n_embd)", c.mlp_scale, h.mlp_scale);
  differs("activation_function", c.activation_function, h.activation_function);
}

std::string adapter::hf_name(const std::string& ours) {
  static const std::pair<const char*, const char*> map[] = {
      {"transformer.blocks.stacked.", "h.{i}."},
      {"transformer.ln_f.", "ln_f."},
      {"embeddings.token_embeddings.", "wte."},
      {"embeddings.position_embeddings.", "wpe."},
  };
  for (const auto& [from, to] : map)
    if (ours.rfind(from, 0) == 0) return std::string(to) + ours.substr(std::strlen(from));
  throw error("no Hugging Face name for parameter '" + ours + "'");
}

std::vector<std::pair<std::string, std::vector<std::int64_t>>> adapter::hf_layout(const Gpt2Config& c,
                                                                                   std::int64_t vocab) {
  const std::int64_t E = c.hidden_dim, M = c.mlp_dim();
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  out.push_back({"wte.weight", {vocab, E}});
  out.push_back({"wpe.weight", {c.seq_len, E}});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    out.push_back({h + "ln_1.weight", {E}});
    out.push_back({h + "ln_1.bias", {E}});
    out.push_back({h + "attn.c_attn.weight", {E, 3 * E}});
    out.push_back({h + "attn.c_attn.bias", {3 * E}});
    out.push_back({h + "attn.c_proj.weight", {E, E}});
    out.push_back({h + "attn.c_proj.bias", {E}});
    out.push_back({h + "ln_2.weight", {E}});
    out.push_back({h + "ln_2.bias", {E}});
    out.push_back({h + "mlp.c_fc.weight", {E, M}});
    out.push_back({h + "mlp.c_fc.bias", {M}});
    out.push_back({h + "mlp.c_proj.weight", {M, E}});
    out.push_back({h + "mlp.c_proj.bias", {E}});
  }
  out.push_back({"ln_f.weight", {E}});
  out.push_back({"ln_f.bias", {E}});
  return out;
}

// HF's GPT-2 always has biases: a model with use_bias false writes them as zeros.
bool adapter::missing_ok(const std::string& name) { return name.ends_with(".bias"); }

std::string adapter::full_name(const hf_dir& d, const std::string& name) {
  return (d.tensors.find("transformer.wte.weight") ? "transformer." : "") + name;
}

std::string adapter::unused(const hf_dir& d, const std::string& n) {
  // Attention-mask buffers that some writers store.
  if (n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias")) return "";
  if (n == "lm_head.weight") {
    if (d.tensors.read_f32(n) != d.tensors.read_f32(full_name(d, "wte.weight")))
      return "lm_head.weight differs from wte.weight; untied GPT-2 heads are not supported";
    return "";
  }
  if (n.ends_with(".bias")) {
    const auto b = d.tensors.read_f32(n);
    if (std::all_of(b.begin(), b.end(), [](float x) { return x == 0.0f; })) return "";
    return "tensor '" + n + "' is a non-zero bias but the model config has use_bias: false";
  }
  return "unknown";
}

}  // namespace levanter::hf
