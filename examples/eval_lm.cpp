// eval_lm: the loss of a trained model on the validation sets, per tag and in bits per byte, as train_lm evaluates
// it (upstream levanter.main.eval_lm). See include/levanter/main/eval_lm.hpp and docs/eval_lm.md.
//
//   eval_lm --checkpoint_path checkpoints/RUN
//   eval_lm --hf_checkpoint hf/gpt2 --data.validation_urls '["valid.jsonl"]' [--output_path results.json]
#include <levanter/main/programs.hpp>

int main(int argc, char** argv) {
  levanter::maybe_relaunch_for_openblas(argv, "eval_lm");
  return levanter::eval_lm_main(argc, argv);
}
