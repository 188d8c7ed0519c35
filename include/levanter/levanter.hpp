// levanter/levanter.hpp: the umbrella header of the training framework: haliax, the config system, GPT-2, AdamW
// with upstream's schedules, the data path of train_lm, trackers and the trainer (`run_train_lm`).
#pragma once

#include <haliax/haliax.hpp>
#include <haliax/tree.hpp>

#include <levanter/checkpoint/checkpointer.hpp>
#include <levanter/checkpoint/h5.hpp>
#include <levanter/checkpoint/train_state.hpp>
#include <levanter/compat/hf_gpt2.hpp>
#include <levanter/compat/safetensors.hpp>
#include <levanter/config/cli.hpp>
#include <levanter/config/train_lm_config.hpp>
#include <levanter/config/validate.hpp>
#include <levanter/config/yaml.hpp>
#include <levanter/data/cache.hpp>
#include <levanter/data/error.hpp>
#include <levanter/data/lm_data.hpp>
#include <levanter/data/mixture.hpp>
#include <levanter/data/permutation.hpp>
#include <levanter/data/sources.hpp>
#include <levanter/data/text.hpp>
#include <levanter/data/tokenizer.hpp>
#include <levanter/main/hf_convert.hpp>
#include <levanter/main/train_lm.hpp>
#include <levanter/main/viz_lm.hpp>
#include <levanter/models/gpt2.hpp>
#include <levanter/optim/adamw.hpp>
#include <levanter/optim/schedule.hpp>
#include <levanter/profiler.hpp>
#include <levanter/run_metadata.hpp>
#include <levanter/tracker.hpp>
#include <levanter/trainer.hpp>
#include <levanter/viz/logprobs_html.hpp>
#include <levanter/watch.hpp>

namespace levanter {

/// Version of the levanter library (matches the CMake project version).
inline constexpr const char* version = "0.1.0";

}  // namespace levanter
