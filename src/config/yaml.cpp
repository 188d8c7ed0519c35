// config/yaml.hpp: the non-template parts of the YAML config layer (scalars, positions, !include, emitting).
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <yaml-cpp/depthguard.h>

#include <levanter/config/limits.hpp>
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
  // Every comma separates two key=dtype entries: an empty entry (a trailing or doubled comma) and a key given twice
  // are refused, not read as whichever came last.
  std::size_t start = 0;
  while (true) {
    const auto comma = s.find(',', start);
    const std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (part.empty()) return why = "an empty entry (a trailing or doubled comma)", std::nullopt;
    auto eq = part.find('=');
    if (eq == std::string::npos) return why = "'" + part + "' is not key=dtype", std::nullopt;
    std::string key = part.substr(0, eq), val = part.substr(eq + 1);
    auto d = parse_dtype(val);
    if (!d) return why = "unknown dtype '" + val + "'", std::nullopt;
    std::optional<dtype>* slot = nullptr;
    if (key == "p" || key == "params")
      slot = &p;
    else if (key == "c" || key == "compute")
      slot = &c;
    else if (key == "o" || key == "output")
      slot = &o;
    else
      return why = "unknown key '" + key + "' (use p, c or o)", std::nullopt;
    if (*slot) return why = "'" + key + "' is given twice", std::nullopt;
    *slot = d;
    if (comma == std::string::npos) break;
    start = comma + 1;
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

namespace {
std::string human_duration(double secs) {
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
}  // namespace

std::string format_duration(double secs) {
  // The human form when it reads back as exactly `secs`; otherwise the number of seconds, which always does.
  // Out-of-range values (refused when read) are written as numbers too, never through an int64 conversion.
  if (!std::isfinite(secs) || secs < 0 || secs > max_duration_seconds) return format_double(secs);
  std::string h = human_duration(secs);
  if (auto back = parse_duration(h); back && back->seconds == secs) return h;
  return format_double(secs);
}

std::string number_problem(double v) {
  if (std::isfinite(v)) return {};
  return "expected a finite number, got " + format_double(v) + " (infinity and NaN are not accepted here)";
}

std::string duration_problem(double seconds) {
  if (std::isnan(seconds) || std::isinf(seconds))
    return "expected a finite duration, got " + format_double(seconds);
  if (seconds < 0) return "a duration cannot be negative (got " + format_double(seconds) + " seconds)";
  if (seconds > max_duration_seconds)
    return "a duration must be at most 3650d (10 years; got " + format_double(seconds) +
           " seconds); use a shorter one";
  return {};
}

std::string string_problem(const std::string& s) {
  // Control characters (other than tab and newline) and invalid UTF-8 cannot be written back into config.yaml
  // faithfully; no key needs them.
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if ((c < 0x20 && c != '\t' && c != '\n') || c == 0x7f)
        return "the text contains the control character " + std::to_string(int(c)) +
               " (at byte " + std::to_string(i) + "); remove it";
      ++i;
      continue;
    }
    const std::size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    bool ok = len != 0 && i + len <= s.size();
    uint32_t cp = ok ? (len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07) : 0;
    for (std::size_t k = 1; ok && k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (ok && ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff))))
      ok = false;
    if (!ok) return "the text is not valid UTF-8 (at byte " + std::to_string(i) + "); save the file as UTF-8";
    i += len;
  }
  return {};
}

std::string opaque_text(const YAML::Node& node) {
  YAML::Emitter e;
  e << YAML::Flow;
  emit(e, node);
  return e.c_str();
}

YAML::Node load_opaque(const std::string& text) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception&) {
    return string_node(text);  // not reached for text written by opaque_text
  }
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

std::string with_commas(std::size_t n) {
  std::string s = std::to_string(n);
  for (int i = int(s.size()) - 3; i > 0; i -= 3) s.insert(std::size_t(i), ",");
  return s;
}

std::string mib(std::size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

/// What one load (a file with its includes, or one text) has used of the limits of config/limits.hpp.
struct load_state {
  std::vector<std::string> chain;  // canonical paths of the files being included, outermost first
  std::size_t nodes = 0;           // nodes visited, aliases and includes expanded
  std::size_t expanded_bytes = 0;  // scalar text and key paths, aliases and includes expanded
  std::size_t file_bytes = 0;      // bytes read from files
  include_policy policy = include_policy::relative_to_cwd;
};

std::string line_of(const std::string& name, const YAML::Node& n) {
  return n.Mark().line >= 0 ? name + ":" + std::to_string(n.Mark().line + 1) : name;
}

/// Walks a freshly parsed tree (shared nodes, i.e. aliases, visited as often as they are referred to) and refuses
/// cycles, nesting deeper than max_yaml_depth, complex keys, and trees that expand beyond the node and byte budgets
/// of `st`. Recursion depth is bounded by max_yaml_depth.
void check_tree(const YAML::Node& n, const std::string& name, int depth, std::size_t path_bytes,
                std::vector<YAML::Node>& ancestors, load_state& st) {
  if (++st.nodes > max_yaml_nodes)
    throw config_error(name + ": the YAML expands to more than " + with_commas(max_yaml_nodes) +
                       " nodes (aliases and !include expanded; the limit is " + with_commas(max_yaml_nodes) +
                       "); a config is never this large: look for anchors (&x) used many times, aliases of aliases "
                       "(\"billion laughs\") or an !include repeated many times");
  std::size_t bytes = path_bytes + (n.IsScalar() ? n.Scalar().size() : 0);
  st.expanded_bytes += bytes;
  if (st.expanded_bytes > max_yaml_expanded_bytes)
    throw config_error(name + ": the YAML expands to more than " + mib(max_yaml_expanded_bytes) +
                       " of values and key paths (aliases and !include expanded; the limit is " +
                       mib(max_yaml_expanded_bytes) + "); look for anchors (&x) of long values used many times");
  if (!n.IsMap() && !n.IsSequence()) return;
  for (const auto& a : ancestors)
    if (a.is(n))
      throw config_error(line_of(name, n) + ": an alias (*name) refers to a map or list that contains it (starting at " +
                         line_of(name, a) + "); such a cycle has no finite value: replace the alias by the values");
  if (depth >= max_yaml_depth)
    throw config_error(line_of(name, n) + ": maps and lists nested more than " + std::to_string(max_yaml_depth) +
                       " levels deep (the limit is " + std::to_string(max_yaml_depth) +
                       ", counting across !include); flatten the config");
  ancestors.push_back(n);
  if (n.IsMap()) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      const YAML::Node k = it->first;  // a copy: it-> returns a temporary proxy
      if (k.IsMap() || k.IsSequence())
        throw config_error(line_of(name, k) + ": a map key must be a plain name, not a " +
                           (k.IsMap() ? "map" : "list") + " (`? [a, b]: ...` keys are not config keys)");
      if (k.IsScalar() && k.Scalar().size() > max_yaml_key_bytes)
        throw config_error(line_of(name, k) + ": a map key is " + with_commas(k.Scalar().size()) +
                           " characters long (the limit is " + with_commas(max_yaml_key_bytes) + ")");
      const std::size_t key_bytes = k.IsScalar() ? k.Scalar().size() : 0;
      const YAML::Node value = it->second;
      check_tree(value, name, depth + 1, path_bytes + key_bytes + 1, ancestors, st);
    }
  } else {
    for (std::size_t i = 0; i < n.size(); ++i)
      check_tree(n[i], name, depth + 1, path_bytes + std::to_string(i).size() + 2, ancestors, st);
  }
  ancestors.pop_back();
}

YAML::Node parse_yaml_text(const std::string& text, const std::string& name, load_state& st) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::DeepRecursion& ex) {
    throw config_error(name + ":" + std::to_string(ex.mark.line + 1) + ": maps and lists nested more than " +
                       std::to_string(max_yaml_depth) + " levels deep (the limit is " +
                       std::to_string(max_yaml_depth) + "); flatten the config");
  } catch (const YAML::Exception& ex) {
    throw config_error(name + ":" + std::to_string(ex.mark.line + 1) + ":" + std::to_string(ex.mark.column + 1) +
                       ": YAML syntax error: " + ex.msg);
  }
  std::vector<YAML::Node> ancestors;
  check_tree(root, name, 0, 0, ancestors, st);
  return root;
}

/// The text of a config file: it must be a regular file (after following symlinks) of at most max_yaml_file_bytes,
/// and the load may read at most max_yaml_total_bytes in all. `what` names the file in messages
/// ("config file 'x.yaml'", "included file 'y.yaml' (from x.yaml:3)").
std::string read_config_file(const std::string& path, const std::string& what, load_state& st,
                             const std::string& not_found_hint = "") {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) throw config_error(what + " not found" + not_found_hint);
  if (fs::is_directory(status)) throw config_error(what + " is a directory, not a YAML file");
  if (!fs::is_regular_file(status))
    throw config_error(what + " is not a regular file (a device, pipe or socket); give the path of a YAML file");
  const auto size = fs::file_size(path, ec);
  const std::string limit = "; the limit is " + mib(max_yaml_file_bytes) + " per file";
  if (!ec && size > max_yaml_file_bytes)
    throw config_error(what + " is " + with_commas(std::size_t(size)) + " bytes" + limit);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw config_error(what + " cannot be opened for reading");
  std::string text;
  char buf[65536];
  while (in.read(buf, sizeof buf), in.gcount() > 0) {  // the file may grow after the size check
    text.append(buf, std::size_t(in.gcount()));
    if (text.size() > max_yaml_file_bytes) throw config_error(what + " is larger than " + mib(max_yaml_file_bytes) + limit);
  }
  if (in.bad()) throw config_error(what + " could not be read");
  st.file_bytes += text.size();
  if (st.file_bytes > max_yaml_total_bytes)
    throw config_error(what + ": the config and its includes add up to more than " + mib(max_yaml_total_bytes) +
                       " (the limit); look for an !include repeated many times");
  return text;
}

YAML::Node resolve_includes(const YAML::Node& n, const std::string& file, const std::string& path, int depth,
                            load_state& st, source_map& sources);

YAML::Node load_included(const std::string& file, const std::string& what, const std::string& path, int depth,
                         load_state& st, source_map& sources, const std::string& not_found_hint = "") {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string canon = fs::weakly_canonical(fs::path(file), ec).string();
  if (ec) canon = fs::path(file).lexically_normal().string();
  if (std::find(st.chain.begin(), st.chain.end(), canon) != st.chain.end()) {
    std::string msg = "!include cycle: ";
    bool on = false;
    for (const auto& c : st.chain) {
      if (c == canon) on = true;
      if (on) msg += c + " -> ";
    }
    throw config_error(msg + canon);
  }
  if (int(st.chain.size()) >= max_include_depth + 1)
    throw config_error(what + ": includes nested more than " + std::to_string(max_include_depth) +
                       " files deep (the limit is " + std::to_string(max_include_depth) + ")");
  std::string text = read_config_file(file, what, st, not_found_hint);
  st.chain.push_back(canon);
  YAML::Node raw = parse_yaml_text(text, file, st);
  YAML::Node out = resolve_includes(raw, file, path, depth, st, sources);
  st.chain.pop_back();
  return out;
}

YAML::Node resolve_includes(const YAML::Node& n, const std::string& file, const std::string& path, int depth,
                            load_state& st, source_map& sources) {
  namespace fs = std::filesystem;
  if (depth >= max_yaml_depth && (n.IsMap() || n.IsSequence()))
    throw config_error(line_of(file, n) + ": maps and lists nested more than " + std::to_string(max_yaml_depth) +
                       " levels deep counting across !include (the limit is " + std::to_string(max_yaml_depth) +
                       "); flatten the config");
  if (n.Tag() == "!include") {
    const std::string where = (path.empty() ? "<root>" : path) + " (" + line_of(file, n) + ")";
    if (st.policy == include_policy::refuse)
      throw config_error(where + ": !include is not allowed here (this text may not read other files)");
    if (!n.IsScalar() || n.Scalar().empty())
      throw config_error(where + ": !include takes the path of a YAML file (relative to the including file)");
    fs::path target = fs::path(file).parent_path() / n.Scalar();
    std::string target_s = target.lexically_normal().string();
    const std::string what = where + ": included file '" + n.Scalar() + "'";
    return load_included(target_s, what, path, depth, st, sources,
                         " (looked for " + target_s + ", relative to the including file)");
  }
  if (n.IsMap()) {
    YAML::Node m(YAML::NodeType::Map);
    for (auto it = n.begin(); it != n.end(); ++it) {
      std::string p = join_key(path, it->first.Scalar());
      sources[p] = line_of(file, it->first);
      m[it->first.Scalar()] = resolve_includes(it->second, file, p, depth + 1, st, sources);
    }
    return m;
  }
  if (n.IsSequence()) {
    YAML::Node s(YAML::NodeType::Sequence);
    for (std::size_t i = 0; i < n.size(); ++i) {
      std::string p = join_index(path, i);
      sources[p] = line_of(file, n[i]);
      s.push_back(resolve_includes(n[i], file, p, depth + 1, st, sources));
    }
    return s;
  }
  // A fresh node, not `n`: assigning a node of the parsed tree into the new one would merge the parsed tree's whole
  // node memory into it, for every map and list built (quadratic for aliases expanded many times).
  if (n.IsScalar()) {
    YAML::Node c(n.Scalar());
    c.SetTag(n.Tag());
    return c;
  }
  return YAML::Node(YAML::NodeType::Null);
}

}  // namespace
}  // namespace detail

YAML::Node load_yaml_file(const std::string& file, source_map& sources, const std::string& prefix) {
  detail::load_state st;
  return detail::load_included(file, "config file '" + file + "'", prefix, 0, st, sources);
}

YAML::Node load_yaml_string(const std::string& text, const std::string& name, source_map& sources) {
  return load_yaml_text(text, name, sources, include_policy::relative_to_cwd);
}

YAML::Node load_yaml_text(const std::string& text, const std::string& name, source_map& sources,
                          include_policy policy) {
  detail::load_state st;
  st.policy = policy;
  if (text.size() > max_yaml_file_bytes)
    throw config_error(name + ": the config text is " + detail::with_commas(text.size()) + " bytes; the limit is " +
                       detail::mib(max_yaml_file_bytes));
  YAML::Node raw = detail::parse_yaml_text(text, name, st);
  return detail::resolve_includes(raw, name, "", 0, st, sources);
}

YAML::Node load_yaml_value(const std::string& text, const std::string& what) {
  detail::load_state st;
  YAML::Node v = YAML::Load(text);  // YAML::Exception (DeepRecursion included) goes to the caller
  std::vector<YAML::Node> ancestors;
  detail::check_tree(v, what, 0, 0, ancestors, st);
  return v;
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
