// levanter/models/builtin_models.hpp: the built-in models' definitions with their Hugging Face adapters (the list
// is models/builtin.hpp). Included by the program headers, which declare the models' instantiations extern.
#pragma once

#include <levanter/models/builtin.hpp>
#include <levanter/models/gpt2_hf.hpp>
#include <levanter/models/llama_hf.hpp>
