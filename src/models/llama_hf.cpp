// The Llama family <-> Hugging Face (levanter/models/llama_hf.hpp).
#include <levanter/models/llama_hf.hpp>

#include <cstring>
#include <optional>
#include <variant>

#include <levanter/models/hf_config_json.hpp>
#include <levanter/models/registry.hpp>

namespace levanter::hf {

using adapter = hf_adapter<llama::LMHeadModel>;

bool adapter::reads_model_type(std::string_view t) {
  bool reads = false;
  for_each_model_config([&]<class T>(std::type_identity<T>) {
    if constexpr (std::is_base_of_v<LlamaConfig, T>) reads = reads || T::hf_model_type == t;
  });
  return reads;
}

std::string_view adapter::model_type_of(const LlamaConfig& c) { return llama_model_type_of(c); }

nlohmann::json adapter::to_hf_config(const LlamaConfig& c, std::int64_t vocab) { return llama_to_hf_config(c, vocab); }

LlamaConfig adapter::from_hf_config(LlamaConfig base, const nlohmann::json& j, const std::string& where) {
  return llama_from_hf_config(std::move(base), j, where);
}

void adapter::check_matches(const LlamaConfig& c, const nlohmann::json& j, const std::string& where) {
  const LlamaConfig h = from_hf_config(c, j, where);
  auto differs = [&](const char* key, auto ours, auto theirs) {
    if (ours != theirs)
      throw error(where + ": the Hugging Face model has " + key + " " + nlohmann::json(theirs).dump() +
                  " but the model config says " + nlohmann::json(ours).dump() +
                  " (set use_hf_model_config: true to take the checkpoint's architecture)");
  };
  differs("max_position_embeddings", c.seq_len, h.seq_len);
  differs("hidden_size", c.hidden_dim, h.hidden_dim);
  differs("intermediate_size", c.intermediate_dim, h.intermediate_dim);
  differs("num_hidden_layers", c.num_layers, h.num_layers);
  differs("num_attention_heads", c.num_heads, h.num_heads);
  differs("num_key_value_heads", c.num_kv_heads, h.num_kv_heads);
  differs("head_dim", c.head_size(), h.head_size());
  differs("hidden_act", c.activation_function, h.activation_function);
  differs("tie_word_embeddings", c.tied(), h.tied());
  differs("rope_parameters", rope_to_hf(c.rope).dump(), rope_to_hf(h.rope).dump());
  differs("query_pre_attn_scalar (as the attention scale)", c.attention_scale(), h.attention_scale());
  differs("attn_logit_softcapping", nlohmann::json(c.attn_logit_softcapping ? *c.attn_logit_softcapping : 0.0),
          nlohmann::json(h.attn_logit_softcapping ? *h.attn_logit_softcapping : 0.0));
  differs("final_logit_softcapping", nlohmann::json(c.final_logit_softcapping ? *c.final_logit_softcapping : 0.0),
          nlohmann::json(h.final_logit_softcapping ? *h.final_logit_softcapping : 0.0));
  for (int i = 0; i < c.num_layers; ++i)
    differs("the RoPE of this layer", rope_to_hf(c.rope_of_layer(i)).dump(), rope_to_hf(h.rope_of_layer(i)).dump());
  for (int i = 0; i < c.num_layers; ++i)
    differs("a sliding window on this layer", c.window_of_layer(i), h.window_of_layer(i));
  if (c.moe()) {
    differs("num_local_experts", c.n_routed_experts, h.n_routed_experts);
    differs("num_experts_per_tok", c.num_experts_per_tok, h.num_experts_per_tok);
  }
}

std::string adapter::hf_name(const std::string& ours) {
  static const std::pair<const char*, const char*> map[] = {
      {"transformer.layers.stacked.", "model.layers.{i}."},
      {"transformer.norm.", "model.norm."},
      {"embeddings.token_embeddings.", "model.embed_tokens."},
      {"lm_head.", "lm_head."},
  };
  for (const auto& [from, to] : map)
    if (ours.rfind(from, 0) == 0) {
      const std::string rest = ours.substr(std::strlen(from));
      if (rest.starts_with("post_attn_layernorm") || rest.starts_with("post_mlp_layernorm") ||
          rest.starts_with("shared_mlp."))
        break;  // hybrid_norm, shared experts: no Hugging Face form
      // Mixtral's experts: one tensor per expert ("{e}", the axis after the layers), [out, in] as ours
      for (const char* w : {"w1", "w2", "w3"})
        if (rest == std::string("block_sparse_moe.experts.") + w + ".weight")
          return std::string(to) + "block_sparse_moe.experts.{e}." + w + ".weight";
      // OLMo 2's whole-projection norms are its q_norm / k_norm
      for (const auto& [ours_norm, hf_norm] : {std::pair{"self_attn.q_proj_norm.", "self_attn.q_norm."},
                                               std::pair{"self_attn.k_proj_norm.", "self_attn.k_norm."}})
        if (rest.starts_with(ours_norm)) return std::string(to) + hf_norm + rest.substr(std::strlen(ours_norm));
      return std::string(to) + rest;
    }
  throw error("no Hugging Face name for parameter '" + ours +
              "' (hybrid_norm, input_embedding_norm and use_bias "
              "have no Hugging Face form)");
}

std::vector<std::pair<std::string, std::vector<std::int64_t>>> adapter::hf_layout(const LlamaConfig& c,
                                                                                  std::int64_t vocab) {
  const std::int64_t E = c.hidden_dim, M = c.intermediate_dim, D = c.head_size(), H = c.num_heads, K = c.num_kv_heads;
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  out.push_back({"model.embed_tokens.weight", {vocab, E}});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    out.push_back({l + "self_attn.q_proj.weight", {H * D, E}});
    if (c.qkv_bias()) out.push_back({l + "self_attn.q_proj.bias", {H * D}});
    out.push_back({l + "self_attn.k_proj.weight", {K * D, E}});
    if (c.qkv_bias()) out.push_back({l + "self_attn.k_proj.bias", {K * D}});
    out.push_back({l + "self_attn.v_proj.weight", {K * D, E}});
    if (c.qkv_bias()) out.push_back({l + "self_attn.v_proj.bias", {K * D}});
    out.push_back({l + "self_attn.o_proj.weight", {E, H * D}});
    if (c.o_bias()) out.push_back({l + "self_attn.o_proj.bias", {E}});
    if (c.qk_norm()) {
      out.push_back({l + "self_attn.q_norm.weight", {D}});
      out.push_back({l + "self_attn.k_norm.weight", {D}});
    }
    if (c.projection_qk_norm()) {
      out.push_back({l + "self_attn.q_norm.weight", {H * D}});
      out.push_back({l + "self_attn.k_norm.weight", {K * D}});
    }
    if (c.moe()) {
      out.push_back({l + "block_sparse_moe.gate.weight", {c.n_routed_experts, E}});
      for (int e = 0; e < c.n_routed_experts; ++e) {
        const std::string x = l + "block_sparse_moe.experts." + std::to_string(e) + ".";
        out.push_back({x + "w1.weight", {M, E}});
        out.push_back({x + "w2.weight", {E, M}});
        out.push_back({x + "w3.weight", {M, E}});
      }
    } else {
      out.push_back({l + "mlp.gate_proj.weight", {M, E}});
      out.push_back({l + "mlp.up_proj.weight", {M, E}});
      out.push_back({l + "mlp.down_proj.weight", {E, M}});
    }
    if (!c.post_norms_only()) out.push_back({l + "input_layernorm.weight", {E}});
    out.push_back({l + "post_attention_layernorm.weight", {E}});
    if (c.post_norms_only()) out.push_back({l + "post_feedforward_layernorm.weight", {E}});
    if (c.sandwich_norms()) {
      out.push_back({l + "pre_feedforward_layernorm.weight", {E}});
      out.push_back({l + "post_feedforward_layernorm.weight", {E}});
    }
  }
  out.push_back({"model.norm.weight", {E}});
  if (!c.tied()) out.push_back({"lm_head.weight", {vocab, E}});
  return out;
}

std::string adapter::full_name(const hf_dir& d, const std::string& name) {
  if (d.wrapper != "gemma3") return name;
  if (d.tensors.find("language_model.model.embed_tokens.weight")) return "language_model." + name;
  if (name.starts_with("model.")) return "model.language_model." + name.substr(6);
  return name;  // lm_head.weight
}

std::string adapter::unused(const hf_dir& d, const std::string& n) {
  if (n.ends_with(".rotary_emb.inv_freq")) return "";  // a buffer older writers stored
  if (n == full_name(d, "lm_head.weight") || n == "lm_head.weight") {
    const std::string embed = full_name(d, "model.embed_tokens.weight");
    if (d.tensors.read_f32(n) != d.tensors.read_f32(embed))
      return "tensor " + n + " differs from " + embed +
             " but config.json's tie_word_embeddings ties them (set tie_word_embeddings: false)";
    return "";
  }
  // a multimodal Gemma 3's image side: the language model does not use it
  if (d.wrapper == "gemma3")
    for (const char* p : {"vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector."})
      if (n.starts_with(p)) return "";
  return "unknown";
}

}  // namespace levanter::hf
