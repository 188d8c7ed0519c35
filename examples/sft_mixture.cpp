// sft_mixture: supervised fine-tuning on a weighted mixture of datasets with upstream's SFTMixtureConfig keys
// (upstream `python -m levanter.main.sft_mixture`): the datasets' rows are mixed, then packed as sft packs them.
// See include/levanter/main/sft.hpp and docs/sft.md.
//
//   sft_mixture config/sft_mixture.yaml
#include <levanter/main/programs.hpp>

int main(int argc, char** argv) {
  levanter::maybe_relaunch_for_openblas(argv, "sft_mixture");
  return levanter::sft_mixture_main(argc, argv);
}
