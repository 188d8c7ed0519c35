// import_hf_to_lm: a local Hugging Face directory as a train_lm checkpoint (upstream
// levanter.main.export_hf_to_lm); start a run from it with initialize_from_checkpoint_path.
//
//   import_hf_to_lm --hf_checkpoint DIR --output_path checkpoints/imported
#include <levanter/main/programs.hpp>

int main(int argc, char** argv) { return levanter::import_hf_to_lm_main(argc, argv); }
