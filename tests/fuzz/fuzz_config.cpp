// fuzz-sources: src/config/yaml.cpp src/config/cli.cpp src/config/validate.cpp src/trainer/config.cpp src/optim/config.cpp src/data/config.cpp src/models/*_config.cpp src/models/llama_spec.cpp src/compat/hf_json.cpp src/io/json_limits.cpp
// fuzz-libs: -lyaml-cpp
//
// libFuzzer target for the train_lm config reader (not built by CMake). Each input is read as a config file is:
// parsed with every limit of config/limits.hpp, `!include` refused (the input may not read other files; config
// files on disk resolve includes relative to themselves), decoded into TrainLmConfig and validated by each
// section's validate() (validate_train_lm adds only top-level checks, and lives with the program). Nothing runs.
//
// Beyond "no crash, no hang, bounded memory", a config that decodes must round-trip: its resolved YAML (what
// train_lm writes as config.yaml) re-loads, decodes, and prints the same text; otherwise the harness aborts.
//
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude \
//     -isystem /usr/include/trilinos -isystem /usr/include/hdf5/serial -DBOOST_ALL_NO_LIB \
//     tests/fuzz/fuzz_config.cpp <fuzz-sources> -lyaml-cpp -o /tmp/fuzz_cfg
//   /tmp/fuzz_cfg -max_total_time=120 -max_len=4096 -timeout=10 -rss_limit_mb=1024 -malloc_limit_mb=256 \
//     /tmp/cfgcorpus tests/fuzz/config-seeds
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <variant>

#include <levanter/config/limits.hpp>
#include <levanter/config/validate.hpp>
#include <levanter/config/yaml.hpp>
#include <levanter/main/train_lm_config.hpp>

// train_lm_config.hpp declares these extern (they are compiled with the program); the harness compiles its own.
namespace levanter::config {
template levanter::TrainLmConfig decode<levanter::TrainLmConfig>(const YAML::Node&, const std::string&,
                                                                 const source_map&, const std::string&);
template YAML::Node encode<levanter::TrainLmConfig>(const levanter::TrainLmConfig&);
template std::string to_yaml_string<levanter::TrainLmConfig>(const levanter::TrainLmConfig&);
}  // namespace levanter::config

namespace {

using namespace levanter;
using config::config_error;

/// As read_command_line and parse_command_line do for one config file; throws config_error.
TrainLmConfig read_config(const std::string& text, const std::string& name, config::source_map& sources) {
  YAML::Node root = config::load_yaml_text(text, name, sources, config::include_policy::refuse);
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) throw config_error(name + ": the top level of a config must be a map of keys");
  return config::decode<TrainLmConfig>(root, "", sources, name);
}

[[noreturn]] void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_config: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  config::source_map sources;
  TrainLmConfig cfg;
  try {
    cfg = read_config(text, "fuzz.yaml", sources);
  } catch (const config_error&) {
    return 0;
  }
  config::validator v{sources, {}};
  validate(v, cfg.data);
  validate(v, cfg.trainer);
  std::visit([&](const auto& m) { validate(v, m); }, cfg.model.value);
  std::visit([&](const auto& o) { validate(v, o); }, cfg.optimizer.value);

  const std::string resolved = config::to_yaml_string(cfg);
  config::source_map again_sources;
  std::string again;
  try {
    again = config::to_yaml_string(read_config(resolved, "resolved.yaml", again_sources));
  } catch (const config_error& e) {
    fail("the resolved config does not load again", std::string(e.what()) + "\n--- resolved:\n" + resolved);
  }
  if (again != resolved) fail("the resolved config loads to a different config", resolved + "\n--- again:\n" + again);
  return 0;
}
