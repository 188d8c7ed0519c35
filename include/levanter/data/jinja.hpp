// levanter/data/jinja.hpp: a Jinja2 engine for the subset Hugging Face chat templates use, so that
// `tokenizer.chat_template` renders byte for byte as `transformers`' `apply_chat_template` renders it.
//
// The environment is the one `transformers` builds (`_compile_jinja_template`): an immutable sandbox with
// `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `tojson` filter that is Python's
// `json.dumps(x, ensure_ascii=False, indent=, separators=, sort_keys=)`, the globals `raise_exception(message)` and
// `strftime_now(format)`, and the `{% generation %}` block (its body renders as is; render() can report where).
//
// The subset:
// * text, `{{ expr }}`, `{% stmt %}`, `{# comment #}`, `{%- -%}` / `{{- -}}` / `{%+` whitespace control, `raw`;
// * statements `if/elif/else`, `for x in xs [if cond]` (tuple targets, `else`, `loop.*`, `break`, `continue`),
//   `set` (names, tuples, `ns.attr`, block form with filters), `macro` (defaults, keywords, recursion), `filter`
//   blocks and `generation`;
// * expressions: literals (strings with Python escapes, ints in any base, floats, booleans, none, lists, tuples,
//   dicts), `a.b`, `a[i]`, slices, `+ - * / // % ** ~`, comparisons (chained), `in`, `not in`, `and or not`,
//   `x if c else y`, `is [not] test`, filters and calls;
// * filters abs, capitalize, center, count, default/d, dictsort, escape/e, first, float, indent, int, items, join,
//   last, length, list, lower, map, reject, rejectattr, replace, reverse, safe, select, selectattr, sort, string,
//   sum, title, tojson, trim, unique, upper, wordcount; the Jinja tests (defined, none, string, number, mapping,
//   iterable, sequence, boolean, integer, float, equalto/eq/==, ne, gt, ge, lt, le, in, odd, even, divisibleby,
//   sameas, lower, upper, callable, true, false, undefined);
// * Python str methods (strip/lstrip/rstrip, split/rsplit/splitlines, startswith/endswith, upper/lower/title/
//   capitalize, replace, find/rfind/count, join, isdigit/isalpha/isalnum/isspace/islower/isupper), dict
//   items/keys/values/get, list index/count; mutating methods (`append`, `update`, `pop`, ...) are refused as the
//   sandbox refuses them; globals range (at most 100,000 items, like the sandbox), namespace, dict,
//   raise_exception, strftime_now.
// Values follow Python: truthiness, int/float arithmetic, `str()`/`repr()` of floats, lists and dicts, dict order as
// given, Jinja's `Undefined` (prints empty, is falsy, fails when used further).
//
// Limits (not Python's): integers are 64-bit (overflow is an error); case mapping covers ASCII, Latin-1, Latin
// Extended-A, Greek and Cyrillic; `extends`/`include`/`import`/`call`/`with` and filters or tests not listed above
// are refused at parse time. Hostile templates end in a template_error: see `limits`.
//
// Example:
//   auto t = levanter::data::jinja::compiled_template::parse(tokenizer_config["chat_template"].get<std::string>());
//   std::string prompt = t.render({{"messages", messages}, {"add_generation_prompt", true}, {"bos_token", "<s>"}});
#pragma once

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace levanter::data::jinja {

/// Bounds that make any template, however hostile, end quickly with a template_error instead of a crash, a hang or
/// unbounded memory.
struct limits {
  /// Largest template source accepted by parse().
  std::size_t max_template_bytes = 1 << 20;
  /// Deepest nesting of statements and expressions (the syntax tree's depth, so also the length of an operator
  /// chain such as `a + b + c`), checked at parse time. Rendering is bounded as well: at most 1,500 nested
  /// evaluations in all (macro recursion included), so that no template can exhaust the stack.
  int max_depth = 128;
  /// Largest rendered output and largest string built while rendering, in bytes; a list holds at most
  /// max_output_bytes / 64 items.
  std::size_t max_output_bytes = 64 << 20;
  /// Work allowed in one render: one step per loop iteration, call, element compared or copied, and per 16 bytes of
  /// string built.
  std::int64_t max_steps = 10'000'000;
  /// Deepest chain of macro calls.
  int max_macro_recursion = 64;
};

/// A template that cannot be parsed or rendered. The message names the template line and column and what is
/// wrong, e.g. "chat template line 3, column 12: unknown filter 'frobnicate'".
class template_error : public std::runtime_error {
 public:
  template_error(const std::string& message, int line, int column)
      : std::runtime_error(message), line_(line), column_(column) {}
  /// 1-based line of the offending construct (0 when not known).
  int line() const { return line_; }
  /// 1-based column (in bytes) of the offending construct (0 when not known).
  int column() const { return column_; }

 private:
  int line_, column_;
};

/// `raise_exception(message)` called by the template: what() is exactly the template's message (as
/// `jinja2.exceptions.TemplateError(message)` upstream); line() says where it was raised.
class raised_error : public template_error {
 public:
  using template_error::template_error;
};

/// Options of one render.
struct render_options {
  /// The local time `strftime_now` formats; unset: the current local time (upstream: `datetime.now()`).
  std::optional<std::tm> now;
  /// When set, receives the [begin, end) byte ranges of the output that `{% generation %}` blocks produced (blocks
  /// rendered directly into the output; a block inside a macro or a `set` block is not reported), in output order.
  std::vector<std::pair<std::size_t, std::size_t>>* generation_spans = nullptr;
};

namespace detail {
struct program;
}  // namespace detail

/// A parsed template: parse once, render many times (render is const and safe to call from several threads).
class compiled_template {
 public:
  /// Parses `source`; throws template_error naming the line for a syntax error, an unknown statement, filter or
  /// test, or a limit exceeded.
  static compiled_template parse(std::string_view source, const limits& lim = {});

  /// Renders with `context` (a JSON object whose keys become the template's variables, e.g. `messages`,
  /// `add_generation_prompt`, `bos_token`, `tools`). Throws raised_error for `raise_exception`, template_error
  /// for anything else that fails (undefined attribute of undefined, type errors, limits).
  std::string render(const nlohmann::ordered_json& context) const;

  /// As render(context), also reporting the byte ranges of `{% generation %}` blocks (cleared first).
  std::string render(const nlohmann::ordered_json& context,
                     std::vector<std::pair<std::size_t, std::size_t>>* generation_spans) const;

  /// As render(context) with explicit options (a fixed clock for `strftime_now`, generation spans).
  std::string render(const nlohmann::ordered_json& context, const render_options& options) const;

 private:
  explicit compiled_template(std::shared_ptr<const detail::program> p) : program_(std::move(p)) {}
  std::shared_ptr<const detail::program> program_;
};

}  // namespace levanter::data::jinja
