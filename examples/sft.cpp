// sft: supervised fine-tuning with upstream's SFTConfig keys (upstream `python -m levanter.main.sft`): single-turn
// chats or prompt/response records, packed as upstream packs them, the loss on the responses only. See
// include/levanter/main/sft.hpp and docs/sft.md.
//
//   sft config/sft_tiny.yaml
//   sft --config_path sft.yaml --epoch 3 --trainer.num_train_steps 200
#include <levanter/main/programs.hpp>

int main(int argc, char** argv) {
  levanter::maybe_relaunch_for_openblas(argv, "sft");
  return levanter::sft_main(argc, argv);
}
