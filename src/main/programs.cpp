// levanter/main/programs.hpp.
#include <levanter/main/programs.hpp>

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>
#include <utility>

#include <levanter/checkpoint/checkpointer.hpp>
#include <levanter/compat/hf.hpp>
#include <levanter/config/yaml.hpp>
#include <levanter/data/error.hpp>
#include <levanter/distributed/comm.hpp>
#include <levanter/io/atomic_file.hpp>
#include <levanter/trainer/run.hpp>
#include <levanter/viz/logprobs_html.hpp>

namespace levanter {

namespace {
bool cpu_has_avx512() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}
}  // namespace

void maybe_relaunch_for_openblas(char** argv, std::string_view program) {
  if (std::getenv("LEVANTER_KEEP_OPENBLAS_CORE") || std::getenv("LEVANTER_RELAUNCHED")) return;
  // Under mpirun the launcher owns the process: set OPENBLAS_CORETYPE in mpirun's environment (-x) instead.
  if (distributed::launched_by_mpi()) return;
  const std::string core = openblas_core();
  if (!cpu_has_avx512() || (core != "Haswell" && core != "Zen" && core != "Sandybridge")) return;
  ::setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  ::setenv("LEVANTER_RELAUNCHED", "1", 1);
  std::cerr << program << ": the CPU has AVX-512 but OpenBLAS runs its " << core
            << " kernels; re-launching with OPENBLAS_CORETYPE=SkylakeX (LEVANTER_KEEP_OPENBLAS_CORE=1 keeps " << core
            << ")" << std::endl;
  ::execv("/proc/self/exe", argv);
  std::cerr << program << ": re-launch failed (" << std::strerror(errno) << "); continuing with " << core << std::endl;
}

namespace {
// The message and exit code for the exception being handled.
std::pair<std::string, int> describe_failure(const std::string& p) {
  try {
    throw;
  } catch (const config::config_error& e) {
    return {p + ": config error: " + e.what(), 2};
  } catch (const data::data_error& e) {
    return {p + ": data error: " + e.what(), 3};
  } catch (const training_error& e) {
    return {p + ": stopped: " + e.what(), 4};
  } catch (const checkpoint::error& e) {
    return {p + ": checkpoint error: " + e.what(), 5};
  } catch (const hf::error& e) {
    return {p + ": Hugging Face checkpoint error: " + e.what(), 5};
  } catch (const safetensors::format_error& e) {
    return {p + ": safetensors error: " + e.what(), 5};
  } catch (const io::io_error& e) {
    return {p + ": cannot write: " + e.what(), 5};
  } catch (const std::filesystem::filesystem_error& e) {
    return {p + ": file system error: " + e.what(), 5};
  } catch (const viz::viz_error& e) {
    return {p + ": " + e.what(), 1};
  } catch (const distributed::comm_error& e) {
    return {p + ": distributed error: " + e.what(), 6};
  } catch (const std::exception& e) {
    return {p + ": error: " + e.what(), 1};
  }
}
}  // namespace

int run_program(std::string_view program, const std::function<int()>& body) {
  const std::string p(program);
  // A file-size limit (ulimit -f) makes a write fail with EFBIG, which is reported like a full disk, instead of
  // killing the process with SIGXFSZ half-way through a file.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    return body();
  } catch (...) {
    auto [message, code] = describe_failure(p);
    auto& w = distributed::world();
    // One rank failing ends the job: the others would otherwise wait forever in their next collective.
    if (w.size() > 1)
      w.abort_job(message + " [rank " + std::to_string(w.rank()) + " of " + std::to_string(w.size()) +
                      "; ending the job]",
                  code);
    std::cerr << message << "\n";
    return code;
  }
}

}  // namespace levanter
