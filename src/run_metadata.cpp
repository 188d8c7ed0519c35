// levanter/run_metadata.hpp.
#include <levanter/run_metadata.hpp>

#include <H5public.h>
#include <Kokkos_Macros.hpp>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <boost/version.hpp>
#include <chrono>
#include <cstdlib>
#include <ctime>

#include <haliax/core.hpp>

#if defined(HALIAX_HAVE_HOST_BLAS)
extern "C" char* openblas_get_corename();
extern "C" char* openblas_get_config();
extern "C" int openblas_get_num_threads();
#else
// A device build made without a host BLAS (docs/portability.md): nothing to report.
namespace {
const char* openblas_get_corename() { return "none (no host BLAS in this build)"; }
const char* openblas_get_config() { return "none"; }
int openblas_get_num_threads() { return 0; }
}  // namespace
#endif

namespace levanter {

std::string compiler_string() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("gcc ") + __VERSION__;
#else
  return "unknown";
#endif
}

nlohmann::ordered_json run_metadata(int ranks) {
  const auto& b = program_build_info();
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = 0;
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char when[32] = {0};
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const char* core = openblas_get_corename();
  const char* blas_cfg = openblas_get_config();
  const char* env_core = std::getenv("OPENBLAS_CORETYPE");
  const auto kv = KOKKOS_VERSION;
  nlohmann::ordered_json libs = {
      {"kokkos", std::to_string(kv / 10000) + "." + std::to_string(kv / 100 % 100) + "." + std::to_string(kv % 100)},
      {"openblas", blas_cfg ? blas_cfg : "unknown"},
      {"hdf5", std::to_string(H5_VERS_MAJOR) + "." + std::to_string(H5_VERS_MINOR) + "." + std::to_string(H5_VERS_RELEASE)},
      {"boost", BOOST_LIB_VERSION},
      {"nlohmann_json", std::to_string(NLOHMANN_JSON_VERSION_MAJOR) + "." + std::to_string(NLOHMANN_JSON_VERSION_MINOR) +
                            "." + std::to_string(NLOHMANN_JSON_VERSION_PATCH)},
      {"zlib", ZLIB_VERSION},
      {"zstd", ZSTD_VERSION_STRING},
  };
  return {
      {"program", b.program},
      {"git_sha", b.git_sha},
      {"git_dirty", b.git_dirty},
      {"build_type", b.build_type},
      {"compiler", compiler_string()},
      {"cxx_standard", static_cast<long>(__cplusplus)},
      {"libraries", libs},
      {"openblas_core", core ? core : "unknown"},
      {"openblas_coretype_env", env_core ? env_core : ""},
      {"openblas_threads", openblas_get_num_threads()},
      {"threads", haliax::num_threads()},
      {"ranks", ranks},
      {"host", std::string(host)},
      {"pid", static_cast<long>(::getpid())},
      {"start_time", std::string(when)},
  };
}

}  // namespace levanter
