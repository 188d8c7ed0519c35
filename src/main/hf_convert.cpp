// levanter/main/hf_convert.hpp: the export_lm_to_hf and import_hf_to_lm programs' drivers.
#include <levanter/main/hf_convert.hpp>

#include <filesystem>
#include <iostream>

#include <levanter/config/validate.hpp>
#include <levanter/data/lm_data.hpp>
#include <levanter/main/programs.hpp>

namespace levanter {

namespace config {
template ConvertLmConfig decode<ConvertLmConfig>(const YAML::Node&, const std::string&, const source_map&,
                                                 const std::string&);
template std::string help_text<ConvertLmConfig>(const std::string&, const ConvertLmConfig&);
template command_line<ConvertLmConfig> parse_command_line<ConvertLmConfig>(int, const char* const*,
                                                                           const std::string&, const std::string&);
template ImportHfConfig decode<ImportHfConfig>(const YAML::Node&, const std::string&, const source_map&,
                                               const std::string&);
template std::string help_text<ImportHfConfig>(const std::string&, const ImportHfConfig&);
template command_line<ImportHfConfig> parse_command_line<ImportHfConfig>(int, const char* const*, const std::string&,
                                                                         const std::string&);
}  // namespace config

namespace detail {

namespace {

bool set_under(const config::source_map& sources, const std::string& prefix) {
  auto it = sources.lower_bound(prefix);
  return it != sources.end() && it->first.compare(0, prefix.size(), prefix) == 0 &&
         (it->first.size() == prefix.size() || it->first[prefix.size()] == '.');
}

/// A tokenizer named by a `tokenizer:` value: byte, passthrough, or a local tokenizer.json (or its directory).
/// A hub name or URL is refused: nothing can be downloaded here.
data::tokenizer open_tokenizer(const std::string& spec, const std::string& key, std::int64_t vocab) {
  if (spec == "byte") return data::tokenizer::byte_level();
  if (spec == "passthrough") return data::tokenizer::passthrough(vocab);
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(spec, ec))
    throw config::config_error(key + ": '" + spec + "' is not a local tokenizer.json or a directory holding one " +
                               "(Hugging Face hub names need a download, which is not possible here; download it " +
                               "first and give the local path)");
  return data::tokenizer::from_file(spec);
}

}  // namespace

bool is_local_tokenizer(const std::string& spec) {
  namespace fs = std::filesystem;
  std::error_code ec;
  return spec == "byte" || spec == "passthrough" || fs::is_regular_file(spec, ec) ||
         fs::exists(fs::path(spec) / "tokenizer.json", ec);
}

std::vector<std::string> copy_tokenizer_files(const std::string& spec, const std::string& output_dir) {
  namespace fs = std::filesystem;
  if (spec == "byte" || spec == "passthrough") return {};
  const fs::path dir = fs::is_directory(spec) ? fs::path(spec) : fs::path(spec).parent_path();
  const fs::path json_file = fs::is_directory(spec) ? dir / "tokenizer.json" : fs::path(spec);
  std::vector<std::string> copied;
  std::error_code ec;
  fs::copy_file(json_file, fs::path(output_dir) / "tokenizer.json", fs::copy_options::overwrite_existing, ec);
  if (ec)
    throw hf::error("cannot copy '" + json_file.string() + "' into '" + output_dir + "': " + ec.message());
  copied.push_back("tokenizer.json");
  for (const char* extra : {"tokenizer_config.json", "special_tokens_map.json"}) {
    if (!fs::exists(dir / extra)) continue;
    fs::copy_file(dir / extra, fs::path(output_dir) / extra, fs::copy_options::overwrite_existing, ec);
    if (ec) throw hf::error("cannot copy '" + (dir / extra).string() + "' into '" + output_dir + "': " + ec.message());
    copied.push_back(extra);
  }
  return copied;
}

void write_imported_checkpoint(const ImportHfConfig& cfg, std::vector<checkpoint::named_file> files,
                               std::int64_t vocab, std::int64_t parameters, const nlohmann::json& hf_config,
                               std::ostream& out) {
  // The checkpoint carries a train_lm config whose model section is this architecture (and whose tokenizer is the
  // one given), so export_lm_to_hf, viz_logprobs and initialize_from_checkpoint_path need nothing else.
  TrainLmConfig tc;
  tc.model = cfg.model;
  tc.data.vocab_size = vocab;
  // The tokenizer to record: the one given, else the Hugging Face directory's own tokenizer.json when it has one.
  if (cfg.tokenizer)
    tc.data.tokenizer = *cfg.tokenizer;
  else if (std::filesystem::exists(std::filesystem::path(cfg.hf_checkpoint) / "tokenizer.json"))
    tc.data.tokenizer = cfg.hf_checkpoint;
  files.push_back({"config.yaml", {}, config::to_yaml_string(tc)});
  // config.json's special-token ids, kept for an export without a tokenizer (export_lm_to_hf writes them back).
  nlohmann::json ids = nlohmann::json::object();
  for (const char* k : {"bos_token_id", "eos_token_id"})
    ids[k] = hf_config.contains(k) ? hf_config[k] : nlohmann::json(nullptr);
  const auto bytes = checkpoint::write_checkpoint(cfg.output_path, files, 0, false, std::chrono::system_clock::now(),
                                                  {{"source", cfg.hf_checkpoint}, {"hf_token_ids", ids}});
  out << "import_hf_to_lm: " << cfg.hf_checkpoint << " -> " << cfg.output_path << " (" << bytes / 1000 << " kB, "
      << parameters << " parameters)\n";
}

}  // namespace detail

std::string run_export_lm_to_hf(const ConvertLmConfig& cfg, const config::source_map& sources, std::ostream& out) {
  if (cfg.checkpoint_path.empty()) throw config::config_error("checkpoint_path is required");
  if (cfg.output_dir.empty()) throw config::config_error("output_dir is required");
  if (cfg.upload_to_hf.set)
    throw config::config_error("upload_to_hf: uploading to the Hugging Face Hub is not possible here");
  if (cfg.config_overrides.set) throw config::config_error("config_overrides is not supported");
  if (cfg.max_shard_size <= 0) throw config::config_error("max_shard_size must be positive");
  if (cfg.tokenizer && !config::url_scheme(*cfg.tokenizer).empty())
    throw config::config_error("tokenizer: '" + *cfg.tokenizer + "' is a remote URL; give a local tokenizer.json");

  detail::export_job job;
  job.cfg = &cfg;
  job.dtype = hf::dtype_from_config(cfg.save_dtype);
  job.checkpoint = find_checkpoint(cfg.checkpoint_path, "checkpoint_path",
                                   [&](const std::string& m) { out << "export_lm_to_hf: " << m << "\n"; });
  const auto train_cfg = checkpoint_train_config(job.checkpoint);
  ModelChoice choice = cfg.model;
  if (!detail::set_under(sources, "model")) {
    if (!train_cfg)
      throw config::config_error("the checkpoint has no config.yaml; give the model section (--model.type gpt2 "
                                 "--model.hidden_dim ...)");
    choice = train_cfg->model;
  }
  // The tokenizer the model was trained with: config.json gets its BOS/EOS, the export its files.
  const std::int64_t vocab = checkpoint_vocab_size(job.checkpoint);
  if (cfg.tokenizer)
    job.tokenizer = *cfg.tokenizer;
  else if (train_cfg)
    job.tokenizer = train_cfg->data.tokenizer;
  // An imported checkpoint remembers the ids of the config.json it came from.
  const auto& meta = job.checkpoint.metadata;
  const bool imported_ids = meta.contains("hf_token_ids") && meta["hf_token_ids"].is_object();
  if (job.tokenizer && !cfg.tokenizer && !detail::is_local_tokenizer(*job.tokenizer)) {
    // The checkpoint's config names a tokenizer we cannot open here (a hub name such as upstream's default "gpt2").
    out << "export_lm_to_hf: the checkpoint's data.tokenizer '" << *job.tokenizer << "' is not a local tokenizer.json: "
        << (imported_ids ? "config.json gets the bos_token_id / eos_token_id the checkpoint was imported with"
                         : "config.json gets no bos_token_id / eos_token_id")
        << " and no tokenizer files are saved (give --tokenizer PATH to the tokenizer the model was trained with)\n";
    job.tokenizer.reset();
  }
  if (job.tokenizer) {
    const auto tok = detail::open_tokenizer(*job.tokenizer, cfg.tokenizer ? "tokenizer" : "the checkpoint's data.tokenizer",
                                            vocab);
    if (tok.vocab_size() > vocab)
      throw config::config_error("tokenizer '" + *job.tokenizer + "' has " + std::to_string(tok.vocab_size()) +
                                 " tokens, more than the model's vocabulary of " + std::to_string(vocab) +
                                 " (is it the tokenizer the model was trained with?)");
    job.ids = {tok.bos_id(), tok.eos_id()};
  } else if (imported_ids) {
    job.ids.bos_json = meta["hf_token_ids"].value("bos_token_id", nlohmann::json(nullptr));
    job.ids.eos_json = meta["hf_token_ids"].value("eos_token_id", nlohmann::json(nullptr));
  } else {
    out << "export_lm_to_hf: no tokenizer known (the checkpoint has no config.yaml and --tokenizer was not given): "
           "config.json gets no bos_token_id / eos_token_id\n";
  }
  auto files = with_model(choice, [&]<class M>(std::type_identity<M>, const typename M::config_type& mc) {
    return export_lm_to_hf_with<M>(job, mc, out);
  });
  if (cfg.save_tokenizer && job.tokenizer) {
    const auto copied = detail::copy_tokenizer_files(*job.tokenizer, cfg.output_dir);
    if (copied.empty())
      out << "export_lm_to_hf: the '" << *job.tokenizer
          << "' tokenizer is built in and has no Hugging Face files to save\n";
    else
      out << "export_lm_to_hf: saved the tokenizer (" << copied.size() << " files) from " << *job.tokenizer << "\n";
  }
  return cfg.output_dir;
}

std::string run_import_hf_to_lm(const ImportHfConfig& cfg, std::ostream& out) {
  if (cfg.hf_checkpoint.empty()) throw config::config_error("hf_checkpoint is required");
  if (cfg.output_path.empty()) throw config::config_error("output_path is required");
  if (cfg.dtype && *cfg.dtype != "float32" && *cfg.dtype != "f32" && *cfg.dtype != "fp32")
    throw config::config_error("dtype '" + *cfg.dtype + "': parameters are stored in float32 here; use dtype: float32");
  const auto d = hf::open_dir(cfg.hf_checkpoint, "hf_checkpoint");
  if (cfg.tokenizer) {
    const auto tok = detail::open_tokenizer(*cfg.tokenizer, "tokenizer", d.vocab_size);
    if (tok.vocab_size() > d.vocab_size)
      throw config::config_error("tokenizer '" + *cfg.tokenizer + "' has " + std::to_string(tok.vocab_size()) +
                                 " tokens, more than the model's vocab_size of " + std::to_string(d.vocab_size));
  }
  // With use_hf_model_config the model type is the directory's; else the given model section's.
  const ModelChoice choice = cfg.use_hf_model_config ? model_choice_for_hf(d) : cfg.model;
  with_model(choice, [&]<class M>(std::type_identity<M>, const typename M::config_type& defaults) {
    using C = typename M::config_type;
    const C* given = model_config_as<C>(cfg.model);
    import_hf_to_lm_with<M>(cfg, d, given ? *given : defaults, out);
  });
  return cfg.output_path;
}

int export_lm_to_hf_main(int argc, char** argv) {
  return run_program("export_lm_to_hf", [&] {
    auto parsed = config::parse_command_line<ConvertLmConfig>(argc, argv, "{}", "<defaults>");
    if (parsed.help) {
      std::cout << config::help_text<ConvertLmConfig>("export_lm_to_hf");
      return 0;
    }
    if (parsed.dry_run) {
      std::cout << parsed.resolved_yaml;
      return 0;
    }
    run_export_lm_to_hf(parsed.config, parsed.sources, std::cout);
    return 0;
  });
}

int import_hf_to_lm_main(int argc, char** argv) {
  return run_program("import_hf_to_lm", [&] {
    auto parsed = config::parse_command_line<ImportHfConfig>(argc, argv, "{}", "<defaults>");
    if (parsed.help) {
      std::cout << config::help_text<ImportHfConfig>("import_hf_to_lm");
      return 0;
    }
    if (parsed.dry_run) {
      std::cout << parsed.resolved_yaml;
      return 0;
    }
    run_import_hf_to_lm(parsed.config, std::cout);
    return 0;
  });
}

}  // namespace levanter
