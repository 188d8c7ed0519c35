// config/cli.hpp: reading the command line into one YAML tree (files, merging, --KEY VALUE overrides), and --help
// lines.
#include <algorithm>
#include <filesystem>
#include <levanter/config/cli.hpp>
#include <levanter/config/limits.hpp>

namespace levanter::config::detail {

namespace {

void erase_prefix(source_map& sources, const std::string& path) {
  if (path.empty()) return sources.clear();
  for (auto it = sources.lower_bound(path); it != sources.end() && it->first.rfind(path, 0) == 0;) {
    const std::string& k = it->first;
    if (k.size() == path.size() || k[path.size()] == '.' || k[path.size()] == '[')
      it = sources.erase(it);
    else
      ++it;
  }
}

void copy_prefix(source_map& to, const source_map& from, const std::string& path) {
  for (auto it = from.lower_bound(path); it != from.end() && it->first.rfind(path, 0) == 0; ++it) {
    const std::string& k = it->first;
    if (path.empty() || k.size() == path.size() || k[path.size()] == '.' || k[path.size()] == '[') to[k] = it->second;
  }
}

std::string type_of(const YAML::Node& n) {
  return n.IsMap() && n["type"] && n["type"].IsScalar() ? n["type"].Scalar() : std::string();
}

/// Merge `over` into `base` at `path`: maps merge key by key (a map with a different `type:` replaces the old one),
/// anything else replaces. A choice written as a bare name (`lr_schedule: cosine`) becomes `{type: cosine}` when a
/// map without `type:` is merged into it. Positions follow the winning value.
YAML::Node merge(const YAML::Node& base, const YAML::Node& over, const std::string& path, source_map& sources,
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

void mark_all(const YAML::Node& n, const std::string& path, const std::string& origin, source_map& s) {
  s[path] = origin;
  if (n.IsMap())
    for (auto it = n.begin(); it != n.end(); ++it) mark_all(it->second, join_key(path, it->first.Scalar()), origin, s);
  else if (n.IsSequence())
    for (std::size_t i = 0; i < n.size(); ++i) mark_all(n[i], join_index(path, i), origin, s);
}

/// `--a.b.c VALUE` as the tree {a: {b: {c: VALUE}}} (VALUE parsed as YAML; unparsable text stays a string).
YAML::Node override_tree(const std::string& dotted, const std::string& value, source_map& over_sources) {
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
  if (parts.size() > std::size_t(max_yaml_depth))
    throw config_error("command line: option '--" + dotted.substr(0, 80) + "...' has more than " +
                       std::to_string(max_yaml_depth) + " dotted parts (the nesting limit)");
  const std::string what = "command line (--" + dotted + ")";
  YAML::Node v;
  try {
    v.reset(load_yaml_value(value, what));
  } catch (const YAML::Exception&) {
    v.reset(YAML::Node(value));  // not YAML: the text itself
  }
  // The value sits parts.size() levels down; together they must stay within the nesting limit.
  std::vector<YAML::Node> stack{v};
  for (int depth = int(parts.size()); !stack.empty() && depth <= max_yaml_depth + 1; ++depth) {
    std::vector<YAML::Node> next;
    for (const auto& n : stack) {
      if (!n.IsMap() && !n.IsSequence()) continue;
      if (depth >= max_yaml_depth)
        throw config_error(what + ": maps and lists nested more than " + std::to_string(max_yaml_depth) +
                           " levels deep, counting the dotted key (the limit is " + std::to_string(max_yaml_depth) +
                           ")");
      if (n.IsMap())
        for (auto it = n.begin(); it != n.end(); ++it) next.push_back(it->second);
      else
        for (const auto& c : n) next.push_back(c);
    }
    stack = std::move(next);
  }
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

std::string find_config_file(const std::string& p) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (p.empty()) throw config_error("command line: the config file path is empty; give the path of a YAML file");
  for (const std::string& c : {p, p + ".yaml", p + ".yml"})
    if (fs::is_regular_file(c, ec)) return c;
  if (fs::is_directory(p, ec))
    throw config_error("config file '" + p + "' is a directory, not a YAML file; give the path of a YAML file");
  if (fs::exists(p, ec))
    throw config_error("config file '" + p + "' is not a regular file (a device, pipe or socket); give the path "
                       "of a YAML file");
  throw config_error("config file '" + p + "' not found (working directory: " +
                     std::filesystem::current_path(ec).string() + "; relative paths are taken from there)");
}

}  // namespace

void help_line(std::string& out, const std::string& indent, const std::string& path, const std::string& type,
               const std::string& def, std::string_view doc) {
  out += indent + "--" + path + " " + type;
  if (!def.empty()) out += " (default " + (def == "~" ? std::string("null") : def) + ")";
  if (!doc.empty()) out += ": " + std::string(doc);
  out += "\n";
}

raw_command_line read_command_line(int argc, const char* const* argv, const std::string& default_yaml,
                                   const std::string& default_yaml_name) {
  raw_command_line r;
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
      if (eq != std::string::npos)
        overrides.emplace_back(a.substr(2, eq - 2), a.substr(eq + 1));
      else
        overrides.emplace_back(a.substr(2), next_value(a));
    } else {
      throw config_error("command line: unexpected argument '" + a +
                         "' (options are --KEY VALUE; the config file may only come first)");
    }
  }
  if (r.help) return r;

  YAML::Node root;
  if (files.empty()) {
    root.reset(default_yaml.empty() ? YAML::Node(YAML::NodeType::Map)
                                    : load_yaml_string(default_yaml, default_yaml_name, r.sources));
  } else {
    for (std::size_t k = 0; k < files.size(); ++k) {
      std::string path = find_config_file(files[k]);
      r.config_path += (k ? " " : "") + path;
      source_map s;
      YAML::Node tree = load_yaml_file(path, s);
      if (k == 0)
        root.reset(tree), r.sources = std::move(s);
      else
        root.reset(merge(root, tree, "", r.sources, s));
    }
  }
  if (root.IsNull()) root.reset(YAML::Node(YAML::NodeType::Map));
  if (!root.IsMap())
    throw config_error((r.config_path.empty() ? default_yaml_name : r.config_path) +
                       ": the top level of a config must be a map of keys");
  for (const auto& [key, value] : overrides) {
    source_map s;
    YAML::Node tree = override_tree(key, value, s);
    root.reset(merge(root, tree, "", r.sources, s));
  }
  r.root.reset(root);
  return r;
}

}  // namespace levanter::config::detail
