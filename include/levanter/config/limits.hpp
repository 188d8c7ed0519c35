// levanter/config/limits.hpp: the bounds the YAML config reader enforces on what it is given, so that a hostile or
// broken file cannot exhaust the stack, the memory or the time of the program reading it:
//
//   * nesting deeper than max_yaml_depth levels (maps and lists in maps and lists, across !include),
//   * more than max_yaml_nodes nodes visited while expanding aliases (`*x`) and includes (the "billion laughs"),
//     or more than max_yaml_expanded_bytes of scalar text and key paths after that expansion,
//   * an alias that refers to a node containing it (a cycle),
//   * config files (the main one and every `!include`) that are not regular files or are larger than
//     max_yaml_file_bytes, more than max_include_depth nested includes, or more than max_yaml_total_bytes read
//     in all,
//   * durations longer than max_duration_seconds (they are written back into config.yaml).
//
// Each is reported as a config_error naming the file (and line) and the limit.
#pragma once

#include <cstddef>
#include <string>

#include <levanter/config/yaml.hpp>

namespace levanter::config {

inline constexpr int max_yaml_depth = 64;
inline constexpr std::size_t max_yaml_nodes = 200'000;  // ~1.3 KiB each once decoded: ~260 MB at most
inline constexpr std::size_t max_yaml_expanded_bytes = std::size_t(64) << 20;  // 64 MiB
inline constexpr std::size_t max_yaml_key_bytes = 1024;
inline constexpr std::size_t max_yaml_file_bytes = std::size_t(16) << 20;      // 16 MiB
inline constexpr std::size_t max_yaml_total_bytes = std::size_t(64) << 20;     // 64 MiB over all files
inline constexpr int max_include_depth = 16;
inline constexpr double max_duration_seconds = 3650.0 * 86400.0;               // 3650 days

/// How `load_yaml_text` treats `!include`.
enum class include_policy {
  relative_to_cwd,  ///< resolved relative to the working directory (load_yaml_string)
  refuse,           ///< an error: the text may not read other files (fuzzing, untrusted text)
};

/// Like load_yaml_string, with every limit above, and `!include` resolved or refused as `policy` says.
YAML::Node load_yaml_text(const std::string& text, const std::string& name, source_map& sources,
                          include_policy policy);

/// Parse one YAML value (a command-line override) with the same limits; `what` names it in messages.
/// Throws YAML::Exception for text that is not YAML (the caller may then take it as a plain string).
YAML::Node load_yaml_value(const std::string& text, const std::string& what);

}  // namespace levanter::config
