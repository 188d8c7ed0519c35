// config/validate.hpp: the range checks shared by the config sections' validate().
#include <levanter/config/validate.hpp>

#include <cmath>

namespace levanter::config {

std::string fmt_bound(int64_t x) {
  if (x > 65536 && (x & (x - 1)) == 0) {
    int k = 0;
    while ((int64_t(1) << k) != x) ++k;
    return "2^" + std::to_string(k) + " = " + std::to_string(x);
  }
  return std::to_string(x);
}

bool check_int(validator& v, const std::string& key, int64_t x, int64_t lo, int64_t hi, const std::string& hint) {
  if (x >= lo && x <= hi) return true;
  v.error(key, "must be an integer in [" + fmt_bound(lo) + ", " + fmt_bound(hi) + "] (got " + std::to_string(x) + ")" +
                   (hint.empty() ? std::string() : "; " + hint));
  return false;
}

bool check_real(validator& v, const std::string& key, double x, double lo, double hi, bool lo_open, bool hi_open,
                const std::string& hint) {
  const bool ok = std::isfinite(x) && (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  if (ok) return true;
  v.error(key, "must be a finite number in " + std::string(lo_open ? "(" : "[") + fmt_num(lo) + ", " + fmt_num(hi) +
                   (hi_open ? ")" : "]") + " (got " + fmt_num(x) + ")" + (hint.empty() ? std::string() : "; " + hint));
  return false;
}

bool check_path_component(validator& v, const std::string& key, const std::string& value, const std::string& what) {
  std::string why;
  if (value.empty()) {
    why = "is empty";
  } else if (value.size() > bounds::max_name_chars) {
    why = "is " + std::to_string(value.size()) + " characters long";
  } else if (value[0] == '.') {
    why = "starts with '.'";
  } else {
    for (char c : value)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
        const auto u = static_cast<unsigned char>(c);
        why = (u >= 0x20 && u < 0x7f) ? "contains '" + std::string(1, c) + "'"
                                       : "contains the byte " + std::to_string(int(u));
        break;
      }
  }
  if (why.empty()) return true;
  v.error(key, "the " + what + " '" + (value.size() > 64 ? value.substr(0, 64) + "..." : value) + "' " + why + "; a " +
                   what + " names a directory, so it must be 1 to " + std::to_string(bounds::max_name_chars) +
                   " letters, digits, '-', '_' or '.', not starting with '.'");
  return false;
}

}  // namespace levanter::config
