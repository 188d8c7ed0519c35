// train_lm: train a GPT-2 from a Levanter-style YAML config (upstream `python -m levanter.main.train_lm`).
//
//   train_lm                                   # the embedded default: nano GPT-2 on Debian's fortunes, bytes
//   train_lm config/gpt2_nano.yaml             # a config file (or --config_path FILE)
//   train_lm --config_path config/gpt2_small.yaml --trainer.num_train_steps 10
//   train_lm --help | --dry_run
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <unistd.h>
#include <vector>

#include <levanter/levanter.hpp>

#include "levanter_git_info.hpp"        // generated: kLevanterGitSha, kLevanterGitDirty, kLevanterBuildType
#include "train_lm_default_config.hpp"  // generated: kDefaultConfigYaml

namespace {

bool cpu_has_avx512() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

/// OpenBLAS picks its kernels when it loads, from OPENBLAS_CORETYPE. Debian's build (and this image's
/// OPENBLAS_CORETYPE=Haswell) runs AVX2 kernels on AVX-512 CPUs, at about half the sgemm rate. When the CPU has
/// AVX-512 and the kernels in use are the AVX2 ones, re-launch once with OPENBLAS_CORETYPE=SkylakeX.
/// LEVANTER_KEEP_OPENBLAS_CORE=1 keeps whatever was chosen.
void maybe_relaunch_for_openblas(char** argv) {
  if (std::getenv("LEVANTER_KEEP_OPENBLAS_CORE") || std::getenv("LEVANTER_RELAUNCHED")) return;
  const std::string core = levanter::openblas_core();
  if (!cpu_has_avx512() || (core != "Haswell" && core != "Zen" && core != "Sandybridge")) return;
  ::setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  ::setenv("LEVANTER_RELAUNCHED", "1", 1);
  std::cerr << "train_lm: the CPU has AVX-512 but OpenBLAS runs its " << core
            << " kernels; re-launching with OPENBLAS_CORETYPE=SkylakeX (LEVANTER_KEEP_OPENBLAS_CORE=1 keeps "
            << core << ")" << std::endl;
  ::execv("/proc/self/exe", argv);
  std::cerr << "train_lm: re-launch failed (" << std::strerror(errno) << "); continuing with " << core << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  maybe_relaunch_for_openblas(argv);
  levanter::program_build_info() = {kLevanterGitSha, kLevanterGitDirty, kLevanterBuildType, "train_lm"};
  try {
    auto parsed = levanter::config::parse_command_line<levanter::TrainLmConfig>(argc, argv, kDefaultConfigYaml,
                                                                                 "<embedded default>");
    if (parsed.help) {
      std::cout << levanter::config::help_text<levanter::TrainLmConfig>("train_lm");
      return 0;
    }
    const auto checked = levanter::config::validate(parsed.config, parsed.sources);
    for (const auto& n : checked.notes) std::cerr << "train_lm: note: " << n << "\n";
    if (!checked.errors.empty()) {
      std::cerr << "train_lm: the config cannot be used as it is (" << parsed.config_path << "):\n";
      for (const auto& e : checked.errors) std::cerr << "  - " << e << "\n";
      return 2;
    }
    if (parsed.dry_run) {
      std::cout << parsed.resolved_yaml;
      std::cerr << "train_lm: config resolved and valid (--dry_run: not training)\n";
      return 0;
    }
    levanter::run_train_lm(parsed.config, parsed.resolved_yaml, std::cout);
    return 0;
  } catch (const levanter::config::config_error& e) {
    std::cerr << "train_lm: config error: " << e.what() << "\n";
    return 2;
  } catch (const levanter::data::data_error& e) {
    std::cerr << "train_lm: data error: " << e.what() << "\n";
    return 3;
  } catch (const levanter::checkpoint::error& e) {
    std::cerr << "train_lm: checkpoint error: " << e.what() << "\n";
    return 5;
  } catch (const levanter::hf::error& e) {
    std::cerr << "train_lm: Hugging Face checkpoint error: " << e.what() << "\n";
    return 5;
  } catch (const levanter::training_error& e) {
    std::cerr << "train_lm: stopped: " << e.what() << "\n";
    return 4;
  } catch (const std::exception& e) {
    std::cerr << "train_lm: error: " << e.what() << "\n";
    return 1;
  }
}
