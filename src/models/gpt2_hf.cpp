// GPT-2 <-> Hugging Face (levanter/models/gpt2_hf.hpp).
#include <levanter/models/gpt2_hf.hpp>

#include <levanter/config/validate.hpp>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <haliax/nn/activation.hpp>

namespace levanter::hf {

using adapter = hf_adapter<gpt2::LMHeadModel>;

nlohmann::json adapter::to_hf_config(const Gpt2Config& c, std::int64_t vocab) { return gpt2_to_hf_config(c, vocab); }

Gpt2Config adapter::from_hf_config(Gpt2Config base, const nlohmann::json& j, const std::string& where) {
  return gpt2_from_hf_config(std::move(base), j, where);
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
