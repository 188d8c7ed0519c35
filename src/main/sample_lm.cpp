// sample_lm (levanter/main/sample_lm.hpp): finding the model and tokenizer, the prompts and the stop sequence, the
// sampling options of each continuation, and the printout. The generation loop is instantiated per model type.
#include <levanter/main/sample_lm.hpp>

#include <iostream>
#include <string>
#include <vector>

#include <levanter/config/validate.hpp>
#include <levanter/data/lm_data.hpp>

namespace levanter {

namespace detail {

sampling_options sample_options(const SampleLmConfig& cfg, const std::vector<std::int32_t>& stop, std::int64_t round,
                                std::int64_t prompt, std::int64_t index) {
  sampling_options s;
  s.max_new_tokens = cfg.max_new_tokens;
  s.temperature = cfg.temperature;
  // One seed per continuation, from (seed, round, prompt, index): each continuation is reproducible on its own.
  std::uint64_t h = static_cast<std::uint64_t>(cfg.seed);
  for (const std::int64_t v : {round, prompt, index}) h = (h ^ static_cast<std::uint64_t>(v)) * 0x100000001B3ull + 0x9E37;
  s.seed = h;
  if (!stop.empty()) s.stop_sequences = {stop};
  return s;
}

std::string print_sample(const sample_job& job, const sample& s, std::ostream& out) {
  const std::string text = job.tok.decode(s.gen.tokens);
  out << "Generation " << s.prompt << "." << s.index << " (round " << s.round << ", " << s.gen.tokens.size()
      << " tokens, " << s.gen.finish_reason << "): " << text << "\n";
  return text;
}

}  // namespace detail

namespace detail {

model_source resolve_model_source(const std::optional<std::string>& checkpoint_path,
                                  const std::optional<std::string>& hf_checkpoint, const ModelChoice& model,
                                  const std::optional<std::string>& tokenizer, const config::source_map& sources,
                                  const std::function<void(const std::string&)>& say) {
  if (checkpoint_path && hf_checkpoint)
    throw config::config_error("checkpoint_path and hf_checkpoint are both set; give one (as upstream)");
  if (!checkpoint_path && !hf_checkpoint)
    throw config::config_error("give checkpoint_path (a train_lm checkpoint) or hf_checkpoint (a local Hugging Face "
                               "directory; no network here)");
  if (hf_checkpoint && !config::url_scheme(*hf_checkpoint).empty())
    throw config::config_error("hf_checkpoint: '" + *hf_checkpoint +
                               "' is not a local directory (no network here); download the model and give its path");
  model_source src;
  if (hf_checkpoint) {
    src.hf.emplace(hf::open_dir(*hf_checkpoint, "hf_checkpoint"));
  } else {
    src.checkpoint = find_checkpoint(*checkpoint_path, "checkpoint_path", say);
    src.train_config = checkpoint_train_config(*src.checkpoint);
  }
  // The tokenizer: the given one, else hf_checkpoint's own files, else the checkpoint's data.tokenizer.
  LmDataConfig tok_cfg;
  if (tokenizer) {
    tok_cfg.tokenizer = *tokenizer;
    if (*tokenizer == "passthrough")  // ids as text, up to the model's vocabulary
      tok_cfg.vocab_size = src.hf ? src.hf->vocab_size : checkpoint_vocab_size(*src.checkpoint);
  }
  else if (src.hf)
    tok_cfg.tokenizer = src.hf->dir;
  else if (src.train_config)
    tok_cfg = src.train_config->data;
  else
    throw config::config_error("tokenizer: the checkpoint has no config.yaml to take it from; give --tokenizer");
  try {
    src.tok = data::make_tokenizer(tok_cfg);
  } catch (const data::data_error& e) {
    throw data::data_error(std::string("tokenizer: ") + e.what());
  }
  // The model type: the given model section, else the checkpoint's, else the Hugging Face directory's.
  src.model = model;
  if (!sources_under(sources, "model")) {
    if (src.train_config)
      src.model = src.train_config->model;
    else if (src.hf)
      src.model = model_choice_for_hf(*src.hf);
    else
      throw config::config_error("checkpoint_path: the checkpoint has no config.yaml; give the model section "
                                 "(--model.type gpt2 --model.hidden_dim ...)");
  }
  return src;
}

}  // namespace detail

std::vector<sample> run_sample_lm(const SampleLmConfig& cfg, const config::source_map& sources, std::ostream& out) {
  if (cfg.max_new_tokens <= 0) throw config::config_error("max_new_tokens must be positive");
  if (!(cfg.temperature >= 0)) throw config::config_error("temperature must be at least 0 (0 is greedy)");
  if (cfg.n_generations <= 0 || cfg.n_rounds <= 0)
    throw config::config_error("n_generations and n_rounds must be positive");
  if (cfg.prompts.empty()) throw config::config_error("prompts is empty: give at least one prompt");

  detail::sample_job job;
  static_cast<detail::model_source&>(job) =
      detail::resolve_model_source(cfg.checkpoint_path, cfg.hf_checkpoint, cfg.model, cfg.tokenizer, sources,
                                   [&](const std::string& m) { out << "sample_lm: " << m << "\n"; });
  job.cfg = &cfg;
  for (const auto& p : cfg.prompts) {
    job.prompts.push_back(job.tok.encode(p, false));
    if (job.prompts.back().empty())
      throw config::config_error("prompts: '" + p + "' has no tokens; give text to continue");
  }
  if (cfg.stop_sequence) {
    job.stop = job.tok.encode(*cfg.stop_sequence, false);
    if (job.stop.empty()) throw config::config_error("stop_sequence must be non-empty (as upstream), or null for none");
  }
  if (cfg.engine.set) {  // upstream InferenceEngineConfig: its max_seqs bounds the batch; the rest is not used
    const YAML::Node e = YAML::Load(cfg.engine.yaml);
    if (e.IsMap() && e["max_seqs"]) {
      try {
        job.max_seqs = e["max_seqs"].as<std::int64_t>();
      } catch (const YAML::Exception&) {
        throw config::config_error(cfg.engine.where + ": engine.max_seqs must be an integer");
      }
      if (job.max_seqs <= 0) throw config::config_error(cfg.engine.where + ": engine.max_seqs must be positive");
    }
    out << "sample_lm: continuations decode in batches of up to " << job.max_seqs
        << " (engine.max_seqs); the engine's other keys (the paged cache's sizes) are read but not used\n";
  }
  for (std::size_t i = 0; i < job.prompts.size(); ++i)
    out << "Prompt " << i << ": " << cfg.prompts[i] << " (" << job.prompts[i].size() << " tokens)\n";
  return with_model(job.model, [&]<class M>(std::type_identity<M>, const auto&) { return run_sample_lm_with<M>(job, out); });
}

int sample_lm_main(int argc, char** argv) {
  return run_program("sample_lm", [&] {
    auto parsed = config::parse_command_line<SampleLmConfig>(argc, argv, "{}", "<defaults>");
    if (parsed.help) {
      std::cout << config::help_text<SampleLmConfig>("sample_lm");
      return 0;
    }
    if (parsed.dry_run) {
      std::cout << parsed.resolved_yaml;
      return 0;
    }
    run_sample_lm(parsed.config, parsed.sources, std::cout);
    return 0;
  });
}

}  // namespace levanter
