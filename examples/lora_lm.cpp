// lora_lm: LoRA fine-tuning of a Hugging Face model; exports PEFT adapters and the merged model. See
// include/levanter/main/lora_lm.hpp and docs/lora.md.
//
//   lora_lm lora.yaml
//   lora_lm --config_path tests/upstream-config/lora_llama2.yaml --initialize_from_hf path/to/Llama-2-7b-hf
#include <levanter/main/programs.hpp>

int main(int argc, char** argv) { return levanter::lora_lm_main(argc, argv); }
