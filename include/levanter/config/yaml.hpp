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

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
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

inline std::string join_key(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}
inline std::string join_index(const std::string& path, std::size_t i) { return path + "[" + std::to_string(i) + "]"; }

/// Levenshtein distance, for "did you mean" hints.
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

/// "; did you mean 'x'?" when a valid key is close, else "; valid keys: a, b, c".
inline std::string suggestion(std::string_view key, const std::vector<std::string>& valid) {
  if (valid.empty()) return "; this section takes no keys";
  std::string best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (const auto& v : valid) {
    std::size_t d = edit_distance(key, v);
    if (d < best_d) best_d = d, best = v;
  }
  if (best_d <= std::max<std::size_t>(2, key.size() / 2)) return "; did you mean '" + best + "'?";
  std::string out = "; valid keys: ";
  for (std::size_t i = 0; i < valid.size(); ++i) out += (i ? ", " : "") + valid[i];
  return out;
}

inline bool is_plain(const YAML::Node& n) { return n.Tag() != "!"; }

inline std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

inline std::optional<bool> parse_bool(const std::string& s) {
  static const char* t[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
  static const char* f[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
  for (auto* x : t)
    if (s == x) return true;
  for (auto* x : f)
    if (s == x) return false;
  return std::nullopt;
}

inline std::optional<int64_t> parse_int(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (s.empty()) return std::nullopt;
  const char* b = s.data();
  const char* e = s.data() + s.size();
  if (*b == '+') ++b;
  int base = 10;
  bool neg = false;
  if (b < e && *b == '-') neg = true, ++b;
  if (e - b > 2 && b[0] == '0' && (b[1] == 'x' || b[1] == 'X')) base = 16, b += 2;
  uint64_t v = 0;
  auto r = std::from_chars(b, e, v, base);
  if (r.ec != std::errc() || r.ptr != e || b == e) {
    // 1e3, 1000.0: integral values written as floats are accepted.
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (end != s.c_str() + s.size() || !std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.2e18)
      return std::nullopt;
    return int64_t(d);
  }
  if (v > uint64_t(std::numeric_limits<int64_t>::max()) + (neg ? 1 : 0)) return std::nullopt;
  return neg ? int64_t(0 - v) : int64_t(v);
}

inline std::optional<double> parse_double(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  std::string l = lower(s);
  if (l == ".inf" || l == "+.inf" || l == "inf" || l == "+inf") return std::numeric_limits<double>::infinity();
  if (l == "-.inf" || l == "-inf") return -std::numeric_limits<double>::infinity();
  if (l == ".nan" || l == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return d;
}

inline std::string format_double(double d) {
  if (std::isnan(d)) return ".nan";
  if (std::isinf(d)) return d > 0 ? ".inf" : "-.inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

/// A string a YAML reader would take for something else (null, bool, number) must be quoted when written.
inline bool needs_quotes(const std::string& s) {
  if (s.empty() || s == "~" || lower(s) == "null") return true;
  if (parse_bool(s) || parse_double(s) || parse_int(s)) return true;
  if (s == "y" || s == "n" || s == "Y" || s == "N") return true;
  return false;
}

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
  std::string where(const std::string& path, const YAML::Node& node) const {
    if (sources) {
      auto it = sources->find(path);
      if (it != sources->end()) return it->second;
    }
    if (node.IsDefined() && node.Mark().line >= 0) return file + ":" + std::to_string(node.Mark().line + 1);
    return "";
  }
  std::string at(const std::string& path, const YAML::Node& node) const {
    std::string w = where(path, node);
    return w.empty() ? std::string() : " (" + w + ")";
  }
  void wrong_type(const std::string& path, const YAML::Node& node, const std::string& expected) {
    std::string given;
    if (!node.IsDefined() || node.IsNull()) given = "null";
    else if (node.IsScalar()) given = "'" + node.Scalar() + "'";
    else if (node.IsSequence()) given = "a list";
    else given = "a map";
    errors.push_back((path.empty() ? std::string("<root>") : path) + at(path, node) + ": expected " + expected +
                     ", got " + given);
  }
  void fail(const std::string& path, const YAML::Node& node, const std::string& what) {
    errors.push_back((path.empty() ? std::string("<root>") : path) + at(path, node) + ": " + what);
  }
};

template <class T>
void decode_into(const YAML::Node& node, T& out, const std::string& path, decode_context& ctx);

namespace detail {
inline void emit(YAML::Emitter& e, const YAML::Node& n);

inline std::optional<Duration> parse_duration(std::string s) {
  // pytimeparse-style: "90", "5m", "15min", "1h30m", "2 days", "1:30:00".
  s.erase(std::remove_if(s.begin(), s.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)); }),
          s.end());
  if (s.empty()) return std::nullopt;
  if (auto d = parse_double(s); d && std::isfinite(*d)) return Duration{*d};
  if (s.find(':') != std::string::npos) {
    std::vector<double> parts;
    std::stringstream ss(s);
    std::string p;
    while (std::getline(ss, p, ':')) {
      auto d = parse_double(p);
      if (!d) return std::nullopt;
      parts.push_back(*d);
    }
    if (parts.size() < 2 || parts.size() > 3) return std::nullopt;
    double secs = 0;
    for (double x : parts) secs = secs * 60 + x;
    return Duration{secs};
  }
  static const std::pair<const char*, double> units[] = {
      {"weeks", 604800}, {"week", 604800}, {"wks", 604800}, {"wk", 604800}, {"w", 604800},
      {"days", 86400},   {"day", 86400},   {"d", 86400},
      {"hours", 3600},   {"hour", 3600},   {"hrs", 3600},   {"hr", 3600},   {"h", 3600},
      {"minutes", 60},   {"minute", 60},   {"mins", 60},    {"min", 60},    {"m", 60},
      {"seconds", 1},    {"second", 1},    {"secs", 1},     {"sec", 1},     {"s", 1},
  };
  double total = 0;
  std::size_t i = 0;
  bool any = false;
  while (i < s.size()) {
    std::size_t j = i;
    while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '.')) ++j;
    if (j == i) return std::nullopt;
    auto num = parse_double(s.substr(i, j - i));
    if (!num) return std::nullopt;
    std::size_t k = j;
    while (k < s.size() && std::isalpha(static_cast<unsigned char>(s[k]))) ++k;
    std::string unit = lower(s.substr(j, k - j));
    if (unit.empty() && k == s.size() && !any) return std::nullopt;  // handled above as a bare number
    bool found = false;
    for (const auto& [name, secs] : units)
      if (unit == name) total += *num * secs, found = true;
    if (!found) return std::nullopt;
    any = true;
    i = k;
  }
  return Duration{total};
}

inline std::optional<dtype> parse_dtype(const std::string& s) {
  std::string l = lower(s);
  if (l == "f32" || l == "float32" || l == "full" || l == "single") return dtype::f32;
  if (l == "bf16" || l == "bfloat16") return dtype::bf16;
  if (l == "f16" || l == "float16" || l == "half") return dtype::f16;
  if (l == "f64" || l == "float64" || l == "double") return dtype::f64;
  return std::nullopt;
}

inline std::string dtype_name(dtype d) {
  switch (d) {
    case dtype::f32: return "float32";
    case dtype::bf16: return "bfloat16";
    case dtype::f16: return "float16";
    case dtype::f64: return "float64";
  }
  return "float32";
}

/// jmp.get_policy: a single dtype sets all three; otherwise p/params, c/compute, o/output with compute defaulting to
/// params and output to compute.
inline std::optional<MpPolicy> parse_mp_policy(const std::string& s, std::string& why) {
  if (s.find('=') == std::string::npos) {
    auto d = parse_dtype(s);
    if (!d) return why = "unknown dtype '" + s + "'", std::nullopt;
    return MpPolicy{*d, *d, *d};
  }
  std::optional<dtype> p, c, o;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    auto eq = part.find('=');
    if (eq == std::string::npos) return why = "'" + part + "' is not key=dtype", std::nullopt;
    std::string key = part.substr(0, eq), val = part.substr(eq + 1);
    auto d = parse_dtype(val);
    if (!d) return why = "unknown dtype '" + val + "'", std::nullopt;
    if (key == "p" || key == "params") p = d;
    else if (key == "c" || key == "compute") c = d;
    else if (key == "o" || key == "output") o = d;
    else return why = "unknown key '" + key + "' (use p, c or o)", std::nullopt;
  }
  MpPolicy m;
  m.param = p.value_or(dtype::f32);
  m.compute = c.value_or(m.param);
  m.output = o.value_or(m.compute);
  return m;
}

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
      YAML::Emitter e;
      e << YAML::Flow;
      emit(e, node);
      out.yaml = e.c_str();
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
    if (v) out = T(*v);
    else ctx.wrong_type(path, node, "a number");
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (node.IsScalar()) out = s;
    else ctx.wrong_type(path, node, "a string");
  } else if constexpr (std::is_same_v<T, Duration>) {
    auto v = node.IsScalar() ? parse_duration(s) : std::nullopt;
    if (v && v->seconds < 0) ctx.fail(path, node, "a duration cannot be negative");
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
      if (v) out = NumberOrList{*v, {}};
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
inline YAML::Node string_node(const std::string& s) {
  YAML::Node n(s);
  n.SetTag("!");
  return n;
}
inline YAML::Node plain_node(const std::string& s) { return YAML::Node(s); }

inline std::string format_duration(double secs) {
  // As upstream encode_timedelta: days, hours, minutes, then seconds ("1d2h", "15m", "90.5s" -> "1m30.5s").
  if (secs == 0) return "0s";
  std::string out;
  double whole = std::floor(secs);
  double frac = secs - whole;
  auto w = int64_t(whole);
  if (w >= 86400) out += std::to_string(w / 86400) + "d", w %= 86400;
  if (w >= 3600) out += std::to_string(w / 3600) + "h", w %= 3600;
  if (w >= 60) out += std::to_string(w / 60) + "m", w %= 60;
  if (w > 0 || frac > 0) {
    if (frac > 0) {
      std::string f = format_double(double(w) + frac);
      out += f + "s";
    } else {
      out += std::to_string(w) + "s";
    }
  }
  return out;
}
}  // namespace detail

/// The YAML form of `x` (maps list every field, defaults included; choices carry `type:` first).
template <class T>
YAML::Node encode(const T& x) {
  using namespace detail;
  if constexpr (is_optional<T>::value) {
    return x ? encode(*x) : YAML::Node(YAML::NodeType::Null);
  } else if constexpr (std::is_same_v<T, Opaque>) {
    return x.set ? YAML::Load(x.yaml) : YAML::Node(YAML::NodeType::Null);
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

namespace detail {
inline void emit(YAML::Emitter& e, const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map:
      e << YAML::BeginMap;
      for (auto it = n.begin(); it != n.end(); ++it) {
        e << YAML::Key << it->first.Scalar() << YAML::Value;
        emit(e, it->second);
      }
      e << YAML::EndMap;
      break;
    case YAML::NodeType::Sequence:
      e << YAML::BeginSeq;
      for (const auto& c : n) emit(e, c);
      e << YAML::EndSeq;
      break;
    case YAML::NodeType::Scalar:
      if (n.Tag() == "!" && needs_quotes(n.Scalar())) e << YAML::DoubleQuoted << n.Scalar();
      else e << n.Scalar();
      break;
    default:
      e << YAML::Null;
  }
}
}  // namespace detail

/// Write a YAML tree as block YAML (strings that would read back as something else are quoted).
inline std::string to_yaml_string(const YAML::Node& n) {
  YAML::Emitter e;
  detail::emit(e, n);
  return std::string(e.c_str()) + "\n";
}

/// Write a YAML tree on one line, in flow style (`{type: adam, learning_rate: 0.001}`).
inline std::string to_flow_string(const YAML::Node& n) {
  YAML::Emitter e;
  e << YAML::Flow;
  detail::emit(e, n);
  return e.c_str();
}

/// The resolved config as YAML (written to the run directory and printed by --dry_run).
template <class T>
  requires(!std::is_same_v<T, YAML::Node>)
std::string to_yaml_string(const T& x) {
  return to_yaml_string(encode(x));
}

// ---- loading files with !include --------------------------------------------------------------------------------
namespace detail {

inline void record_positions(const YAML::Node& n, const std::string& path, const std::string& file,
                             source_map& sources) {
  if (n.IsMap()) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      std::string p = join_key(path, it->first.Scalar());
      sources[p] = file + ":" + std::to_string(it->first.Mark().line + 1);
      record_positions(it->second, p, file, sources);
    }
  } else if (n.IsSequence()) {
    for (std::size_t i = 0; i < n.size(); ++i) {
      std::string p = join_index(path, i);
      sources[p] = file + ":" + std::to_string(n[i].Mark().line + 1);
      record_positions(n[i], p, file, sources);
    }
  }
}

inline YAML::Node parse_yaml_text(const std::string& text, const std::string& name) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& ex) {
    throw config_error(name + ":" + std::to_string(ex.mark.line + 1) + ":" + std::to_string(ex.mark.column + 1) +
                       ": YAML syntax error: " + ex.msg);
  }
}

inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline YAML::Node resolve_includes(const YAML::Node& n, const std::string& file, const std::string& path,
                                   std::vector<std::string>& chain, source_map& sources);

inline YAML::Node load_included(const std::string& file, const std::string& path, std::vector<std::string>& chain,
                                source_map& sources) {
  namespace fs = std::filesystem;
  std::string canon = fs::weakly_canonical(fs::path(file)).string();
  if (std::find(chain.begin(), chain.end(), canon) != chain.end()) {
    std::string msg = "!include cycle: ";
    bool on = false;
    for (const auto& c : chain) {
      if (c == canon) on = true;
      if (on) msg += c + " -> ";
    }
    throw config_error(msg + canon);
  }
  chain.push_back(canon);
  YAML::Node raw = parse_yaml_text(read_text_file(file), file);
  YAML::Node out = resolve_includes(raw, file, path, chain, sources);
  chain.pop_back();
  return out;
}

inline YAML::Node resolve_includes(const YAML::Node& n, const std::string& file, const std::string& path,
                                   std::vector<std::string>& chain, source_map& sources) {
  namespace fs = std::filesystem;
  if (n.Tag() == "!include") {
    std::string line = file + ":" + std::to_string(n.Mark().line + 1);
    if (!n.IsScalar())
      throw config_error((path.empty() ? "<root>" : path) + " (" + line + "): !include takes a file path");
    fs::path target = fs::path(file).parent_path() / n.Scalar();
    std::string target_s = target.lexically_normal().string();
    if (!fs::exists(target))
      throw config_error((path.empty() ? "<root>" : path) + " (" + line + "): included file '" + n.Scalar() +
                         "' not found (looked for " + target_s + ", relative to the including file)");
    return load_included(target_s, path, chain, sources);
  }
  if (n.IsMap()) {
    YAML::Node m(YAML::NodeType::Map);
    for (auto it = n.begin(); it != n.end(); ++it) {
      std::string p = join_key(path, it->first.Scalar());
      sources[p] = file + ":" + std::to_string(it->first.Mark().line + 1);
      m[it->first.Scalar()] = resolve_includes(it->second, file, p, chain, sources);
    }
    return m;
  }
  if (n.IsSequence()) {
    YAML::Node s(YAML::NodeType::Sequence);
    for (std::size_t i = 0; i < n.size(); ++i) {
      std::string p = join_index(path, i);
      sources[p] = file + ":" + std::to_string(n[i].Mark().line + 1);
      s.push_back(resolve_includes(n[i], file, p, chain, sources));
    }
    return s;
  }
  return n;
}

}  // namespace detail

/// Load a YAML file, replacing every `!include other.yaml` node by that file's content (paths relative to the
/// including file), and record where every key came from in `sources` (keys under `prefix`).
inline YAML::Node load_yaml_file(const std::string& file, source_map& sources, const std::string& prefix = "") {
  if (!std::filesystem::exists(file)) throw config_error("config file '" + file + "' not found");
  std::vector<std::string> chain;
  return detail::load_included(file, prefix, chain, sources);
}

/// Same for YAML text (an embedded default); `name` is used in positions, includes are relative to the cwd.
inline YAML::Node load_yaml_string(const std::string& text, const std::string& name, source_map& sources) {
  std::vector<std::string> chain;
  YAML::Node raw = detail::parse_yaml_text(text, name);
  return detail::resolve_includes(raw, name, "", chain, sources);
}

}  // namespace levanter::config
