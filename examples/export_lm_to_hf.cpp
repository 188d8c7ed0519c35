// export_lm_to_hf: a train_lm checkpoint as a Hugging Face directory, with the tokenizer's files and ids
// (upstream levanter.main.export_lm_to_hf). See include/levanter/main/hf_convert.hpp and docs/checkpoints.md.
//
//   export_lm_to_hf --checkpoint_path checkpoints/RUN --output_dir hf/RUN [--save_dtype bfloat16]
#include <levanter/main/programs.hpp>

int main(int argc, char** argv) { return levanter::export_lm_to_hf_main(argc, argv); }
