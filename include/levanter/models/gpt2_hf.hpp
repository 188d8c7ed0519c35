// levanter/models/gpt2_hf.hpp: GPT-2 to and from Hugging Face (`transformers`' GPT2LMHeadModel), as an adapter for
// compat/hf.hpp.
//
// Names follow upstream's state-dict key map: `transformer.` and `embeddings.` dropped, `blocks` -> `h`,
// `token_embeddings` -> `wte`, `position_embeddings` -> `wpe`, stacked layers unstacked to `h.0.`, `h.1.`, ...
// (the layout of the `gpt2` hub checkpoint). Reading also accepts the `transformer.`-prefixed names that
// `save_pretrained` writes, ignores the attention-mask buffers (`attn.bias`, `attn.masked_bias`) and checks that
// an `lm_head.weight`, if present, is the tied `wte.weight`. GPT-2's Conv1D weights are stored [in, out], which
// is exactly our {In..., Out...} layout flattened, so no transposes are needed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <levanter/compat/hf.hpp>
#include <levanter/models/gpt2.hpp>
#include <levanter/models/hf_config_json.hpp>

namespace levanter::hf {

template <>
struct hf_adapter<gpt2::LMHeadModel> {
  static constexpr std::string_view model_type = "gpt2";
  /// The tensors are stored without it, but in GPT2LMHeadModel they live under `transformer` (PEFT's adapter names
  /// are module paths: base_model.model.transformer.h.0.attn.c_attn).
  static constexpr std::string_view module_prefix = "transformer.";
  /// upstream `Gpt2Config.to_hf_config`.
  static nlohmann::json to_hf_config(const Gpt2Config& c, std::int64_t vocab);
  /// upstream `Gpt2Config.from_hf_config`: the architecture from config.json; gradient checkpointing, the
  /// attention backend and other settings of ours are kept from `base`.
  static Gpt2Config from_hf_config(Gpt2Config base, const nlohmann::json& j, const std::string& where);
  static void check_matches(const Gpt2Config& c, const nlohmann::json& j, const std::string& where);
  static std::string hf_name(const std::string& ours);
  static std::vector<std::pair<std::string, std::vector<std::int64_t>>> hf_layout(const Gpt2Config& c,
                                                                                   std::int64_t vocab);
  static bool missing_ok(const std::string& hf_name);
  static std::string full_name(const hf_dir& d, const std::string& hf_name);
  static std::string unused(const hf_dir& d, const std::string& name);
  /// Our model keys and the config.json keys they come from, for messages about an imported config.
  static std::vector<std::pair<std::string, std::string>> hf_keys() { return gpt2_hf_keys(); }
};

}  // namespace levanter::hf
