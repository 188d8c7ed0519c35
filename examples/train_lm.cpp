// train_lm: train a language model from a Levanter-style YAML config (upstream `python -m levanter.main.train_lm`).
// The program is levanter::train_lm_main (include/levanter/main/train_lm.hpp); this file adds what only the build
// knows: the embedded default config and the source revision.
//
//   train_lm                                   # the embedded default: nano GPT-2 on Debian's fortunes, bytes
//   train_lm config/gpt2_nano.yaml             # a config file (or --config_path FILE)
//   train_lm --config_path config/gpt2_small.yaml --trainer.num_train_steps 10
//   train_lm --help | --dry_run
#include <levanter/main/programs.hpp>
#include <levanter/run_metadata.hpp>

#include "levanter_git_info.hpp"        // generated: kLevanterGitSha, kLevanterGitDirty, kLevanterBuildType
#include "train_lm_default_config.hpp"  // generated: kDefaultConfigYaml

int main(int argc, char** argv) {
  levanter::maybe_relaunch_for_openblas(argv, "train_lm");
  levanter::program_build_info() = {kLevanterGitSha, kLevanterGitDirty, kLevanterBuildType, "train_lm"};
  return levanter::train_lm_main(argc, argv, kDefaultConfigYaml);
}
