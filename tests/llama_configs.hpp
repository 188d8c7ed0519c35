// The Llama family's config type for a Hugging Face model_type, for tests that import the tiny goldens of
// tests/golden/hf_llama (test_llama.cpp, test_generate.cpp).
#pragma once

#include <string>

#include <levanter/models/llama_hf.hpp>

namespace test_llama {

/// Our config type (its defaults) for an HF model_type; Llama for anything else.
inline levanter::LlamaConfig base_for(const std::string& model_type) {
  if (model_type == "mistral") return levanter::MistralConfig{};
  if (model_type == "qwen2") return levanter::QwenConfig{};
  if (model_type == "qwen3") return levanter::Qwen3Config{};
  if (model_type == "gemma") return levanter::GemmaConfig{};
  if (model_type == "gemma2") return levanter::Gemma2Config{};
  if (model_type == "gemma3_text") return levanter::Gemma3Config{};
  if (model_type == "olmo2") return levanter::Olmo2Config{};
  if (model_type == "mixtral") return levanter::MixtralConfig{};
  return levanter::LlamaConfig{};
}

}  // namespace test_llama
