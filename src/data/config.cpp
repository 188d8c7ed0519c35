// data/config.hpp: checks of the `data:` section.
#include <levanter/data/config.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <levanter/config/validate.hpp>

namespace levanter {

using config::check_int;
using config::check_path_component;
using config::check_remote;
namespace bounds = config::bounds;
using config::detail::join_index;
using config::url_scheme;

namespace {
// A `format:` (the dataset's, or a mixture component's): `type: text` with an optional `text_key` and `pack`, `type:
// supervised` with upstream's keys, or `type: chat` (multi-turn through a chat template, or with `single_turn: true`
// supervised pairs as upstream reads them).
void check_format(config::validator& v, const std::string& key, const YAML::Node& f, const std::string& where) {
  const std::string type = f.IsScalar() ? f.Scalar() : (f.IsMap() && f["type"] ? f["type"].Scalar() : "text");
  if (type != "text" && type != "supervised" && type != "chat") {
    v.error(key, "unknown format '" + type + "'; use text, supervised or chat", where);
    return;
  }
  auto flag = [&](const char* k) {
    try {
      return f.IsMap() && f[k] && f[k].IsScalar() && f[k].as<bool>();
    } catch (const YAML::Exception&) {
      return false;
    }
  };
  if (type == "chat" && flag("single_turn") && f["chat_template"] && !f["chat_template"].IsNull())
    v.error(key + ".chat_template", "chat templates are not supported for single-turn chat (as upstream)", where);
  if (!f.IsMap()) return;
  const std::map<std::string, std::vector<std::string>> keys = {
      {"text", {"text_key", "pack"}},
      {"supervised", {"input_field", "output_field", "separate_with", "pack", "mask_inputs"}},
      {"chat", {"messages_field", "single_turn", "chat_template", "pack", "mask_user_turns"}}};
  const auto& allowed = keys.at(type);
  for (auto it = f.begin(); it != f.end(); ++it) {
    const std::string k = it->first.Scalar();
    if (k != "type" && std::find(allowed.begin(), allowed.end(), k) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      v.error(key + "." + k, "not a key of format '" + type + "' (" + list + ")", where);
      continue;
    }
    if (k == "pack" || k == "mask_inputs" || k == "single_turn" || k == "mask_user_turns") {
      bool ok = it->second.IsScalar();
      try {
        if (ok) (void)it->second.as<bool>();
      } catch (const YAML::Exception&) {
        ok = false;
      }
      if (!ok) v.error(key + "." + k, "expected true or false", where);
    }
    if (k == "separate_with" && !it->second.IsNull() && !it->second.IsScalar())
      v.error(key + "." + k, "expected the separator's text", where);
    if ((k == "chat_template" && !it->second.IsNull() && !it->second.IsScalar()) ||
        (k == "messages_field" && !it->second.IsScalar()))
      v.error(key + "." + k, k == "chat_template" ? "expected the template's text" : "expected a field name", where);
  }
}
// Simulated epoching (target_budget, experiment_budget), max_train_batches and num_validation_sequences: a
// mixture's caps, as upstream's LMMixtureDatasetConfig (budgets exclude the two maps there).
void check_caps(config::validator& v, const LmDataConfig& d) {
  const bool caps = d.target_budget.set || d.experiment_budget.set || d.max_train_batches.set ||
                    d.num_validation_sequences.set;
  if (caps && !d.configs.set) {
    for (const auto& [k, o] : {std::pair<const char*, const config::Opaque*>{"data.target_budget", &d.target_budget},
                               {"data.experiment_budget", &d.experiment_budget},
                               {"data.max_train_batches", &d.max_train_batches},
                               {"data.num_validation_sequences", &d.num_validation_sequences}})
      if (o->set)
        v.error(k, "caps the datasets of a mixture (data.configs); a single dataset is shortened with its files, or "
                   "ended with epoch: N", o->where);
    return;
  }
  std::optional<std::int64_t> budget[2];
  const std::pair<const char*, const config::Opaque*> budgets[] = {{"data.target_budget", &d.target_budget},
                                                                   {"data.experiment_budget", &d.experiment_budget}};
  for (int i = 0; i < 2; ++i) {
    if (!budgets[i].second->set) continue;
    const YAML::Node n = config::detail::load_opaque(budgets[i].second->yaml);
    if (n.IsNull()) continue;
    try {
      budget[i] = n.as<std::int64_t>();
    } catch (const YAML::Exception&) {
    }
    if (!budget[i] || *budget[i] <= 0)
      v.error(budgets[i].first, "must be a positive number of tokens (got '" + (n.IsScalar() ? n.Scalar() : "?") + "')",
              budgets[i].second->where);
  }
  if (budget[0].has_value() != budget[1].has_value() && (budget[0] || budget[1]))
    v.note(budget[0] ? "data.target_budget" : "data.experiment_budget",
           "ignored: simulated epoching needs both target_budget and experiment_budget");
  if (budget[0] && budget[1] && *budget[1] > *budget[0])
    v.error("data.experiment_budget", "experiment budget should be smaller than target budget, got " +
                                          std::to_string(*budget[1]) + " > " + std::to_string(*budget[0]),
            d.experiment_budget.where);
  // {name: count} maps of datasets of data.configs.
  const YAML::Node c = config::detail::load_opaque(d.configs.yaml);
  const std::pair<const char*, const config::Opaque*> maps[] = {
      {"max_train_batches", &d.max_train_batches}, {"num_validation_sequences", &d.num_validation_sequences}};
  for (const auto& [k, o] : maps) {
    if (!o->set) continue;
    const std::string key = std::string("data.") + k;
    if (budget[0] && budget[1])
      v.error(key, "cannot be combined with simulated epoching (target_budget, experiment_budget)", o->where);
    const YAML::Node m = config::detail::load_opaque(o->yaml);
    if (!m.IsMap() && !m.IsNull()) {
      v.error(key, "expected a map of dataset name -> count, e.g. {web: 1000}", o->where);
      continue;
    }
    if (!m.IsMap()) continue;
    for (auto it = m.begin(); it != m.end(); ++it) {
      const std::string name = it->first.Scalar(), at = key + "." + name;
      if (!c.IsMap() || !c[name]) v.error(at, "no dataset '" + name + "' in data.configs", o->where);
      std::int64_t n = 0;
      try {
        n = it->second.as<std::int64_t>();
      } catch (const YAML::Exception&) {
      }
      if (n <= 0 || n > bounds::max_examples)
        v.error(at, "must be a positive count (got '" + (it->second.IsScalar() ? it->second.Scalar() : "?") + "')",
                o->where);
    }
  }
}
}  // namespace

void validate(config::validator& v, const LmDataConfig& d) {
  if (d.id)
    v.refuse("data.id", "Hugging Face datasets ('" + *d.id + "') are not supported (no network here)",
             "convert the dataset to local .jsonl files and list them in data.train_urls / data.validation_urls");
  const std::pair<const char*, const std::vector<std::string>*> url_lists[] = {
      {"data.train_urls", &d.train_urls}, {"data.validation_urls", &d.validation_urls}};
  for (const auto& [name, list] : url_lists)
    for (std::size_t i = 0; i < list->size(); ++i)
      check_remote(v, join_index(name, i), (*list)[i], "path (globs and {a..b} ranges work)");
  check_remote(v, "data.cache_dir", d.cache_dir, "cache directory");

  // Mixtures: configs + train_weights (checked in full when the data is built: names, weights, stages).
  // Mixture dataset names become cache subdirectories (<cache_dir>/<name>); upstream names such as paloma/4chan
  // nest, so a name is '/'-separated parts, each a safe directory name (no '..', no absolute paths).
  if (d.configs.set) {
    YAML::Node c = config::detail::load_opaque(d.configs.yaml);
    if (c.IsMap())
      for (auto it = c.begin(); it != c.end(); ++it) {
        const std::string name = it->first.Scalar();
        const std::string key = "data.configs." + name;
        if (it->second.IsMap() && it->second["format"])
          check_format(v, key + ".format", it->second["format"], d.configs.where);
        if (it->second.IsMap())  // (as dataset_specs reads them, so that --dry_run says what a run would)
          for (auto f = it->second.begin(); f != it->second.end(); ++f) {
            const std::string k = f->first.Scalar();
            if (k == "id" || k == "name" || k == "stream")
              v.refuse(key + "." + k, "Hugging Face datasets are not supported (no network here)",
                       "convert the dataset to local .jsonl files and list them in train_urls", d.configs.where);
            else if (k != "train_urls" && k != "validation_urls" && k != "cache_dir" && k != "tags" && k != "format")
              v.error(key + "." + k, "unknown key of a dataset (use train_urls, validation_urls, cache_dir, tags, format)",
                      d.configs.where);
          }
        std::size_t start = 0;
        while (true) {
          const auto slash = name.find('/', start);
          const std::string part = name.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
          config::validator one{v.sources, {}};
          if (!check_path_component(one, key, part, "dataset name part")) {
            v.error(key, "the dataset name '" + name + "' names cache subdirectories, so it must be '/'-separated parts "
                         "of 1 to 128 letters, digits, '-', '_' or '.', none starting with '.' (e.g. paloma/4chan)");
            break;
          }
          if (slash == std::string::npos) break;
          start = slash + 1;
        }
      }
  }
  if (d.cache_dir.empty()) v.error("data.cache_dir", "is empty; give a directory (default cache/)");
  if (d.vocab_size) check_int(v, "data.vocab_size", *d.vocab_size, 1, bounds::max_vocab);
  check_int(v, "data.ignore_token_id", d.ignore_token_id, INT32_MIN, INT32_MAX, "token ids are 32-bit");
  if (d.shuffle_buffer_size) check_int(v, "data.shuffle_buffer_size", *d.shuffle_buffer_size, 1, bounds::max_examples);
  check_int(v, "data.cache_options.num_shard_groups", d.cache_options.num_shard_groups, 1, 1 << 20);
  if (d.train_weights.set && !d.configs.set)
    v.error("data.train_weights", "mixture weights need data.configs (a map of dataset name -> sources)");
  if (d.configs.set && (!d.train_urls.empty() || !d.validation_urls.empty()))
    v.error("data.configs", "give either data.configs (a mixture) or data.train_urls/validation_urls (one dataset), "
                            "not both");
  if (d.stop_strategy) {
    const std::string& s = *d.stop_strategy;
    if (s != "restart" && s != "first_exhausted" && s != "all_exhausted")
      v.error("data.stop_strategy", "unknown stop strategy '" + s + "': use restart, first_exhausted or all_exhausted");
    else if (s != "restart" && !d.configs.set)
      v.note("data.stop_strategy", "ignored (it ends a mixture, data.configs; end a single dataset with epoch: N)");
  }
  if (d.mixture_block_size && (*d.mixture_block_size <= 0 || *d.mixture_block_size >= 65536))
    v.error("data.mixture_block_size", "must be in [1, 65535] (got " + std::to_string(*d.mixture_block_size) + ")");
  check_caps(v, d);
  if (d.bad_documents != "stop" && d.bad_documents != "skip")
    v.error("data.bad_documents", "unknown policy '" + d.bad_documents + "': use stop or skip");
  if (d.cache_options.target_size_bytes() <= 0)
    v.error("data.cache_options.target_size_per_flush", "'" + d.cache_options.target_size_per_flush +
                                                            "' is not a size from 1 byte to 1 PiB (e.g. 512MB)");
  check_int(v, "data.cache_options.batch_size", d.cache_options.batch_size, 1, 1 << 20, "documents per commit");
  check_int(v, "data.cache_options.num_threads", d.cache_options.num_threads, 0, 1024, "0: one per core");
  if (d.format.set) check_format(v, "data.format", config::detail::load_opaque(d.format.yaml), d.format.where);
  const std::string& t = d.tokenizer;
  const bool local_json = t.size() > 5 && t.substr(t.size() - 5) == ".json";
  // The error_code forms: a name the file system refuses (too long, say) is "not a local directory", not a throw.
  std::error_code fs_ec;
  const bool local_dir = std::filesystem::is_directory(t, fs_ec) &&
                         std::filesystem::exists(std::filesystem::path(t) / "tokenizer.json", fs_ec);
  if (t == "passthrough") {
    if (!d.vocab_size)
      v.error("data.vocab_size", "the passthrough tokenizer needs a positive vocab_size; set data.vocab_size");
  } else if (t != "byte" && !local_json && !local_dir) {
    check_remote(v, "data.tokenizer", t, "tokenizer.json path");
    if (url_scheme(t).empty())
      v.refuse("data.tokenizer", "tokenizer '" + t + "' is a Hugging Face hub name and Hugging Face hub tokenizers "
               "need a download (not supported: no network here)",
               "pass a local tokenizer.json path, or use tokenizer: byte");
  }
  if (d.permutation_type && *d.permutation_type != "linear" && *d.permutation_type != "feistel")
    v.error("data.permutation_type", "unknown permutation_type '" + *d.permutation_type + "'; use linear or feistel");
  if (auto* era = std::get_if<int64_t>(&d.shuffle))
    check_int(v, "data.shuffle", *era, 1, bounds::max_examples,
              "an era length in sequences; use true for a full shuffle or false for none");
  if (d.shuffle_buffer_size) v.note("data.shuffle_buffer_size", "ignored (shuffling is by permutation)");
  if (!d.id && d.name) v.note("data.name", "ignored (it names a Hugging Face dataset configuration)");
}

}  // namespace levanter

LEVANTER_CONFIG_SECTION_INSTANTIATE(levanter::LmDataConfig)
