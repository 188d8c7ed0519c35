// viz_logprobs: the per-token log-probabilities of a model on validation documents as an HTML heatmap
// (upstream levanter.main.viz_logprobs). See include/levanter/main/viz_lm.hpp and docs/viz.md.
//
//   viz_logprobs --checkpoint_path checkpoints/RUN [--path logprobs.html] [--num_docs 32]
//   viz_logprobs --checkpoint_path checkpoints/B --comparison_model_path checkpoints/A
#include <levanter/main/programs.hpp>

int main(int argc, char** argv) { return levanter::viz_logprobs_main(argc, argv); }
