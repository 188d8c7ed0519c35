// sample_lm: continuations of prompts from a trained model with a KV cache (upstream levanter.main.sample_lm). See
// include/levanter/main/sample_lm.hpp and docs/generation.md.
//
//   sample_lm --checkpoint_path checkpoints/RUN --prompts '["Four score and"]' --max_new_tokens 32
//   sample_lm --hf_checkpoint path/to/hf_dir --temperature 0
#include <levanter/main/programs.hpp>

int main(int argc, char** argv) { return levanter::sample_lm_main(argc, argv); }
