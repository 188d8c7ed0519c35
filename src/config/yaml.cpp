// config/yaml.hpp: the non-template parts of the YAML config layer (scalars, positions, !include, emitting).
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <levanter/config/yaml.hpp>
#include <limits>
#include <sstream>

namespace levanter::config {

namespace detail {

std::string join_key(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

std::string join_index(const std::string& path, std::size_t i) { return path + "[" + std::to_string(i) + "]"; }

std::size_t edit_distance(std::string_view a, std::string_view b) {
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

std::string suggestion(std::string_view key, const std::vector<std::string>& valid) {
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

bool is_plain(const YAML::Node& n) { return n.Tag() != "!"; }

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::optional<bool> parse_bool(const std::string& s) {
  static const char* t[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
  static const char* f[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
  for (auto* x : t)
    if (s == x) return true;
  for (auto* x : f)
    if (s == x) return false;
  return std::nullopt;
}

std::optional<int64_t> parse_int(std::string s) {
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

std::optional<double> parse_double(std::string s) {
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

std::string format_double(double d) {
  if (std::isnan(d)) return ".nan";
  if (std::isinf(d)) return d > 0 ? ".inf" : "-.inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

bool needs_quotes(const std::string& s) {
  if (s.empty() || s == "~" || lower(s) == "null") return true;
  if (parse_bool(s) || parse_double(s) || parse_int(s)) return true;
  if (s == "y" || s == "n" || s == "Y" || s == "N") return true;
  return false;
}

std::optional<Duration> parse_duration(std::string s) {
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
      {"weeks", 604800}, {"week", 604800}, {"wks", 604800}, {"wk", 604800}, {"w", 604800}, {"days", 86400},
      {"day", 86400},    {"d", 86400},     {"hours", 3600}, {"hour", 3600}, {"hrs", 3600}, {"hr", 3600},
      {"h", 3600},       {"minutes", 60},  {"minute", 60},  {"mins", 60},   {"min", 60},   {"m", 60},
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

std::optional<dtype> parse_dtype(const std::string& s) {
  std::string l = lower(s);
  if (l == "f32" || l == "float32" || l == "full" || l == "single") return dtype::f32;
  if (l == "bf16" || l == "bfloat16") return dtype::bf16;
  if (l == "f16" || l == "float16" || l == "half") return dtype::f16;
  if (l == "f64" || l == "float64" || l == "double") return dtype::f64;
  return std::nullopt;
}

std::string dtype_name(dtype d) {
  switch (d) {
    case dtype::f32:
      return "float32";
    case dtype::bf16:
      return "bfloat16";
    case dtype::f16:
      return "float16";
    case dtype::f64:
      return "float64";
  }
  return "float32";
}

std::optional<MpPolicy> parse_mp_policy(const std::string& s, std::string& why) {
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
    if (key == "p" || key == "params")
      p = d;
    else if (key == "c" || key == "compute")
      c = d;
    else if (key == "o" || key == "output")
      o = d;
    else
      return why = "unknown key '" + key + "' (use p, c or o)", std::nullopt;
  }
  MpPolicy m;
  m.param = p.value_or(dtype::f32);
  m.compute = c.value_or(m.param);
  m.output = o.value_or(m.compute);
  return m;
}

YAML::Node string_node(const std::string& s) {
  YAML::Node n(s);
  n.SetTag("!");
  return n;
}

YAML::Node plain_node(const std::string& s) { return YAML::Node(s); }

std::string format_duration(double secs) {
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

void emit(YAML::Emitter& e, const YAML::Node& n) {
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
      if (n.Tag() == "!" && needs_quotes(n.Scalar()))
        e << YAML::DoubleQuoted << n.Scalar();
      else
        e << n.Scalar();
      break;
    default:
      e << YAML::Null;
  }
}

}  // namespace detail

std::string to_yaml_string(const YAML::Node& n) {
  YAML::Emitter e;
  detail::emit(e, n);
  return std::string(e.c_str()) + "\n";
}

std::string to_flow_string(const YAML::Node& n) {
  YAML::Emitter e;
  e << YAML::Flow;
  detail::emit(e, n);
  return e.c_str();
}

namespace detail {
namespace {

void record_positions(const YAML::Node& n, const std::string& path, const std::string& file, source_map& sources) {
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

YAML::Node parse_yaml_text(const std::string& text, const std::string& name) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& ex) {
    throw config_error(name + ":" + std::to_string(ex.mark.line + 1) + ":" + std::to_string(ex.mark.column + 1) +
                       ": YAML syntax error: " + ex.msg);
  }
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

YAML::Node resolve_includes(const YAML::Node& n, const std::string& file, const std::string& path,
                            std::vector<std::string>& chain, source_map& sources);

YAML::Node load_included(const std::string& file, const std::string& path, std::vector<std::string>& chain,
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

YAML::Node resolve_includes(const YAML::Node& n, const std::string& file, const std::string& path,
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

}  // namespace
}  // namespace detail

YAML::Node load_yaml_file(const std::string& file, source_map& sources, const std::string& prefix) {
  if (!std::filesystem::exists(file)) throw config_error("config file '" + file + "' not found");
  std::vector<std::string> chain;
  return detail::load_included(file, prefix, chain, sources);
}

YAML::Node load_yaml_string(const std::string& text, const std::string& name, source_map& sources) {
  std::vector<std::string> chain;
  YAML::Node raw = detail::parse_yaml_text(text, name);
  return detail::resolve_includes(raw, name, "", chain, sources);
}

std::string decode_context::where(const std::string& path, const YAML::Node& node) const {
  if (sources) {
    auto it = sources->find(path);
    if (it != sources->end()) return it->second;
  }
  if (node.IsDefined() && node.Mark().line >= 0) return file + ":" + std::to_string(node.Mark().line + 1);
  return "";
}

std::string decode_context::at(const std::string& path, const YAML::Node& node) const {
  std::string w = where(path, node);
  return w.empty() ? std::string() : " (" + w + ")";
}

void decode_context::wrong_type(const std::string& path, const YAML::Node& node, const std::string& expected) {
  std::string given;
  if (!node.IsDefined() || node.IsNull())
    given = "null";
  else if (node.IsScalar())
    given = "'" + node.Scalar() + "'";
  else if (node.IsSequence())
    given = "a list";
  else
    given = "a map";
  errors.push_back((path.empty() ? std::string("<root>") : path) + at(path, node) + ": expected " + expected +
                   ", got " + given);
}

void decode_context::fail(const std::string& path, const YAML::Node& node, const std::string& what) {
  errors.push_back((path.empty() ? std::string("<root>") : path) + at(path, node) + ": " + what);
}

}  // namespace levanter::config
