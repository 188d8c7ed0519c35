// Reader for tests/golden/random_golden.txt (written by
// tests/oracle/gen_random_golden.py).  Shared by the random tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "haliax/detail/threefry.hpp"

#ifndef HALIAX_GOLDEN_DIR
#define HALIAX_GOLDEN_DIR "tests/golden"
#endif

namespace haliax_test_golden {

struct record {
  int line = 0;
  std::string op;
  std::map<std::string, std::string> fields;
  std::vector<std::string> values;

  bool has(const std::string& k) const { return fields.count(k) != 0; }
  const std::string& at(const std::string& k) const {
    auto it = fields.find(k);
    if (it == fields.end()) throw std::runtime_error("golden line " + std::to_string(line) +
                                                     ": missing field " + k);
    return it->second;
  }
  std::string text() const {
    std::string s = op;
    for (const auto& [k, v] : fields) s += " " + k + "=" + (v.size() > 40 ? v.substr(0, 40) + "..." : v);
    return "line " + std::to_string(line) + ": " + s;
  }
};

inline std::uint64_t parse_hex(const std::string& s) { return std::stoull(s, nullptr, 16); }
inline std::int64_t parse_dec(const std::string& s) { return std::stoll(s); }
inline std::uint64_t parse_udec(const std::string& s) { return std::stoull(s); }

inline float hex_f32(const std::string& s) {
  const auto u = static_cast<std::uint32_t>(parse_hex(s));
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline double hex_f64(const std::string& s) {
  const std::uint64_t u = parse_hex(s);
  double f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline std::vector<std::string> split_on(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

inline haliax::detail::threefry::key_data key_of(const record& r) {
  const auto parts = split_on(r.at("key"), ',');
  if (parts.size() != 2) throw std::runtime_error("bad key in " + r.text());
  return {static_cast<std::uint32_t>(parse_hex(parts[0])),
          static_cast<std::uint32_t>(parse_hex(parts[1]))};
}

inline haliax::detail::threefry::counter_mode mode_of(const record& r) {
  return r.at("mode") == "o" ? haliax::detail::threefry::counter_mode::original
                             : haliax::detail::threefry::counter_mode::partitionable;
}

/// Shape field: "AxBxC", or "scalar" for ().
inline std::vector<std::size_t> shape_of(const record& r) {
  const std::string& s = r.at("shape");
  std::vector<std::size_t> out;
  if (s == "scalar") return out;
  for (const auto& p : split_on(s, 'x')) out.push_back(static_cast<std::size_t>(std::stoull(p)));
  return out;
}

inline std::size_t count_of(const std::vector<std::size_t>& shape) {
  std::size_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

inline std::vector<record> load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open golden file " + path);
  std::vector<record> out;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    const auto colon = line.find(" : ");
    if (colon == std::string::npos) throw std::runtime_error("bad golden line " + std::to_string(lineno));
    record r;
    r.line = lineno;
    std::istringstream head(line.substr(0, colon));
    head >> r.op;
    std::string tok;
    while (head >> tok) {
      const auto eq = tok.find('=');
      if (eq == std::string::npos) throw std::runtime_error("bad field on line " + std::to_string(lineno));
      r.fields[tok.substr(0, eq)] = tok.substr(eq + 1);
    }
    std::istringstream vals(line.substr(colon + 3));
    while (vals >> tok) r.values.push_back(tok);
    out.push_back(std::move(r));
  }
  return out;
}

/// All records, loaded once.
inline const std::vector<record>& all() {
  static const std::vector<record> recs = load(std::string(HALIAX_GOLDEN_DIR) + "/random_golden.txt");
  return recs;
}

inline std::vector<const record*> of(const std::string& op) {
  std::vector<const record*> out;
  for (const auto& r : all())
    if (r.op == op) out.push_back(&r);
  return out;
}

// splitmix64 hash used by the "exhaustive" records.
inline std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace haliax_test_golden
