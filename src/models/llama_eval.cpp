// eval_lm for the Llama family, instantiated once for the model (main/eval_lm.hpp declares this instantiation
// extern for every other translation unit).
#include <levanter/main/eval_lm.hpp>

namespace levanter {
template eval_lm_result run_eval_lm_with<llama::LMHeadModel>(const detail::eval_job&, std::ostream&);
}  // namespace levanter
