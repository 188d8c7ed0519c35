// levanter/models/builtin.hpp: the built-in model types, listed once. What enumerates them follows from this list:
// the `model:` choice (`ModelChoice`, models/registry.hpp), the programs' instantiations (declared extern at the end
// of levanter/main/{train_lm,eval_lm,hf_convert,viz_lm}.hpp, defined in the files CMakeLists.txt generates from the
// X lines below, one per program and model) and the headers every program sees (models/builtin_models.hpp).
//
//   X(model type, the config type its programs take, file stem, every `type:` config that makes this model)
//
// Adding a model (docs/architecture.md, "Adding a model"): its own files, then one X line here and its headers:
// the config's below, the model's and its Hugging Face adapter's in models/builtin_models.hpp.
#pragma once

#include <levanter/models/gemma_config.hpp>
#include <levanter/models/gpt2_config.hpp>
#include <levanter/models/llama_config.hpp>

// One entry per line, `  X(` first: CMakeLists.txt reads them.
// clang-format off
#define LEVANTER_BUILTIN_MODELS(X)                   \
  X(gpt2::LMHeadModel, Gpt2Config, gpt2, Gpt2Config) \
  X(llama::LMHeadModel, LlamaConfig, llama, LlamaConfig, MistralConfig, QwenConfig, Qwen3Config, GemmaConfig, Gemma2Config, Gemma3Config, Olmo2Config, MixtralConfig)
// clang-format on
