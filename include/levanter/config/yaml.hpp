// levanter/config/yaml.hpp: schema-driven YAML reading and writing for config structs (the draccus equivalent).
//
// `decode<T>(node)` fills a T from a YAML tree, starting from T's defaults; `encode(x)` turns it back into YAML and
// `to_yaml_string(x)` prints it (decode(encode(x)) == x for every config type). Every error names the dotted key
// path and the `file:line` it came from, and unknown keys suggest the nearest valid one:
//
//   source_map sources;
//   YAML::Node root = load_yaml_file("config/gpt2_nano.yaml", sources);   // resolves `!include`
//   TrainLmConfig cfg = decode<TrainLmConfig>(root, "", sources);          // throws config_error
//   std::cout << to_yaml_string(cfg);
//
// Supported field types: bool, integers, double, std::string, std::optional, std::vector, std::map<std::string, T>,
// std::variant (alternative picked by the node's kind), every value type of config/types.hpp, and any struct with
// a `config::schema`. This header is deliberately free of haliax includes so it compiles quickly.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <levanter/config/types.hpp>

namespace levanter::config {

/// Every configuration problem (bad YAML, unknown key, wrong type, missing file) is thrown as this, with a message
/// that names the key path, the file and line, and what to do.
struct config_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Dotted key path (`trainer.checkpointer.keep[0].every`) -> where it was set (`config/x.yaml:7`, `command line`).
using source_map = std::map<std::string, std::string>;

// ---- type traits and small helpers -----------------------------------------------------------------------------
namespace detail {

template <class T> struct is_optional : std::false_type {};
template <class T> struct is_optional<std::optional<T>> : std::true_type {};
template <class T> struct is_vector : std::false_type {};
template <class T> struct is_vector<std::vector<T>> : std::true_type {};
template <class T> struct is_string_map : std::false_type {};
template <class T> struct is_string_map<std::map<std::string, T>> : std::true_type {};
template <class T> struct is_variant : std::false_type {};
template <class... A> struct is_variant<std::variant<A...>> : std::true_type {};
template <class T> struct is_choice : std::false_type {};
template <class... A> struct is_choice<Choice<A...>> : std::true_type {};
template <class T> struct is_one_or_many : std::false_type {};
template <class T> struct is_one_or_many<OneOrMany<T>> : std::true_type {};

template <class T>
concept has_schema = requires { schema<T>::fields; };

template <class T>
concept integer = std::is_integral_v<T> && !std::is_same_v<T, bool>;

std::string join_key(const std::string& path, std::string_view key);
std::string join_index(const std::string& path, std::size_t i);

/// Levenshtein distance, for "did you mean" hints.
std::size_t edit_distance(std::string_view a, std::string_view b);

/// "; did you mean 'x'?" when a valid key is close, else "; valid keys: a, b, c".
std::string suggestion(std::string_view key, const std::vector<std::string>& valid);

bool is_plain(const YAML::Node& n);

std::string lower(std::string s);

std::optional<bool> parse_bool(const std::string& s);

std::optional<int64_t> parse_int(std::string s);

std::optional<double> parse_double(std::string s);

std::string format_double(double d);

/// A string a YAML reader would take for something else (null, bool, number) must be quoted when written.
bool needs_quotes(const std::string& s);

}  // namespace detail

// ---- type labels (errors and --help) ---------------------------------------------------------------------------
template <class T>
std::string type_label();

namespace detail {
template <class... A>
std::string alternatives_label(const char* sep) {
  std::string out;
  ((out += (out.empty() ? "" : sep) + type_label<A>()), ...);
  return out;
}
template <class... A>
std::string choice_names(const Choice<A...>*) {
  std::string out;
  ((out += (out.empty() ? "" : ",") + std::string(A::type_name)), ...);
  return "{" + out + "}";
}
template <class T>
std::string one_or_many_label(const OneOrMany<T>*) {
  return type_label<T>() + " or a list of them";
}
}  // namespace detail

/// A short human name of a field type: INT, FLOAT, BOOL, STR, DURATION, [STR], {cosine,constant,...}, ...
template <class T>
std::string type_label() {
  if constexpr (std::is_same_v<T, bool>) return "BOOL";
  else if constexpr (detail::integer<T>) return "INT";
  else if constexpr (std::is_floating_point_v<T>) return "FLOAT";
  else if constexpr (std::is_same_v<T, std::string>) return "STR";
  else if constexpr (std::is_same_v<T, Duration>) return "DURATION";
  else if constexpr (std::is_same_v<T, MpPolicy>) return "MP_POLICY";
  else if constexpr (std::is_same_v<T, IntSchedule>) return "INT|[{start,value}]";
  else if constexpr (std::is_same_v<T, StringOrList>) return "STR|[STR]";
  else if constexpr (std::is_same_v<T, NumberOrList>) return "NUMBER|[INT]";
  else if constexpr (std::is_same_v<T, Opaque>) return "YAML";
  else if constexpr (detail::is_optional<T>::value) return type_label<typename T::value_type>();
  else if constexpr (detail::is_vector<T>::value) return "[" + type_label<typename T::value_type>() + "]";
  else if constexpr (detail::is_string_map<T>::value) return "{STR: " + type_label<typename T::mapped_type>() + "}";
  else if constexpr (detail::is_choice<T>::value) return detail::choice_names(static_cast<const T*>(nullptr));
  else if constexpr (detail::is_one_or_many<T>::value) return detail::one_or_many_label(static_cast<const T*>(nullptr));
  else if constexpr (detail::is_variant<T>::value)
    return []<class... A>(std::variant<A...>*) { return detail::alternatives_label<A...>("|"); }(static_cast<T*>(nullptr));
  else if constexpr (detail::has_schema<T>) return "MAP";
  else static_assert(sizeof(T) == 0, "levanter::config::type_label: no YAML mapping for this type");
}

// ---- decoding --------------------------------------------------------------------------------------------------
/// State of one decode: where positions come from, and the problems found so far (all are reported at once).
struct decode_context {
  const source_map* sources = nullptr;
  std::string file = "<yaml>";  // file named for positions not in `sources` (from the node's mark)
  std::vector<std::string> errors;

  /// "file:line" of `path` (from the source map, else the node's own mark), or "" if unknown.
  std::string where(const std::string& path, const YAML::Node& node) const;
  std::string at(const std::string& path, const YAML::Node& node) const;
  void wrong_type(const std::string& path, const YAML::Node& node, const std::string& expected);
  void fail(const std::string& path, const YAML::Node& node, const std::string& what);
};

template <class T>
void decode_into(const YAML::Node& node, T& out, const std::string& path, decode_context& ctx);

namespace detail {
void emit(YAML::Emitter& e, const YAML::Node& n);

std::optional<Duration> parse_duration(std::string s);

std::optional<dtype> parse_dtype(const std::string& s);

std::string dtype_name(dtype d);

/// Why a number read from a config cannot be used ("" when it can): infinity and NaN are refused.
std::string number_problem(double v);

/// Why a duration cannot be used ("" when it can): negative, infinite, or longer than 3650 days.
std::string duration_problem(double seconds);

/// Why a string value cannot be used ("" when it can): text that the resolved config.yaml could not hold
/// (control characters other than tab/newline, invalid UTF-8).
std::string string_problem(const std::string& s);

/// An Opaque sub-tree as one line of flow YAML, and back.
std::string opaque_text(const YAML::Node& node);
YAML::Node load_opaque(const std::string& text);

/// jmp.get_policy: a single dtype sets all three; otherwise p/params, c/compute, o/output with compute defaulting to
/// params and output to compute.
std::optional<MpPolicy> parse_mp_policy(const std::string& s, std::string& why);

/// Can `node` be read as a T without error? (picks the alternative of a std::variant by the node's kind)
template <class T>
bool accepts(const YAML::Node& node) {
  const bool scalar = node.IsScalar();
  if constexpr (std::is_same_v<T, bool>) return scalar && is_plain(node) && parse_bool(node.Scalar()).has_value();
  else if constexpr (integer<T>) return scalar && is_plain(node) && parse_int(node.Scalar()).has_value();
  else if constexpr (std::is_floating_point_v<T>) return scalar && is_plain(node) && parse_double(node.Scalar()).has_value();
  else if constexpr (std::is_same_v<T, std::string>) return scalar;
  else if constexpr (is_vector<T>::value) return node.IsSequence();
  else if constexpr (is_optional<T>::value) return node.IsNull() || accepts<typename T::value_type>(node);
  else if constexpr (has_schema<T> || is_string_map<T>::value) return node.IsMap();
  else return true;
}

template <class Struct>
std::vector<std::string> schema_keys() {
  std::vector<std::string> keys;
  std::apply([&](const auto&... f) { (keys.emplace_back(f.name), ...); }, schema<Struct>::fields);
  return keys;
}

/// Fill the fields of a schema struct from a map node (`skip` is a key handled by the caller, e.g. `type`).
template <class Struct>
void decode_struct(const YAML::Node& node, Struct& out, const std::string& path, decode_context& ctx,
                   std::string_view skip = {}, std::vector<std::string> extra_keys = {}) {
  if (node.IsNull()) return;  // `section:` with nothing under it keeps the defaults
  if (!node.IsMap()) return ctx.wrong_type(path, node, "a map of " + std::string(path.empty() ? "keys" : "settings"));
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string key = it->first.Scalar();
    if (!skip.empty() && key == skip) continue;
    const std::string sub = join_key(path, key);
    bool found = false;
    std::apply([&](const auto&... f) {
      ((!found && f.name == key ? (found = true, decode_into(it->second, out.*(f.member), sub, ctx), 0) : 0), ...);
    }, schema<Struct>::fields);
    if (!found) {
      auto valid = schema_keys<Struct>();
      valid.insert(valid.end(), extra_keys.begin(), extra_keys.end());
      ctx.errors.push_back("unknown key '" + sub + "'" + ctx.at(sub, it->first) + suggestion(key, valid));
    }
  }
}

template <class ChoiceT>
std::string unsupported_hint(std::string_view name) {
  for (const auto& u : unsupported_choices<ChoiceT>::names)
    if (!u.type_name.empty() && u.type_name == name) return std::string(u.hint);
  return {};
}

template <class... A>
void decode_choice(const YAML::Node& node, Choice<A...>& out, const std::string& path, decode_context& ctx) {
  using C = Choice<A...>;
  if (node.IsNull()) return;
  std::string name(out.type_name());
  YAML::Node body;
  bool has_body = false;
  std::string type_path = join_key(path, "type");
  YAML::Node type_node = node;
  if (node.IsScalar()) {
    name = node.Scalar();
    type_path = path;
  } else if (node.IsMap()) {
    body.reset(node);
    has_body = true;
    if (node["type"]) {
      type_node.reset(node["type"]);
      if (!type_node.IsScalar()) return ctx.wrong_type(type_path, type_node, "a type name " + choice_names(&out));
      name = type_node.Scalar();
    }
  } else {
    return ctx.wrong_type(path, node, "a map with 'type:' or a type name " + choice_names(&out));
  }
  if (has_body && !node["type"]) {
    // No `type:`: keep the current class if it has every key given, else take the one class that has them all
    // (upstream's defaults differ from ours: `tracker: {project: x}` means wandb there).
    auto fits = [&]<class Alt>(Alt*) {
      auto keys = schema_keys<Alt>();
      for (auto it = body.begin(); it != body.end(); ++it)
        if (std::find(keys.begin(), keys.end(), it->first.Scalar()) == keys.end()) return false;
      return true;
    };
    bool current_fits = false;
    std::vector<std::string_view> fitting;
    auto check = [&]<class Alt>(Alt* p) {
      if (!fits(p)) return;
      fitting.push_back(Alt::type_name);
      if (std::holds_alternative<Alt>(out.value)) current_fits = true;
    };
    (check(static_cast<A*>(nullptr)), ...);
    if (!current_fits && fitting.size() == 1) name = std::string(fitting.front());
  }
  bool found = false;
  auto try_alt = [&]<class Alt>(Alt*) {
    if (found || Alt::type_name != name) return;
    found = true;
    if (!std::holds_alternative<Alt>(out.value)) out.value = Alt{};
    if (has_body) decode_struct(body, std::get<Alt>(out.value), path, ctx, "type", {"type"});
  };
  (try_alt(static_cast<A*>(nullptr)), ...);
  if (found) return;
  if (std::string hint = unsupported_hint<C>(name); !hint.empty())
    return ctx.fail(type_path, type_node, name + " is not supported yet; " + hint);
  ctx.fail(type_path, type_node, "unknown type '" + name + "'; supported types: " + choice_names(&out));
}

template <class... A>
void decode_variant(const YAML::Node& node, std::variant<A...>& out, const std::string& path, decode_context& ctx) {
  bool done = false;
  auto try_alt = [&]<class Alt>(Alt*) {
    if (done || !accepts<Alt>(node)) return;
    done = true;
    if (!std::holds_alternative<Alt>(out)) out = Alt{};
    decode_into(node, std::get<Alt>(out), path, ctx);
  };
  (try_alt(static_cast<A*>(nullptr)), ...);
  if (!done) ctx.wrong_type(path, node, alternatives_label<A...>(" or "));
}

}  // namespace detail

/// Read `node` into `out` (which holds the defaults); problems are appended to `ctx.errors`.
template <class T>
void decode_into(const YAML::Node& node, T& out, const std::string& path, decode_context& ctx) {
  using namespace detail;
  const std::string& s = node.IsScalar() ? node.Scalar() : std::string();
  if constexpr (is_optional<T>::value) {
    if (node.IsNull()) {
      out.reset();
    } else {
      if (!out) out.emplace();
      decode_into(node, *out, path, ctx);
    }
  } else if constexpr (std::is_same_v<T, Opaque>) {
    if (node.IsNull()) {
      out = Opaque{};
    } else {
      out.set = true;
      out.yaml = opaque_text(node);
      out.where = ctx.where(path, node);
    }
  } else if constexpr (std::is_same_v<T, bool>) {
    auto v = node.IsScalar() ? parse_bool(s) : std::nullopt;
    if (v) out = *v;
    else ctx.wrong_type(path, node, "a boolean (true or false)");
  } else if constexpr (integer<T>) {
    auto v = node.IsScalar() ? parse_int(s) : std::nullopt;
    if (v && (*v < int64_t(std::numeric_limits<T>::min()) || *v > int64_t(std::numeric_limits<T>::max()))) {
      ctx.fail(path, node, "integer " + s + " is out of range");
    } else if (v) {
      out = T(*v);
    } else {
      ctx.wrong_type(path, node, "an integer");
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    auto v = node.IsScalar() ? parse_double(s) : std::nullopt;
    if (v && !number_problem(*v).empty()) ctx.fail(path, node, number_problem(*v));
    else if (v) out = T(*v);
    else ctx.wrong_type(path, node, "a number");
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (node.IsScalar() && !string_problem(s).empty()) ctx.fail(path, node, string_problem(s));
    else if (node.IsScalar()) out = s;
    else ctx.wrong_type(path, node, "a string");
  } else if constexpr (std::is_same_v<T, Duration>) {
    auto v = node.IsScalar() ? parse_duration(s) : std::nullopt;
    if (v && !duration_problem(v->seconds).empty()) ctx.fail(path, node, duration_problem(v->seconds));
    else if (v) out = *v;
    else ctx.wrong_type(path, node, "a duration (e.g. 30s, 5m, 15min, 1h, 2d, or seconds)");
  } else if constexpr (std::is_same_v<T, MpPolicy>) {
    std::string why;
    auto v = node.IsScalar() ? parse_mp_policy(s, why) : std::nullopt;
    if (v) out = *v;
    else ctx.wrong_type(path, node, "a precision policy (f32, bfloat16, or p=f32,c=bfloat16[,o=f32])" +
                                        (why.empty() ? std::string() : "; " + why));
  } else if constexpr (std::is_same_v<T, IntSchedule>) {
    if (node.IsScalar()) {
      auto v = parse_int(s);
      if (v) out = IntSchedule(*v);
      else ctx.wrong_type(path, node, "an integer or a list of {start, value}");
    } else if (node.IsSequence() && node.size() > 0) {
      IntSchedule sched;
      sched.steps.clear();
      for (std::size_t i = 0; i < node.size(); ++i) {
        ScheduleStep st;
        decode_into(node[i], st, join_index(path, i), ctx);
        sched.steps.push_back(st);
      }
      out = sched;
    } else {
      ctx.wrong_type(path, node, "an integer or a non-empty list of {start, value}");
    }
  } else if constexpr (std::is_same_v<T, StringOrList>) {
    if (node.IsScalar()) {
      out = StringOrList(s);
    } else if (node.IsSequence()) {
      StringOrList v;
      v.is_list = true;
      decode_into(node, v.items, path, ctx);
      out = v;
    } else {
      ctx.wrong_type(path, node, "a string or a list of strings");
    }
  } else if constexpr (std::is_same_v<T, NumberOrList>) {
    if (node.IsScalar()) {
      auto v = parse_double(s);
      if (v && !number_problem(*v).empty()) ctx.fail(path, node, number_problem(*v));
      else if (v) out = NumberOrList{*v, {}};
      else ctx.wrong_type(path, node, "a number or a list of integers");
    } else if (node.IsSequence()) {
      NumberOrList v;
      decode_into(node, v.list, path, ctx);
      out = v;
    } else {
      ctx.wrong_type(path, node, "a number or a list of integers");
    }
  } else if constexpr (is_vector<T>::value) {
    if (node.IsNull()) {
      out.clear();
    } else if (node.IsSequence()) {
      T v(node.size());
      for (std::size_t i = 0; i < node.size(); ++i) decode_into(node[i], v[i], join_index(path, i), ctx);
      out = std::move(v);
    } else {
      ctx.wrong_type(path, node, "a list " + type_label<T>());
    }
  } else if constexpr (is_string_map<T>::value) {
    if (node.IsNull()) {
      out.clear();
    } else if (node.IsMap()) {
      T v;
      for (auto it = node.begin(); it != node.end(); ++it) {
        std::string k = it->first.Scalar();
        decode_into(it->second, v[k], join_key(path, k), ctx);
      }
      out = std::move(v);
    } else {
      ctx.wrong_type(path, node, "a map " + type_label<T>());
    }
  } else if constexpr (is_choice<T>::value) {
    decode_choice(node, out, path, ctx);
  } else if constexpr (is_one_or_many<T>::value) {
    if (node.IsNull()) return;
    if (node.IsSequence()) {
      T v;
      v.is_list = true;
      v.items.assign(node.size(), {});
      for (std::size_t i = 0; i < node.size(); ++i) decode_into(node[i], v.items[i], join_index(path, i), ctx);
      out = std::move(v);
    } else {
      T v;
      v.is_list = false;
      decode_into(node, v.items.front(), path, ctx);
      out = std::move(v);
    }
  } else if constexpr (is_variant<T>::value) {
    decode_variant(node, out, path, ctx);
  } else if constexpr (has_schema<T>) {
    decode_struct(node, out, path, ctx);
  } else {
    static_assert(sizeof(T) == 0, "levanter::config::decode: no YAML mapping for this type (add a config::schema)");
  }
}

/// Decode a T (starting from its defaults) from `node`; `path` prefixes the key paths in messages and `sources`
/// says where each key was set. Throws config_error listing every problem found.
template <class T>
T decode(const YAML::Node& node, const std::string& path = "", const source_map& sources = {},
         const std::string& file = "<yaml>") {
  decode_context ctx;
  ctx.sources = &sources;
  ctx.file = file;
  T out{};
  decode_into(node, out, path, ctx);
  if (!ctx.errors.empty()) {
    std::string msg;
    for (const auto& e : ctx.errors) msg += (msg.empty() ? "" : "\n") + e;
    throw config_error(msg);
  }
  return out;
}

template <>
struct schema<ScheduleStep> {
  using T = ScheduleStep;
  static constexpr auto fields = std::make_tuple(field("start", &T::start, "first step of the segment"),
                                                 field("value", &T::value, "value from that step on"));
};

// ---- encoding --------------------------------------------------------------------------------------------------
namespace detail {
/// A string node that must read back as a string (quoted when written if it looks like a number, bool or null).
YAML::Node string_node(const std::string& s);
YAML::Node plain_node(const std::string& s);

std::string format_duration(double secs);
}  // namespace detail

/// The YAML form of `x` (maps list every field, defaults included; choices carry `type:` first).
template <class T>
YAML::Node encode(const T& x) {
  using namespace detail;
  if constexpr (is_optional<T>::value) {
    return x ? encode(*x) : YAML::Node(YAML::NodeType::Null);
  } else if constexpr (std::is_same_v<T, Opaque>) {
    return x.set ? load_opaque(x.yaml) : YAML::Node(YAML::NodeType::Null);
  } else if constexpr (std::is_same_v<T, bool>) {
    return plain_node(x ? "true" : "false");
  } else if constexpr (integer<T>) {
    return plain_node(std::to_string(x));
  } else if constexpr (std::is_floating_point_v<T>) {
    return plain_node(format_double(double(x)));
  } else if constexpr (std::is_same_v<T, std::string>) {
    return string_node(x);
  } else if constexpr (std::is_same_v<T, Duration>) {
    return plain_node(format_duration(x.seconds));
  } else if constexpr (std::is_same_v<T, MpPolicy>) {
    if (x.param == x.compute && x.compute == x.output) return plain_node(dtype_name(x.param));
    return plain_node("p=" + dtype_name(x.param) + ",c=" + dtype_name(x.compute) + ",o=" + dtype_name(x.output));
  } else if constexpr (std::is_same_v<T, IntSchedule>) {
    if (x.is_constant() && x.steps.front().start == 0) return plain_node(std::to_string(x.steps.front().value));
    return encode(x.steps);
  } else if constexpr (std::is_same_v<T, StringOrList>) {
    if (!x.is_list && x.items.size() == 1) return string_node(x.items.front());
    return encode(x.items);
  } else if constexpr (std::is_same_v<T, NumberOrList>) {
    return x.number ? encode(*x.number) : encode(x.list);
  } else if constexpr (is_vector<T>::value) {
    YAML::Node n(YAML::NodeType::Sequence);
    for (const auto& e : x) n.push_back(encode(e));
    return n;
  } else if constexpr (is_string_map<T>::value) {
    YAML::Node n(YAML::NodeType::Map);
    for (const auto& [k, v] : x) n[k] = encode(v);
    return n;
  } else if constexpr (is_choice<T>::value) {
    return std::visit([](const auto& alt) {
      YAML::Node n(YAML::NodeType::Map);
      n["type"] = plain_node(std::string(std::decay_t<decltype(alt)>::type_name));
      YAML::Node body = encode(alt);
      for (auto it = body.begin(); it != body.end(); ++it) n[it->first.Scalar()] = it->second;
      return n;
    }, x.value);
  } else if constexpr (is_one_or_many<T>::value) {
    if (!x.is_list && x.items.size() == 1) return encode(x.items.front());
    return encode(x.items);
  } else if constexpr (is_variant<T>::value) {
    return std::visit([](const auto& alt) { return encode(alt); }, x);
  } else if constexpr (has_schema<T>) {
    YAML::Node n(YAML::NodeType::Map);
    std::apply([&](const auto&... f) { ((n[std::string(f.name)] = encode(x.*(f.member))), ...); }, schema<T>::fields);
    return n;
  } else {
    static_assert(sizeof(T) == 0, "levanter::config::encode: no YAML mapping for this type (add a config::schema)");
  }
}

/// Write a YAML tree as block YAML (strings that would read back as something else are quoted).
std::string to_yaml_string(const YAML::Node& n);

/// Write a YAML tree on one line, in flow style (`{type: adam, learning_rate: 0.001}`).
std::string to_flow_string(const YAML::Node& n);

/// The resolved config as YAML (written to the run directory and printed by --dry_run).
template <class T>
  requires(!std::is_same_v<T, YAML::Node>)
std::string to_yaml_string(const T& x) {
  return to_yaml_string(encode(x));
}

// ---- loading files with !include --------------------------------------------------------------------------------

/// Load a YAML file, replacing every `!include other.yaml` node by that file's content (paths relative to the
/// including file), and record where every key came from in `sources` (keys under `prefix`).
YAML::Node load_yaml_file(const std::string& file, source_map& sources, const std::string& prefix = "");

/// Same for YAML text (an embedded default); `name` is used in positions, includes are relative to the cwd.
YAML::Node load_yaml_string(const std::string& text, const std::string& name, source_map& sources);

}  // namespace levanter::config
