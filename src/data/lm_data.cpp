// data/lm_data.hpp: the `data:` section of train_lm put together.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <levanter/config/yaml.hpp>
#include <levanter/data/jinja.hpp>
#include <levanter/data/lm_data.hpp>
#include <nlohmann/json.hpp>

namespace levanter::data {

tokenizer make_tokenizer(const LmDataConfig& d) {
  if (d.tokenizer == "byte") return tokenizer::byte_level();
  if (d.tokenizer == "passthrough") return tokenizer::passthrough(d.vocab_size.value_or(0));
  return tokenizer::from_file(d.tokenizer);
}

namespace detail {
namespace {
inline std::vector<std::string> yaml_strings(const YAML::Node& n, const std::string& key) {
  std::vector<std::string> out;
  if (!n) return out;
  if (n.IsScalar()) return {n.Scalar()};
  if (!n.IsSequence()) throw config::config_error(key + ": expected a list of strings");
  for (const auto& e : n) out.push_back(e.as<std::string>());
  return out;
}
inline std::string join_path(const std::string& dir, const std::string& sub) {
  return (std::filesystem::path(dir) / sub).string();
}
// A `format:` into the spec (validate() refused chat and unknown keys).
void read_format(const YAML::Node& f, const std::string& key, dataset_spec& s) {
  const std::string type = f.IsScalar() ? f.Scalar() : (f.IsMap() && f["type"] ? f["type"].Scalar() : "text");
  if (type == "text") {
    if (f.IsMap() && f["text_key"]) s.text_key = f["text_key"].as<std::string>();
    if (f.IsMap() && f["pack"]) s.text_pack = f["pack"].as<bool>();
    return;
  }
  supervised_format sf;
  if (type == "chat" && (!f.IsMap() || !f["single_turn"] || !f["single_turn"].as<bool>())) {
    chat_format cf;  // multi-turn: rendered with a chat template (upstream ChatProcessor)
    if (f.IsMap()) {
      if (f["messages_field"]) cf.messages_field = f["messages_field"].as<std::string>();
      if (f["chat_template"] && !f["chat_template"].IsNull()) cf.chat_template = f["chat_template"].as<std::string>();
      if (f["pack"]) cf.pack = f["pack"].as<bool>();
      if (f["mask_user_turns"]) cf.mask_user_turns = f["mask_user_turns"].as<bool>();
    }
    s.chat = cf;
    return;
  }
  if (type == "chat") {  // single_turn: a supervised pair (upstream does the same)
    sf.messages_field = f["messages_field"] ? f["messages_field"].as<std::string>() : "messages";
    if (f["pack"]) sf.pack = f["pack"].as<bool>();
    if (f["mask_user_turns"]) sf.mask_inputs = f["mask_user_turns"].as<bool>();
    s.supervised = sf;
    return;
  }
  if (type != "supervised")
    throw config::config_error(key + ": format '" + type + "' is not supported (use text, supervised or chat)");
  if (f.IsMap()) {
    if (f["input_field"]) sf.input_field = f["input_field"].as<std::string>();
    if (f["output_field"]) sf.output_field = f["output_field"].as<std::string>();
    if (f["separate_with"] && !f["separate_with"].IsNull()) sf.separate_with = f["separate_with"].as<std::string>();
    if (f["pack"]) sf.pack = f["pack"].as<bool>();
    if (f["mask_inputs"]) sf.mask_inputs = f["mask_inputs"].as<bool>();
  }
  s.supervised = sf;
}
}  // namespace
}  // namespace detail

std::vector<dataset_spec> dataset_specs(const LmDataConfig& d) {
  if (!d.configs.set) {
    dataset_spec s;
    s.train_urls = d.train_urls;
    s.validation_urls = d.validation_urls;
    s.cache_dir = d.cache_dir;
    s.tags = d.tags.value_or(std::vector<std::string>{});
    if (d.format.set) detail::read_format(YAML::Load(d.format.yaml), "data.format", s);
    return {s};
  }
  const YAML::Node root = YAML::Load(d.configs.yaml);
  if (!root.IsMap() || root.size() == 0)
    throw config::config_error("data.configs (" + d.configs.where +
                               "): expected a map of dataset name -> {train_urls, "
                               "validation_urls, cache_dir, tags}");
  std::vector<dataset_spec> out;
  for (const auto& kv : root) {
    const std::string name = kv.first.as<std::string>();
    const std::string key = "data.configs." + name;
    const YAML::Node& c = kv.second;
    if (!c.IsMap()) throw config::config_error(key + " (" + d.configs.where + "): expected a map");
    for (const auto& f : c) {
      const std::string k = f.first.as<std::string>();
      if (k == "id" || k == "name" || k == "stream")
        throw config::config_error(key + "." + k +
                                   ": Hugging Face datasets are not supported (no network here); "
                                   "convert the dataset to local .jsonl files and list them in train_urls");
      if (k != "train_urls" && k != "validation_urls" && k != "cache_dir" && k != "tags" && k != "format")
        throw config::config_error(key + ": unknown key '" + k +
                                   "' (use train_urls, validation_urls, cache_dir, tags)");
    }
    dataset_spec s;
    s.name = name;
    s.train_urls = detail::yaml_strings(c["train_urls"], key + ".train_urls");
    s.validation_urls = detail::yaml_strings(c["validation_urls"], key + ".validation_urls");
    s.cache_dir = c["cache_dir"] && !c["cache_dir"].IsNull() ? c["cache_dir"].as<std::string>()
                                                             : detail::join_path(d.cache_dir, name);
    s.tags = detail::yaml_strings(c["tags"], key + ".tags");
    if (const YAML::Node f = c["format"]; f && !f.IsNull()) detail::read_format(f, key + ".format", s);
    for (const auto& u : s.train_urls)
      if (is_remote_url(u))
        throw config::config_error(key + ".train_urls: '" + u +
                                   "' is a remote URL; no network here: download it and give a local path");
    for (const auto& u : s.validation_urls)
      if (is_remote_url(u))
        throw config::config_error(key + ".validation_urls: '" + u +
                                   "' is a remote URL; no network here: download it and give a local path");
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<mixture_stage> weight_stages(const LmDataConfig& d, const std::vector<dataset_spec>& specs) {
  auto weights_of = [&](const YAML::Node& m, const std::string& key) {
    if (!m.IsMap()) throw config::config_error(key + ": expected a map of dataset name -> weight");
    std::vector<std::pair<std::string, double>> w;
    for (const auto& kv : m) {
      double v = 0;
      try {
        v = kv.second.as<double>();
      } catch (const YAML::Exception&) {
        throw config::config_error(key + "." + kv.first.as<std::string>() + ": '" + kv.second.as<std::string>("?") +
                                   "' is not a number");
      }
      w.emplace_back(kv.first.as<std::string>(), v);
    }
    return w;
  };
  if (!d.train_weights.set) {  // upstream needs weights; equal weights is the natural reading of "none given"
    if (specs.size() > 1)
      throw config::config_error("data.train_weights is missing: give a weight per dataset of data.configs, e.g. {" +
                                 specs.front().name + ": 0.5, " + specs.back().name + ": 0.5}");
    return {mixture_stage{0, {{specs.front().name, 1.0}}}};
  }
  const YAML::Node root = YAML::Load(d.train_weights.yaml);
  const std::string where = " (" + d.train_weights.where + ")";
  if (root.IsMap()) return {mixture_stage{0, weights_of(root, "data.train_weights" + where)}};
  if (!root.IsSequence())
    throw config::config_error("data.train_weights" + where +
                               ": expected {name: weight} or [[step, {name: weight}], ...]");
  std::vector<mixture_stage> out;
  for (std::size_t i = 0; i < root.size(); ++i) {
    const std::string key = "data.train_weights[" + std::to_string(i) + "]" + where;
    const YAML::Node& e = root[i];
    if (!e.IsSequence() || e.size() != 2) throw config::config_error(key + ": expected [step, {name: weight}]");
    std::int64_t step = 0;
    try {
      step = e[0].as<std::int64_t>();
    } catch (const YAML::Exception&) {
      throw config::config_error(key + ": the step '" + e[0].as<std::string>("?") + "' is not an integer");
    }
    out.push_back(mixture_stage{step, weights_of(e[1], key)});
  }
  return out;
}

namespace {

// The windows of a single dataset's finished training cache; none is a data_error saying what to do.
std::int64_t windows_of(const cache_windows& w, std::int64_t seq_len) {
  const std::int64_t n = w.final_size();
  if (n == 0)
    throw data_error("the training data holds " + std::to_string(w.cache().total_tokens()) +
                     " tokens, fewer than one window of seq_len " + std::to_string(seq_len) +
                     " (add data or lower model.seq_len)");
  return n;
}

// The position of dataset `name` in `specs`; a config_error under `key` when data.configs has none.
std::size_t spec_position(const std::vector<dataset_spec>& specs, const std::string& name, const std::string& key) {
  std::size_t i = 0;
  while (i < specs.size() && specs[i].name != name) ++i;
  if (i == specs.size()) throw config::config_error(key + ": no dataset '" + name + "' in data.configs");
  return i;
}

std::optional<std::int64_t> budget_of(const config::Opaque& o) {
  if (!o.set) return std::nullopt;
  const YAML::Node n = YAML::Load(o.yaml);
  if (n.IsNull()) return std::nullopt;
  return n.as<std::int64_t>();
}

// A mixture's caps (upstream LMMixtureDatasetConfig.train_sets, applied after each dataset's shuffle): simulated
// epoching keeps the first int(length x experiment_budget / target_budget) examples of every dataset,
// max_train_batches {name: k} the first k x (the first step's batch size) examples of that dataset. `lengths`
// (0 for a dataset not in use) become what the mixture draws from.
void apply_caps(const LmDataConfig& d, std::int64_t batch_size, const std::vector<dataset_spec>& specs,
                std::vector<std::int64_t>& lengths, const std::function<void(const std::string&)>& log) {
  const auto target = budget_of(d.target_budget), experiment = budget_of(d.experiment_budget);
  if (target && experiment) {
    const double ratio = double(*experiment) / double(*target);
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (lengths[i] == 0) continue;
      const auto cut = static_cast<std::int64_t>(double(lengths[i]) * ratio);
      if (cut <= 0)
        throw data_error("data.configs." + specs[i].name + ": simulated epoching (experiment_budget " +
                         std::to_string(*experiment) + " / target_budget " + std::to_string(*target) + ") keeps none " +
                         "of its " + std::to_string(lengths[i]) + " examples; raise data.experiment_budget");
      log("mixture: simulated epoching keeps " + std::to_string(cut) + " of the " + std::to_string(lengths[i]) +
          " examples of '" + specs[i].name + "'");
      lengths[i] = cut;
    }
  }
  if (!d.max_train_batches.set) return;
  const YAML::Node m = YAML::Load(d.max_train_batches.yaml);
  if (!m.IsMap()) return;  // null; validate() refuses other shapes
  for (auto it = m.begin(); it != m.end(); ++it) {
    const std::string name = it->first.as<std::string>(), key = "data.max_train_batches." + name;
    const std::size_t i = spec_position(specs, name, key);
    const auto k = it->second.as<std::int64_t>();
    if (k <= 0) throw config::config_error(key + ": must be a positive number of batches");
    if (lengths[i] == 0) continue;  // no training weight: not drawn from
    if (k > lengths[i] / batch_size)
      throw data_error(key + ": " + std::to_string(k) + " batches of " + std::to_string(batch_size) +
                       " examples are more than the dataset's " + std::to_string(lengths[i]) +
                       " examples; lower it or remove it");
    log("mixture: max_train_batches keeps " + std::to_string(k * batch_size) + " of the " +
        std::to_string(lengths[i]) + " examples of '" + name + "'");
    lengths[i] = k * batch_size;
  }
}

}  // namespace

std::shared_ptr<token_cache> open_split_cache(const LmDataConfig& d, const tokenizer& tok, const dataset_spec& s,
                                              const std::vector<std::string>& urls, const char* split,
                                              const std::function<void(const std::string&)>& log) {
  source_options src;
  src.text_key = d.text_key.value_or("text");
  if (d.format.set) {
    const YAML::Node f = YAML::Load(d.format.yaml);
    if (f.IsMap() && f["text_key"]) src.text_key = f["text_key"].as<std::string>();
  }
  src.on_bad_document = parse_bad_document_policy(d.bad_documents);
  cache_options co;
  co.num_threads = static_cast<int>(d.cache_options.num_threads);
  co.docs_per_chunk = d.cache_options.batch_size;
  co.bytes_per_chunk = d.cache_options.target_size_bytes();
  co.log = log;
  const auto dir = detail::join_path(s.cache_dir, split);
  std::vector<std::string> files;
  try {
    files = expand_urls(urls);
  } catch (const data_error& e) {
    throw data_error(std::string("data.") + split + "_urls" + (s.name.empty() ? "" : " of '" + s.name + "'") + ": " +
                     e.what());
  }
  if (s.text_key) src.text_key = *s.text_key;
  if (s.supervised && s.supervised->messages_field) {
    src.messages_field = *s.supervised->messages_field;
    src.input_role = s.supervised->input_role;
    src.output_role = s.supervised->output_role;
  } else if (s.supervised) {
    src.fields = {s.supervised->input_field, s.supervised->output_field};
  }
  if (s.chat) {
    src.chat = true;
    src.messages_field = s.chat->messages_field;
    const std::string where = std::string("data") + (s.name.empty() ? "" : ".configs." + s.name) + ".format";
    std::string tmpl;
    encode_fn enc;
    try {
      tmpl = chat_template_for(tok, *s.chat, d.chat_template);
      enc = make_chat_encode_fn(tok, tmpl, s.chat->mask_user_turns);
    } catch (const jinja::template_error& e) {
      throw data_error(where + ": the chat template does not parse: " + e.what());
    } catch (const data_error& e) {
      throw data_error(where + ": " + e.what());
    }
    auto c = open_or_build_cache(dir, files, src, std::move(enc), chat_metadata(tok, tmpl, s.chat->messages_field), co);
    if (log)
      log(std::string(c->finished() ? "cache " : "building cache ") + dir +
          (c->finished() ? " (complete)" : " in the background"));
    return c;
  }
  auto c = s.supervised ? open_or_build_cache(dir, files, src, make_supervised_encode_fn(tok, *s.supervised),
                                              supervised_metadata(tok, *s.supervised), co)
                        : open_or_build_cache(dir, files, src, make_encode_fn(tok, true, d.enforce_eos),
                                              tokenizer_metadata(tok, true, d.enforce_eos), co);
  if (log)
    log(std::string(c->finished() ? "cache " : "building cache ") + dir +
        (c->finished() ? " (complete)" : " in the background"));
  return c;
}

std::shared_ptr<cache_windows> open_split(const LmDataConfig& d, const tokenizer& tok, const dataset_spec& s,
                                          const std::vector<std::string>& urls, const char* split,
                                          std::int64_t seq_len, const std::function<void(const std::string&)>& log) {
  auto say = [&](const std::string& m) {
    if (log) log(m);
  };
  auto c = open_split_cache(d, tok, s, urls, split, log);
  const auto dir = c->dir();
  if (s.chat) {  // chat rows are packed from the whole cache (upstream's MultiturnChatDataset awaits it)
    if (!c->finished()) say("waiting for the cache " + dir + " to be complete (chat rows are packed from all of it)");
    auto packs = std::make_shared<const packed_examples>(packed_examples::chat(c, seq_len, s.chat->max_segments()));
    say("chat data " + dir + ": " + std::to_string(c->committed_docs()) + " conversations packed into " +
        std::to_string(packs->size()) + " examples of " + std::to_string(seq_len) + " tokens");
    return std::make_shared<cache_windows>(std::move(packs), std::move(c), s.chat->mask_user_turns);
  }
  if (!s.supervised && !s.text_pack) return std::make_shared<cache_windows>(std::move(c), seq_len);
  if (!s.supervised) {  // format: {type: text, pack: true}: whole documents packed (ours; see docs/data.md)
    if (!c->finished()) say("waiting for the cache " + dir + " to be complete (its documents are packed)");
    auto packs = std::make_shared<const packed_examples>(packed_examples::documents(c, seq_len, 64));
    say("text " + dir + ": " + std::to_string(c->committed_docs()) + " documents packed into " +
        std::to_string(packs->size()) + " examples of " + std::to_string(seq_len) + " tokens");
    return std::make_shared<cache_windows>(std::move(packs), std::move(c), false);
  }
  // Supervised rows are packed from the whole cache (as upstream's SupervisedDataset, which awaits it).
  if (!c->finished()) say("waiting for the cache " + dir + " to be complete (supervised rows are packed from all of it)");
  auto packs = std::make_shared<const packed_examples>(c, seq_len, s.supervised->max_segments());
  say("supervised data " + dir + ": " + std::to_string(c->committed_docs()) + " records packed into " +
      std::to_string(packs->size()) + " examples of " + std::to_string(seq_len) + " tokens");
  return std::make_shared<cache_windows>(std::move(packs), std::move(c), s.supervised->mask_inputs);
}

lm_data::lm_data(const LmDataConfig& d, const options& o)
    : tok_(make_tokenizer(d)), seq_len_(o.seq_len), epochs_(o.epochs) {
  auto log = o.log ? o.log : [](const std::string&) {};
  specs_ = dataset_specs(d);
  const bool sft_mixture = d.sft && d.configs.set;
  if (d.sft) {  // the sft programs' datasets of supervised or single-turn chat records
    if ((!sft_mixture && specs_.size() != 1) || specs_.empty())
      throw config::config_error("sft: the data must be one dataset of supervised or chat records");
    for (auto& spec : specs_) {
      if (!spec.supervised)
        throw config::config_error("sft: dataset '" + spec.name + "' is not of supervised or single-turn chat records");
      auto& f = *spec.supervised;
      f.input_role = d.sft->input_role;
      f.output_role = d.sft->output_role;
      f.append_eos = f.messages_field.has_value();
      f.mask_inputs = true;
    }
  }
  auto open_cache = [&](const dataset_spec& s, const std::vector<std::string>& urls, const char* split) {
    return open_split_cache(d, tok_, s, urls, split, log);
  };
  auto open = [&](const dataset_spec& s, const std::vector<std::string>& urls, const char* split) {
    if (!d.sft) return open_split(d, tok_, s, urls, split, o.seq_len, log);
    // The sft programs' rows: permuted and packed as upstream sft packs them.
    auto c = open_cache(s, urls, split);
    const auto dir = c->dir();
    if (!c->finished()) log("waiting for the cache " + dir + " to be complete (supervised rows are packed from all of it)");
    prompt_completion_options pc;
    pc.seq_len = o.seq_len;
    pc.max_seq_len = d.sft->max_seq_len;
    pc.epochs = d.sft->epochs;
    pc.key = o.data_key;
    pc.pad_id = tok_.eos_id().value_or(0);  // upstream pads with pad_token, else EOS (see docs/sft.md)
    auto packs = std::make_shared<const packed_examples>(c, pc);
    log("sft data " + dir + ": " + std::to_string(c->committed_docs()) + " records" +
        (pc.epochs > 1 ? ", " + std::to_string(pc.epochs) + " epochs," : "") + " packed into " +
        std::to_string(packs->size()) + " examples of " + std::to_string(o.seq_len) + " tokens" +
        (packs->dropped_rows() ? " (" + std::to_string(packs->dropped_rows()) +
                                     " rows left out: a prompt of seq_len tokens or more, or no response left "
                                     "within max_seq_len)"
                               : ""));
    return std::make_shared<cache_windows>(std::move(packs), std::move(c), true);
  };
  if (sft_mixture) {  // sft_mixture: the mixture's rows are packed (upstream mixes rows, then packs them)
    std::vector<std::shared_ptr<token_cache>> caches;
    std::vector<std::string> names;
    std::vector<std::int64_t> rows;
    for (const auto& s : specs_) {
      if (s.train_urls.empty())
        throw config::config_error("supervised_data." + s.name + ": train_urls is empty: give its .jsonl files");
      caches.push_back(open_cache(s, s.train_urls, "train"));
      log("waiting for the cache of '" + s.name + "' to be complete (its rows are mixed and packed)");
      caches.back()->total_tokens();  // waits for the build
      rows.push_back(caches.back()->committed_docs());
      names.push_back(s.name);
    }
    const std::int64_t block = d.mixture_block_size.value_or(2048);
    prompt_completion_options pc;
    pc.seq_len = o.seq_len;
    pc.max_seq_len = d.sft->max_seq_len;
    pc.key = o.data_key;
    pc.pad_id = tok_.eos_id().value_or(0);
    pc.examples = d.sft->examples;
    pc.mixture.emplace(names, mixture_stages_from_steps(weight_stages(d, specs_), o.batch_size, block), block,
                       o.data_key, rows, stop_strategy::restart);
    for (const auto& w : pc.mixture->warnings()) log("mixture: " + w);
    auto first = caches.front();
    auto packs = std::make_shared<const packed_examples>(std::move(caches), pc);
    log("sft mixture of " + std::to_string(names.size()) + " datasets: " + std::to_string(packs->size()) +
        " examples of " + std::to_string(o.seq_len) + " tokens packed for the run" +
        (packs->dropped_rows() ? " (" + std::to_string(packs->dropped_rows()) +
                                     " rows left out: a prompt of seq_len tokens or more, or no response left within "
                                     "max_seq_len)"
                               : ""));
    train_.push_back(std::make_shared<cache_windows>(std::move(packs), std::move(first), true));
    for (std::size_t i = 1; i < specs_.size(); ++i) train_.push_back(nullptr);
    single_key_ = o.data_key;
    return;
  }
  for (const auto& s : specs_) {
    if (!s.train_urls.empty())
      train_.push_back(open(s, s.train_urls, "train"));
    else
      train_.push_back(nullptr);
    if (!s.validation_urls.empty()) {
      std::vector<std::string> tags;
      if (!s.name.empty()) tags.push_back(s.name);
      for (const auto& t : s.tags) tags.push_back(t);
      valid_.push_back({s.name, tags, open(s, s.validation_urls, "validation")});
    }
  }
  // The example order.
  kind_ = d.permutation_type ? parse_permutation_kind(*d.permutation_type) : permutation_kind::linear;
  if (const auto* b = std::get_if<bool>(&d.shuffle))
    shuffle_ = *b ? shuffle_setting::full() : shuffle_setting::none();
  else
    shuffle_ = shuffle_setting::eras(std::get<std::int64_t>(d.shuffle));
  shuffled_ = !(std::holds_alternative<bool>(d.shuffle) && !std::get<bool>(d.shuffle));
  if (!d.configs.set) {
    if (!train_.front())
      throw config::config_error("data.train_urls is empty: give at least one local .jsonl or .txt file");
    single_key_ = o.data_key;
    return;
  }
  // A mixture: every dataset in use must be complete to know its length.
  if (o.epochs > 0)  // as upstream (LMMixtureDatasetConfig.train_sets)
    throw config::config_error("epoch: epochs are not supported for mixture datasets (data.configs); use "
                               "data.stop_strategy: first_exhausted or all_exhausted to end a mixture, or epoch: 0");
  const auto stop = parse_stop_strategy(d.stop_strategy.value_or("restart"));
  auto stages = mixture_stages_from_steps(weight_stages(d, specs_), o.batch_size, d.mixture_block_size.value_or(2048));
  std::vector<std::string> names;
  for (const auto& s : specs_) names.push_back(s.name);
  std::vector<std::int64_t> lengths;
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    bool used = false;
    for (const auto& st : stages)
      for (const auto& [n, w] : st.weights)
        if (n == specs_[i].name && w > 0) used = true;
    if (used && !train_[i])
      throw config::config_error("data.configs." + specs_[i].name + " has a training weight but no train_urls");
    if (used)
      log("mixture: waiting for the cache of '" + specs_[i].name + "' to be complete (its length sets the mixture)");
    lengths.push_back(used ? train_[i]->final_size() : 0);
    if (used && lengths.back() == 0)
      throw data_error("data.configs." + specs_[i].name + ": its data holds fewer tokens than one window of seq_len " +
                       std::to_string(o.seq_len));
  }
  // num_validation_sequences {name: n} (as upstream's current LmDataConfig, whose split is disjoint): the dataset's
  // training windows are put in a fixed order (shuffle_before_trainval_split: a Feistel permutation keyed
  // PRNGKey(0), else as they are) and the last n become its validation set, tagged with its name and tags (in place
  // of one from validation_urls); the rest is the dataset the mixture shuffles, caps and draws from.
  split_.resize(specs_.size());
  if (d.num_validation_sequences.set) {
    const YAML::Node m = YAML::Load(d.num_validation_sequences.yaml);
    for (auto it = m.begin(); m.IsMap() && it != m.end(); ++it) {
      const std::string name = it->first.as<std::string>(), key = "data.num_validation_sequences." + name;
      const std::size_t i = spec_position(specs_, name, key);
      if (!train_[i]) throw config::config_error(key + ": the dataset has no train_urls to split validation sequences off");
      const auto n = it->second.as<std::int64_t>();
      log("mixture: waiting for the cache of '" + name + "' to be complete (validation sequences are split off it)");
      const std::int64_t total = train_[i]->final_size();
      if (n <= 0 || n >= total)
        throw data_error(key + ": " + std::to_string(n) + " validation sequences leave none of the dataset's " +
                         std::to_string(total) + " windows to train on; lower it");
      auto order = d.shuffle_before_trainval_split
                       ? make_example_order(shuffle_setting::full(), permutation_kind::feistel,
                                            static_cast<std::uint64_t>(total), haliax::random::make_key(0))
                       : example_order::identity(static_cast<std::uint64_t>(total));
      std::vector<std::int64_t> held;
      for (std::int64_t j = total - n; j < total; ++j)
        held.push_back(static_cast<std::int64_t>(order(static_cast<std::uint64_t>(j))));
      validation_set v{name, {name}, std::make_shared<cache_windows>(*train_[i], std::move(held))};
      for (const auto& t : specs_[i].tags) v.tags.push_back(t);
      auto same = std::find_if(valid_.begin(), valid_.end(), [&](const validation_set& s) { return s.name == name; });
      if (same != valid_.end()) {
        log("mixture: the validation set of '" + name + "' is the sequences split off its training data, not its "
            "validation_urls");
        *same = std::move(v);
      } else {
        valid_.push_back(std::move(v));
      }
      log("mixture: " + std::to_string(n) + " of the " + std::to_string(total) + " windows of '" + name +
          "' are held out for validation");
      if (lengths[i] > 0) lengths[i] = total - n;
      split_[i] = std::move(order);
    }
  }
  std::vector<std::int64_t> drawn = lengths;  // each dataset's order stays a permutation of all its windows
  apply_caps(d, o.batch_size, specs_, drawn, log);
  mixture_.emplace(names, stages, d.mixture_block_size.value_or(2048), make_mixture_keys(o.data_key, 0).mix, drawn,
                   stop);
  for (const auto& w : mixture_->warnings()) log("mixture: " + w);
  if (stop != stop_strategy::restart)
    log(std::string("mixture: stop_strategy ") + to_string(stop) + ": " +
        (mixture_->length() ? "the mixture ends after " + std::to_string(*mixture_->length()) + " examples"
                            : std::string("no dataset in use runs out, so the mixture never ends")));
  const auto keys = make_mixture_keys(o.data_key, mixture_->datasets_in_use().size());
  orders_.resize(specs_.size());
  std::size_t k = 0;
  for (std::size_t pos : mixture_->datasets_in_use())
    orders_[pos] = make_example_order(shuffle_, kind_, static_cast<std::uint64_t>(lengths[pos]), keys.component[k++]);
}

std::optional<std::int64_t> lm_data::train_length() const {
  if (mixture_) return mixture_->length();
  if (epochs_ <= 0) return std::nullopt;
  return epochs_ * windows_of(*train_.front(), seq_len_);
}

void cache_windows::window(std::int64_t w, std::int32_t* out) const {
  const std::int64_t at = index_ ? (*index_)[static_cast<std::size_t>(w)] : w;
  if (!packs_) {
    cache_->read_tokens(at * seq_len_, seq_len_, out);
    return;
  }
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(seq_len_));
  std::vector<std::int32_t> segment(static_cast<std::size_t>(seq_len_));
  packs_->example(at, mask_inputs_, out, keep.data(), segment.data());
}

void cache_windows::example(std::int64_t w, std::int64_t eos_id, std::int64_t ignore_id, std::int32_t* tokens,
                            std::uint8_t* keep, std::int32_t* segment) const {
  const std::int64_t at = index_ ? (*index_)[static_cast<std::size_t>(w)] : w;
  if (packs_) return packs_->example(at, mask_inputs_, tokens, keep, segment);
  cache_->read_tokens(at * seq_len_, seq_len_, tokens);
  causal_labels(tokens, seq_len_, eos_id, ignore_id, keep, segment);
}

std::vector<std::int32_t> lm_data::examples(std::int64_t first, std::int64_t n) const {
  std::vector<std::int32_t> out(static_cast<std::size_t>(n * seq_len_));
  for (std::int64_t r = 0; r < n; ++r) {
    const auto [w, k] = locate(first + r);
    w->window(k, out.data() + r * seq_len_);
  }
  return out;
}

example_batch lm_data::batch(std::int64_t first, std::int64_t n, std::int64_t eos_id, std::int64_t ignore_id) const {
  const auto size = static_cast<std::size_t>(n * seq_len_);
  example_batch b{std::vector<std::int32_t>(size), std::vector<std::uint8_t>(size), std::vector<std::int32_t>(size)};
  for (std::int64_t r = 0; r < n; ++r) {
    const auto [w, k] = locate(first + r);
    const auto at = static_cast<std::size_t>(r * seq_len_);
    w->example(k, eos_id, ignore_id, b.tokens.data() + at, b.keep.data() + at, b.segments.data() + at);
  }
  return b;
}

std::pair<const cache_windows*, std::int64_t> lm_data::locate(std::int64_t i) const {
  if (mixture_) {
    const auto [pos, k] = (*mixture_)(i);
    auto w = (*orders_[pos])(static_cast<std::uint64_t>(k));
    if (split_[pos]) w = (*split_[pos])(w);  // the training part of a dataset validation sequences were split off
    return {train_[pos].get(), static_cast<std::int64_t>(w)};
  }
  const auto& w = *train_.front();
  if (!shuffled_ && w.has(i)) return {&w, i};  // in order: no need to wait for the whole cache
  // Shuffled, or past the end (the run wraps around to the start: another epoch in the same order, as upstream's
  // EpochDataset over the shuffled windows).
  std::call_once(single_once_, [&] {
    single_n_ = windows_of(w, seq_len_);
    single_order_.emplace(make_example_order(shuffle_, kind_, static_cast<std::uint64_t>(single_n_), single_key_));
  });
  const auto j = static_cast<std::uint64_t>(i % single_n_);
  return {&w, static_cast<std::int64_t>((*single_order_)(j))};
}

}  // namespace levanter::data
