// levanter/config/cli.hpp: the command line of a config-driven program, as draccus reads it.
//
//   train_lm config/gpt2_nano.yaml --trainer.num_train_steps 10 --data.train_urls '["a.jsonl"]'
//   train_lm --config_path x.yaml --optimizer '{type: adam, learning_rate: 1e-3}' --dry_run
//   train_lm --configs base.yaml small.yaml          # later files override earlier ones, maps are merged
//   train_lm --help                                  # every option with its type, default and doc
//
// Overrides are parsed as YAML (flow style) and merged into the YAML tree before it is decoded, so an override
// inside a choice (`--optimizer.lr_schedule.exponent 2`) or under a section the file does not have works, and an
// unknown key gets the same "did you mean" error as in a file, with `command line` as its position.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <levanter/config/yaml.hpp>

namespace levanter::config {

/// What `parse_command_line` found: the decoded config and where every key was set.
template <class T>
struct command_line {
  T config{};
  source_map sources;
  bool help = false;           // --help / -h: print help_text and exit
  bool dry_run = false;        // --dry_run: print the resolved config and exit
  std::string config_path;     // the config file(s) read ("" when the default was used)
  std::string resolved_yaml;   // to_yaml_string(config)
};

// ---- merging YAML trees ----------------------------------------------------------------------------------------
namespace detail {

inline void erase_prefix(source_map& sources, const std::string& path) {
  if (path.empty()) return sources.clear();
  for (auto it = sources.lower_bound(path); it != sources.end() && it->first.rfind(path, 0) == 0;) {
    const std::string& k = it->first;
    if (k.size() == path.size() || k[path.size()] == '.' || k[path.size()] == '[') it = sources.erase(it);
    else ++it;
  }
}

inline void copy_prefix(source_map& to, const source_map& from, const std::string& path) {
  for (auto it = from.lower_bound(path); it != from.end() && it->first.rfind(path, 0) == 0; ++it) {
    const std::string& k = it->first;
    if (path.empty() || k.size() == path.size() || k[path.size()] == '.' || k[path.size()] == '[') to[k] = it->second;
  }
}

inline std::string type_of(const YAML::Node& n) {
  return n.IsMap() && n["type"] && n["type"].IsScalar() ? n["type"].Scalar() : std::string();
}

/// Merge `over` into `base` at `path`: maps merge key by key (a map with a different `type:` replaces the old one),
/// anything else replaces. A choice written as a bare name (`lr_schedule: cosine`) becomes `{type: cosine}` when a
/// map without `type:` is merged into it. Positions follow the winning value.
inline YAML::Node merge(const YAML::Node& base, const YAML::Node& over, const std::string& path, source_map& sources,
                        const source_map& over_sources) {
  YAML::Node b = base;
  if (b.IsScalar() && !b.IsNull() && over.IsMap() && !over["type"]) {
    YAML::Node m(YAML::NodeType::Map);
    m["type"] = YAML::Node(b.Scalar());
    b.reset(m);
  }
  const bool both_maps = b.IsMap() && over.IsMap();
  const bool retyped = both_maps && !type_of(over).empty() && type_of(over) != type_of(b);
  if (!both_maps || retyped) {
    erase_prefix(sources, path);
    copy_prefix(sources, over_sources, path);
    return over;
  }
  YAML::Node out(YAML::NodeType::Map);
  for (auto it = b.begin(); it != b.end(); ++it) out[it->first.Scalar()] = it->second;
  for (auto it = over.begin(); it != over.end(); ++it) {
    const std::string key = it->first.Scalar();
    const std::string p = join_key(path, key);
    YAML::Node merged = out[key] ? merge(out[key], it->second, p, sources, over_sources)
                                 : (copy_prefix(sources, over_sources, p), it->second);
    if (auto pos = over_sources.find(p); pos != over_sources.end()) sources[p] = pos->second;
    out.remove(key);
    out[key] = merged;
  }
  return out;
}

inline void mark_all(const YAML::Node& n, const std::string& path, const std::string& origin, source_map& s) {
  s[path] = origin;
  if (n.IsMap())
    for (auto it = n.begin(); it != n.end(); ++it) mark_all(it->second, join_key(path, it->first.Scalar()), origin, s);
  else if (n.IsSequence())
    for (std::size_t i = 0; i < n.size(); ++i) mark_all(n[i], join_index(path, i), origin, s);
}

/// `--a.b.c VALUE` as the tree {a: {b: {c: VALUE}}} (VALUE parsed as YAML; unparsable text stays a string).
inline YAML::Node override_tree(const std::string& dotted, const std::string& value, source_map& over_sources) {
  YAML::Node v;
  try {
    v.reset(YAML::Load(value));
  } catch (const YAML::Exception&) {
    v.reset(YAML::Node(value));
  }
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    auto dot = dotted.find('.', start);
    parts.push_back(dotted.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (const auto& p : parts)
    if (p.empty()) throw config_error("command line: malformed option '--" + dotted + "' (empty key)");
  mark_all(v, dotted, "command line", over_sources);
  std::string prefix;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    prefix = join_key(prefix, parts[i]);
    over_sources[prefix] = "command line";
  }
  YAML::Node tree = v;
  for (std::size_t i = parts.size(); i-- > 0;) {
    YAML::Node m(YAML::NodeType::Map);
    m[parts[i]] = tree;
    tree.reset(m);
  }
  return tree;
}

inline std::string find_config_file(const std::string& p) {
  for (const std::string& c : {p, p + ".yaml", p + ".yml"})
    if (std::filesystem::is_regular_file(c)) return c;
  std::error_code ec;
  throw config_error("config file '" + p + "' not found (working directory: " +
                     std::filesystem::current_path(ec).string() + "; relative paths are taken from there)");
}

}  // namespace detail

// ---- --help --------------------------------------------------------------------------------------------------
namespace detail {

template <class S>
void help_struct(const S& value, const std::string& path, std::string& out, const std::string& indent);

template <class T> struct optional_struct : std::false_type {};
template <has_schema T> struct optional_struct<std::optional<T>> : std::true_type {};
template <class T> struct vector_struct : std::false_type {};
template <has_schema T> struct vector_struct<std::vector<T>> : std::true_type {};

inline void help_line(std::string& out, const std::string& indent, const std::string& path, const std::string& type,
                      const std::string& def, std::string_view doc) {
  out += indent + "--" + path + " " + type;
  if (!def.empty()) out += " (default " + (def == "~" ? std::string("null") : def) + ")";
  if (!doc.empty()) out += ": " + std::string(doc);
  out += "\n";
}

template <class... A>
void help_choice_alternatives(const Choice<A...>& current, const std::string& path, std::string& out,
                              const std::string& indent) {
  auto one = [&]<class Alt>(Alt*) {
    const Alt* cur = current.template get_if<Alt>();
    Alt def = cur ? *cur : Alt{};
    out += indent + "  with type: " + std::string(Alt::type_name) +
           (std::tuple_size_v<decltype(schema<Alt>::fields)> == 0 ? " (no options)\n" : "\n");
    help_struct(def, path, out, indent + "    ");
  };
  (one(static_cast<A*>(nullptr)), ...);
}

template <class M>
void help_field(const M& v, const std::string& path, std::string_view doc, std::string& out,
                const std::string& indent) {
  if constexpr (has_schema<M>) {
    out += indent + "--" + path + ": " + std::string(doc) + "\n";
    help_struct(v, path, out, indent + "  ");
  } else if constexpr (is_choice<M>::value) {
    help_line(out, indent, path, type_label<M>(), std::string(v.type_name()), doc);
    help_choice_alternatives(v, path, out, indent);
  } else if constexpr (is_one_or_many<M>::value) {
    help_line(out, indent, path, type_label<M>(), to_flow_string(encode(v)), doc);
    using E = typename decltype(v.items)::value_type;
    if constexpr (is_choice<E>::value) help_choice_alternatives(v.items.empty() ? E{} : v.items.front(), path, out, indent);
    else if constexpr (has_schema<E>) help_struct(v.items.empty() ? E{} : v.items.front(), path, out, indent + "  ");
  } else if constexpr (optional_struct<M>::value) {
    help_line(out, indent, path, "MAP", to_flow_string(encode(v)), doc);
    help_struct(v ? *v : typename M::value_type{}, path, out, indent + "  ");
  } else if constexpr (vector_struct<M>::value) {
    help_line(out, indent, path, "[MAP]", to_flow_string(encode(v)), doc);
    help_struct(typename M::value_type{}, path + "[]", out, indent + "  ");
  } else if constexpr (is_variant<M>::value) {
    help_line(out, indent, path, type_label<M>(), to_flow_string(encode(v)), doc);
    [&]<class... A>(const std::variant<A...>*) {
      auto one = [&]<class Alt>(Alt*) {
        if constexpr (has_schema<Alt>) help_struct(Alt{}, path, out, indent + "  ");
      };
      (one(static_cast<A*>(nullptr)), ...);
    }(&v);
  } else {
    help_line(out, indent, path, type_label<M>(), to_flow_string(encode(v)), doc);
  }
}

template <class S>
void help_struct(const S& value, const std::string& path, std::string& out, const std::string& indent) {
  std::apply([&](const auto&... f) { (help_field(value.*(f.member), join_key(path, f.name), f.doc, out, indent), ...); },
             schema<S>::fields);
}

}  // namespace detail

/// Every option of T, one per line: `--trainer.seed INT (default 0): doc`, sections recursed, choices with the
/// options of each alternative.
template <class T>
std::string help_text(const std::string& program, const T& defaults = T{}) {
  std::string out = "usage: " + program +
                    " [CONFIG.yaml | --config_path CONFIG.yaml | --configs A.yaml B.yaml ...] [--KEY VALUE ...]"
                    " [--dry_run] [--help]\n\n"
                    "Options are YAML keys; nested keys are dotted (--trainer.num_train_steps 10) and values are YAML\n"
                    "(--data.train_urls '[\"a.jsonl\"]', --optimizer '{type: adam, learning_rate: 1e-3}').\n"
                    "  --config_path FILE: YAML config (also accepted as the first argument)\n"
                    "  --configs FILE...: several YAML configs, later ones override earlier ones\n"
                    "  --dry_run: print the resolved config and exit\n"
                    "  --help, -h: print this help\n\n";
  detail::help_struct(defaults, "", out, "");
  return out;
}

// ---- parsing -------------------------------------------------------------------------------------------------
/// Read the command line of a program whose config is T. With no config file, `default_yaml` (named
/// `default_yaml_name` in messages) is used; "" means T's own defaults. Throws config_error.
template <class T>
command_line<T> parse_command_line(int argc, const char* const* argv, const std::string& default_yaml = "",
                                   const std::string& default_yaml_name = "<default config>") {
  command_line<T> r;
  std::vector<std::string> files;
  std::vector<std::pair<std::string, std::string>> overrides;
  std::vector<std::string> args(argv + (argc > 0 ? 1 : 0), argv + std::max(argc, 0));
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto next_value = [&](const std::string& opt) -> std::string {
      if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0)
        throw config_error("command line: option '" + opt + "' needs a value");
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      r.help = true;
    } else if (a == "--dry_run" || a == "--dry-run") {
      r.dry_run = true;
    } else if (i == 0 && !a.empty() && a[0] != '-') {
      files.push_back(a);
    } else if (a == "--config_path" || a == "--config-path") {
      files.push_back(next_value(a));
    } else if (a.rfind("--config_path=", 0) == 0) {
      files.push_back(a.substr(14));
    } else if (a == "--configs") {
      if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0)
        throw config_error("command line: option '--configs' needs at least one file");
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) files.push_back(args[++i]);
    } else if (a.rfind("--", 0) == 0 && a.size() > 2) {
      auto eq = a.find('=');
      if (eq != std::string::npos) overrides.emplace_back(a.substr(2, eq - 2), a.substr(eq + 1));
      else overrides.emplace_back(a.substr(2), next_value(a));
    } else {
      throw config_error("command line: unexpected argument '" + a +
                         "' (options are --KEY VALUE; the config file may only come first)");
    }
  }
  if (r.help) {
    r.resolved_yaml = to_yaml_string(r.config);
    return r;
  }

  YAML::Node root;
  if (files.empty()) {
    root.reset(default_yaml.empty() ? YAML::Node(YAML::NodeType::Map)
                                    : load_yaml_string(default_yaml, default_yaml_name, r.sources));
  } else {
    for (std::size_t k = 0; k < files.size(); ++k) {
      std::string path = detail::find_config_file(files[k]);
      r.config_path += (k ? " " : "") + path;
      source_map s;
      YAML::Node tree = load_yaml_file(path, s);
      if (k == 0) root.reset(tree), r.sources = std::move(s);
      else root.reset(detail::merge(root, tree, "", r.sources, s));
    }
  }
  if (root.IsNull()) root.reset(YAML::Node(YAML::NodeType::Map));
  if (!root.IsMap())
    throw config_error((r.config_path.empty() ? default_yaml_name : r.config_path) +
                       ": the top level of a config must be a map of keys");
  for (const auto& [key, value] : overrides) {
    source_map s;
    YAML::Node tree = detail::override_tree(key, value, s);
    root.reset(detail::merge(root, tree, "", r.sources, s));
  }
  r.config = decode<T>(root, "", r.sources, r.config_path.empty() ? default_yaml_name : r.config_path);
  r.resolved_yaml = to_yaml_string(r.config);
  return r;
}

}  // namespace levanter::config
