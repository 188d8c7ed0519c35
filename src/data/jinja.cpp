// data/jinja.hpp: the chat-template subset of Jinja2 as three stages: a lexer that reproduces Jinja's whitespace
// rules (trim_blocks, lstrip_blocks, `-`/`+` markers), a recursive-descent parser to a syntax tree that resolves
// filters and tests by name, and a tree-walking evaluator over Python-like values.
#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <ctime>
#include <functional>
#include <levanter/data/detail/utf8.hpp>
#include <levanter/data/jinja.hpp>
#include <limits>
#include <string>
#include <unordered_map>

namespace levanter::data::jinja {
namespace detail {
namespace {

// ---- Positions and errors -------------------------------------------------------------------------------------

struct pos {
  int line = 0, col = 0;
};

std::string where(pos at) {
  return "chat template line " + std::to_string(at.line) + ", column " + std::to_string(at.col) + ": ";
}

[[noreturn]] void fail(pos at, const std::string& what) { throw template_error(where(at) + what, at.line, at.col); }

// The render-time stack bound (see limits::max_depth): far below what 8 MiB of stack holds even with sanitizers.
constexpr int runtime_depth_cap = 1500;
constexpr int json_depth_cap = 512;

// ---- UTF-8 and Python's character classes ----------------------------------------------------------------------

// Decodes the code point at s[i]; an invalid byte decodes as itself (one byte), so slicing never loses bytes.
std::size_t next_cp(std::string_view s, std::size_t i, char32_t* cp) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    *cp = c;
    return i + 1;
  }
  const std::size_t n = c >= 0xF0 && c < 0xF5 ? 3 : c >= 0xE0 && c < 0xF0 ? 2 : c >= 0xC2 && c < 0xE0 ? 1 : 0;
  *cp = 0xDC00 + c;
  if (n == 0 || i + n >= s.size()) return i + 1;
  char32_t v = c & (0x3F >> n);
  for (std::size_t k = 1; k <= n; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) return i + 1;
    v = (v << 6) | (d & 0x3F);
  }
  if ((n == 2 && (v < 0x800 || (v >= 0xD800 && v <= 0xDFFF))) || (n == 3 && (v < 0x10000 || v > 0x10FFFF)))
    return i + 1;
  *cp = v;
  return i + n + 1;
}

void put_cp(std::string& out, char32_t c) {
  if (c >= 0xDC80 && c <= 0xDCFF)  // an invalid input byte, kept as it was
    out.push_back(static_cast<char>(c - 0xDC00));
  else
    levanter::data::detail::append_utf8(out, c);
}

std::vector<char32_t> to_cps(std::string_view s) {
  std::vector<char32_t> v;
  v.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    char32_t c;
    i = next_cp(s, i, &c);
    v.push_back(c);
  }
  return v;
}

std::string from_cps(const std::vector<char32_t>& v, std::size_t b = 0, std::size_t e = std::string::npos) {
  std::string s;
  e = std::min(e, v.size());
  for (std::size_t i = b; i < e; ++i) put_cp(s, v[i]);
  return s;
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

std::size_t cp_count(std::string_view s) {
  if (is_ascii(s)) return s.size();
  std::size_t n = 0;
  for (std::size_t i = 0; i < s.size(); ++n) {
    char32_t c;
    i = next_cp(s, i, &c);
  }
  return n;
}

// str.isspace(): the characters Python (and Python's `\s`) treat as whitespace.
bool py_space(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Simple case mapping of ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (the header states the limit).
char32_t to_upper_cp(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c >= 0x100 && c <= 0x17F) {
    if ((c <= 0x137 || (c >= 0x14A && c <= 0x177)) && (c & 1) && c != 0x131) return c - 1;
    if (((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) && !(c & 1)) return c - 1;
    return c;
  }
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
  if (c == 0x3C2) return 0x3A3;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 37;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}

char32_t to_lower_cp(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c == 0x178) return 0xFF;
  if (c >= 0x100 && c <= 0x17F) {
    if ((c <= 0x137 || (c >= 0x14A && c <= 0x177)) && !(c & 1) && c != 0x130) return c + 1;
    if (((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) && (c & 1)) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

bool is_upper_cp(char32_t c) { return to_lower_cp(c) != c; }
bool is_lower_cp(char32_t c) { return to_upper_cp(c) != c || c == 0xDF; }
bool is_cased_cp(char32_t c) { return is_upper_cp(c) || is_lower_cp(c); }
bool is_alpha_cp(char32_t c) { return (c < 0x80) ? std::isalpha(static_cast<int>(c)) != 0 : is_cased_cp(c); }
bool is_digit_cp(char32_t c) { return c >= '0' && c <= '9'; }

template <class F>
std::string map_cps(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    char32_t c;
    i = next_cp(s, i, &c);
    put_cp(out, f(c));
  }
  return out;
}

std::string upper(std::string_view s) { return map_cps(s, to_upper_cp); }
std::string lower(std::string_view s) { return map_cps(s, to_lower_cp); }

// str.title(): a cased character after a cased one is lowered, any other is raised.
std::string py_title(std::string_view s) {
  bool prev_cased = false;
  return map_cps(s, [&](char32_t c) {
    const char32_t r = prev_cased ? to_lower_cp(c) : to_upper_cp(c);
    prev_cased = is_cased_cp(c);
    return r;
  });
}

std::string py_capitalize(std::string_view s) {
  bool first = true;
  return map_cps(s, [&](char32_t c) {
    const char32_t r = first ? to_upper_cp(c) : to_lower_cp(c);
    first = false;
    return r;
  });
}

// Jinja's `title` filter: each piece after a run of `-`, whitespace, `(`, `{`, `[` or `<` gets an upper-case first
// character and lower-case rest.
std::string jinja_title(std::string_view s) {
  bool start = true;
  return map_cps(s, [&](char32_t c) {
    const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_space(c);
    const char32_t r = sep ? c : start ? to_upper_cp(c) : to_lower_cp(c);
    start = sep;
    return r;
  });
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  auto cps = to_cps(s);
  std::vector<char32_t> set;
  if (chars) set = to_cps(*chars);
  auto strip = [&](char32_t c) { return chars ? std::find(set.begin(), set.end(), c) != set.end() : py_space(c); };
  std::size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip(cps[b])) ++b;
  if (right)
    while (e > b && strip(cps[e - 1])) --e;
  return from_cps(cps, b, e);
}

// ---- Values ---------------------------------------------------------------------------------------------------

enum class vk : std::uint8_t {
  undefined,
  none,
  boolean,
  integer,
  floating,
  string,
  list,
  tuple,
  dict,
  ns,
  loop,
  callable
};

struct object {
  virtual ~object() = default;
};
struct value;
struct list_obj;
struct dict_obj;
struct callable_obj;

struct value {
  vk k = vk::undefined;
  bool b = false;                        // boolean; for undefined: the access was refused by the sandbox
  std::int64_t i = 0;                    // integer
  double f = 0;                          // floating
  std::shared_ptr<const std::string> s;  // string; for undefined: why it is undefined
  std::shared_ptr<object> o;             // list, tuple, dict, ns, loop, callable

  const std::string& str() const { return *s; }
  list_obj& list() const;
  dict_obj& dict() const;
  callable_obj& fn() const;
  bool is_num() const { return k == vk::boolean || k == vk::integer || k == vk::floating; }
  bool is_int() const { return k == vk::boolean || k == vk::integer; }
  bool is_seq() const { return k == vk::list || k == vk::tuple; }
  bool is_map() const { return k == vk::dict || k == vk::ns; }
  std::int64_t as_int() const { return k == vk::boolean ? (b ? 1 : 0) : i; }
  double as_double() const { return k == vk::floating ? f : static_cast<double>(as_int()); }
};

struct list_obj : object {
  std::vector<value> items;
};

struct dict_obj : object {
  std::vector<std::pair<value, value>> items;
  const value* find(const value& key) const;
  const value* find(std::string_view key) const {
    for (const auto& [k, v] : items)
      if (k.k == vk::string && k.str() == key) return &v;
    return nullptr;
  }
  void set(const value& key, value v);
};

struct frame;
struct stmt;

enum class fn_kind : std::uint8_t { macro, builtin, method };
enum class builtin : std::uint8_t { range, namespace_, dict, raise_exception, strftime_now };

struct callable_obj : object {
  fn_kind kind = fn_kind::builtin;
  builtin which = builtin::range;
  std::string name;
  const stmt* macro = nullptr;
  std::weak_ptr<frame> scope;
  value self;  // the receiver of a bound method
};

// The `loop` variable of one iteration; its attributes are computed when read.
struct loop_obj : object {
  std::int64_t index0 = 0, length = 0;
  std::shared_ptr<const std::vector<value>> items;
};

list_obj& value::list() const { return static_cast<list_obj&>(*o); }
dict_obj& value::dict() const { return static_cast<dict_obj&>(*o); }
callable_obj& value::fn() const { return static_cast<callable_obj&>(*o); }

value make_none() {
  value v;
  v.k = vk::none;
  return v;
}
value make_bool(bool b) {
  value v;
  v.k = vk::boolean;
  v.b = b;
  return v;
}
value make_int(std::int64_t i) {
  value v;
  v.k = vk::integer;
  v.i = i;
  return v;
}
value make_float(double f) {
  value v;
  v.k = vk::floating;
  v.f = f;
  return v;
}
value make_str(std::string s) {
  value v;
  v.k = vk::string;
  v.s = std::make_shared<const std::string>(std::move(s));
  return v;
}
value make_undefined(std::string why, bool unsafe = false) {
  value v;
  v.s = std::make_shared<const std::string>(std::move(why));
  v.b = unsafe;
  return v;
}
value make_list(std::vector<value> items, vk kind = vk::list) {
  value v;
  v.k = kind;
  auto l = std::make_shared<list_obj>();
  l->items = std::move(items);
  v.o = std::move(l);
  return v;
}
value make_dict(vk kind = vk::dict) {
  value v;
  v.k = kind;
  v.o = std::make_shared<dict_obj>();
  return v;
}
value make_builtin(builtin which, std::string name) {
  value v;
  v.k = vk::callable;
  auto c = std::make_shared<callable_obj>();
  c->which = which;
  c->name = std::move(name);
  v.o = std::move(c);
  return v;
}
value make_method(const value& self, std::string name) {
  value v;
  v.k = vk::callable;
  auto c = std::make_shared<callable_obj>();
  c->kind = fn_kind::method;
  c->name = std::move(name);
  c->self = self;
  v.o = std::move(c);
  return v;
}

const char* type_name(const value& v) {
  switch (v.k) {
    case vk::undefined:
      return "Undefined";
    case vk::none:
      return "NoneType";
    case vk::boolean:
      return "bool";
    case vk::integer:
      return "int";
    case vk::floating:
      return "float";
    case vk::string:
      return "str";
    case vk::list:
      return "list";
    case vk::tuple:
      return "tuple";
    case vk::dict:
      return "dict";
    case vk::ns:
      return "Namespace";
    case vk::loop:
      return "LoopContext";
    case vk::callable:
      return v.fn().kind == fn_kind::macro ? "Macro" : "function";
  }
  return "object";
}

bool truthy(const value& v) {
  switch (v.k) {
    case vk::undefined:
    case vk::none:
      return false;
    case vk::boolean:
      return v.b;
    case vk::integer:
      return v.i != 0;
    case vk::floating:
      return v.f != 0;
    case vk::string:
      return !v.s->empty();
    case vk::list:
    case vk::tuple:
      return !v.list().items.empty();
    case vk::dict:
      return !v.dict().items.empty();
    default:
      return true;
  }
}

// float.__repr__: the shortest round-trip digits, positional for exponents -4..15, else d.ddde+XX.
std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const auto e_at = sci.find('e');
  std::string digits = sci.substr(0, e_at);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e_at + 1));
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp >= 0) {
      std::string ip = digits.substr(0, std::min<std::size_t>(digits.size(), exp + 1));
      ip.append(static_cast<std::size_t>(exp + 1) - ip.size(), '0');
      std::string fp = digits.size() > static_cast<std::size_t>(exp + 1) ? digits.substr(exp + 1) : "0";
      out = ip + "." + fp;
    } else {
      out = "0." + std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  const int ae = std::abs(exp);
  out += exp < 0 ? "e-" : "e+";
  if (ae < 10) out += "0";
  return sign + out + std::to_string(ae);
}

std::string hex2(unsigned v) {
  static const char* h = "0123456789abcdef";
  return std::string{h[(v >> 4) & 15], h[v & 15]};
}

// repr() of a str.
std::string py_repr_str(std::string_view s) {
  const bool has_sq = s.find('\'') != std::string_view::npos, has_dq = s.find('"') != std::string_view::npos;
  const char q = has_sq && !has_dq ? '"' : '\'';
  std::string out(1, q);
  for (std::size_t i = 0; i < s.size();) {
    char32_t c;
    const std::size_t j = next_cp(s, i, &c);
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0xA0) || c == 0xAD) {
      out += "\\x" + hex2(c);
    } else if (c >= 0xDC80 && c <= 0xDCFF) {
      out += "\\udc" + hex2(c & 0xFF);
    } else if ((c >= 0x200B && c <= 0x200F) || (c >= 0x2028 && c <= 0x202E) || (c >= 0x2060 && c <= 0x2064) ||
               c == 0xFEFF) {
      out += "\\u" + hex2(c >> 8) + hex2(c & 0xFF);
    } else {
      out.append(s.substr(i, j - i));
    }
    i = j;
  }
  out += q;
  return out;
}

// A size-bounded string builder for str()/repr()/tojson of values that may be large.
struct bounded {
  std::string out;
  std::size_t cap;
  pos at;
  void add(std::string_view s) {
    if (out.size() + s.size() > cap) fail(at, "string longer than max_output_bytes");
    out.append(s);
  }
};

void repr_into(const value& v, bounded& b, int depth);

void str_into(const value& v, bounded& b, int depth) {
  if (depth > json_depth_cap) fail(b.at, "value nested too deeply to print");
  switch (v.k) {
    case vk::undefined:
      return;
    case vk::none:
      return b.add("None");
    case vk::boolean:
      return b.add(v.b ? "True" : "False");
    case vk::integer:
      return b.add(std::to_string(v.i));
    case vk::floating:
      return b.add(py_float(v.f));
    case vk::string:
      return b.add(v.str());
    case vk::list:
    case vk::tuple: {
      const auto& items = v.list().items;
      b.add(v.k == vk::list ? "[" : "(");
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i) b.add(", ");
        repr_into(items[i], b, depth + 1);
      }
      if (v.k == vk::tuple && items.size() == 1) b.add(",");
      return b.add(v.k == vk::list ? "]" : ")");
    }
    case vk::dict:
    case vk::ns:
    case vk::loop: {
      if (v.k == vk::ns) b.add("<Namespace ");
      if (v.k == vk::loop) return b.add("<LoopContext>");
      b.add("{");
      bool first = true;
      for (const auto& [key, val] : v.dict().items) {
        if (!first) b.add(", ");
        first = false;
        repr_into(key, b, depth + 1);
        b.add(": ");
        repr_into(val, b, depth + 1);
      }
      b.add("}");
      if (v.k == vk::ns) b.add(">");
      return;
    }
    case vk::callable:
      return b.add("<" + std::string(type_name(v)) + " '" + v.fn().name + "'>");
  }
}

void repr_into(const value& v, bounded& b, int depth) {
  if (v.k == vk::string) return b.add(py_repr_str(v.str()));
  if (v.k == vk::undefined) return b.add("Undefined");
  str_into(v, b, depth);
}

// ---- Python-compatible json.dumps -----------------------------------------------------------------------------

struct json_style {
  std::optional<std::string> indent;
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false, ensure_ascii = false;
};

void json_str(std::string_view s, bool ensure_ascii, bounded& b) {
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size();) {
    char32_t c;
    const std::size_t j = next_cp(s, i, &c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00" + hex2(c);
        } else if (ensure_ascii && c >= 0x80) {
          auto u4 = [&](unsigned u) { out += "\\u" + hex2(u >> 8) + hex2(u & 0xFF); };
          if (c >= 0x10000) {
            u4(0xD800 + ((c - 0x10000) >> 10));
            u4(0xDC00 + ((c - 0x10000) & 0x3FF));
          } else {
            u4(c);
          }
        } else {
          out.append(s.substr(i, j - i));
        }
    }
    i = j;
  }
  out += '"';
  b.add(out);
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return py_float(d);
}

void json_into(const value& v, const json_style& st, int level, bounded& b) {
  if (level > json_depth_cap) fail(b.at, "tojson: value nested too deeply");
  auto newline = [&](int lvl) {
    b.add("\n");
    for (int k = 0; k < lvl; ++k) b.add(*st.indent);
  };
  switch (v.k) {
    case vk::none:
      return b.add("null");
    case vk::boolean:
      return b.add(v.b ? "true" : "false");
    case vk::integer:
      return b.add(std::to_string(v.i));
    case vk::floating:
      return b.add(json_float(v.f));
    case vk::string:
      return json_str(v.str(), st.ensure_ascii, b);
    case vk::list:
    case vk::tuple: {
      const auto& items = v.list().items;
      if (items.empty()) return b.add("[]");
      b.add("[");
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i) b.add(st.item_sep);
        if (st.indent) newline(level + 1);
        json_into(items[i], st, level + 1, b);
      }
      if (st.indent) newline(level);
      return b.add("]");
    }
    case vk::dict: {
      std::vector<std::pair<std::string, const value*>> entries;
      for (const auto& [key, val] : v.dict().items) {
        std::string k;
        switch (key.k) {
          case vk::string:
            k = key.str();
            break;
          case vk::integer:
            k = std::to_string(key.i);
            break;
          case vk::floating:
            k = json_float(key.f);
            break;
          case vk::boolean:
            k = key.b ? "true" : "false";
            break;
          case vk::none:
            k = "null";
            break;
          default:
            fail(b.at, std::string("tojson: keys must be str, int, float, bool or None, not ") + type_name(key));
        }
        entries.emplace_back(std::move(k), &val);
      }
      if (st.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& x, const auto& y) { return x.first < y.first; });
      if (entries.empty()) return b.add("{}");
      b.add("{");
      for (std::size_t i = 0; i < entries.size(); ++i) {
        if (i) b.add(st.item_sep);
        if (st.indent) newline(level + 1);
        json_str(entries[i].first, st.ensure_ascii, b);
        b.add(st.key_sep);
        json_into(*entries[i].second, st, level + 1, b);
      }
      if (st.indent) newline(level);
      return b.add("}");
    }
    default:
      fail(b.at, std::string("tojson: Object of type ") + type_name(v) + " is not JSON serializable");
  }
}

value from_json(const nlohmann::ordered_json& j, int depth) {
  if (depth > json_depth_cap) fail({}, "context nested more than 512 levels deep");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return make_none();
    case nlohmann::ordered_json::value_t::boolean:
      return make_bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return make_int(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<std::uint64_t>();
      return u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())
                 ? make_int(static_cast<std::int64_t>(u))
                 : make_float(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return make_float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return make_str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, depth + 1));
      return make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = make_dict();
      auto& items = d.dict().items;
      items.reserve(j.size());
      for (const auto& [k, e] : j.items()) items.emplace_back(make_str(k), from_json(e, depth + 1));
      return d;
    }
    default:
      return make_undefined("unsupported JSON value");
  }
}

// ---- Lexer ----------------------------------------------------------------------------------------------------

enum class tk : std::uint8_t {
  data,
  var_begin,
  var_end,
  block_begin,
  block_end,
  name,
  string,
  integer,
  floating,
  op,
  eof
};

struct token {
  tk k;
  std::string text;  // data, name, operator, decoded string
  pos at;
  std::int64_t ival = 0;
  double fval = 0;
};

// Jinja's lexer with the chat-template environment (trim_blocks, lstrip_blocks, keep_trailing_newline off).
class lexer {
 public:
  explicit lexer(std::string_view source) {
    // Jinja splits the source on \r\n, \r and \n, rejoins with \n, and drops one trailing newline.
    src_.reserve(source.size());
    for (std::size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<token> run() {
    std::size_t p = 0;
    bool line_starting = true;
    const std::size_t n = src_.size();
    while (p < n) {
      std::size_t q = p;
      for (;;) {
        q = src_.find('{', q);
        if (q == std::string::npos || q + 1 >= n) {
          q = std::string::npos;
          break;
        }
        const char c = src_[q + 1];
        if (c == '{' || c == '%' || c == '#') break;
        ++q;
      }
      if (q == std::string::npos) {
        emit_data(p, src_.substr(p));
        break;
      }
      const char kind = src_[q + 1];
      std::size_t after = q + 2;
      char sign = 0;
      if (after < n && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      std::string text = src_.substr(p, q - p);
      std::size_t raw_end = 0;
      const bool raw = kind == '%' && match_raw_begin(after, &raw_end);
      text = strip_before(text, sign, kind != '{', line_starting);
      emit_data(p, std::move(text));
      if (kind == '#') {
        p = skip_comment(q, after);
      } else if (raw) {
        p = lex_raw(q, raw_end);
      } else {
        p = lex_tag(q, after, kind == '%');
      }
      line_starting = p > 0 && src_[p - 1] == '\n';
    }
    out_.push_back(token{tk::eof, "", at(n)});
    return std::move(out_);
  }

 private:
  std::string src_;
  std::vector<token> out_;
  std::size_t line_off_ = 0;
  int line_ = 1;
  std::size_t line_start_ = 0;

  pos at(std::size_t off) {
    if (off < line_off_) line_off_ = 0, line_ = 1, line_start_ = 0;
    for (; line_off_ < off && line_off_ < src_.size(); ++line_off_)
      if (src_[line_off_] == '\n') ++line_, line_start_ = line_off_ + 1;
    return pos{line_, static_cast<int>(off - line_start_) + 1};
  }

  bool space_at(std::size_t i, std::size_t* next) const {
    if (i >= src_.size()) return false;
    char32_t c;
    *next = next_cp(src_, i, &c);
    return py_space(c);
  }
  std::size_t skip_space(std::size_t i) const {
    std::size_t j;
    while (space_at(i, &j)) i = j;
    return i;
  }
  bool starts(std::size_t i, std::string_view s) const { return src_.compare(i, s.size(), s) == 0; }

  static std::string rstrip_space(const std::string& t) {
    auto cps = to_cps(t);
    std::size_t e = cps.size();
    while (e > 0 && py_space(cps[e - 1])) --e;
    return e == cps.size() ? t : from_cps(cps, 0, e);
  }

  // The text before a tag: `-` strips all trailing whitespace; a block or comment tag (not `+`) strips the
  // spaces between the last line start and the tag when only whitespace stands there.
  static std::string strip_before(std::string text, char sign, bool lstrip_kind, bool line_starting) {
    if (sign == '-') return rstrip_space(text);
    if (sign == '+' || !lstrip_kind) return text;
    const auto nl = text.rfind('\n');
    const std::size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting) return text;
    if (l_pos == text.size()) return text;
    auto cps = to_cps(std::string_view(text).substr(l_pos));
    if (std::all_of(cps.begin(), cps.end(), py_space)) text.resize(l_pos);
    return text;
  }

  void emit_data(std::size_t off, std::string text) {
    if (!text.empty()) out_.push_back(token{tk::data, std::move(text), at(off)});
  }

  // After `{%` and its sign: `\s*raw\s*` then `-%}\s*` or `%}` (a raw tag ignores trim_blocks).
  bool match_raw_begin(std::size_t i, std::size_t* end) const {
    i = skip_space(i);
    if (!starts(i, "raw")) return false;
    i = skip_space(i + 3);
    if (starts(i, "-%}")) {
      *end = skip_space(i + 3);
      return true;
    }
    if (starts(i, "%}")) {
      *end = i + 2;
      return true;
    }
    return false;
  }

  // The end of a block or comment tag at i (`+%}`, `-%}` + whitespace, `%}` + one newline); npos if none.
  std::size_t tag_end(std::size_t i, char close) const {
    const char e[3] = {close, '}', 0};
    if (src_[i] == '+' && starts(i + 1, e)) return i + 3;
    if (src_[i] == '-' && starts(i + 1, e)) return skip_space(i + 3);
    if (starts(i, e)) return i + 2 + (i + 2 < src_.size() && src_[i + 2] == '\n' ? 1 : 0);
    return std::string::npos;
  }

  std::size_t skip_comment(std::size_t begin, std::size_t i) {
    for (; i < src_.size(); ++i) {
      const auto e = tag_end(i, '#');
      if (e != std::string::npos) return e;
    }
    fail(at(begin), "missing end of comment tag");
  }

  std::size_t lex_raw(std::size_t begin, std::size_t body) {
    for (std::size_t q = src_.find("{%", body); q != std::string::npos; q = src_.find("{%", q + 1)) {
      std::size_t i = q + 2;
      char sign = 0;
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) sign = src_[i++];
      i = skip_space(i);
      if (!starts(i, "endraw")) continue;
      i = skip_space(i + 6);
      if (i >= src_.size()) break;
      const auto e = tag_end(i, '%');
      if (e == std::string::npos) continue;
      const bool line_starting = body > 0 && src_[body - 1] == '\n';
      emit_data(body, strip_before(src_.substr(body, q - body), sign, true, line_starting));
      return e;
    }
    fail(at(begin), "missing end of raw directive ({% endraw %})");
  }

  std::size_t lex_tag(std::size_t begin, std::size_t i, bool block) {
    out_.push_back(token{block ? tk::block_begin : tk::var_begin, "", at(begin)});
    std::vector<char> balance;
    const std::size_t n = src_.size();
    while (true) {
      if (i >= n)
        fail(at(begin),
             block ? "unexpected end of template: '{%' not closed" : "unexpected end of template: '{{' not closed");
      if (balance.empty()) {
        if (block) {
          const auto e = tag_end(i, '%');
          if (e != std::string::npos) {
            out_.push_back(token{tk::block_end, "", at(i)});
            return e;
          }
        } else if (src_[i] == '-' && starts(i + 1, "}}")) {
          out_.push_back(token{tk::var_end, "", at(i)});
          return skip_space(i + 3);
        } else if (starts(i, "}}")) {
          out_.push_back(token{tk::var_end, "", at(i)});
          return i + 2;
        }
      }
      std::size_t j;
      if (space_at(i, &j)) {
        i = j;
        continue;
      }
      const char c = src_[i];
      const pos p = at(i);
      if (std::isdigit(static_cast<unsigned char>(c))) {
        i = lex_number(i, p);
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_' || static_cast<unsigned char>(c) >= 0x80) {
        j = i;
        while (j < n && (std::isalnum(static_cast<unsigned char>(src_[j])) || src_[j] == '_' ||
                         static_cast<unsigned char>(src_[j]) >= 0x80))
          ++j;
        out_.push_back(token{tk::name, src_.substr(i, j - i), p});
        i = j;
      } else if (c == '\'' || c == '"') {
        i = lex_string(i, p);
      } else {
        static const char* two[] = {"//", "**", "==", "!=", ">=", "<="};
        std::string op;
        for (const char* t : two)
          if (starts(i, t)) op = t;
        if (op.empty()) {
          if (!std::strchr("+-/*%~[](){}><=.:|,;", c) || c == 0) fail(p, std::string("unexpected char '") + c + "'");
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        if (op == ")" || op == "]" || op == "}") {
          if (balance.empty()) fail(p, "unexpected '" + op + "'");
          if (balance.back() != op[0]) fail(p, "unexpected '" + op + "', expected '" + balance.back() + "'");
          balance.pop_back();
        }
        out_.push_back(token{tk::op, op, p});
        i += op.size();
      }
    }
  }

  // Digits with single underscores between them, as Jinja's number patterns allow.
  std::size_t digits(std::size_t i, int base) const {
    auto ok = [&](char c) {
      if (base == 16) return std::isxdigit(static_cast<unsigned char>(c)) != 0;
      return c >= '0' && c < '0' + base;
    };
    if (i >= src_.size() || !ok(src_[i])) return i;
    ++i;
    while (i < src_.size()) {
      if (ok(src_[i])) {
        ++i;
      } else if (src_[i] == '_' && i + 1 < src_.size() && ok(src_[i + 1])) {
        i += 2;
      } else {
        break;
      }
    }
    return i;
  }

  std::size_t lex_number(std::size_t i, pos p) {
    auto clean = [](std::string s) {
      s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
      return s;
    };
    const std::size_t n = src_.size();
    // Floats first, as Jinja: digits then a fraction and/or an exponent (not right after a '.').
    if (i == 0 || src_[i - 1] != '.') {
      std::size_t j = digits(i, 10), k = j;
      bool frac = false, expo = false;
      if (k < n && src_[k] == '.' && k + 1 < n && std::isdigit(static_cast<unsigned char>(src_[k + 1]))) {
        k = digits(k + 1, 10);
        frac = true;
      }
      if (k < n && (src_[k] == 'e' || src_[k] == 'E')) {
        std::size_t m = k + 1;
        if (m < n && (src_[m] == '+' || src_[m] == '-')) ++m;
        const std::size_t e = digits(m, 10);
        if (e > m) k = e, expo = true;
      }
      if (frac || expo) {
        token t{tk::floating, src_.substr(i, k - i), p};
        t.fval = std::strtod(clean(t.text).c_str(), nullptr);
        out_.push_back(std::move(t));
        return k;
      }
    }
    int base = 10;
    std::size_t start = i, j;
    if (src_[i] == '0' && i + 1 < n && src_[i + 1] != 0 && std::strchr("bBoOxX", src_[i + 1])) {
      const char b = static_cast<char>(std::tolower(static_cast<unsigned char>(src_[i + 1])));
      base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
      std::size_t m = i + 2;
      if (m < n && src_[m] == '_') ++m;
      j = digits(m, base);
      if (j > m) {
        start = i + 2;
      } else {
        base = 10;
        j = i + 1;
      }
    } else if (src_[i] == '0') {
      j = i + 1;
      while (j < n && (src_[j] == '0' || (src_[j] == '_' && j + 1 < n && src_[j + 1] == '0')))
        j += src_[j] == '_' ? 2 : 1;
    } else {
      j = digits(i, 10);
    }
    const std::string text = clean(src_.substr(start, j - start));
    std::int64_t v = 0;
    auto r = std::from_chars(text.data(), text.data() + text.size(), v, base);
    if (r.ec != std::errc()) fail(p, "integer literal " + src_.substr(i, j - i) + " does not fit in 64 bits");
    token t{tk::integer, src_.substr(i, j - i), p};
    t.ival = v;
    out_.push_back(std::move(t));
    return j;
  }

  // A quoted string with Python's escapes (Jinja decodes literals with `unicode-escape`).
  std::size_t lex_string(std::size_t i, pos p) {
    const char q = src_[i];
    std::string out;
    std::size_t j = i + 1;
    auto hex = [&](std::size_t at, int count) -> char32_t {
      char32_t v = 0;
      for (int k = 0; k < count; ++k) {
        if (at + k >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[at + k])))
          fail(p, "truncated \\x, \\u or \\U escape in a string literal");
        const char c = src_[at + k];
        v = v * 16 +
            static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (std::tolower(c) - 'a' + 10));
      }
      return v;
    };
    while (true) {
      if (j >= src_.size()) fail(p, std::string("unexpected char '") + q + "' (unterminated string)");
      const char c = src_[j];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        ++j;
        continue;
      }
      if (j + 1 >= src_.size()) fail(p, std::string("unexpected char '") + q + "' (unterminated string)");
      const char e = src_[j + 1];
      j += 2;
      switch (e) {
        case '\n':
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
          put_cp(out, hex(j, 2)), j += 2;
          break;
        case 'u':
          put_cp(out, hex(j, 4)), j += 4;
          break;
        case 'U': {
          const char32_t v = hex(j, 8);
          if (v > 0x10FFFF) fail(p, "\\U escape out of range");
          put_cp(out, v);
          j += 8;
          break;
        }
        case 'N':
          fail(p, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && j < src_.size() && src_[j] >= '0' && src_[j] <= '7'; ++k, ++j)
              v = v * 8 + static_cast<char32_t>(src_[j] - '0');
            put_cp(out, v);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    out_.push_back(token{tk::string, std::move(out), p});
    return j + 1;
  }
};

// ---- Syntax tree ----------------------------------------------------------------------------------------------

enum class ek : std::uint8_t {
  literal,
  name,
  list,
  tuple,
  dict,
  attr,
  item,
  slice,
  neg,
  pos,
  not_,
  binop,
  compare,
  and_,
  or_,
  cond,
  filter,
  test,
  call,
  block_value
};
enum class op : std::uint8_t { add, sub, mul, div, floordiv, mod, pow, concat, eq, ne, lt, le, gt, ge, in, not_in };

enum class filter_id : std::uint8_t {
  abs,
  capitalize,
  center,
  count,
  default_,
  dictsort,
  escape,
  first,
  float_,
  indent,
  int_,
  items,
  join,
  last,
  length,
  list,
  lower,
  map,
  reject,
  rejectattr,
  replace,
  reverse,
  safe,
  select,
  selectattr,
  sort,
  string,
  sum,
  title,
  tojson,
  trim,
  unique,
  upper,
  wordcount
};
enum class test_id : std::uint8_t {
  defined,
  undefined,
  none,
  boolean,
  false_,
  true_,
  integer,
  float_,
  number,
  string,
  mapping,
  iterable,
  sequence,
  callable,
  odd,
  even,
  divisibleby,
  eq,
  ne,
  gt,
  ge,
  lt,
  le,
  in,
  sameas,
  lower,
  upper,
  escaped
};

const std::unordered_map<std::string_view, filter_id>& filter_names() {
  static const std::unordered_map<std::string_view, filter_id> m = {{"abs", filter_id::abs},
                                                                    {"capitalize", filter_id::capitalize},
                                                                    {"center", filter_id::center},
                                                                    {"count", filter_id::count},
                                                                    {"default", filter_id::default_},
                                                                    {"d", filter_id::default_},
                                                                    {"dictsort", filter_id::dictsort},
                                                                    {"escape", filter_id::escape},
                                                                    {"e", filter_id::escape},
                                                                    {"first", filter_id::first},
                                                                    {"float", filter_id::float_},
                                                                    {"indent", filter_id::indent},
                                                                    {"int", filter_id::int_},
                                                                    {"items", filter_id::items},
                                                                    {"join", filter_id::join},
                                                                    {"last", filter_id::last},
                                                                    {"length", filter_id::length},
                                                                    {"list", filter_id::list},
                                                                    {"lower", filter_id::lower},
                                                                    {"map", filter_id::map},
                                                                    {"reject", filter_id::reject},
                                                                    {"rejectattr", filter_id::rejectattr},
                                                                    {"replace", filter_id::replace},
                                                                    {"reverse", filter_id::reverse},
                                                                    {"safe", filter_id::safe},
                                                                    {"select", filter_id::select},
                                                                    {"selectattr", filter_id::selectattr},
                                                                    {"sort", filter_id::sort},
                                                                    {"string", filter_id::string},
                                                                    {"sum", filter_id::sum},
                                                                    {"title", filter_id::title},
                                                                    {"tojson", filter_id::tojson},
                                                                    {"trim", filter_id::trim},
                                                                    {"unique", filter_id::unique},
                                                                    {"upper", filter_id::upper},
                                                                    {"wordcount", filter_id::wordcount}};
  return m;
}

const std::unordered_map<std::string_view, test_id>& test_names() {
  static const std::unordered_map<std::string_view, test_id> m = {{"defined", test_id::defined},
                                                                  {"undefined", test_id::undefined},
                                                                  {"none", test_id::none},
                                                                  {"boolean", test_id::boolean},
                                                                  {"false", test_id::false_},
                                                                  {"true", test_id::true_},
                                                                  {"integer", test_id::integer},
                                                                  {"float", test_id::float_},
                                                                  {"number", test_id::number},
                                                                  {"string", test_id::string},
                                                                  {"mapping", test_id::mapping},
                                                                  {"iterable", test_id::iterable},
                                                                  {"sequence", test_id::sequence},
                                                                  {"callable", test_id::callable},
                                                                  {"odd", test_id::odd},
                                                                  {"even", test_id::even},
                                                                  {"divisibleby", test_id::divisibleby},
                                                                  {"eq", test_id::eq},
                                                                  {"equalto", test_id::eq},
                                                                  {"==", test_id::eq},
                                                                  {"ne", test_id::ne},
                                                                  {"!=", test_id::ne},
                                                                  {"gt", test_id::gt},
                                                                  {"greaterthan", test_id::gt},
                                                                  {">", test_id::gt},
                                                                  {"ge", test_id::ge},
                                                                  {">=", test_id::ge},
                                                                  {"lt", test_id::lt},
                                                                  {"lessthan", test_id::lt},
                                                                  {"<", test_id::lt},
                                                                  {"le", test_id::le},
                                                                  {"<=", test_id::le},
                                                                  {"in", test_id::in},
                                                                  {"sameas", test_id::sameas},
                                                                  {"lower", test_id::lower},
                                                                  {"upper", test_id::upper},
                                                                  {"escaped", test_id::escaped}};
  return m;
}

struct expr {
  ek k;
  pos at;
  value lit;                                // literal
  std::string name;                         // name, attribute, filter or test name
  std::uint8_t id = 0;                      // op, filter_id or test_id
  bool negated = false;                     // `is not`
  std::vector<std::unique_ptr<expr>> args;  // operands and positional arguments (null: an omitted slice part)
  std::vector<std::pair<std::string, std::unique_ptr<expr>>> kwargs;
  std::vector<op> ops;  // comparison chain
  int depth = 1;
};
using expr_ptr = std::unique_ptr<expr>;

enum class sk : std::uint8_t {
  text,
  output,
  if_,
  for_,
  set,
  set_block,
  macro,
  break_,
  continue_,
  generation,
  filter_block
};

struct stmt;
using body = std::vector<std::unique_ptr<stmt>>;

struct stmt {
  sk k;
  pos at;
  std::string text;                  // text; macro name
  expr_ptr e;                        // output / set value / for iterable / block filter chain
  expr_ptr cond;                     // for ... if cond
  std::vector<expr_ptr> conds;       // if / elif conditions
  std::vector<body> bodies;          // if: one per condition (+ else); for: body (+ else); others: body
  std::vector<std::string> targets;  // for / set names; set ns.attr: {ns, attr}
  bool attr_target = false;          // set ns.attr
  bool tuple_target = false;         // for a, b / set a, b
  std::vector<std::string> params;   // macro parameters
  std::vector<expr_ptr> defaults;    // macro defaults (null: none)
};

}  // namespace

struct program {
  body root;
  limits lim;
};

namespace {

// ---- Parser ---------------------------------------------------------------------------------------------------

class parser {
 public:
  parser(std::vector<token> toks, const limits& lim) : t_(std::move(toks)), lim_(lim) {}

  body parse_template() {
    std::string end;
    return parse_body({}, &end);
  }

 private:
  std::vector<token> t_;
  std::size_t i_ = 0;
  const limits& lim_;
  int nesting_ = 0;
  int loops_ = 0;

  struct nest {
    parser& p;
    explicit nest(parser& p_, pos at) : p(p_) {
      if (++p.nesting_ > p.lim_.max_depth)
        fail(at, "template nested more than max_depth (" + std::to_string(p.lim_.max_depth) + ") levels deep");
    }
    ~nest() { --p.nesting_; }
  };

  const token& cur() const { return t_[i_]; }
  const token& peek(std::size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  bool is_op(std::string_view o) const { return cur().k == tk::op && cur().text == o; }
  bool is_name(std::string_view n) const { return cur().k == tk::name && cur().text == n; }

  static std::string describe(const token& t) {
    switch (t.k) {
      case tk::data:
        return "template text";
      case tk::var_begin:
        return "'{{'";
      case tk::var_end:
        return "end of print statement '}}'";
      case tk::block_begin:
        return "'{%'";
      case tk::block_end:
        return "end of statement block '%}'";
      case tk::eof:
        return "end of template";
      case tk::string:
        return "string literal";
      default:
        return "'" + t.text + "'";
    }
  }
  [[noreturn]] void unexpected(const std::string& wanted = "") const {
    fail(cur().at, "unexpected " + describe(cur()) + (wanted.empty() ? "" : ", expected " + wanted));
  }
  void expect_op(std::string_view o) {
    if (!is_op(o)) unexpected("'" + std::string(o) + "'");
    next();
  }
  std::string expect_name() {
    if (cur().k != tk::name) unexpected("a name");
    return next().text;
  }
  void expect_block_end() {
    if (cur().k != tk::block_end) unexpected("end of statement block '%}'");
    next();
  }

  expr_ptr node(ek k, pos at) {
    auto e = std::make_unique<expr>();
    e->k = k;
    e->at = at;
    return e;
  }
  // Every child raises the node's depth; the tree depth bounds the evaluator's recursion.
  expr_ptr done(expr_ptr e) {
    int d = 0;
    for (const auto& a : e->args)
      if (a) d = std::max(d, a->depth);
    for (const auto& [k, a] : e->kwargs) d = std::max(d, a->depth);
    e->depth = d + 1;
    if (e->depth > lim_.max_depth)
      fail(e->at, "expression nested more than max_depth (" + std::to_string(lim_.max_depth) + ") levels deep");
    return e;
  }

  // ---- statements

  body parse_body(std::initializer_list<std::string_view> ends, std::string* found) {
    nest guard(*this, cur().at);
    body out;
    while (true) {
      const token& t = cur();
      if (t.k == tk::eof) {
        if (ends.size() == 0) return out;
        std::string want;
        for (auto e : ends) want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
        fail(t.at, "unexpected end of template, expected " + want);
      }
      if (t.k == tk::data) {
        auto s = std::make_unique<stmt>();
        s->k = sk::text;
        s->at = t.at;
        s->text = t.text;
        out.push_back(std::move(s));
        next();
      } else if (t.k == tk::var_begin) {
        auto s = std::make_unique<stmt>();
        s->k = sk::output;
        s->at = t.at;
        next();
        s->e = parse_tuple(true);
        if (cur().k != tk::var_end) unexpected("end of print statement '}}'");
        next();
        out.push_back(std::move(s));
      } else if (t.k == tk::block_begin) {
        next();
        if (cur().k != tk::name) unexpected("a statement name");
        const std::string& name = cur().text;
        if (std::find(ends.begin(), ends.end(), name) != ends.end()) {
          *found = next().text;
          return out;
        }
        out.push_back(parse_statement());
      } else {
        unexpected();
      }
    }
  }

  std::unique_ptr<stmt> parse_statement() {
    const token& t = cur();
    const std::string name = t.text;
    auto s = std::make_unique<stmt>();
    s->at = t.at;
    next();
    std::string end;
    if (name == "if") {
      s->k = sk::if_;
      s->conds.push_back(parse_expression(false));
      expect_block_end();
      while (true) {
        s->bodies.push_back(parse_body({"elif", "else", "endif"}, &end));
        if (end == "elif") {
          s->conds.push_back(parse_expression(false));
          expect_block_end();
        } else if (end == "else") {
          expect_block_end();
          s->bodies.push_back(parse_body({"endif"}, &end));
          break;
        } else {
          break;
        }
      }
      expect_block_end();
    } else if (name == "for") {
      s->k = sk::for_;
      parse_targets(*s, false);
      if (!is_name("in")) unexpected("'in'");
      next();
      s->e = parse_tuple(false);
      if (is_name("if")) {
        next();
        s->cond = parse_expression(true);
      }
      if (is_name("recursive")) fail(cur().at, "recursive loops are not supported");
      expect_block_end();
      ++loops_;
      s->bodies.push_back(parse_body({"else", "endfor"}, &end));
      --loops_;
      if (end == "else") {
        expect_block_end();
        s->bodies.push_back(parse_body({"endfor"}, &end));
      }
      expect_block_end();
    } else if (name == "set") {
      parse_targets(*s, true);
      if (is_op("=")) {
        s->k = sk::set;
        next();
        s->e = parse_tuple(true);
        expect_block_end();
      } else {
        if (s->attr_target || s->tuple_target) unexpected("'='");
        s->k = sk::set_block;
        s->e = parse_filter_chain();
        expect_block_end();
        s->bodies.push_back(parse_body({"endset"}, &end));
        expect_block_end();
      }
    } else if (name == "macro") {
      s->k = sk::macro;
      s->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        if (!s->params.empty()) expect_op(",");
        if (is_op(")")) break;
        s->params.push_back(expect_name());
        if (is_op("=")) {
          next();
          s->defaults.push_back(parse_expression(true));
        } else {
          s->defaults.push_back(nullptr);
        }
      }
      next();
      expect_block_end();
      const int saved = loops_;
      loops_ = 0;
      s->bodies.push_back(parse_body({"endmacro"}, &end));
      loops_ = saved;
      if (cur().k == tk::name) next();
      expect_block_end();
    } else if (name == "break" || name == "continue") {
      if (loops_ == 0) fail(s->at, "'" + name + "' outside loop");
      s->k = name == "break" ? sk::break_ : sk::continue_;
      expect_block_end();
    } else if (name == "generation") {
      s->k = sk::generation;
      expect_block_end();
      s->bodies.push_back(parse_body({"endgeneration"}, &end));
      expect_block_end();
    } else if (name == "filter") {
      s->k = sk::filter_block;
      s->e = parse_filter_chain();
      if (s->e->k == ek::block_value) unexpected("a filter name");
      expect_block_end();
      s->bodies.push_back(parse_body({"endfilter"}, &end));
      expect_block_end();
    } else if (name == "raw") {
      fail(s->at, "malformed raw block");
    } else if (name == "extends" || name == "include" || name == "import" || name == "from" || name == "block" ||
               name == "call" || name == "with" || name == "autoescape" || name == "do" || name == "trans") {
      fail(s->at, "'" + name + "' is not supported in chat templates (no other templates can be loaded or called)");
    } else if (name.rfind("end", 0) == 0 || name == "elif" || name == "else") {
      fail(s->at, "unexpected '" + name + "'");
    } else {
      fail(s->at, "unknown statement '" + name + "'");
    }
    return s;
  }

  // `x`, `a, b`, `(a, b)` (for loops), `ns.attr` (set).
  void parse_targets(stmt& s, bool allow_attr) {
    const bool paren = is_op("(");
    if (paren) next();
    s.targets.push_back(expect_name());
    if (allow_attr && !paren && is_op(".")) {
      next();
      s.targets.push_back(expect_name());
      s.attr_target = true;
      return;
    }
    while (is_op(",")) {
      next();
      if (cur().k != tk::name) break;
      s.targets.push_back(expect_name());
      s.tuple_target = true;
    }
    if (paren) {
      expect_op(")");
      s.tuple_target = true;
    }
  }

  // `| f(args) | g` applied to a block's text.
  expr_ptr parse_filter_chain() {
    auto base = node(ek::block_value, cur().at);
    if (!is_op("|") && cur().k != tk::block_end && cur().k == tk::name) {
      // `{% filter upper %}`: the chain starts without a pipe.
      base = parse_filter(done(std::move(base)), false);
    }
    while (is_op("|")) {
      next();
      base = parse_filter(std::move(base), false);
    }
    return done(std::move(base));
  }

  // ---- expressions

  expr_ptr parse_tuple(bool with_condexpr) {
    const pos at = cur().at;
    auto first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    auto t = node(ek::tuple, at);
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (cur().k == tk::block_end || cur().k == tk::var_end || is_op(")") || (!with_condexpr && is_name("if"))) break;
      t->args.push_back(parse_expression(with_condexpr));
    }
    return done(std::move(t));
  }

  expr_ptr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  expr_ptr parse_condexpr() {
    auto e = parse_or();
    while (is_name("if")) {
      auto c = node(ek::cond, cur().at);
      next();
      auto test = parse_or();
      expr_ptr other;
      if (is_name("else")) {
        next();
        other = parse_condexpr();
      }
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(test));
      c->args.push_back(std::move(other));
      e = done(std::move(c));
    }
    return e;
  }

  expr_ptr binary(ek k, pos at, expr_ptr a, expr_ptr b, std::uint8_t id = 0) {
    auto n = node(k, at);
    n->id = id;
    n->args.push_back(std::move(a));
    n->args.push_back(std::move(b));
    return done(std::move(n));
  }

  expr_ptr parse_or() {
    auto e = parse_and();
    while (is_name("or")) {
      const pos at = next().at;
      e = binary(ek::or_, at, std::move(e), parse_and());
    }
    return e;
  }

  expr_ptr parse_and() {
    auto e = parse_not();
    while (is_name("and")) {
      const pos at = next().at;
      e = binary(ek::and_, at, std::move(e), parse_not());
    }
    return e;
  }

  expr_ptr parse_not() {
    if (is_name("not")) {
      nest guard(*this, cur().at);
      auto n = node(ek::not_, next().at);
      n->args.push_back(parse_not());
      return done(std::move(n));
    }
    return parse_compare();
  }

  expr_ptr parse_compare() {
    const pos at = cur().at;
    auto first = parse_math1();
    expr_ptr chain;
    while (true) {
      op o;
      if (cur().k == tk::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
                                cur().text == "<=" || cur().text == ">=")) {
        const std::string& t = cur().text;
        o = t == "=="   ? op::eq
            : t == "!=" ? op::ne
            : t == "<"  ? op::lt
            : t == ">"  ? op::gt
            : t == "<=" ? op::le
                        : op::ge;
        next();
      } else if (is_name("in")) {
        o = op::in;
        next();
      } else if (is_name("not") && peek().k == tk::name && peek().text == "in") {
        o = op::not_in;
        next();
        next();
      } else {
        break;
      }
      if (!chain) {
        chain = node(ek::compare, at);
        chain->args.push_back(std::move(first));
      }
      chain->ops.push_back(o);
      chain->args.push_back(parse_math1());
    }
    return chain ? done(std::move(chain)) : std::move(first);
  }

  expr_ptr parse_math1() {
    auto e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const op o = cur().text == "+" ? op::add : op::sub;
      const pos at = next().at;
      e = binary(ek::binop, at, std::move(e), parse_concat(), static_cast<std::uint8_t>(o));
    }
    return e;
  }

  expr_ptr parse_concat() {
    auto e = parse_math2();
    while (is_op("~")) {
      const pos at = next().at;
      e = binary(ek::binop, at, std::move(e), parse_math2(), static_cast<std::uint8_t>(op::concat));
    }
    return e;
  }

  expr_ptr parse_math2() {
    auto e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string& t = cur().text;
      const op o = t == "*" ? op::mul : t == "/" ? op::div : t == "//" ? op::floordiv : op::mod;
      const pos at = next().at;
      e = binary(ek::binop, at, std::move(e), parse_pow(), static_cast<std::uint8_t>(o));
    }
    return e;
  }

  expr_ptr parse_pow() {
    auto e = parse_unary(true);
    while (is_op("**")) {
      const pos at = next().at;
      e = binary(ek::binop, at, std::move(e), parse_unary(true), static_cast<std::uint8_t>(op::pow));
    }
    return e;
  }

  expr_ptr parse_unary(bool with_filter) {
    nest guard(*this, cur().at);
    expr_ptr e;
    if (is_op("-") || is_op("+")) {
      auto n = node(cur().text == "-" ? ek::neg : ek::pos, cur().at);
      next();
      n->args.push_back(parse_unary(false));
      e = done(std::move(n));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  expr_ptr parse_primary() {
    const token& t = cur();
    const pos at = t.at;
    if (t.k == tk::name) {
      const std::string& n = t.text;
      auto e = node(ek::literal, at);
      if (n == "true" || n == "True") {
        e->lit = make_bool(true);
      } else if (n == "false" || n == "False") {
        e->lit = make_bool(false);
      } else if (n == "none" || n == "None") {
        e->lit = make_none();
      } else {
        e->k = ek::name;
        e->name = n;
      }
      next();
      return done(std::move(e));
    }
    if (t.k == tk::string) {
      std::string s;
      while (cur().k == tk::string) s += next().text;
      auto e = node(ek::literal, at);
      e->lit = make_str(std::move(s));
      return done(std::move(e));
    }
    if (t.k == tk::integer || t.k == tk::floating) {
      auto e = node(ek::literal, at);
      e->lit = t.k == tk::integer ? make_int(t.ival) : make_float(t.fval);
      next();
      return done(std::move(e));
    }
    if (is_op("(")) {
      next();
      if (is_op(")")) {
        next();
        return done(node(ek::tuple, at));
      }
      auto first = parse_expression(true);
      if (is_op(")")) {
        next();
        return first;
      }
      auto tup = node(ek::tuple, at);
      tup->args.push_back(std::move(first));
      while (is_op(",")) {
        next();
        if (is_op(")")) break;
        tup->args.push_back(parse_expression(true));
      }
      expect_op(")");
      return done(std::move(tup));
    }
    if (is_op("[")) {
      next();
      auto l = node(ek::list, at);
      while (!is_op("]")) {
        if (!l->args.empty()) expect_op(",");
        if (is_op("]")) break;
        l->args.push_back(parse_expression(true));
      }
      next();
      return done(std::move(l));
    }
    if (is_op("{")) {
      next();
      auto d = node(ek::dict, at);
      while (!is_op("}")) {
        if (!d->args.empty()) expect_op(",");
        if (is_op("}")) break;
        d->args.push_back(parse_expression(true));
        expect_op(":");
        d->args.push_back(parse_expression(true));
      }
      next();
      return done(std::move(d));
    }
    unexpected();
  }

  expr_ptr parse_postfix(expr_ptr e) {
    while (true) {
      if (is_op(".")) {
        const pos at = next().at;
        if (cur().k == tk::name) {
          auto n = node(ek::attr, at);
          n->name = next().text;
          n->args.push_back(std::move(e));
          e = done(std::move(n));
        } else if (cur().k == tk::integer) {
          auto idx = node(ek::literal, cur().at);
          idx->lit = make_int(next().ival);
          e = binary(ek::item, at, std::move(e), done(std::move(idx)));
        } else {
          unexpected("an attribute name");
        }
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  expr_ptr parse_subscript(expr_ptr obj) {
    const pos at = next().at;
    expr_ptr parts[3];
    bool slice = false;
    if (!is_op(":")) parts[0] = parse_expression(true);
    if (is_op(":")) {
      slice = true;
      next();
      if (!is_op(":") && !is_op("]")) parts[1] = parse_expression(true);
      if (is_op(":")) {
        next();
        if (!is_op("]")) parts[2] = parse_expression(true);
      }
    }
    expect_op("]");
    auto n = node(slice ? ek::slice : ek::item, at);
    n->args.push_back(std::move(obj));
    if (slice) {
      for (auto& p : parts) n->args.push_back(std::move(p));
    } else {
      n->args.push_back(std::move(parts[0]));
    }
    return done(std::move(n));
  }

  void parse_args(expr& n) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail(cur().at, "*args and **kwargs in calls are not supported");
      if (cur().k == tk::name && peek().k == tk::op && peek().text == "=") {
        std::string key = next().text;
        next();
        n.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!n.kwargs.empty()) fail(cur().at, "positional argument follows keyword argument");
        n.args.push_back(parse_expression(true));
      }
    }
    next();
  }

  expr_ptr parse_call(expr_ptr callee) {
    auto n = node(ek::call, cur().at);
    n->args.push_back(std::move(callee));
    parse_args(*n);
    return done(std::move(n));
  }

  expr_ptr parse_filter(expr_ptr operand, bool) {
    const pos at = cur().at;
    std::string name = expect_name();
    while (is_op(".")) {
      next();
      name += "." + expect_name();
    }
    const auto it = filter_names().find(name);
    if (it == filter_names().end()) fail(at, "unknown filter '" + name + "'");
    auto n = node(ek::filter, at);
    n->name = name;
    n->id = static_cast<std::uint8_t>(it->second);
    n->args.push_back(std::move(operand));
    if (is_op("(")) parse_args(*n);
    return done(std::move(n));
  }

  expr_ptr parse_filter_expr(expr_ptr e) {
    while (true) {
      if (is_op("|")) {
        next();
        e = parse_filter(std::move(e), true);
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  expr_ptr parse_test(expr_ptr operand) {
    const pos at = next().at;
    bool negated = false;
    if (is_name("not")) {
      next();
      negated = true;
    }
    const pos name_at = cur().at;
    std::string name = expect_name();
    while (is_op(".")) {
      next();
      name += "." + expect_name();
    }
    const auto it = test_names().find(name);
    if (it == test_names().end()) fail(name_at, "unknown test '" + name + "'");
    auto n = node(ek::test, at);
    n->name = name;
    n->id = static_cast<std::uint8_t>(it->second);
    n->negated = negated;
    n->args.push_back(std::move(operand));
    const token& c = cur();
    if (is_op("(")) {
      parse_args(*n);
    } else if ((c.k == tk::name || c.k == tk::string || c.k == tk::integer || c.k == tk::floating || is_op("(") ||
                is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail(c.at, "you cannot chain multiple tests with 'is'");
      nest guard(*this, c.at);
      n->args.push_back(parse_postfix(parse_primary()));
    }
    return done(std::move(n));
  }
};

// ---- Evaluator ------------------------------------------------------------------------------------------------

struct frame {
  frame() { vars.reserve(4); }
  std::vector<std::pair<std::string, value>> vars;
  std::shared_ptr<frame> parent;
  value* find(std::string_view n) {
    for (auto& [k, v] : vars)
      if (k == n) return &v;
    return nullptr;
  }
  void set(const std::string& n, value v) {
    if (value* p = find(n)) {
      *p = std::move(v);
    } else {
      vars.emplace_back(n, std::move(v));
    }
  }
};
using frame_ptr = std::shared_ptr<frame>;

frame_ptr child(const frame_ptr& parent) {
  auto f = std::make_shared<frame>();
  f->parent = parent;
  return f;
}

enum class flow { normal, brk, cont };

struct call_args {
  std::vector<value> pos;
  std::vector<std::pair<std::string, value>> kw;
  const value* get(std::size_t i, std::string_view name) const {
    if (i < pos.size()) return &pos[i];
    for (const auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
};

const value* dict_obj::find(const value& key) const {
  if (key.k == vk::string) return find(std::string_view(key.str()));
  for (const auto& [k, v] : items) {
    if (k.k == key.k || (k.is_num() && key.is_num())) {
      if (k.is_num() && key.is_num() ? k.as_double() == key.as_double() : (k.k == vk::none)) return &v;
    }
  }
  return nullptr;
}

void dict_obj::set(const value& key, value v) {
  for (auto& [k, old] : items) {
    const bool same = key.k == vk::string ? (k.k == vk::string && k.str() == key.str())
                      : key.is_num()      ? (k.is_num() && k.as_double() == key.as_double())
                                          : k.k == key.k && key.k == vk::none;
    if (same) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

class renderer {
 public:
  renderer(const program& p, const render_options& opt) : lim_(p.lim), opt_(opt), prog_(p) {
    max_items_ = std::max<std::size_t>(1, lim_.max_output_bytes / 64);
    if (opt.now) {
      now_ = *opt.now;
    } else {
      const std::time_t t = std::time(nullptr);
      localtime_r(&t, &now_);
    }
  }

  std::string run(const nlohmann::ordered_json& context) {
    if (!context.is_object() && !context.is_null()) fail({}, "the render context must be a JSON object");
    auto globals = std::make_shared<frame>();
    globals->set("range", make_builtin(builtin::range, "range"));
    globals->set("namespace", make_builtin(builtin::namespace_, "namespace"));
    globals->set("dict", make_builtin(builtin::dict, "dict"));
    globals->set("raise_exception", make_builtin(builtin::raise_exception, "raise_exception"));
    globals->set("strftime_now", make_builtin(builtin::strftime_now, "strftime_now"));
    if (context.is_object())
      for (const auto& [k, v] : context.items()) globals->set(k, from_json(v, 0));
    top_ = child(globals);
    std::string out;
    main_out_ = &out;
    if (opt_.generation_spans) opt_.generation_spans->clear();
    exec_body(prog_.root, top_, out);
    return out;
  }

 private:
  const limits& lim_;
  const render_options& opt_;
  const program& prog_;
  std::tm now_{};
  std::size_t max_items_;
  std::int64_t steps_ = 0;
  int depth_ = 0, macro_depth_ = 0;
  std::string* main_out_ = nullptr;
  frame_ptr top_;
  std::vector<value> block_values_;

  struct depth_guard {
    renderer& r;
    depth_guard(renderer& r_, pos at) : r(r_) {
      if (++r.depth_ > runtime_depth_cap)
        fail(at, "rendering nested more than " + std::to_string(runtime_depth_cap) + " levels deep (macro recursion?)");
    }
    ~depth_guard() { --r.depth_; }
  };

  void tick(pos at, std::int64_t n = 1) {
    steps_ += n;
    if (steps_ > lim_.max_steps)
      fail(at, "rendering took more than max_steps (" + std::to_string(lim_.max_steps) + ") steps");
  }
  void check_len(pos at, std::size_t bytes) {
    if (bytes > lim_.max_output_bytes)
      fail(at, "string longer than max_output_bytes (" + std::to_string(lim_.max_output_bytes) + ")");
    tick(at, static_cast<std::int64_t>(bytes / 16));
  }
  void check_items(pos at, std::size_t n) {
    if (n > max_items_) fail(at, "list longer than max_output_bytes / 64 (" + std::to_string(max_items_) + ") items");
    tick(at, static_cast<std::int64_t>(n));
  }
  value str_value(pos at, std::string s) {
    check_len(at, s.size());
    return make_str(std::move(s));
  }
  void emit(std::string& out, std::string_view s, pos at) {
    if (out.size() + s.size() > lim_.max_output_bytes)
      fail(at, "output longer than max_output_bytes (" + std::to_string(lim_.max_output_bytes) + ")");
    tick(at, static_cast<std::int64_t>(s.size() / 16));
    out.append(s);
  }

  std::string to_str(const value& v, pos at) {
    if (v.k == vk::string) return v.str();
    bounded b{{}, lim_.max_output_bytes, at};
    str_into(v, b, 0);
    return std::move(b.out);
  }

  [[noreturn]] static void undefined_error(const value& v, pos at) {
    fail(at, v.s && !v.s->empty() ? *v.s : "value is undefined");
  }
  [[noreturn]] static void type_error(pos at, const std::string& what) { fail(at, what); }

  // ---- statements

  flow exec_body(const body& b, const frame_ptr& f, std::string& out) {
    depth_guard g(*this, b.empty() ? pos{} : b.front()->at);
    for (const auto& s : b) {
      const flow fl = exec(*s, f, out);
      if (fl != flow::normal) return fl;
    }
    return flow::normal;
  }

  flow exec(const stmt& s, const frame_ptr& f, std::string& out) {
    switch (s.k) {
      case sk::text:
        emit(out, s.text, s.at);
        return flow::normal;
      case sk::output: {
        const value v = eval(*s.e, f);
        if (v.k == vk::string) {
          emit(out, v.str(), s.at);
        } else {
          emit(out, to_str(v, s.at), s.at);
        }
        return flow::normal;
      }
      case sk::if_:
        for (std::size_t i = 0; i < s.bodies.size(); ++i)
          if (i >= s.conds.size() || truthy(eval(*s.conds[i], f))) return exec_body(s.bodies[i], f, out);
        return flow::normal;
      case sk::for_:
        return exec_for(s, f, out);
      case sk::set:
        assign(s, eval(*s.e, f), f);
        return flow::normal;
      case sk::set_block: {
        std::string captured;
        exec_body(s.bodies[0], child(f), captured);
        assign(s, apply_block_filters(*s.e, std::move(captured), f), f);
        return flow::normal;
      }
      case sk::filter_block: {
        std::string captured;
        const flow fl = exec_body(s.bodies[0], child(f), captured);
        const value v = apply_block_filters(*s.e, std::move(captured), f);
        emit(out, to_str(v, s.at), s.at);
        return fl;
      }
      case sk::macro: {
        value v;
        v.k = vk::callable;
        auto c = std::make_shared<callable_obj>();
        c->kind = fn_kind::macro;
        c->name = s.text;
        c->macro = &s;
        c->scope = f;
        v.o = std::move(c);
        f->set(s.text, std::move(v));
        return flow::normal;
      }
      case sk::break_:
        return flow::brk;
      case sk::continue_:
        return flow::cont;
      case sk::generation: {
        const std::size_t start = out.size();
        const flow fl = exec_body(s.bodies[0], child(f), out);
        if (&out == main_out_ && opt_.generation_spans) opt_.generation_spans->emplace_back(start, out.size());
        return fl;
      }
    }
    return flow::normal;
  }

  value apply_block_filters(const expr& chain, std::string captured, const frame_ptr& f) {
    block_values_.push_back(make_str(std::move(captured)));
    value v = eval(chain, f);
    block_values_.pop_back();
    return v;
  }

  void unpack(const std::vector<std::string>& names, const value& v, const frame_ptr& f, pos at) {
    if (v.k == vk::undefined) undefined_error(v, at);
    const auto items = iterate(v, at);
    if (items.size() < names.size())
      fail(at, "not enough values to unpack (expected " + std::to_string(names.size()) + ", got " +
                   std::to_string(items.size()) + ")");
    if (items.size() > names.size())
      fail(at, "too many values to unpack (expected " + std::to_string(names.size()) + ")");
    for (std::size_t i = 0; i < names.size(); ++i) f->set(names[i], items[i]);
  }

  void assign(const stmt& s, value v, const frame_ptr& f) {
    if (s.attr_target) {
      const value target = lookup(s.targets[0], f);
      if (target.k != vk::ns) fail(s.at, "cannot assign attribute on non-namespace object");
      target.dict().set(make_str(s.targets[1]), std::move(v));
    } else if (s.tuple_target) {
      unpack(s.targets, v, f, s.at);
    } else {
      f->set(s.targets[0], std::move(v));
    }
  }

  void bind_targets(const stmt& s, const value& item, const frame_ptr& f) {
    if (s.tuple_target) {
      unpack(s.targets, item, f, s.at);
    } else {
      f->set(s.targets[0], item);
    }
  }

  flow exec_for(const stmt& s, const frame_ptr& f, std::string& out) {
    std::vector<value> items = iterate(eval(*s.e, f), s.e->at);
    if (s.cond) {
      std::vector<value> kept;
      for (auto& item : items) {
        tick(s.at);
        auto fr = child(f);
        bind_targets(s, item, fr);
        if (truthy(eval(*s.cond, fr))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) return s.bodies.size() > 1 ? exec_body(s.bodies[1], child(f), out) : flow::normal;
    const auto n = static_cast<std::int64_t>(items.size());
    const auto shared_items = std::make_shared<const std::vector<value>>(std::move(items));
    for (std::int64_t i = 0; i < n; ++i) {
      tick(s.at);
      auto fr = child(f);
      bind_targets(s, (*shared_items)[static_cast<std::size_t>(i)], fr);
      value loop;
      loop.k = vk::loop;
      auto l = std::make_shared<loop_obj>();
      l->index0 = i;
      l->length = n;
      l->items = shared_items;
      loop.o = std::move(l);
      fr->set("loop", std::move(loop));
      if (exec_body(s.bodies[0], fr, out) == flow::brk) break;
    }
    return flow::normal;
  }

  // ---- expressions

  value lookup(const std::string& name, const frame_ptr& f) const {
    for (frame* fr = f.get(); fr; fr = fr->parent.get())
      if (value* v = fr->find(name)) return *v;
    return make_undefined("'" + name + "' is undefined");
  }

  value eval(const expr& e, const frame_ptr& f) {
    depth_guard g(*this, e.at);
    switch (e.k) {
      case ek::literal:
        return e.lit;
      case ek::name:
        return lookup(e.name, f);
      case ek::block_value:
        return block_values_.back();
      case ek::list:
      case ek::tuple: {
        std::vector<value> items;
        items.reserve(e.args.size());
        for (const auto& a : e.args) items.push_back(eval(*a, f));
        return make_list(std::move(items), e.k == ek::list ? vk::list : vk::tuple);
      }
      case ek::dict: {
        auto d = make_dict();
        for (std::size_t i = 0; i + 1 < e.args.size(); i += 2) {
          value k = eval(*e.args[i], f);
          if (k.k == vk::undefined || k.is_seq() || k.is_map())
            fail(e.args[i]->at, std::string("unhashable dict key of type ") + type_name(k));
          d.dict().set(k, eval(*e.args[i + 1], f));
        }
        return d;
      }
      case ek::attr:
        return get_attr(eval(*e.args[0], f), e.name, e.at);
      case ek::item:
        return get_item(eval(*e.args[0], f), eval(*e.args[1], f), e.at);
      case ek::slice: {
        const value obj = eval(*e.args[0], f);
        std::optional<std::int64_t> parts[3];
        for (int k = 0; k < 3; ++k) {
          if (!e.args[k + 1]) continue;
          const value v = eval(*e.args[k + 1], f);
          if (v.k == vk::none) continue;
          if (!v.is_int()) fail(e.at, "slice indices must be integers or None");
          parts[k] = v.as_int();
        }
        return slice(obj, parts, e.at);
      }
      case ek::neg:
      case ek::pos: {
        const value v = eval(*e.args[0], f);
        if (v.k == vk::undefined) undefined_error(v, e.at);
        if (!v.is_num())
          fail(e.at,
               std::string("bad operand type for unary ") + (e.k == ek::neg ? "-" : "+") + ": '" + type_name(v) + "'");
        if (e.k == ek::pos) return v.k == vk::boolean ? make_int(v.as_int()) : v;
        if (v.k == vk::floating) return make_float(-v.f);
        if (v.as_int() == std::numeric_limits<std::int64_t>::min()) fail(e.at, "integer overflow");
        return make_int(-v.as_int());
      }
      case ek::not_:
        return make_bool(!truthy(eval(*e.args[0], f)));
      case ek::and_: {
        value a = eval(*e.args[0], f);
        return truthy(a) ? eval(*e.args[1], f) : a;
      }
      case ek::or_: {
        value a = eval(*e.args[0], f);
        return truthy(a) ? a : eval(*e.args[1], f);
      }
      case ek::cond:
        if (truthy(eval(*e.args[1], f))) return eval(*e.args[0], f);
        return e.args[2] ? eval(*e.args[2], f) : make_undefined("the condition of an inline if was false");
      case ek::binop: {
        const value a = eval(*e.args[0], f);
        const value b = eval(*e.args[1], f);
        return arith(static_cast<op>(e.id), a, b, e.at);
      }
      case ek::compare: {
        value left = eval(*e.args[0], f);
        for (std::size_t i = 0; i < e.ops.size(); ++i) {
          value right = eval(*e.args[i + 1], f);
          if (!compare(e.ops[i], left, right, e.at)) return make_bool(false);
          left = std::move(right);
        }
        return make_bool(true);
      }
      case ek::filter: {
        value operand = eval(*e.args[0], f);
        const call_args a = eval_args(e, f, 1);
        tick(e.at);
        return apply_filter(static_cast<filter_id>(e.id), operand, a, e.at);
      }
      case ek::test: {
        const value operand = eval(*e.args[0], f);
        const call_args a = eval_args(e, f, 1);
        return make_bool(apply_test(static_cast<test_id>(e.id), operand, a, e.at) != e.negated);
      }
      case ek::call: {
        const value callee = eval(*e.args[0], f);
        return call(callee, eval_args(e, f, 1), e.at);
      }
    }
    return make_undefined("");
  }

  call_args eval_args(const expr& e, const frame_ptr& f, std::size_t from) {
    call_args a;
    for (std::size_t i = from; i < e.args.size(); ++i) a.pos.push_back(eval(*e.args[i], f));
    for (const auto& [k, v] : e.kwargs) a.kw.emplace_back(k, eval(*v, f));
    return a;
  }

  // Python's slice of a str (by code point), list or tuple; anything else slices to undefined, as in Jinja.
  value slice(const value& obj, const std::optional<std::int64_t> (&p)[3], pos at) {
    if (obj.k == vk::undefined) undefined_error(obj, at);
    if (obj.k != vk::string && !obj.is_seq()) return make_undefined("object is not sliceable");
    const std::int64_t step = p[2].value_or(1);
    if (step == 0) fail(at, "slice step cannot be zero");
    std::vector<char32_t> cps;
    if (obj.k == vk::string) cps = to_cps(obj.str());
    const std::int64_t len = obj.k == vk::string ? static_cast<std::int64_t>(cps.size())
                                                 : static_cast<std::int64_t>(obj.list().items.size());
    const std::int64_t lower = step > 0 ? 0 : -1, upper = step > 0 ? len : len - 1;
    auto clamp = [&](std::optional<std::int64_t> v, std::int64_t dflt) {
      if (!v) return dflt;
      std::int64_t x = *v;
      if (x < 0) {
        x = x < -len ? lower : x + len;
        return std::max(x, lower);
      }
      return std::min(x, upper);
    };
    const std::int64_t start = clamp(p[0], step > 0 ? lower : upper), stop = clamp(p[1], step > 0 ? upper : lower);
    std::vector<std::int64_t> idx;
    for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx.push_back(i);
    tick(at, static_cast<std::int64_t>(idx.size()));
    if (obj.k == vk::string) {
      std::string s;
      for (auto i : idx) put_cp(s, cps[static_cast<std::size_t>(i)]);
      return make_str(std::move(s));
    }
    std::vector<value> items;
    items.reserve(idx.size());
    for (auto i : idx) items.push_back(obj.list().items[static_cast<std::size_t>(i)]);
    return make_list(std::move(items), obj.k);
  }

  static bool is_unsafe(const value& obj, std::string_view name) {
    static const char* list_mut[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort"};
    static const char* dict_mut[] = {"clear", "pop", "popitem", "setdefault", "update"};
    if (obj.k == vk::list)
      return std::any_of(std::begin(list_mut), std::end(list_mut), [&](const char* m) { return name == m; });
    if (obj.k == vk::dict)
      return std::any_of(std::begin(dict_mut), std::end(dict_mut), [&](const char* m) { return name == m; });
    return false;
  }

  static bool has_method(const value& obj, std::string_view n) {
    static const char* str_m[] = {"strip",      "lstrip",   "rstrip",  "split",   "rsplit",  "splitlines",
                                  "startswith", "endswith", "upper",   "lower",   "title",   "capitalize",
                                  "replace",    "find",     "rfind",   "count",   "join",    "isdigit",
                                  "isalpha",    "isalnum",  "isspace", "islower", "isupper", "format"};
    static const char* dict_m[] = {"items", "keys", "values", "get"};
    static const char* seq_m[] = {"index", "count"};
    auto in = [&](const auto& arr) {
      return std::any_of(std::begin(arr), std::end(arr), [&](const char* m) { return n == m; });
    };
    if (obj.k == vk::string) return in(str_m);
    if (obj.k == vk::dict) return in(dict_m);
    if (obj.is_seq()) return in(seq_m);
    if (obj.k == vk::loop) return n == "cycle";
    return false;
  }

  value get_attr(const value& obj, const std::string& name, pos at) {
    if (obj.k == vk::undefined) undefined_error(obj, at);
    if (is_unsafe(obj, name))
      return make_undefined("access to attribute '" + name + "' of '" + type_name(obj) + "' object is unsafe.", true);
    if (has_method(obj, name)) return make_method(obj, name);
    if (obj.k == vk::loop) {
      const auto& l = static_cast<const loop_obj&>(*obj.o);
      const std::int64_t i = l.index0, n = l.length;
      if (name == "index") return make_int(i + 1);
      if (name == "index0") return make_int(i);
      if (name == "revindex") return make_int(n - i);
      if (name == "revindex0") return make_int(n - i - 1);
      if (name == "first") return make_bool(i == 0);
      if (name == "last") return make_bool(i == n - 1);
      if (name == "length") return make_int(n);
      if (name == "depth") return make_int(1);
      if (name == "depth0") return make_int(0);
      if (name == "previtem" && i > 0) return (*l.items)[static_cast<std::size_t>(i - 1)];
      if (name == "nextitem" && i + 1 < n) return (*l.items)[static_cast<std::size_t>(i + 1)];
      return make_undefined("'LoopContext object' has no attribute '" + name + "'");
    }
    if (obj.is_map())
      if (const value* v = obj.dict().find(std::string_view(name))) return *v;
    return make_undefined("'" + std::string(type_name(obj)) + " object' has no attribute '" + name + "'");
  }

  value get_item(const value& obj, const value& key, pos at) {
    if (obj.k == vk::undefined) undefined_error(obj, at);
    if (obj.is_map()) {
      if (const value* v = obj.dict().find(key)) return *v;
    } else if ((obj.is_seq() || obj.k == vk::string) && key.is_int()) {
      std::int64_t i = key.as_int();
      if (obj.k == vk::string) {
        const auto cps = to_cps(obj.str());
        const auto len = static_cast<std::int64_t>(cps.size());
        if (i < 0) i += len;
        if (i >= 0 && i < len) {
          std::string s;
          put_cp(s, cps[static_cast<std::size_t>(i)]);
          return make_str(std::move(s));
        }
      } else {
        const auto& items = obj.list().items;
        const auto len = static_cast<std::int64_t>(items.size());
        if (i < 0) i += len;
        if (i >= 0 && i < len) return items[static_cast<std::size_t>(i)];
      }
      return make_undefined(std::string(type_name(obj)) + " object has no element " + std::to_string(key.as_int()));
    }
    if (key.k == vk::string && obj.k != vk::dict) return get_attr(obj, key.str(), at);
    if (key.k == vk::string && obj.k == vk::dict && (has_method(obj, key.str()) || is_unsafe(obj, key.str())))
      return get_attr(obj, key.str(), at);
    return make_undefined("'" + std::string(type_name(obj)) + " object' has no attribute " +
                          (key.k == vk::string ? "'" + key.str() + "'" : to_str(key, at)));
  }

  std::vector<value> iterate(const value& v, pos at) {
    std::vector<value> out;
    switch (v.k) {
      case vk::undefined:
        return out;
      case vk::list:
      case vk::tuple:
        tick(at, static_cast<std::int64_t>(v.list().items.size()));
        return v.list().items;
      case vk::dict:
        tick(at, static_cast<std::int64_t>(v.dict().items.size()));
        for (const auto& [k, val] : v.dict().items) out.push_back(k);
        return out;
      case vk::string: {
        const std::string& s = v.str();
        check_items(at, s.size());
        for (std::size_t i = 0; i < s.size();) {
          char32_t c;
          const std::size_t j = next_cp(s, i, &c);
          out.push_back(make_str(s.substr(i, j - i)));
          i = j;
        }
        return out;
      }
      default:
        fail(at, std::string("'") + type_name(v) + "' object is not iterable");
    }
  }

  // ---- operators

  bool eq(const value& a, const value& b, pos at) {
    tick(at);
    if (a.is_num() && b.is_num())
      return a.is_int() && b.is_int() ? a.as_int() == b.as_int() : a.as_double() == b.as_double();
    if (a.k != b.k) return false;
    switch (a.k) {
      case vk::undefined:
      case vk::none:
        return true;
      case vk::string:
        return a.str() == b.str();
      case vk::list:
      case vk::tuple: {
        const auto &x = a.list().items, &y = b.list().items;
        if (x.size() != y.size()) return false;
        for (std::size_t i = 0; i < x.size(); ++i)
          if (!eq(x[i], y[i], at)) return false;
        return true;
      }
      case vk::dict: {
        const auto& x = a.dict().items;
        const dict_obj& y = b.dict();
        if (x.size() != y.items.size()) return false;
        for (const auto& [k, v] : x) {
          const value* w = y.find(k);
          if (!w || !eq(v, *w, at)) return false;
        }
        return true;
      }
      default:
        return a.o == b.o;
    }
  }

  bool lt(const value& a, const value& b, pos at, const char* sym = "<") {
    tick(at);
    if (a.k == vk::undefined) undefined_error(a, at);
    if (b.k == vk::undefined) undefined_error(b, at);
    if (a.is_num() && b.is_num())
      return a.is_int() && b.is_int() ? a.as_int() < b.as_int() : a.as_double() < b.as_double();
    if (a.k == vk::string && b.k == vk::string) return a.str() < b.str();
    if (a.is_seq() && a.k == b.k) {
      const auto &x = a.list().items, &y = b.list().items;
      for (std::size_t i = 0; i < x.size() && i < y.size(); ++i)
        if (!eq(x[i], y[i], at)) return lt(x[i], y[i], at, sym);
      return x.size() < y.size();
    }
    fail(at, std::string("'") + sym + "' not supported between instances of '" + type_name(a) + "' and '" +
                 type_name(b) + "'");
  }

  bool contains(const value& container, const value& item, pos at) {
    switch (container.k) {
      case vk::undefined:
        return false;
      case vk::string:
        if (item.k != vk::string)
          fail(at, std::string("'in <string>' requires string as left operand, not ") + type_name(item));
        return container.str().find(item.str()) != std::string::npos;
      case vk::list:
      case vk::tuple:
        for (const auto& x : container.list().items)
          if (eq(x, item, at)) return true;
        return false;
      case vk::dict:
        tick(at, static_cast<std::int64_t>(container.dict().items.size()));
        return container.dict().find(item) != nullptr;
      default:
        fail(at, std::string("argument of type '") + type_name(container) + "' is not iterable");
    }
  }

  bool compare(op o, const value& a, const value& b, pos at) {
    switch (o) {
      case op::eq:
        return eq(a, b, at);
      case op::ne:
        return !eq(a, b, at);
      case op::lt:
        return lt(a, b, at, "<");
      case op::gt:
        return lt(b, a, at, ">");
      case op::le:
        return lt(a, b, at, "<=") || eq(a, b, at);
      case op::ge:
        return lt(b, a, at, ">=") || eq(a, b, at);
      case op::in:
        return contains(b, a, at);
      case op::not_in:
        return !contains(b, a, at);
      default:
        return false;
    }
  }

  static double py_fmod(double x, double y) {
    double m = std::fmod(x, y);
    if (m != 0) {
      if ((y < 0) != (m < 0)) m += y;
    } else {
      m = std::copysign(0.0, y);
    }
    return m;
  }
  static double py_floordiv(double x, double y) {
    double m = std::fmod(x, y);
    double div = (x - m) / y;
    if (m != 0 && ((y < 0) != (m < 0))) div -= 1.0;
    if (div != 0) {
      double fl = std::floor(div);
      if (div - fl > 0.5) fl += 1.0;
      return fl;
    }
    return std::copysign(0.0, x / y);
  }

  value repeat(const value& seq, std::int64_t n, pos at) {
    if (n <= 0) return seq.k == vk::string ? make_str("") : make_list({}, seq.k);
    if (seq.k == vk::string) {
      const std::string& s = seq.str();
      if (!s.empty() && static_cast<std::uint64_t>(n) > lim_.max_output_bytes / s.size())
        fail(at, "string longer than max_output_bytes (" + std::to_string(lim_.max_output_bytes) + ")");
      check_len(at, s.size() * static_cast<std::size_t>(n));
      const std::size_t total = s.size() * static_cast<std::size_t>(n);
      std::string out;
      out.reserve(total);
      out = s;
      while (!out.empty() && out.size() * 2 <= total) out.append(out);  // doubling: O(total), not n appends
      out.append(out, 0, total - out.size());
      return make_str(std::move(out));
    }
    const auto& items = seq.list().items;
    if (!items.empty() && static_cast<std::uint64_t>(n) > max_items_ / items.size())
      fail(at, "list longer than max_output_bytes / 64 (" + std::to_string(max_items_) + ") items");
    check_items(at, items.size() * static_cast<std::size_t>(n));
    std::vector<value> out;
    for (std::int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
    return make_list(std::move(out), seq.k);
  }

  value arith(op o, const value& a, const value& b, pos at) {
    if (o == op::concat) {
      std::string s = to_str(a, at);
      s += to_str(b, at);
      return str_value(at, std::move(s));
    }
    if (a.k == vk::undefined) undefined_error(a, at);
    if (b.k == vk::undefined) undefined_error(b, at);
    static const char* sym[] = {"+", "-", "*", "/", "//", "%", "**"};
    auto unsupported = [&]() -> value {
      fail(at, std::string("unsupported operand type(s) for ") + sym[static_cast<int>(o)] + ": '" + type_name(a) +
                   "' and '" + type_name(b) + "'");
    };
    if (a.is_num() && b.is_num()) {
      const bool ints = a.is_int() && b.is_int();
      const std::int64_t x = a.as_int(), y = b.as_int();
      const double fx = a.as_double(), fy = b.as_double();
      std::int64_t r = 0;
      switch (o) {
        case op::add:
          if (!ints) return make_float(fx + fy);
          if (__builtin_add_overflow(x, y, &r)) fail(at, "integer overflow (integers are 64-bit here)");
          return make_int(r);
        case op::sub:
          if (!ints) return make_float(fx - fy);
          if (__builtin_sub_overflow(x, y, &r)) fail(at, "integer overflow (integers are 64-bit here)");
          return make_int(r);
        case op::mul:
          if (!ints) return make_float(fx * fy);
          if (__builtin_mul_overflow(x, y, &r)) fail(at, "integer overflow (integers are 64-bit here)");
          return make_int(r);
        case op::div:
          if (fy == 0) fail(at, "division by zero");
          return make_float(fx / fy);
        case op::floordiv:
          if (ints) {
            if (y == 0) fail(at, "integer division or modulo by zero");
            if (x == std::numeric_limits<std::int64_t>::min() && y == -1) fail(at, "integer overflow");
            std::int64_t q = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
            return make_int(q);
          }
          if (fy == 0) fail(at, "float floor division by zero");
          return make_float(py_floordiv(fx, fy));
        case op::mod:
          if (ints) {
            if (y == 0) fail(at, "integer modulo by zero");
            if (y == -1) return make_int(0);
            std::int64_t m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return make_int(m);
          }
          if (fy == 0) fail(at, "float modulo");
          return make_float(py_fmod(fx, fy));
        case op::pow:
          if (ints && y >= 0) {
            std::int64_t base = x, e = y, acc = 1;
            while (e > 0) {
              if (e & 1)
                if (__builtin_mul_overflow(acc, base, &acc)) fail(at, "integer overflow (integers are 64-bit here)");
              e >>= 1;
              if (e > 0 && __builtin_mul_overflow(base, base, &base))
                fail(at, "integer overflow (integers are 64-bit here)");
            }
            return make_int(acc);
          }
          if (fx == 0 && fy < 0) fail(at, "0.0 cannot be raised to a negative power");
          if (fx < 0 && fy != std::floor(fy)) fail(at, "a negative number to a fractional power is complex");
          return make_float(std::pow(fx, fy));
        default:
          break;
      }
    }
    if (o == op::add && a.k == vk::string && b.k == vk::string) {
      check_len(at, a.str().size() + b.str().size());
      return make_str(a.str() + b.str());
    }
    if (o == op::add && a.is_seq() && a.k == b.k) {
      const auto &x = a.list().items, &y = b.list().items;
      check_items(at, x.size() + y.size());
      std::vector<value> items(x);
      items.insert(items.end(), y.begin(), y.end());
      return make_list(std::move(items), a.k);
    }
    if (o == op::mul && (a.k == vk::string || a.is_seq()) && b.is_int()) return repeat(a, b.as_int(), at);
    if (o == op::mul && (b.k == vk::string || b.is_seq()) && a.is_int()) return repeat(b, a.as_int(), at);
    if (o == op::add && a.k == vk::string)
      fail(at, std::string("can only concatenate str (not \"") + type_name(b) + "\") to str");
    if (o == op::mod && a.k == vk::string) fail(at, "printf-style '%' formatting of strings is not supported");
    return unsupported();
  }

  // ---- calls

  value call(const value& callee, const call_args& a, pos at) {
    if (callee.k == vk::undefined) undefined_error(callee, at);
    if (callee.k != vk::callable) fail(at, std::string("'") + type_name(callee) + "' object is not callable");
    tick(at);
    const callable_obj& c = callee.fn();
    switch (c.kind) {
      case fn_kind::macro:
        return call_macro(c, a, at);
      case fn_kind::builtin:
        return call_builtin(c.which, a, at);
      case fn_kind::method:
        return call_method(c.self, c.name, a, at);
    }
    return make_undefined("");
  }

  value call_macro(const callable_obj& m, const call_args& a, pos at) {
    if (macro_depth_ >= lim_.max_macro_recursion)
      fail(at, "macro calls nested more than max_macro_recursion (" + std::to_string(lim_.max_macro_recursion) + ")");
    const stmt& s = *m.macro;
    frame_ptr parent = m.scope.lock();
    auto fr = child(parent ? parent : top_);
    if (a.pos.size() > s.params.size())
      fail(at, "macro '" + m.name + "' takes not more than " + std::to_string(s.params.size()) + " argument(s)");
    for (const auto& [k, v] : a.kw)
      if (std::find(s.params.begin(), s.params.end(), k) == s.params.end())
        fail(at, "macro '" + m.name + "' takes no keyword argument '" + k + "'");
    for (std::size_t i = 0; i < s.params.size(); ++i) {
      const value* kw = nullptr;
      for (const auto& [k, v] : a.kw)
        if (k == s.params[i]) kw = &v;
      if (i < a.pos.size()) {
        if (kw) fail(at, "macro '" + m.name + "' got multiple values for argument '" + s.params[i] + "'");
        fr->set(s.params[i], a.pos[i]);
      } else if (kw) {
        fr->set(s.params[i], *kw);
      } else if (s.defaults[i]) {
        fr->set(s.params[i], eval(*s.defaults[i], fr));
      } else {
        fr->set(s.params[i], make_undefined("parameter '" + s.params[i] + "' was not provided"));
      }
    }
    ++macro_depth_;
    std::string out;
    try {
      exec_body(s.bodies[0], fr, out);
    } catch (...) {
      --macro_depth_;
      throw;
    }
    --macro_depth_;
    return make_str(std::move(out));
  }

  std::int64_t int_arg(const value* v, pos at, const char* what) {
    if (!v || !v->is_int())
      fail(at, std::string(what) + ": '" + (v ? type_name(*v) : "nothing") +
                   "' object cannot be interpreted as an integer");
    return v->as_int();
  }

  value make_mapping(const call_args& a, vk kind, pos at) {
    value d = make_dict(kind);
    if (a.pos.size() > 1) fail(at, "expected at most 1 positional argument");
    if (!a.pos.empty()) {
      const value& src = a.pos[0];
      if (src.is_map()) {
        for (const auto& [k, v] : src.dict().items) d.dict().set(k, v);
      } else {
        for (const auto& pair : iterate(src, at)) {
          const auto kv = iterate(pair, at);
          if (kv.size() != 2) fail(at, "dictionary update sequence element has the wrong length");
          d.dict().set(kv[0], kv[1]);
        }
      }
    }
    for (const auto& [k, v] : a.kw) d.dict().set(make_str(k), v);
    return d;
  }

  value call_builtin(builtin which, const call_args& a, pos at) {
    switch (which) {
      case builtin::range: {
        if (a.pos.empty() || a.pos.size() > 3 || !a.kw.empty()) fail(at, "range expects 1 to 3 integer arguments");
        std::int64_t start = 0, stop, step = 1;
        if (a.pos.size() == 1) {
          stop = int_arg(&a.pos[0], at, "range");
        } else {
          start = int_arg(&a.pos[0], at, "range");
          stop = int_arg(&a.pos[1], at, "range");
          if (a.pos.size() == 3) step = int_arg(&a.pos[2], at, "range");
        }
        if (step == 0) fail(at, "range() arg 3 must not be zero");
        const long double count =
            step > 0 ? std::ceil((static_cast<long double>(stop) - start) / step)
                     : std::ceil((static_cast<long double>(start) - stop) / -static_cast<long double>(step));
        if (count > 100000) fail(at, "range too big: the sandbox blocks ranges larger than MAX_RANGE (100000)");
        std::vector<value> items;
        for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) items.push_back(make_int(i));
        tick(at, static_cast<std::int64_t>(items.size()));
        return make_list(std::move(items));
      }
      case builtin::namespace_:
        return make_mapping(a, vk::ns, at);
      case builtin::dict:
        return make_mapping(a, vk::dict, at);
      case builtin::raise_exception: {
        const value* m = a.get(0, "message");
        const std::string msg = m ? to_str(*m, at) : std::string("raise_exception() called without a message");
        throw raised_error(msg, at.line, at.col);
      }
      case builtin::strftime_now: {
        const value* fmt = a.get(0, "format");
        if (!fmt || fmt->k != vk::string) fail(at, "strftime_now expects a format string");
        const std::string& f = fmt->str();
        if (f.size() > 1024) fail(at, "strftime_now: format longer than 1024 bytes");
        if (f.empty()) return make_str("");
        std::vector<char> buf(256 + f.size() * 64);
        const std::size_t n = std::strftime(buf.data(), buf.size(), f.c_str(), &now_);
        return make_str(std::string(buf.data(), n));
      }
    }
    return make_undefined("");
  }

  static std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                           std::int64_t maxsplit) {
    std::vector<std::string> out;
    if (sep) {
      std::size_t p = 0;
      while (maxsplit != 0) {
        const auto q = s.find(*sep, p);
        if (q == std::string_view::npos) break;
        out.emplace_back(s.substr(p, q - p));
        p = q + sep->size();
        if (maxsplit > 0) --maxsplit;
      }
      out.emplace_back(s.substr(p));
      return out;
    }
    const auto cps = to_cps(s);
    std::size_t i = 0;
    const std::size_t n = cps.size();
    while (true) {
      while (i < n && py_space(cps[i])) ++i;
      if (i >= n) break;
      if (maxsplit == 0) {
        std::size_t e = n;
        while (e > i && py_space(cps[e - 1])) --e;
        out.push_back(from_cps(cps, i, e));
        break;
      }
      std::size_t j = i;
      while (j < n && !py_space(cps[j])) ++j;
      out.push_back(from_cps(cps, i, j));
      i = j;
      if (maxsplit > 0) --maxsplit;
    }
    return out;
  }

  static std::vector<std::string> py_rsplit(std::string_view s, const std::optional<std::string>& sep,
                                            std::int64_t maxsplit) {
    if (maxsplit < 0) return py_split(s, sep, maxsplit);
    std::vector<std::string> out;
    if (sep) {
      std::size_t end = s.size();
      while (maxsplit != 0) {
        if (end < sep->size()) break;
        const auto q = s.rfind(*sep, end - sep->size());
        if (q == std::string_view::npos) break;
        out.emplace_back(s.substr(q + sep->size(), end - q - sep->size()));
        end = q;
        --maxsplit;
      }
      out.emplace_back(s.substr(0, end));
    } else {
      const auto cps = to_cps(s);
      std::size_t e = cps.size();
      while (true) {
        while (e > 0 && py_space(cps[e - 1])) --e;
        if (e == 0) break;
        if (maxsplit == 0) {
          std::size_t b = 0;
          while (b < e && py_space(cps[b])) ++b;
          out.push_back(from_cps(cps, b, e));
          break;
        }
        std::size_t b = e;
        while (b > 0 && !py_space(cps[b - 1])) --b;
        out.push_back(from_cps(cps, b, e));
        e = b;
        --maxsplit;
      }
    }
    std::reverse(out.begin(), out.end());
    return out;
  }

  static bool is_line_break(char32_t c) {
    return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
           c == 0x2028 || c == 0x2029;
  }

  static std::vector<std::string> py_splitlines(std::string_view s, bool keepends) {
    std::vector<std::string> out;
    const auto cps = to_cps(s);
    std::size_t b = 0;
    for (std::size_t i = 0; i < cps.size(); ++i) {
      if (!is_line_break(cps[i])) continue;
      std::size_t e = i + 1;
      if (cps[i] == '\r' && e < cps.size() && cps[e] == '\n') ++e;
      out.push_back(from_cps(cps, b, keepends ? e : i));
      b = e;
      i = e - 1;
    }
    if (b < cps.size()) out.push_back(from_cps(cps, b));
    return out;
  }

  std::string py_replace(const std::string& s, const std::string& old, const std::string& with, std::int64_t count,
                         pos at) {
    std::string out;
    if (old.empty()) {
      const auto cps = to_cps(s);
      std::int64_t done = 0;
      for (std::size_t i = 0; i <= cps.size(); ++i) {
        if (count < 0 || done < count) {
          out += with;
          ++done;
        }
        if (i < cps.size()) put_cp(out, cps[i]);
        if (out.size() > lim_.max_output_bytes) check_len(at, out.size());
      }
      check_len(at, out.size());
      return out;
    }
    std::size_t p = 0;
    std::int64_t done = 0;
    while (count < 0 || done < count) {
      const auto q = s.find(old, p);
      if (q == std::string::npos) break;
      out.append(s, p, q - p);
      out += with;
      p = q + old.size();
      ++done;
      if (out.size() > lim_.max_output_bytes) check_len(at, out.size());
    }
    out.append(s, p, std::string::npos);
    check_len(at, out.size());
    return out;
  }

  std::optional<std::string> opt_str(const value* v, pos at, const char* what) {
    if (!v || v->k == vk::none) return std::nullopt;
    if (v->k != vk::string) fail(at, std::string(what) + " arg must be None or str");
    return v->str();
  }

  value str_list(std::vector<std::string> parts) {
    std::vector<value> items;
    items.reserve(parts.size());
    for (auto& p : parts) items.push_back(make_str(std::move(p)));
    return make_list(std::move(items));
  }

  // find/rfind/count over code points, with Python's optional start and end.
  std::int64_t py_find(const std::string& s, const std::string& sub, const call_args& a, int mode, pos at) {
    const auto cps = to_cps(s), sc = to_cps(sub);
    const auto len = static_cast<std::int64_t>(cps.size());
    auto bound = [&](std::size_t i, std::int64_t dflt) {
      const value* v = a.get(i, "");
      if (!v || v->k == vk::none) return dflt;
      std::int64_t x = int_arg(v, at, "find");
      if (x < 0) x = std::max<std::int64_t>(0, x + len);
      return std::min(x, len);
    };
    const std::int64_t b = bound(1, 0), e = bound(2, len), m = static_cast<std::int64_t>(sc.size());
    std::int64_t found = -1, count = 0;
    if (mode == 2 && m == 0) return std::max<std::int64_t>(0, e - b + 1);
    for (std::int64_t i = b; i + m <= e; ++i) {
      if (!std::equal(sc.begin(), sc.end(), cps.begin() + i)) continue;
      if (mode == 0) return i;
      found = i;
      ++count;
      if (mode == 2 && m > 0) i += m - 1;
    }
    tick(at, len / 16);
    return mode == 2 ? count : found;
  }

  value call_method(const value& self, const std::string& name, const call_args& a, pos at) {
    if (self.k == vk::string) {
      const std::string& s = self.str();
      if (name == "strip" || name == "lstrip" || name == "rstrip")
        return make_str(py_strip(s, opt_str(a.get(0, "chars"), at, name.c_str()), name != "rstrip", name != "lstrip"));
      if (name == "split" || name == "rsplit") {
        const auto sep = opt_str(a.get(0, "sep"), at, name.c_str());
        if (sep && sep->empty()) fail(at, "empty separator");
        const value* mx = a.get(1, "maxsplit");
        const std::int64_t maxsplit = mx ? int_arg(mx, at, name.c_str()) : -1;
        auto parts = name == "split" ? py_split(s, sep, maxsplit) : py_rsplit(s, sep, maxsplit);
        check_items(at, parts.size());
        return str_list(std::move(parts));
      }
      if (name == "splitlines") {
        const value* k = a.get(0, "keepends");
        return str_list(py_splitlines(s, k && truthy(*k)));
      }
      if (name == "startswith" || name == "endswith") {
        const value* p = a.get(0, "prefix");
        if (!p) fail(at, name + "() takes at least 1 argument");
        std::vector<value> options = p->k == vk::tuple ? p->list().items : std::vector<value>{*p};
        for (const auto& o : options) {
          if (o.k != vk::string) fail(at, name + " first arg must be str or a tuple of str");
          const std::string& x = o.str();
          if (x.size() <= s.size() && (name == "startswith" ? s.compare(0, x.size(), x) == 0
                                                            : s.compare(s.size() - x.size(), x.size(), x) == 0))
            return make_bool(true);
        }
        return make_bool(false);
      }
      if (name == "upper") return make_str(upper(s));
      if (name == "lower") return make_str(lower(s));
      if (name == "title") return make_str(py_title(s));
      if (name == "capitalize") return make_str(py_capitalize(s));
      if (name == "replace") {
        const value *o = a.get(0, "old"), *w = a.get(1, "new"), *c = a.get(2, "count");
        if (!o || !w || o->k != vk::string || w->k != vk::string) fail(at, "replace() expects two strings");
        return make_str(py_replace(s, o->str(), w->str(), c ? int_arg(c, at, "replace") : -1, at));
      }
      if (name == "find" || name == "rfind" || name == "count") {
        const value* sub = a.get(0, "sub");
        if (!sub || sub->k != vk::string) fail(at, name + "() expects a string");
        return make_int(py_find(s, sub->str(), a, name == "find" ? 0 : name == "rfind" ? 1 : 2, at));
      }
      if (name == "join") {
        const value* it = a.get(0, "iterable");
        if (!it) fail(at, "join() takes exactly one argument");
        const auto items = iterate(*it, at);
        std::string out;
        for (std::size_t i = 0; i < items.size(); ++i) {
          if (items[i].k != vk::string)
            fail(at,
                 "sequence item " + std::to_string(i) + ": expected str instance, " + type_name(items[i]) + " found");
          if (i) out += s;
          out += items[i].str();
          if (out.size() > lim_.max_output_bytes) check_len(at, out.size());
        }
        return str_value(at, std::move(out));
      }
      if (name == "format") fail(at, "str.format is not supported in chat templates here");
      const auto cps = to_cps(s);
      auto all = [&](auto pred) { return !cps.empty() && std::all_of(cps.begin(), cps.end(), pred); };
      if (name == "isdigit") return make_bool(all(is_digit_cp));
      if (name == "isalpha") return make_bool(all(is_alpha_cp));
      if (name == "isalnum") return make_bool(all([](char32_t c) { return is_alpha_cp(c) || is_digit_cp(c); }));
      if (name == "isspace") return make_bool(all(py_space));
      if (name == "islower" || name == "isupper") {
        const bool want_lower = name == "islower";
        bool cased = false;
        for (char32_t c : cps) {
          if (want_lower ? is_upper_cp(c) : is_lower_cp(c)) return make_bool(false);
          cased = cased || is_cased_cp(c);
        }
        return make_bool(cased);
      }
    } else if (self.k == vk::dict) {
      const auto& items = self.dict().items;
      if (name == "items") {
        std::vector<value> out;
        for (const auto& [k, v] : items) out.push_back(make_list({k, v}, vk::tuple));
        return make_list(std::move(out));
      }
      if (name == "keys" || name == "values") {
        std::vector<value> out;
        for (const auto& [k, v] : items) out.push_back(name == "keys" ? k : v);
        return make_list(std::move(out));
      }
      if (name == "get") {
        const value* k = a.get(0, "key");
        if (!k) fail(at, "get expected at least 1 argument");
        if (const value* v = self.dict().find(*k)) return *v;
        const value* d = a.get(1, "default");
        return d ? *d : make_none();
      }
    } else if (self.is_seq()) {
      const value* x = a.get(0, "value");
      if (!x) fail(at, name + "() takes exactly one argument");
      std::int64_t count = 0;
      const auto& items = self.list().items;
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (!eq(items[i], *x, at)) continue;
        if (name == "index") return make_int(static_cast<std::int64_t>(i));
        ++count;
      }
      if (name == "index") fail(at, to_str(*x, at) + " is not in list");
      return make_int(count);
    } else if (self.k == vk::loop && name == "cycle") {
      if (a.pos.empty()) fail(at, "no items for cycling given");
      const auto& l = static_cast<const loop_obj&>(*self.o);
      return a.pos[static_cast<std::size_t>(l.index0 % static_cast<std::int64_t>(a.pos.size()))];
    }
    fail(at, "'" + std::string(type_name(self)) + "' object has no supported method '" + name + "'");
  }

  // ---- filters and tests

  // `a.b.0`: Jinja's attribute getter for map, selectattr, sort, unique, join and sum.
  value get_path(const value& item, const std::string& path, pos at) {
    value v = item;
    std::size_t p = 0;
    while (true) {
      const auto q = path.find('.', p);
      const std::string part = path.substr(p, q == std::string::npos ? std::string::npos : q - p);
      const bool digits =
          !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      std::int64_t idx = 0;
      if (digits && std::from_chars(part.data(), part.data() + part.size(), idx).ec == std::errc()) {
        v = get_item(v, make_int(idx), at);
      } else {
        v = get_item(v, make_str(part), at);
      }
      if (q == std::string::npos) return v;
      p = q + 1;
    }
  }

  std::string attr_name(const value* v, pos at) {
    if (!v) return "";
    if (v->k == vk::string) return v->str();
    if (v->is_int()) return std::to_string(v->as_int());
    fail(at, "attribute must be a string");
  }

  value sort_key(const value& item, const std::string& attribute, bool case_sensitive, pos at) {
    value k = attribute.empty() ? item : get_path(item, attribute, at);
    if (!case_sensitive && k.k == vk::string) return make_str(lower(k.str()));
    return k;
  }

  bool run_test_by_name(const value& name, const value& v, const call_args& rest, pos at) {
    if (name.k != vk::string) fail(at, "a test name must be a string");
    const auto it = test_names().find(name.str());
    if (it == test_names().end()) fail(at, "unknown test '" + name.str() + "'");
    return apply_test(it->second, v, rest, at);
  }

  static call_args shift(const call_args& a, std::size_t n) {
    call_args r;
    for (std::size_t i = n; i < a.pos.size(); ++i) r.pos.push_back(a.pos[i]);
    r.kw = a.kw;
    return r;
  }

  std::string html_escape(const std::string& s) {
    std::string out;
    for (char c : s) {
      switch (c) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&#34;";
          break;
        case '\'':
          out += "&#39;";
          break;
        default:
          out += c;
      }
    }
    return out;
  }

  static std::optional<std::int64_t> parse_py_int(std::string s, int base) {
    s = py_strip(s, std::nullopt, true, true);
    bool neg = false;
    std::size_t i = 0;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    if (i + 1 < s.size() && s[i] == '0') {
      const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(s[i + 1])));
      if ((p == 'x' && (base == 16 || base == 0)) || (p == 'o' && (base == 8 || base == 0)) ||
          (p == 'b' && (base == 2 || base == 0))) {
        base = p == 'x' ? 16 : p == 'o' ? 8 : 2;
        i += 2;
        if (i < s.size() && s[i] == '_') ++i;
      }
    }
    if (base == 0) base = 10;
    if (base < 2 || base > 36) return std::nullopt;
    std::string digits;
    for (std::size_t j = i; j < s.size(); ++j) {
      if (s[j] == '_' && j > i && j + 1 < s.size() && s[j + 1] != '_') continue;
      digits += s[j];
    }
    if (digits.empty()) return std::nullopt;
    std::int64_t v = 0;
    auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
    if (r.ec != std::errc() || r.ptr != digits.data() + digits.size()) return std::nullopt;
    return neg ? -v : v;
  }

  static std::optional<double> parse_py_float(const std::string& raw) {
    const std::string s = py_strip(raw, std::nullopt, true, true);
    if (s.empty() || s.find_first_of("xXpP") != std::string::npos) return std::nullopt;
    std::string clean;
    for (std::size_t j = 0; j < s.size(); ++j) {
      if (s[j] == '_' && j > 0 && j + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[j - 1])) &&
          std::isdigit(static_cast<unsigned char>(s[j + 1])))
        continue;
      clean += s[j];
    }
    const std::string low = lower(clean);
    const std::string body = (!low.empty() && (low[0] == '+' || low[0] == '-')) ? low.substr(1) : low;
    if (body == "inf" || body == "infinity" || body == "nan") {
      const double v =
          body == "nan" ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
      return low[0] == '-' ? -v : v;
    }
    if (body.find_first_not_of("0123456789.e+-") != std::string::npos) return std::nullopt;
    char* end = nullptr;
    const double v = std::strtod(clean.c_str(), &end);
    if (end != clean.c_str() + clean.size()) return std::nullopt;
    return v;
  }

  value apply_filter(filter_id id, const value& v, const call_args& a, pos at) {
    switch (id) {
      case filter_id::abs:
        if (v.k == vk::floating) return make_float(std::fabs(v.f));
        if (v.is_int()) {
          if (v.as_int() == std::numeric_limits<std::int64_t>::min()) fail(at, "integer overflow");
          return make_int(std::llabs(v.as_int()));
        }
        if (v.k == vk::undefined) undefined_error(v, at);
        fail(at, std::string("bad operand type for abs(): '") + type_name(v) + "'");
      case filter_id::capitalize:
        return make_str(py_capitalize(to_str(v, at)));
      case filter_id::center: {
        const std::string s = to_str(v, at);
        const value* w = a.get(0, "width");
        const std::int64_t width = w ? int_arg(w, at, "center") : 80;
        const auto len = static_cast<std::int64_t>(cp_count(s));
        if (width <= len) return make_str(s);
        if (static_cast<std::uint64_t>(width) > lim_.max_output_bytes) check_len(at, static_cast<std::size_t>(width));
        const std::int64_t marg = width - len, left = marg / 2 + (marg & width & 1);
        return make_str(std::string(static_cast<std::size_t>(left), ' ') + s +
                        std::string(static_cast<std::size_t>(marg - left), ' '));
      }
      case filter_id::count:
      case filter_id::length:
        switch (v.k) {
          case vk::undefined:
            return make_int(0);
          case vk::string:
            return make_int(static_cast<std::int64_t>(cp_count(v.str())));
          case vk::list:
          case vk::tuple:
            return make_int(static_cast<std::int64_t>(v.list().items.size()));
          case vk::dict:
            return make_int(static_cast<std::int64_t>(v.dict().items.size()));
          default:
            fail(at, std::string("object of type '") + type_name(v) + "' has no len()");
        }
      case filter_id::default_: {
        const value* d = a.get(0, "default_value");
        const value* boolean = a.get(1, "boolean");
        if (v.k == vk::undefined || (boolean && truthy(*boolean) && !truthy(v))) return d ? *d : make_str("");
        return v;
      }
      case filter_id::dictsort: {
        if (v.k != vk::dict) fail(at, "dictsort expects a mapping");
        const value* cs = a.get(0, "case_sensitive");
        const value* by = a.get(1, "by");
        const value* rev = a.get(2, "reverse");
        const bool by_value = by && by->k == vk::string && by->str() == "value";
        if (by && !(by->k == vk::string && (by->str() == "key" || by->str() == "value")))
          fail(at, "dictsort: you can only sort by either \"key\" or \"value\"");
        std::vector<value> pairs;
        for (const auto& [k, val] : v.dict().items) pairs.push_back(make_list({k, val}, vk::tuple));
        return make_list(sorted(std::move(pairs), by_value ? "1" : "0", cs && truthy(*cs), rev && truthy(*rev), at));
      }
      case filter_id::escape:
        return make_str(html_escape(to_str(v, at)));
      case filter_id::first: {
        if (v.k == vk::undefined) return make_undefined("No first item, sequence was empty.");
        const auto items = iterate(v, at);
        return items.empty() ? make_undefined("No first item, sequence was empty.") : items.front();
      }
      case filter_id::last: {
        if (v.k == vk::undefined) return make_undefined("No last item, sequence was empty.");
        if (!v.is_seq() && v.k != vk::string && v.k != vk::dict)
          fail(at, std::string("'") + type_name(v) + "' object is not reversible");
        const auto items = iterate(v, at);
        return items.empty() ? make_undefined("No last item, sequence was empty.") : items.back();
      }
      case filter_id::float_: {
        const value* d = a.get(0, "default");
        const value dflt = d ? *d : make_float(0.0);
        if (v.is_num()) return make_float(v.as_double());
        if (v.k == vk::string) {
          const auto f = parse_py_float(v.str());
          return f ? make_float(*f) : dflt;
        }
        return dflt;
      }
      case filter_id::int_: {
        const value* d = a.get(0, "default");
        const value* b = a.get(1, "base");
        const value dflt = d ? *d : make_int(0);
        if (v.is_int()) return make_int(v.as_int());
        if (v.k == vk::floating) {
          if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) fail(at, "cannot convert float to a 64-bit integer");
          return make_int(static_cast<std::int64_t>(v.f));
        }
        if (v.k == vk::string) {
          if (auto i = parse_py_int(v.str(), b ? static_cast<int>(int_arg(b, at, "int")) : 10)) return make_int(*i);
          if (auto f = parse_py_float(v.str()); f && std::isfinite(*f) && std::fabs(*f) < 9.2e18)
            return make_int(static_cast<std::int64_t>(*f));
        }
        return dflt;
      }
      case filter_id::indent: {
        std::string s = to_str(v, at);
        const value* w = a.get(0, "width");
        const value* first = a.get(1, "first");
        const value* blank = a.get(2, "blank");
        std::string ind;
        if (w && w->k == vk::string) {
          ind = w->str();
        } else {
          const std::int64_t n = w ? int_arg(w, at, "indent") : 4;
          if (n > 0) {
            check_len(at, static_cast<std::size_t>(
                              std::min<std::int64_t>(n, static_cast<std::int64_t>(lim_.max_output_bytes) + 1)));
            ind.assign(static_cast<std::size_t>(n), ' ');
          }
        }
        s += "\n";
        const auto lines = py_splitlines(s, false);
        std::string out;
        for (std::size_t i = 0; i < lines.size(); ++i) {
          if (i) out += "\n";
          if (i && (!lines[i].empty() || (blank && truthy(*blank)))) out += ind;
          out += lines[i];
          if (out.size() > lim_.max_output_bytes) check_len(at, out.size());
        }
        if (first && truthy(*first)) out = ind + out;
        return str_value(at, std::move(out));
      }
      case filter_id::items: {
        if (v.k == vk::undefined) return make_list({});
        if (v.k != vk::dict) fail(at, "Can only get item pairs from a mapping.");
        return call_method(v, "items", {}, at);
      }
      case filter_id::join: {
        const value* d = a.get(0, "d");
        const value* attr = a.get(1, "attribute");
        const std::string sep = d ? to_str(*d, at) : "";
        const std::string path = attr_name(attr, at);
        std::string out;
        bool first = true;
        for (const auto& item : iterate(v, at)) {
          if (!first) out += sep;
          first = false;
          out += to_str(path.empty() ? item : get_path(item, path, at), at);
          if (out.size() > lim_.max_output_bytes) check_len(at, out.size());
        }
        return str_value(at, std::move(out));
      }
      case filter_id::list:
        return make_list(iterate(v, at));
      case filter_id::lower:
        return make_str(lower(to_str(v, at)));
      case filter_id::upper:
        return make_str(upper(to_str(v, at)));
      case filter_id::map: {
        std::vector<value> out;
        const value* attr = nullptr;
        const value* dflt = nullptr;
        for (const auto& [k, val] : a.kw) {
          if (k == "attribute") attr = &val;
          if (k == "default") dflt = &val;
        }
        const auto items = iterate(v, at);
        if (attr) {
          const std::string path = attr_name(attr, at);
          for (const auto& item : items) {
            value x = get_path(item, path, at);
            out.push_back(x.k == vk::undefined && dflt ? *dflt : x);
          }
          return make_list(std::move(out));
        }
        if (a.pos.empty() || a.pos[0].k != vk::string) fail(at, "map expects a filter name or attribute=");
        const auto it = filter_names().find(a.pos[0].str());
        if (it == filter_names().end()) fail(at, "unknown filter '" + a.pos[0].str() + "'");
        const call_args rest = shift(a, 1);
        for (const auto& item : items) {
          tick(at);
          out.push_back(apply_filter(it->second, item, rest, at));
        }
        return make_list(std::move(out));
      }
      case filter_id::select:
      case filter_id::reject:
      case filter_id::selectattr:
      case filter_id::rejectattr: {
        const bool attr_form = id == filter_id::selectattr || id == filter_id::rejectattr;
        const bool keep_if = id == filter_id::select || id == filter_id::selectattr;
        std::string path;
        if (attr_form) {
          if (a.pos.empty()) fail(at, "selectattr/rejectattr expect an attribute name");
          path = attr_name(&a.pos[0], at);
        }
        const std::size_t test_at = attr_form ? 1 : 0;
        const call_args rest = shift(a, test_at + 1);
        std::vector<value> out;
        for (const auto& item : iterate(v, at)) {
          tick(at);
          const value x = attr_form ? get_path(item, path, at) : item;
          const bool ok = a.pos.size() > test_at ? run_test_by_name(a.pos[test_at], x, rest, at) : truthy(x);
          if (ok == keep_if) out.push_back(item);
        }
        return make_list(std::move(out));
      }
      case filter_id::replace: {
        const value *o = a.get(0, "old"), *w = a.get(1, "new"), *c = a.get(2, "count");
        if (!o || !w) fail(at, "replace expects old and new");
        const std::int64_t count = c && c->k != vk::none ? int_arg(c, at, "replace") : -1;
        return make_str(py_replace(to_str(v, at), to_str(*o, at), to_str(*w, at), count, at));
      }
      case filter_id::reverse: {
        if (v.k == vk::string) {
          auto cps = to_cps(v.str());
          std::reverse(cps.begin(), cps.end());
          return make_str(from_cps(cps));
        }
        if (v.k == vk::undefined) return make_list({});
        if (!v.is_seq() && v.k != vk::dict) fail(at, std::string("'") + type_name(v) + "' object is not reversible");
        auto items = iterate(v, at);
        std::reverse(items.begin(), items.end());
        return make_list(std::move(items));
      }
      case filter_id::safe:
      case filter_id::string:
        return make_str(to_str(v, at));
      case filter_id::sort: {
        const value* rev = a.get(0, "reverse");
        const value* cs = a.get(1, "case_sensitive");
        const value* attr = a.get(2, "attribute");
        return make_list(sorted(iterate(v, at), attr_name(attr, at), cs && truthy(*cs), rev && truthy(*rev), at));
      }
      case filter_id::sum: {
        const value* attr = a.get(0, "attribute");
        const value* start = a.get(1, "start");
        value acc = start ? *start : make_int(0);
        const std::string path = attr_name(attr, at);
        for (const auto& item : iterate(v, at))
          acc = arith(op::add, acc, path.empty() ? item : get_path(item, path, at), at);
        return acc;
      }
      case filter_id::title:
        return make_str(jinja_title(to_str(v, at)));
      case filter_id::tojson: {
        json_style st;
        const value* ea = a.get(0, "ensure_ascii");
        const value* ind = a.get(1, "indent");
        const value* seps = a.get(2, "separators");
        const value* sk = a.get(3, "sort_keys");
        st.ensure_ascii = ea && truthy(*ea);
        st.sort_keys = sk && truthy(*sk);
        if (ind && ind->k != vk::none) {
          if (ind->k == vk::string) {
            st.indent = ind->str();
          } else {
            const std::int64_t n = int_arg(ind, at, "tojson indent");
            st.indent = std::string(static_cast<std::size_t>(std::clamp<std::int64_t>(n, 0, 4096)), ' ');
          }
          st.item_sep = ",";
        }
        if (seps && seps->k != vk::none) {
          if (!seps->is_seq() || seps->list().items.size() != 2 || seps->list().items[0].k != vk::string ||
              seps->list().items[1].k != vk::string)
            fail(at, "tojson: separators must be a pair of strings");
          st.item_sep = seps->list().items[0].str();
          st.key_sep = seps->list().items[1].str();
        }
        bounded b{{}, lim_.max_output_bytes, at};
        json_into(v, st, 0, b);
        return str_value(at, std::move(b.out));
      }
      case filter_id::trim:
        return make_str(py_strip(to_str(v, at), opt_str(a.get(0, "chars"), at, "trim"), true, true));
      case filter_id::unique: {
        const value* cs = a.get(0, "case_sensitive");
        const value* attr = a.get(1, "attribute");
        const std::string path = attr_name(attr, at);
        std::vector<value> seen, out;
        for (const auto& item : iterate(v, at)) {
          const value k = sort_key(item, path, cs && truthy(*cs), at);
          if (std::any_of(seen.begin(), seen.end(), [&](const value& s) { return eq(s, k, at); })) continue;
          seen.push_back(k);
          out.push_back(item);
        }
        return make_list(std::move(out));
      }
      case filter_id::wordcount: {
        const auto cps = to_cps(to_str(v, at));
        std::int64_t n = 0;
        bool in_word = false;
        for (char32_t c : cps) {
          const bool w = c == '_' || is_digit_cp(c) || is_alpha_cp(c) || (c >= 0x80 && !py_space(c));
          if (w && !in_word) ++n;
          in_word = w;
        }
        return make_int(n);
      }
    }
    return v;
  }

  std::vector<value> sorted(std::vector<value> items, const std::string& attribute, bool case_sensitive, bool reverse,
                            pos at) {
    std::vector<std::pair<value, std::size_t>> keyed;
    keyed.reserve(items.size());
    for (std::size_t i = 0; i < items.size(); ++i)
      keyed.emplace_back(sort_key(items[i], attribute, case_sensitive, at), i);
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
      return reverse ? lt(y.first, x.first, at) : lt(x.first, y.first, at);
    });
    std::vector<value> out;
    out.reserve(items.size());
    for (const auto& [k, i] : keyed) out.push_back(items[i]);
    return out;
  }

  bool apply_test(test_id id, const value& v, const call_args& a, pos at) {
    auto arg = [&]() -> const value& {
      if (a.pos.empty()) fail(at, "this test expects an argument");
      return a.pos[0];
    };
    switch (id) {
      case test_id::defined:
        return v.k != vk::undefined;
      case test_id::undefined:
        return v.k == vk::undefined;
      case test_id::none:
        return v.k == vk::none;
      case test_id::boolean:
        return v.k == vk::boolean;
      case test_id::false_:
        return v.k == vk::boolean && !v.b;
      case test_id::true_:
        return v.k == vk::boolean && v.b;
      case test_id::integer:
        return v.k == vk::integer;
      case test_id::float_:
        return v.k == vk::floating;
      case test_id::number:
        return v.is_num();
      case test_id::string:
        return v.k == vk::string;
      case test_id::mapping:
        return v.k == vk::dict;
      case test_id::iterable:
      case test_id::sequence:
        return v.k == vk::undefined || v.k == vk::string || v.is_seq() || v.k == vk::dict;
      case test_id::callable:
        return v.k == vk::callable;
      case test_id::odd:
      case test_id::even: {
        if (v.k == vk::undefined) undefined_error(v, at);
        if (!v.is_num()) fail(at, std::string("unsupported operand type(s) for %: '") + type_name(v) + "' and 'int'");
        const value m = arith(op::mod, v, make_int(2), at);
        return (m.as_double() == 1) == (id == test_id::odd);
      }
      case test_id::divisibleby:
        return arith(op::mod, v, arg(), at).as_double() == 0;
      case test_id::eq:
        return eq(v, arg(), at);
      case test_id::ne:
        return !eq(v, arg(), at);
      case test_id::gt:
        return lt(arg(), v, at, ">");
      case test_id::ge:
        return lt(arg(), v, at, ">=") || eq(v, arg(), at);
      case test_id::lt:
        return lt(v, arg(), at, "<");
      case test_id::le:
        return lt(v, arg(), at, "<=") || eq(v, arg(), at);
      case test_id::in:
        return contains(arg(), v, at);
      case test_id::sameas: {
        const value& o = arg();
        if (v.k != o.k) return false;
        if (v.k == vk::none || v.k == vk::undefined) return true;
        if (v.k == vk::boolean) return v.b == o.b;
        if (v.k == vk::integer) return v.i == o.i && v.i >= -5 && v.i <= 256;
        if (v.k == vk::string) return v.s == o.s;
        return v.o == o.o;
      }
      case test_id::lower:
      case test_id::upper: {
        const auto cps = to_cps(to_str(v, at));
        bool cased = false;
        for (char32_t c : cps) {
          if (id == test_id::lower ? is_upper_cp(c) : is_lower_cp(c)) return false;
          cased = cased || is_cased_cp(c);
        }
        return cased;
      }
      case test_id::escaped:
        return false;
    }
    return false;
  }
};

}  // namespace
}  // namespace detail

// ---- Public API -----------------------------------------------------------------------------------------------

compiled_template compiled_template::parse(std::string_view source, const limits& lim) {
  if (source.size() > lim.max_template_bytes)
    throw template_error("chat template: " + std::to_string(source.size()) + " bytes exceeds max_template_bytes (" +
                             std::to_string(lim.max_template_bytes) + ")",
                         0, 0);
  auto p = std::make_shared<detail::program>();
  p->lim = lim;
  detail::parser ps(detail::lexer(source).run(), p->lim);
  p->root = ps.parse_template();
  return compiled_template(std::move(p));
}

std::string compiled_template::render(const nlohmann::ordered_json& context) const {
  return render(context, render_options{});
}

std::string compiled_template::render(const nlohmann::ordered_json& context,
                                      std::vector<std::pair<std::size_t, std::size_t>>* generation_spans) const {
  render_options opt;
  opt.generation_spans = generation_spans;
  return render(context, opt);
}

std::string compiled_template::render(const nlohmann::ordered_json& context, const render_options& options) const {
  detail::renderer r(*program_, options);
  return r.run(context);
}

}  // namespace levanter::data::jinja
