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

#include <string>
#include <string_view>
#include <utility>
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

// ---- reading the command line --------------------------------------------------------------------------------
namespace detail {

/// The command line read into one YAML tree (the config files merged in order, then the `--KEY VALUE` overrides),
/// before it is decoded into a config type.
struct raw_command_line {
  bool help = false;        // --help / -h (nothing else is read then)
  bool dry_run = false;     // --dry_run
  std::string config_path;  // the config file(s) read ("" when the default was used)
  source_map sources;       // where every key was set
  YAML::Node root;          // the merged tree (a map)
};

/// Parses the arguments and builds the tree (see parse_command_line). Throws config_error.
raw_command_line read_command_line(int argc, const char* const* argv, const std::string& default_yaml,
                                   const std::string& default_yaml_name);

}  // namespace detail

// ---- --help --------------------------------------------------------------------------------------------------
namespace detail {

template <class S>
void help_struct(const S& value, const std::string& path, std::string& out, const std::string& indent);

template <class T> struct optional_struct : std::false_type {};
template <has_schema T> struct optional_struct<std::optional<T>> : std::true_type {};
template <class T> struct optional_choice : std::false_type {};
template <class... A> struct optional_choice<std::optional<Choice<A...>>> : std::true_type {};
template <class T> struct vector_struct : std::false_type {};
template <has_schema T> struct vector_struct<std::vector<T>> : std::true_type {};

void help_line(std::string& out, const std::string& indent, const std::string& path, const std::string& type,
               const std::string& def, std::string_view doc);

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
  } else if constexpr (optional_choice<M>::value) {
    help_line(out, indent, path, type_label<M>(), v ? std::string(v->type_name()) : std::string("null"), doc);
    help_choice_alternatives(v ? *v : typename M::value_type{}, path, out, indent);
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
  auto raw = detail::read_command_line(argc, argv, default_yaml, default_yaml_name);
  command_line<T> r;
  r.help = raw.help;
  r.dry_run = raw.dry_run;
  if (r.help) {
    r.resolved_yaml = to_yaml_string(r.config);
    return r;
  }
  r.config_path = raw.config_path;
  r.sources = std::move(raw.sources);
  r.config = decode<T>(raw.root, "", r.sources, r.config_path.empty() ? default_yaml_name : r.config_path);
  r.resolved_yaml = to_yaml_string(r.config);
  return r;
}

}  // namespace levanter::config
