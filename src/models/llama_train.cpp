// train_lm for the Llama family: the Trainer and the program's wiring instantiated once for the model (see
// levanter/main/train_lm.hpp, which declares this instantiation extern for every other translation unit).
#include <levanter/main/train_lm.hpp>

namespace levanter {
template train_result run_train_lm<llama::LMHeadModel>(const TrainLmConfig&, LlamaConfig, const std::string&,
                                                       std::ostream&, const std::vector<hook<llama::LMHeadModel>>&);
}  // namespace levanter
