// levanter/main/sft.hpp: the sft and sft_mixture programs: upstream SFTConfig / SFTMixtureConfig translated into
// the train_lm run each is.
#include <levanter/main/sft.hpp>

#include <filesystem>
#include <iostream>

#include <levanter/distributed/comm.hpp>
#include <levanter/main/model_loading.hpp>
#include <levanter/main/programs.hpp>
#include <levanter/main/train_lm.hpp>
#include <levanter/trainer/run.hpp>

namespace levanter {

namespace config {
template SftConfig decode<SftConfig>(const YAML::Node&, const std::string&, const source_map&, const std::string&);
template std::string help_text<SftConfig>(const std::string&, const SftConfig&);
template command_line<SftConfig> parse_command_line<SftConfig>(int, const char* const*, const std::string&,
                                                               const std::string&);
template SftMixtureConfig decode<SftMixtureConfig>(const YAML::Node&, const std::string&, const source_map&,
                                                   const std::string&);
template std::string help_text<SftMixtureConfig>(const std::string&, const SftMixtureConfig&);
template command_line<SftMixtureConfig> parse_command_line<SftMixtureConfig>(int, const char* const*,
                                                                             const std::string&, const std::string&);
}  // namespace config

namespace {

// A message of validate_train_lm about the translated config, with the key as the sft config names it.
std::string renamed(std::string msg, bool chat, bool mixture) {
  const std::pair<const char*, const char*> keys[] = {
      {"data.configs.", "supervised_data."},
      {"data.configs", "supervised_data"},
      {"data.train_weights", "mixture_weights"},
      {"data.mixture_block_size", "mixture_block_size"},
      {"data.stop_strategy", "stop_strategy"},
      {"data.train_urls", mixture ? "supervised_data" : chat ? "chat_train_urls" : "supervised_data.train_urls"},
      {"data.cache_dir", "supervised_data.cache_dir"},
      {"data.tokenizer", "tokenizer"},
      {"data.format", chat ? "messages_field" : "supervised_data"}};
  for (const auto& [from, to] : keys)
    if (msg.rfind(from, 0) == 0) return to + msg.substr(std::string(from).size());
  return msg;
}

std::string yaml_quoted(const std::string& s) {
  YAML::Emitter e;
  e << YAML::DoubleQuoted << s;
  return e.c_str();
}

bool is_source(const YAML::Node& x) {
  return x.IsMap() && (x["cache_dir"] || x["train_urls"] || x["id"] || x["input_field"]);
}

// Checks one SupervisedSourceConfig section's keys; Hub datasets are refused.
void check_source(config::validator& v, const YAML::Node& n, const std::string& key, const std::string& where) {
  for (const auto& kv : n) {
    const std::string k = kv.first.as<std::string>();
    if (k == "id" || k == "name" || k == "streaming")
      v.refuse(key + "." + k, "Hugging Face datasets are not supported (no network here)",
               "convert the dataset to local .jsonl files and list them in train_urls", where);
    else if (k != "cache_dir" && k != "train_urls" && k != "validation_urls" && k != "input_field" &&
             k != "output_field" && k != "tags")
      v.error(key + "." + k, "unknown key (use cache_dir, train_urls, input_field, output_field)", where);
  }
  if (!n["cache_dir"] || n["cache_dir"].IsNull())
    v.error(key + ".cache_dir", "required: where the tokenized rows are cached", where);
  if (n["validation_urls"] && n["validation_urls"].size() > 0)
    v.note(key + ".validation_urls", "ignored: sft evaluates nothing (as upstream)");
}

std::vector<std::string> strings_of(const YAML::Node& u) {
  std::vector<std::string> out;
  if (u && u.IsScalar()) out.push_back(u.Scalar());
  if (u && u.IsSequence())
    for (const auto& x : u) out.push_back(x.as<std::string>());
  return out;
}

// The `format:` a source's rows are read with: single-turn chats, or prompt/response records.
std::string format_yaml(bool chat, const std::string& messages_field, const YAML::Node& source) {
  if (chat) return "{type: chat, single_turn: true, messages_field: " + yaml_quoted(messages_field) + "}";
  const auto field = [&](const char* k, const char* dflt) {
    return yaml_quoted(source && source.IsMap() && source[k] ? source[k].as<std::string>() : std::string(dflt));
  };
  return "{type: supervised, input_field: " + field("input_field", "prompt") +
         ", output_field: " + field("output_field", "response") + "}";
}

// What SFTConfig and SFTMixtureConfig share: the model to start from, the tokenizer, the rows' reading, exports.
template <class C>
void plan_common(const C& cfg, config::validator& v, TrainLmConfig& t, bool chat, bool mixture) {
  t.trainer = cfg.trainer;
  t.model = cfg.model;
  t.optimizer = cfg.optimizer;
  t.data_seed = cfg.data_seed;
  t.hf_save_path = cfg.hf_save_path;
  t.hf_upload = cfg.hf_upload;
  t.epoch = 1;  // the packed examples hold every pass sft makes: the run ends after them
  t.data.tokenizer = cfg.tokenizer;
  t.data.shuffle = false;  // the rows are permuted before packing (data::prompt_completion_options)
  if (!chat && cfg.dataset_type != "huggingface")
    v.error("dataset_type", "unknown dataset type '" + cfg.dataset_type + "': use chat_jsonl or huggingface");
  if (cfg.messages_field.empty()) v.error("messages_field", "must name the records' field of messages");
  if (cfg.input_role.empty() || cfg.output_role.empty())
    v.error(cfg.input_role.empty() ? "input_role" : "output_role", "must name a role");
  config::check_int(v, "max_seq_len", cfg.max_seq_len, 2, config::bounds::max_seq_len);
  SftDataOptions sd;
  sd.input_role = cfg.input_role;
  sd.output_role = cfg.output_role;
  sd.max_seq_len = cfg.max_seq_len;
  t.data.sft = sd;

  // The model to fine-tune: a Hugging Face directory (its architecture, max_seq_len tokens) or another run.
  if (const auto* b = std::get_if<bool>(&cfg.initialize_from_hf); b && *b) {
    if (!std::filesystem::is_directory(cfg.model_name_or_path))
      v.error("model_name_or_path", "'" + cfg.model_name_or_path +
                                        "' is not a local directory: initialize_from_hf: true reads the model there "
                                        "(the Hugging Face Hub is not reachable here; download it and give its path)");
    t.initialize_from_hf = cfg.model_name_or_path;
  } else if (const auto* s = std::get_if<std::string>(&cfg.initialize_from_hf)) {
    t.initialize_from_hf = *s;
  }
  if (const auto* dir = std::get_if<std::string>(&t.initialize_from_hf)) {
    // As upstream's converter: the checkpoint's config.json says what model it is (the `model:` section is replaced).
    if (std::filesystem::is_directory(*dir)) {
      try {
        t.model = model_choice_for_hf(hf::open_dir(*dir, "initialize_from_hf"));
      } catch (const hf::error& e) {
        v.error("initialize_from_hf", e.what());
      }
    } else if (config::url_scheme(*dir).empty() && !std::get_if<bool>(&cfg.initialize_from_hf)) {
      v.error("initialize_from_hf", "'" + *dir + "' is not a local directory (a Hugging Face checkpoint: config.json "
                                               "and safetensors)");
    }
    t.use_hf_model_config = true;
    t.hf_seq_len = cfg.max_seq_len;
    if (cfg.trainer.initialize_from)
      v.error("trainer.initialize_from", "cannot be used with initialize_from_hf (as upstream): choose one");
  } else if (!cfg.trainer.initialize_from) {
    v.error("initialize_from_hf", "sft fine-tunes a trained model: set initialize_from_hf (a Hugging Face "
                                  "directory) or trainer.initialize_from (a run's checkpoints), as upstream requires");
  }
  if (cfg.hf_save_path && cfg.hf_save_steps <= 0)
    v.error("hf_save_steps", "must be positive with hf_save_path (the steps between exports), got " +
                                 std::to_string(cfg.hf_save_steps));
  if (cfg.hf_save_steps > 0) t.hf_save_steps = cfg.hf_save_steps;
  if (cfg.reinit_tokens.set) {
    const YAML::Node r = YAML::Load(cfg.reinit_tokens.yaml);
    ReinitTokensSetting rs;
    rs.embeddings = cfg.reinit_embeddings;
    rs.lm_head = cfg.reinit_lm_head;
    rs.mixture_key = mixture;
    bool on = false;
    if (r.IsScalar() && (r.Scalar() == "true" || r.Scalar() == "True")) {
      // upstream's default list (Llama 3's chat tokens)
      rs.tokens = {"<|finetune_right_pad_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>"};
      on = true;
    } else if (r.IsSequence() && r.size() > 0) {
      for (const auto& x : r) rs.tokens.push_back(x.as<std::string>());
      on = true;
    } else if (!(r.IsNull() || (r.IsScalar() && (r.Scalar() == "false" || r.Scalar() == "False")) ||
                 (r.IsSequence() && r.size() == 0))) {
      v.error("reinit_tokens", "expected true, false or a list of tokens", cfg.reinit_tokens.where);
    }
    if (on && !rs.embeddings && !rs.lm_head)
      v.note("reinit_tokens", "reinit_embeddings and reinit_lm_head are both false: nothing is re-drawn");
    if (on) t.reinit_tokens = rs;
  }
}

// What train_lm checks of the rest (trainer, model, optimizer, the data files, remote paths), in sft's keys.
sft_plan finish(config::validator& v, TrainLmConfig&& t, bool chat, bool mixture) {
  const auto train_checked = validate_train_lm(t, v.sources);
  for (const auto& e : train_checked.errors) v.result.errors.push_back(renamed(e, chat, mixture));
  for (const auto& n : train_checked.notes) v.result.notes.push_back(renamed(n, chat, mixture));
  return {std::move(t), std::move(v.result)};
}

template <class C>
int program_main(const char* name, int argc, char** argv, sft_plan (*plan_of)(const C&, const config::source_map&)) {
  return run_program(name, [&] {
    distributed::init_world(&argc, &argv);
    struct finalize {
      ~finalize() {
        if (std::uncaught_exceptions() == 0) distributed::finalize_world();
      }
    } at_end;
    auto parsed = config::parse_command_line<C>(argc, argv, "{}", "<defaults>");
    if (parsed.help) {
      if (distributed::world().rank() == 0) std::cout << config::help_text<C>(name);
      return 0;
    }
    auto plan = plan_of(parsed.config, parsed.sources);
    const bool r0 = distributed::world().rank() == 0;
    if (r0)
      for (const auto& n : plan.checked.notes) std::cerr << name << ": note: " << n << "\n";
    if (!plan.checked.errors.empty()) {
      if (r0) {
        std::cerr << name << ": the config cannot be used as it is ("
                  << (parsed.config_path.empty() ? std::string("command line") : parsed.config_path) << "):\n";
        for (const auto& e : plan.checked.errors) std::cerr << "  - " << e << "\n";
      }
      return 2;
    }
    // The run records the train_lm config it is, which the other programs read.
    const std::string recorded = config::to_yaml_string(plan.train);
    if (parsed.dry_run) {
      dry_run_checks(plan.train);
      if (r0) {
        std::cout << recorded;
        std::cerr << name << ": config resolved and valid (--dry_run: not training; above, the train_lm run it is)\n";
      }
      return 0;
    }
    with_model(plan.train.model, [&]<class M>(std::type_identity<M>, const typename M::config_type& mc) {
      run_train_lm<M>(plan.train, mc, recorded, std::cout);
    });
    return 0;
  });
}

}  // namespace

sft_plan plan_sft(const SftConfig& cfg, const config::source_map& sources) {
  config::validator v{sources, {}};
  TrainLmConfig t;
  const bool chat = cfg.dataset_type == "chat_jsonl";
  plan_common(cfg, v, t, chat, false);
  config::check_int(v, "epoch", cfg.epoch, 0, 1 << 20, "0 reads the rows once");
  t.data.sft->epochs = cfg.epoch;

  // supervised_data: one source, or a map of name -> source of which upstream uses the first.
  YAML::Node source;
  bool have_source = false;
  std::string source_key = "supervised_data";
  if (!cfg.supervised_data.set) {
    v.error("supervised_data", chat ? "required: its cache_dir is where the tokenized rows are cached"
                                    : "required: {cache_dir, train_urls, input_field, output_field}");
  } else {
    const YAML::Node n = YAML::Load(cfg.supervised_data.yaml);
    if (is_source(n)) {
      source = n;
      have_source = true;
    } else if (n.IsMap() && n.size() > 0 && is_source(n.begin()->second)) {
      source_key += "." + n.begin()->first.as<std::string>();
      source = n.begin()->second;
      have_source = true;
      if (n.size() > 1)
        v.note("supervised_data", "holds " + std::to_string(n.size()) + " datasets; sft uses the first ('" +
                                      n.begin()->first.as<std::string>() + "'), as upstream (sft_mixture mixes them)");
    } else {
      v.error("supervised_data", "expected {cache_dir, train_urls, input_field, output_field} or a map of name -> "
                                 "one", cfg.supervised_data.where);
    }
  }
  if (have_source) {
    check_source(v, source, source_key, cfg.supervised_data.where);
    if (source["cache_dir"] && !source["cache_dir"].IsNull()) t.data.cache_dir = source["cache_dir"].as<std::string>();
    if (!chat) t.data.train_urls = strings_of(source["train_urls"]);
  }
  t.data.format.set = true;
  t.data.format.where = "sft";
  t.data.format.yaml = format_yaml(chat, cfg.messages_field, have_source ? source : YAML::Node());
  if (chat) {
    if (!cfg.chat_train_urls || cfg.chat_train_urls->empty())
      v.error("chat_train_urls", "required with dataset_type chat_jsonl: the .jsonl files of chats to train on");
    else
      t.data.train_urls = *cfg.chat_train_urls;
  } else if (cfg.chat_train_urls) {
    v.note("chat_train_urls", "ignored with dataset_type huggingface");
  }
  return finish(v, std::move(t), chat, false);
}

sft_plan plan_sft_mixture(const SftMixtureConfig& cfg, const config::source_map& sources) {
  config::validator v{sources, {}};
  TrainLmConfig t;
  const bool chat = cfg.dataset_type == "chat_jsonl";
  plan_common(cfg, v, t, chat, true);
  t.epoch = 0;  // (train_lm refuses epochs with a mixture) exactly the run's examples are packed: they never run out
  if (cfg.stop_strategy != "restart")
    v.error("stop_strategy", "sft_mixture reads its mixture of rows without end (upstream starts it over when it "
                             "ends, whatever stop_strategy says); use restart and end the run with "
                             "trainer.num_train_steps");
  config::check_int(v, "mixture_block_size", cfg.mixture_block_size, 1, 65535);
  // supervised_data {name: source} becomes data.configs, mixture_weights data.train_weights.
  YAML::Node configs(YAML::NodeType::Map);
  if (!cfg.supervised_data.set) {
    v.error("supervised_data", "required: {name: {cache_dir, train_urls}} of the datasets to mix");
  } else {
    const YAML::Node n = YAML::Load(cfg.supervised_data.yaml);
    if (!n.IsMap() || n.size() == 0 || is_source(n)) {
      v.error("supervised_data", "expected a map of name -> {cache_dir, train_urls, input_field, output_field}",
              cfg.supervised_data.where);
    } else {
      for (const auto& kv : n) {
        const std::string name = kv.first.as<std::string>();
        if (!kv.second.IsMap()) {
          v.error("supervised_data." + name, "expected {cache_dir, train_urls, ...}", cfg.supervised_data.where);
          continue;
        }
        check_source(v, kv.second, "supervised_data." + name, cfg.supervised_data.where);
        YAML::Node c(YAML::NodeType::Map);
        c["train_urls"] = strings_of(kv.second["train_urls"]);
        if (kv.second["cache_dir"] && !kv.second["cache_dir"].IsNull()) c["cache_dir"] = kv.second["cache_dir"];
        c["format"] = YAML::Load(format_yaml(chat, cfg.messages_field, kv.second));
        configs[name] = c;
      }
    }
  }
  if (!cfg.mixture_weights.set) {
    v.error("mixture_weights", "required: {name: weight} for the supervised_data datasets");
  } else {
    const YAML::Node w = YAML::Load(cfg.mixture_weights.yaml);
    if (!w.IsMap())
      v.error("mixture_weights", "expected {name: weight}", cfg.mixture_weights.where);
    else
      for (const auto& kv : w)
        if (!configs[kv.first.as<std::string>()])
          v.error("mixture_weights." + kv.first.as<std::string>(),
                  "names no dataset of supervised_data (give each weight the name of a supervised_data entry)",
                  cfg.mixture_weights.where);
  }
  t.data.configs = {true, YAML::Dump(configs), cfg.supervised_data.where};
  t.data.train_weights = cfg.mixture_weights;
  t.data.mixture_block_size = cfg.mixture_block_size;
  t.data.stop_strategy = "restart";
  t.data.sft->examples = data_offset_at(cfg.trainer.train_batch_size, std::max<int64_t>(0, cfg.trainer.num_train_steps));
  return finish(v, std::move(t), chat, true);
}

int sft_main(int argc, char** argv) { return program_main<SftConfig>("sft", argc, argv, &plan_sft); }

int sft_mixture_main(int argc, char** argv) {
  return program_main<SftMixtureConfig>("sft_mixture", argc, argv, &plan_sft_mixture);
}

}  // namespace levanter
