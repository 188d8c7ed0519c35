// train_lm for GPT-2: the Trainer and the program's wiring instantiated once for the model (see
// levanter/main/train_lm.hpp, which declares this instantiation extern for every other translation unit).
#include <levanter/main/train_lm.hpp>

namespace levanter {
template train_result run_train_lm<gpt2::LMHeadModel>(const TrainLmConfig&, Gpt2Config, const std::string&,
                                                      std::ostream&, const std::vector<hook<gpt2::LMHeadModel>>&);
}  // namespace levanter
