// levanter/config/validate.hpp: the checks a program runs on a decoded config before doing any work.
//
// Each config section has a `validate(config::validator&, const Section&)` next to it (data/config.hpp,
// trainer/config.hpp, optim/config.hpp, models/<model>_config.hpp); a program's config composes them
// (`validate_train_lm` in main/train_lm.hpp). Every problem is reported at once: errors are features we refuse
// (with what to use instead) and impossible values; notes are keys we read but ignore (JAX-only settings). Each
// message starts with the dotted key path and, where known, the file and line it was set at:
//
//   data.id (config/gpt2_nano.yaml:2): Hugging Face datasets are not supported (no network here); convert ...
//   trainer.per_device_parallelism (x.yaml:9): train_batch_size 32 is not divisible by per_device_parallelism 5; ...
#pragma once

#include <cctype>
#include <cstdint>
#include <string>
#include <vector>

#include <levanter/config/yaml.hpp>

namespace levanter::config {

/// What validation found: `errors` stop the program; `notes` are keys accepted but ignored.
struct validation_result {
  std::vector<std::string> errors;
  std::vector<std::string> notes;
  bool ok() const { return errors.empty(); }
};

/// Builds messages in one template: "<key> (<file:line>): <problem>; <what to do>".
struct validator {
  const source_map& sources;
  validation_result result;

  bool set_in_config(const std::string& key) const { return sources.count(key) != 0; }
  /// Whether the config sets `prefix` or any key below it.
  bool set_under(const std::string& prefix) const {
    auto it = sources.lower_bound(prefix);
    return it != sources.end() && it->first.compare(0, prefix.size(), prefix) == 0 &&
           (it->first.size() == prefix.size() || it->first[prefix.size()] == '.');
  }
  std::string at(const std::string& key, const std::string& fallback = "") const {
    auto it = sources.find(key);
    const std::string w = it != sources.end() ? it->second : fallback;
    return w.empty() ? std::string() : " (" + w + ")";
  }
  void error(const std::string& key, const std::string& what, const std::string& where = "") {
    result.errors.push_back(key + at(key, where) + ": " + what);
  }
  void note(const std::string& key, const std::string& what) {
    result.notes.push_back(key + at(key) + ": " + what);
  }
  /// `key` refers to a feature we do not implement: "<name> is not supported...; <instead>".
  void refuse(const std::string& key, const std::string& feature, const std::string& instead,
              const std::string& where = "") {
    error(key, feature + "; " + instead, where);
  }
};

// ---- ranges ----------------------------------------------------------------------------------------------------
/// Bounds shared by the sections. Each key's own range is in its validate(); these keep the products that the
/// program forms in 64-bit integers (batch x seq_len x hidden_dim, batch x seq_len x vocab, sequences per run x
/// seq_len, layers x hidden x intermediate) below 2^63.
namespace bounds {
inline constexpr int64_t max_steps = int64_t(1) << 40;      ///< steps, step intervals and step indices
inline constexpr int64_t max_examples = int64_t(1) << 40;   ///< sequences over a run (batch sizes x steps)
inline constexpr int64_t max_batch = int64_t(1) << 20;      ///< sequences per batch or micro-batch
inline constexpr int64_t max_seq_len = int64_t(1) << 20;    ///< tokens per sequence (and attention windows)
inline constexpr int64_t max_model_dim = int64_t(1) << 17;  ///< hidden_dim, intermediate_dim, head_dim
inline constexpr int64_t max_layers = 4096;                 ///< num_layers
inline constexpr int64_t max_heads = 4096;                  ///< num_heads, num_kv_heads
inline constexpr int64_t max_vocab = int64_t(1) << 22;      ///< vocab_size
inline constexpr std::size_t max_name_chars = 128;          ///< run ids and other names used as path components
}  // namespace bounds

/// `lo <= x <= hi`, else "<key> (<where>): must be an integer in [lo, hi] (got x)<; hint>". Returns whether it is.
bool check_int(validator& v, const std::string& key, int64_t x, int64_t lo, int64_t hi, const std::string& hint = "");
/// A finite `x` in the range (`lo_open`/`hi_open`: excluding that end), else an error naming the range.
bool check_real(validator& v, const std::string& key, double x, double lo, double hi, bool lo_open = false,
                bool hi_open = false, const std::string& hint = "");
/// A value that becomes one path component (a directory or file name): 1 to 128 of letters, digits, '-', '_' and
/// '.', not starting with '.'. `what` names it ("run id").
bool check_path_component(validator& v, const std::string& key, const std::string& value, const std::string& what);
/// Integers as written in messages: 1099511627776 -> "2^40" when a power of two above 2^16, else decimal.
std::string fmt_bound(int64_t x);

inline std::string url_scheme(const std::string& url) {
  auto p = url.find("://");
  if (p == std::string::npos || p == 0) return {};
  for (std::size_t i = 0; i < p; ++i)
    if (!std::isalnum(static_cast<unsigned char>(url[i])) && url[i] != '+' && url[i] != '-' && url[i] != '.')
      return {};
  return url.substr(0, p);
}

inline std::string fmt_num(double v) { return detail::format_double(v); }

inline void check_remote(validator& v, const std::string& key, const std::string& value, const std::string& what) {
  if (auto s = url_scheme(value); !s.empty())
    v.refuse(key, "'" + value + "' is a remote URL (" + s + "://); remote storage is not supported (no network here)",
             "copy the files to a local disk and use a local " + what);
}

}  // namespace levanter::config
