// Tests of data/jinja.hpp: every case of the golden file (rendered by Jinja2 with the environment transformers uses;
// tests/oracle/gen_chat_template_golden.py) renders to exactly the golden text, or fails where Jinja fails; hostile
// templates end quickly in a template_error; generation spans cover exactly the assistant text.
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <levanter/data/jinja.hpp>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#ifndef HALIAX_GOLDEN_DIR
#define HALIAX_GOLDEN_DIR "tests/golden"
#endif

namespace jinja = levanter::data::jinja;
using nlohmann::ordered_json;

namespace {

const ordered_json& golden() {
  static const ordered_json g = [] {
    const std::string path = std::string(HALIAX_GOLDEN_DIR) + "/chat_templates/render.json";
    std::ifstream in(path);
    REQUIRE_MESSAGE(in.good(), "missing golden file " << path << " (run tests/oracle/gen_chat_template_golden.py)");
    return ordered_json::parse(in);
  }();
  return g;
}

// The clock of the golden file (FIXED_NOW in the generator): 2024-07-26 09:05:03, a Friday.
std::tm fixed_now() {
  std::tm t{};
  t.tm_year = 2024 - 1900;
  t.tm_mon = 6;
  t.tm_mday = 26;
  t.tm_hour = 9;
  t.tm_min = 5;
  t.tm_sec = 3;
  t.tm_wday = 5;
  t.tm_yday = 207;
  return t;
}

struct outcome {
  bool ok = false;
  std::string why;
};

// Renders one golden case and compares it with what Jinja did.
outcome check_case(const std::string& source, const ordered_json& c) {
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  jinja::render_options opt;
  opt.now = fixed_now();
  opt.generation_spans = &spans;
  const bool want_error = c.value("error", false);
  std::string out;
  try {
    out = jinja::compiled_template::parse(source).render(c.at("context"), opt);
  } catch (const jinja::raised_error& e) {
    if (!want_error) return {false, std::string("unexpected raise_exception: ") + e.what()};
    if (c.at("error_type") != "TemplateError") return {false, "raise_exception where Jinja failed otherwise"};
    if (c.at("message").get<std::string>() != e.what())
      return {false,
              "raised '" + std::string(e.what()) + "', Jinja raised '" + c.at("message").get<std::string>() + "'"};
    return {true, ""};
  } catch (const jinja::template_error& e) {
    if (!want_error) return {false, std::string("unexpected error: ") + e.what()};
    if (c.at("error_type") == "TemplateError")
      return {false, std::string("expected raise_exception, got: ") + e.what()};
    return {true, ""};
  }
  if (want_error)
    return {false, "rendered '" + out + "' where Jinja failed with " + c.at("error_type").get<std::string>() + ": " +
                       c.at("message").get<std::string>()};
  if (out != c.at("output").get<std::string>())
    return {false, "got:\n" + out + "\n---- Jinja:\n" + c.at("output").get<std::string>()};
  if (c.contains("byte_spans")) {
    std::vector<std::pair<std::size_t, std::size_t>> want;
    for (const auto& s : c.at("byte_spans")) want.emplace_back(s[0].get<std::size_t>(), s[1].get<std::size_t>());
    if (spans != want) return {false, "generation spans differ"};
  } else if (!spans.empty()) {
    return {false, "unexpected generation spans"};
  }
  return {true, ""};
}

// The bound is "ends, and soon" (a hang or a runaway loop would not), not a benchmark: generous, so a loaded CI
// machine does not fail it; sanitizers slow rendering about fivefold.
#if defined(__SANITIZE_ADDRESS__)
constexpr double quick_seconds = 25.0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr double quick_seconds = 25.0;
#else
constexpr double quick_seconds = 5.0;
#endif
#else
constexpr double quick_seconds = 5.0;
#endif

// Parses and renders `source`, expecting a template_error whose message contains `needle`, within quick_seconds.
void expect_error_fast(const std::string& source, const std::string& needle, const jinja::limits& lim = {}) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string message;
  try {
    (void)jinja::compiled_template::parse(source, lim).render(ordered_json{{"x", 1}, {"l", {1, 2}}});
  } catch (const jinja::template_error& e) {
    message = e.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK_MESSAGE(!message.empty(), "no error for: " << source.substr(0, 80));
  CHECK_MESSAGE(message.find(needle) != std::string::npos, "message '" << message << "' lacks '" << needle << "'");
  CHECK_MESSAGE(seconds < quick_seconds, "took " << seconds << " s: " << source.substr(0, 80));
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

}  // namespace

TEST_CASE("jinja: golden unit cases render as Jinja renders them") {
  int passed = 0, errors = 0;
  for (const auto& c : golden().at("unit")) {
    const auto r = check_case(c.at("template").get<std::string>(), c);
    CHECK_MESSAGE(r.ok, c.at("name").get<std::string>() << " " << c.at("template").dump() << ": " << r.why);
    passed += r.ok;
    errors += c.value("error", false);
  }
  MESSAGE("unit cases: " << passed << "/" << golden().at("unit").size() << " pass (" << errors << " expect errors)");
  CHECK(golden().at("unit").size() >= 60);
}

TEST_CASE("jinja: golden real chat templates render as transformers renders them") {
  int passed = 0, errors = 0;
  for (const auto& c : golden().at("conversations")) {
    const auto& name = c.at("template").get_ref<const std::string&>();
    const auto r = check_case(golden().at("templates").at(name).at("text").get<std::string>(), c);
    CHECK_MESSAGE(r.ok, c.at("name").get<std::string>() << ": " << r.why);
    passed += r.ok;
    errors += c.value("error", false);
  }
  MESSAGE("conversations: " << passed << "/" << golden().at("conversations").size() << " pass (" << errors
                            << " expect errors) over " << golden().at("templates").size() << " templates");
  CHECK(golden().at("conversations").size() >= 40);
}

TEST_CASE("jinja: hostile templates end quickly in a template_error") {
  expect_error_fast("{{ " + repeat("(", 100000) + "1" + repeat(")", 100000) + " }}", "max_depth");
  expect_error_fast("{{ " + repeat("(", 100000) + " }}", "unexpected '}', expected ')'");
  expect_error_fast(repeat("{% if true %}", 50000), "max_depth");
  expect_error_fast(repeat("{% for x in l %}", 50000), "max_depth");
  expect_error_fast("{{ " + repeat("not ", 100000) + "x }}", "max_depth");
  expect_error_fast("{{ " + repeat("-", 100000) + "1 }}", "max_depth");
  expect_error_fast("{{ 1" + repeat(" + 1", 100000) + " }}", "max_depth");
  expect_error_fast("{{ x" + repeat("|trim", 100000) + " }}", "max_depth");
  expect_error_fast("{{ " + repeat("[", 50000) + repeat("]", 50000) + " }}", "max_depth");
  expect_error_fast("{{ " + repeat("{'a': ", 50000) + "1" + repeat("}", 50000) + " }}", "max_depth");
  expect_error_fast("{{ x" + repeat(".a", 100000) + " }}", "max_depth");
  expect_error_fast("{{ x" + repeat("[0]", 100000) + " }}", "max_depth");
  expect_error_fast("{% for i in range(10**9) %}x{% endfor %}", "MAX_RANGE");
  expect_error_fast("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "max_steps");
  expect_error_fast("{{ 'a' * 10**12 }}", "max_output_bytes");
  expect_error_fast("{{ [1] * 10**12 }}", "max_output_bytes");
  expect_error_fast("{{ 'ab' * (2**62) }}", "max_output_bytes");
  expect_error_fast("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", "max_output_bytes");
  expect_error_fast("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                    "max_output_bytes");
  expect_error_fast("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "max_macro_recursion");
  expect_error_fast("{% macro f(n) %}{{ f(n) ~ f(n) }}{% endmacro %}{{ f(0) }}", "max_macro_recursion");
  expect_error_fast("{% macro f() %}{% for i in range(100000) %}{{ f() }}{% endfor %}{% endmacro %}{{ f() }}", "max_");
  expect_error_fast("{{ 9223372036854775807 + 1 }}", "overflow");
  expect_error_fast("{{ 2 ** 64 }}", "overflow");
  expect_error_fast("{{ 99999999999999999999 }}", "64 bits");
  expect_error_fast("line 1\nline 2\n  {{ x | frobnicate }}", "line 3, column 10: unknown filter 'frobnicate'");
  expect_error_fast("{{ x is frobnicated }}", "unknown test 'frobnicated'");
  expect_error_fast("a\n{% frobnicate %}", "line 2, column 4: unknown statement 'frobnicate'");
  expect_error_fast("{% include 'other.jinja' %}", "not supported");
  expect_error_fast("{% extends 'base' %}", "not supported");
  expect_error_fast("{% import 'm' as m %}", "not supported");
  expect_error_fast("{% if x %}never closed", "expected 'elif' or 'else' or 'endif'");
  expect_error_fast("{% for a in l %}never closed", "expected 'else' or 'endfor'");
  expect_error_fast("{% macro m() %}never closed", "expected 'endmacro'");
  expect_error_fast("{{ x ", "not closed");
  expect_error_fast("{% if x ", "not closed");
  expect_error_fast("{# x ", "comment");
  expect_error_fast("{{ 'abc }}", "unterminated string");
  expect_error_fast("{% raw %} never ends", "endraw");
  expect_error_fast("{{ l.append(3) }}", "access to attribute 'append' of 'list' object is unsafe");
  expect_error_fast("{% set d = {} %}{{ d.update({'a': 1}) }}", "unsafe");
  expect_error_fast("{{ x.y.z }}", "has no attribute 'y'");
  expect_error_fast("{{ nothing.attr }}", "'nothing' is undefined");
  expect_error_fast("{{ nothing() }}", "'nothing' is undefined");
  expect_error_fast("{% break %}", "outside loop");
  expect_error_fast(std::string(2 << 20, 'a'), "max_template_bytes");
  jinja::limits small;
  small.max_steps = 1000;
  expect_error_fast("{% for i in range(2000) %}{% endfor %}", "max_steps", small);
  small.max_output_bytes = 100;
  expect_error_fast("{{ 'x' * 101 }}", "max_output_bytes", small);
}

TEST_CASE("jinja: raise_exception carries the template's message") {
  const auto t = jinja::compiled_template::parse("a\n{% if x %}{{ raise_exception('bad role: ' ~ x) }}{% endif %}");
  CHECK(t.render(ordered_json{{"x", false}}) == "a\n");
  try {
    (void)t.render(ordered_json{{"x", "tool"}});
    FAIL("no exception");
  } catch (const jinja::raised_error& e) {
    CHECK(std::string(e.what()) == "bad role: tool");
    CHECK(e.line() == 2);
  }
}

TEST_CASE("jinja: generation spans cover exactly the assistant text") {
  const auto t = jinja::compiled_template::parse(
      "{% for m in messages %}<|{{ m.role }}|>\n"
      "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<|end|>{% endgeneration %}"
      "{% else %}{{ m.content }}<|end|>{% endif %}\n{% endfor %}");
  const ordered_json ctx = {{"messages",
                             {{{"role", "user"}, {"content", "Héllo"}},
                              {{"role", "assistant"}, {"content", "Hi — there"}},
                              {{"role", "user"}, {"content", "again"}},
                              {{"role", "assistant"}, {"content", "ok"}}}}};
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  const std::string out = t.render(ctx, &spans);
  REQUIRE(spans.size() == 2);
  CHECK(out.substr(spans[0].first, spans[0].second - spans[0].first) == "Hi — there<|end|>");
  CHECK(out.substr(spans[1].first, spans[1].second - spans[1].first) == "ok<|end|>");
  // trim_blocks removes the newline after `{% endif %}`, as Jinja does.
  CHECK(out == "<|user|>\nHéllo<|end|><|assistant|>\nHi — there<|end|><|user|>\nagain<|end|><|assistant|>\nok<|end|>");
  // Rendering again clears the spans; a render without spans gives the same text.
  CHECK(t.render(ctx, &spans) == out);
  CHECK(spans.size() == 2);
  CHECK(t.render(ctx) == out);
}
