// levanter/main/programs.hpp: what every levanter program shares at its outermost level: one mapping from the
// errors a user can cause to a message and an exit code, so no program dies with a bare exception.
//
//   0 success; 1 anything unexpected; 2 a config error; 3 a data error; 4 training stopped (NaN/Inf loss);
//   5 a checkpoint, Hugging Face directory or output file that cannot be read or written.
#pragma once

#include <functional>
#include <string_view>

namespace levanter {

/// The programs, whole: each parses its command line (a config path, --config_path, dotted overrides), answers
/// --help and --dry_run, runs, and returns the exit code below. The programs in examples/ are these calls.
int train_lm_main(int argc, char** argv, const char* default_yaml, const char* default_name = "<embedded default>");
int viz_logprobs_main(int argc, char** argv);
int export_lm_to_hf_main(int argc, char** argv);
int import_hf_to_lm_main(int argc, char** argv);
int eval_lm_main(int argc, char** argv);
int sft_main(int argc, char** argv);
int sft_mixture_main(int argc, char** argv);
int sample_lm_main(int argc, char** argv);
int serve_lm_main(int argc, char** argv);
int lora_lm_main(int argc, char** argv);

/// OpenBLAS picks its kernels when it loads, from OPENBLAS_CORETYPE. Debian's build (and some images'
/// OPENBLAS_CORETYPE=Haswell) runs AVX2 kernels on AVX-512 CPUs, at about half the sgemm rate. When the CPU has
/// AVX-512 and the kernels in use are the AVX2 ones, this re-executes the program once with
/// OPENBLAS_CORETYPE=SkylakeX (call it first thing in main). LEVANTER_KEEP_OPENBLAS_CORE=1 keeps the choice.
void maybe_relaunch_for_openblas(char** argv, std::string_view program);

/// Runs `body` and returns its exit code, or catches what it throws, prints "<program>: <kind>: <message>" to
/// stderr and returns the code above.
int run_program(std::string_view program, const std::function<int()>& body);

}  // namespace levanter
