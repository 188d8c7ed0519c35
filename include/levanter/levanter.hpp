// levanter/levanter.hpp: the umbrella header of the training framework: haliax, the config system, the model
// interface and the built-in models, AdamW with upstream's schedules, the data pipeline, checkpoints, trackers,
// evaluation and the Trainer. Link the levanter::levanter library (haliax::levanter when installed), which holds
// what is compiled once: the non-template parts and the built-in models' instantiations.
//
//   #include <levanter/levanter.hpp>
//   struct MyLm { ... };                       // satisfies levanter::LmModel (docs/architecture.md)
//   levanter::Trainer<MyLm> trainer(cfg.trainer, run, loss, options);
#pragma once

#include <haliax/haliax.hpp>
#include <haliax/tree.hpp>

#include <levanter/checkpoint/checkpointer.hpp>
#include <levanter/checkpoint/config.hpp>
#include <levanter/checkpoint/h5.hpp>
#include <levanter/checkpoint/train_state.hpp>
#include <levanter/compat/hf.hpp>
#include <levanter/compat/safetensors.hpp>
#include <levanter/config/cli.hpp>
#include <levanter/config/types.hpp>
#include <levanter/config/validate.hpp>
#include <levanter/config/yaml.hpp>
#include <levanter/data/cache.hpp>
#include <levanter/data/config.hpp>
#include <levanter/data/error.hpp>
#include <levanter/data/lm_data.hpp>
#include <levanter/data/mixture.hpp>
#include <levanter/data/permutation.hpp>
#include <levanter/data/sources.hpp>
#include <levanter/data/tokenizer.hpp>
#include <levanter/eval.hpp>
#include <levanter/io/atomic_file.hpp>
#include <levanter/main/hf_convert.hpp>
#include <levanter/main/model_loading.hpp>
#include <levanter/main/programs.hpp>
#include <levanter/main/train_lm.hpp>
#include <levanter/main/train_lm_config.hpp>
#include <levanter/main/viz_lm.hpp>
#include <levanter/models/builtin_models.hpp>
#include <levanter/models/lm.hpp>
#include <levanter/models/registry.hpp>
#include <levanter/optim/adamw.hpp>
#include <levanter/optim/config.hpp>
#include <levanter/optim/optimizer.hpp>
#include <levanter/optim/schedule.hpp>
#include <levanter/profiler.hpp>
#include <levanter/run_metadata.hpp>
#include <levanter/tracker/config.hpp>
#include <levanter/tracker/tracker.hpp>
#include <levanter/trainer/config.hpp>
#include <levanter/trainer/run.hpp>
#include <levanter/trainer/trainer.hpp>
#include <levanter/version.hpp>
#include <levanter/viz/logprobs.hpp>
#include <levanter/viz/logprobs_html.hpp>
#include <levanter/watch.hpp>
