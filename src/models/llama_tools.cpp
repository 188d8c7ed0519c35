// viz_logprobs, export_lm_to_hf and import_hf_to_lm for the Llama family, instantiated once for the model
// (the program headers declare these instantiations extern for every other translation unit).
#include <levanter/main/hf_convert.hpp>
#include <levanter/main/viz_lm.hpp>

namespace levanter {
template std::vector<std::string> run_viz_logprobs_with<llama::LMHeadModel>(const detail::viz_job&, std::ostream&);
template std::vector<std::string> export_lm_to_hf_with<llama::LMHeadModel>(const detail::export_job&,
                                                                           const LlamaConfig&, std::ostream&);
template void import_hf_to_lm_with<llama::LMHeadModel>(const ImportHfConfig&, const hf::hf_dir&, const LlamaConfig&,
                                                       std::ostream&);
}  // namespace levanter
