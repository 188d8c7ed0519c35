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
