// fuzz-sources: src/compat/hf_json.cpp src/models/*_config.cpp src/models/llama_spec.cpp src/config/validate.cpp src/config/yaml.cpp src/config/cli.cpp src/io/json_limits.cpp
// fuzz-libs: -lyaml-cpp
// fuzz-flags: -max_len=4096 -dict=tests/fuzz/hf_config.dict
//
// libFuzzer target for a Hugging Face config.json, read as import_hf_to_lm, eval_lm --hf_checkpoint and
// train_lm --initialize_from_hf read it (no tensors): hf::parse_config_json (what open_dir checks), then the
// model_type's from_hf_config (gpt2, or a listed config type of the Llama family) and the checks train_lm
// makes of a model section (check_model_config). Built and run by scripts/fuzz.sh hf_config SECONDS; its seeds are
// the config.json files transformers wrote for tests/golden.
//
// The contract checked, beyond "no crash, no hang, bounded memory":
//  - every refusal is an hf::error whose message names the file (hf::detail::value_error, which callers complete
//    with the file's name, names the key); nothing else is thrown;
//  - a config that is accepted exports (to_hf_config does not refuse what from_hf_config made), and its export
//    reads back to the same config (the same config.json again) and passes the same checks: import -> export keeps
//    what it read, and never writes a directory that the next program refuses.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include <levanter/compat/hf_json.hpp>
#include <levanter/models/hf_config_json.hpp>
#include <levanter/models/registry.hpp>

namespace {

using namespace levanter;
using json = nlohmann::json;

const std::string file = "fuzz/config.json";

[[noreturn]] void violated(const std::string& what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_hf_config: %s: %s\n", what.c_str(), detail.c_str());
  std::abort();
}

/// A refusal must name the file (value_error names only the key: its callers add the file).
void check_refusal(const hf::error& e, bool names_file) {
  const std::string m = e.what();
  if (m.empty()) violated("empty message", "");
  if (names_file && m.find(file) == std::string::npos) violated("a refusal does not name the file", m);
}

/// from_hf_config, the model checks, and the export round trip, for one config type.
template <class C, class From, class To>
void convert(const C& base, const json& j, std::int64_t vocab, From from, To to,
             const std::vector<std::pair<std::string, std::string>>& keys) {
  C c;
  try {
    c = from(base, j, file);
    hf::check_model_config(c, file, keys);
  } catch (const hf::detail::value_error& e) {
    check_refusal(e, false);
    return;
  } catch (const hf::error& e) {
    check_refusal(e, true);
    return;
  }
  // Accepted: it must export, read back as itself and pass the checks again.
  json out;
  try {
    out = to(c, vocab);
  } catch (const hf::error& e) {
    violated("an accepted config.json does not export", e.what());
  }
  C again;
  try {
    again = from(base, out, file);
    hf::check_model_config(again, file, keys);
  } catch (const hf::error& e) {
    violated("the export of an accepted config.json is refused", std::string(e.what()) + "\n" + out.dump());
  }
  const json out2 = to(again, vocab);
  if (out2 != out) violated("export -> import -> export changed config.json", out.dump() + "\n" + out2.dump());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  hf::config_json cj;
  try {
    cj = hf::parse_config_json(text, file, "hf_checkpoint");
  } catch (const hf::error& e) {
    check_refusal(e, true);
    return 0;
  }
  const auto& t = cj.model_type;
  const auto llama = [&](const LlamaConfig& base) {
    convert(base, cj.config, cj.vocab_size, hf::llama_from_hf_config, hf::llama_to_hf_config, hf::llama_hf_keys());
  };
  if (t == "gpt2") {
    convert(Gpt2Config{}, cj.config, cj.vocab_size, hf::gpt2_from_hf_config, hf::gpt2_to_hf_config,
            hf::gpt2_hf_keys());
    return 0;
  }
  // every config type of the Llama family in the model list reading this model_type (llama, mistral, qwen2, qwen3,
  // gemma, gemma2, gemma3_text, olmo2, mixtral)
  for_each_model_config([&]<class T>(std::type_identity<T>) {
    if constexpr (std::is_base_of_v<LlamaConfig, T>)
      if (T::hf_model_type == t) llama(T{});
  });
  return 0;
}
