// viz_logprobs, export_lm_to_hf and import_hf_to_lm for GPT-2, instantiated once for the model (the program
// headers declare these instantiations extern for every other translation unit).
#include <levanter/main/hf_convert.hpp>
#include <levanter/main/viz_lm.hpp>

namespace levanter {
template std::vector<std::string> run_viz_logprobs_with<gpt2::LMHeadModel>(const detail::viz_job&, std::ostream&);
template std::vector<std::string> export_lm_to_hf_with<gpt2::LMHeadModel>(const detail::export_job&,
                                                                          const Gpt2Config&, std::ostream&);
template void import_hf_to_lm_with<gpt2::LMHeadModel>(const ImportHfConfig&, const hf::hf_dir&, const Gpt2Config&,
                                                      std::ostream&);
}  // namespace levanter
