// fuzz-sources: src/data/jinja.cpp
// fuzz-flags: -max_len=8192 -dict=tests/fuzz/jinja.dict
// libFuzzer target for levanter::data::jinja (the chat-template engine): an input is a template; it is parsed and,
// when it parses, rendered with a small fixed chat context under small limits. A template the engine refuses must
// throw template_error (raised_error included); nothing may crash, hang, overflow the stack or grow without bound.
#include <cstdint>
#include <levanter/data/jinja.hpp>
#include <string_view>

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Héllo <b> \"q\" 😀"},
      {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHi", "tool_calls": [
        {"id": "call12345", "type": "function", "function": {"name": "f", "arguments": {"x": 1.5, "y": [1, null]}}}]},
      {"role": "tool", "content": "{\"r\": 2}"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "documents": null, "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
    "enable_thinking": false, "n": 3, "f": -0.25, "big": 9223372036854775807
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  levanter::data::jinja::limits lim;
  lim.max_steps = 200'000;
  lim.max_output_bytes = 1 << 20;
  lim.max_depth = 64;
  lim.max_macro_recursion = 16;
  try {
    const auto t = levanter::data::jinja::compiled_template::parse(source, lim);
    std::vector<std::pair<std::size_t, std::size_t>> spans;
    levanter::data::jinja::render_options opt;
    opt.now = std::tm{};
    opt.generation_spans = &spans;
    const std::string out = t.render(context(), opt);
    for (const auto& [b, e] : spans)
      if (b > e || e > out.size()) __builtin_trap();
  } catch (const levanter::data::jinja::template_error&) {
  }
  return 0;
}
