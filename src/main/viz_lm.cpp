// levanter/main/viz_lm.hpp: the viz_logprobs program's driver.
#include <levanter/main/viz_lm.hpp>

#include <cmath>
#include <iostream>
#include <memory>
#include <tuple>

#include <levanter/data/cache.hpp>
#include <levanter/data/sources.hpp>
#include <levanter/main/programs.hpp>

namespace levanter {

namespace config {
template VizLmConfig decode<VizLmConfig>(const YAML::Node&, const std::string&, const source_map&, const std::string&);
template std::string help_text<VizLmConfig>(const std::string&, const VizLmConfig&);
template command_line<VizLmConfig> parse_command_line<VizLmConfig>(int, const char* const*, const std::string&,
                                                                   const std::string&);
}  // namespace config

namespace detail {

viz_tokens tokenize_validation(const LmDataConfig& d) {
  if (d.validation_urls.empty())
    throw config::config_error("data.validation_urls is empty: give the documents to show, e.g. "
                               "--data.validation_urls '[\"valid.jsonl\"]'");
  // The documents and their tokens exactly as train_lm's cache holds them (sources.hpp, make_encode_fn).
  data::source_options src;
  src.text_key = d.text_key.value_or("text");
  src.on_bad_document = data::parse_bad_document_policy(d.bad_documents);
  auto tok = std::make_shared<data::tokenizer>(
      d.tokenizer == "byte"          ? data::tokenizer::byte_level()
      : d.tokenizer == "passthrough" ? data::tokenizer::passthrough(d.vocab_size.value_or(0))
                                     : data::tokenizer::from_file(d.tokenizer));
  const auto encode = data::make_encode_fn(*tok, true, d.enforce_eos);
  viz_tokens out;
  data::read_documents(data::expand_urls(d.validation_urls), src, [&](std::string_view text) {
    auto ids = encode(text);
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
  });
  const auto eos = tok->eos_id();
  if (d.tokenizer == "byte")
    out.text = viz::byte_token_text;
  else if (d.tokenizer == "passthrough")  // ids as text: keep them apart
    out.text = [](std::int32_t id) { return std::to_string(id) + " "; };
  else
    out.text = [tok](std::int32_t id) {
      auto s = tok->token_text(id);
      return s.empty() ? "<|" + std::to_string(id) + "|>" : s;
    };
  out.eos_id = eos ? *eos : -1;
  return out;
}

/// Whether a key at or under `prefix` was set (per parse_command_line's sources).
bool sources_under(const config::source_map& sources, const std::string& prefix) {
  auto it = sources.lower_bound(prefix);
  return it != sources.end() && it->first.compare(0, prefix.size(), prefix) == 0 &&
         (it->first.size() == prefix.size() || it->first[prefix.size()] == '.');
}

/// `given`, with every data key the user did not set (per `sources`) taken from `base`.
LmDataConfig merge_data(const LmDataConfig& given, const LmDataConfig& base, const config::source_map& sources) {
  LmDataConfig out = given;
  std::apply(
      [&](const auto&... f) {
        ((!sources_under(sources, "data." + std::string(f.name)) ? void(out.*(f.member) = base.*(f.member))
                                                                        : void()),
         ...);
      },
      config::schema<LmDataConfig>::fields);
  return out;
}

namespace {
viz_source open_source(const std::string& path, bool is_hf, const std::string& key, std::ostream& out) {
  viz_source s;
  s.key = key;
  if (is_hf) {
    s.hf.emplace(hf::open_dir(path, key));
    return s;
  }
  try {
    s.checkpoint = find_checkpoint(path, key, [&](const std::string& m) { out << "viz_logprobs: " << m << "\n"; });
  } catch (const checkpoint::error&) {
    throw checkpoint::error(key + ": no complete checkpoint under '" + path +
                            "' (give a train_lm checkpoint or its run directory; for a Hugging Face directory set " +
                            (key == "checkpoint_path" ? "checkpoint_is_hf" : "comparison_is_hf") + ": true)");
  }
  s.train_config = checkpoint_train_config(*s.checkpoint);
  return s;
}
}  // namespace

std::vector<std::vector<std::int32_t>> viz_documents(const viz_job& job, std::int64_t seq_len, std::ostream& out) {
  data::token_windows windows(job.tokens.ids, seq_len);
  if (windows.size() == 0)
    throw data::data_error("the validation data holds " + std::to_string(windows.num_tokens()) +
                           " tokens, fewer than one window of seq_len " + std::to_string(seq_len));
  auto docs = viz::select_documents(windows, job.cfg->num_docs, job.cfg->data_seed);
  if (static_cast<std::int64_t>(docs.size()) < job.cfg->num_docs)
    out << "viz_logprobs: the validation data has only " << docs.size() << " windows of " << seq_len << " tokens\n";
  return docs;
}

std::vector<std::string> write_viz_pages(const viz_job& job, const std::vector<std::vector<std::int32_t>>& docs,
                                         const std::vector<viz::scored_doc>& scores,
                                         const std::vector<viz::scored_doc>* comparison,
                                         const std::string& model_name, std::optional<std::int64_t> step,
                                         const std::string& comparison_name, std::int64_t seq_len, std::ostream& out) {
  const auto& toks = job.tokens;
  std::string path = job.cfg->path;
  if (!data::ends_with(path, ".html")) path += ".html";
  viz::html_options o;
  o.model_name = model_name;
  o.step = step;
  viz::write_logprobs_html(path, viz::make_documents(docs, scores, nullptr, toks.text, toks.eos_id), o);
  std::vector<std::string> written{path};
  if (comparison) {
    const std::string diff_path = path.substr(0, path.size() - 5) + "_diff.html";
    o.diff = true;
    o.title = "Token log-probability differences";
    o.comparison_name = comparison_name;
    viz::write_logprobs_html(diff_path, viz::make_documents(docs, scores, comparison, toks.text, toks.eos_id), o);
    written.push_back(diff_path);
  }
  double sum = 0;
  std::int64_t n = 0;
  for (const auto& s : scores)
    for (double lp : s.logprob)
      if (!std::isnan(lp)) sum += lp, ++n;
  out << "viz_logprobs: " << docs.size() << " documents of " << seq_len << " tokens, mean log-prob "
      << (n ? sum / double(n) : 0.0) << " -> " << written.front();
  if (written.size() > 1) out << " and " << written[1];
  out << "\n";
  return written;
}

}  // namespace detail

std::vector<std::string> run_viz_logprobs(const VizLmConfig& cfg, const config::source_map& sources,
                                          std::ostream& out) {
  if (cfg.checkpoint_path.empty()) throw config::config_error("checkpoint_path is required");
  if (cfg.num_docs <= 0)
    throw config::config_error("num_docs must be positive (got " + std::to_string(cfg.num_docs) + ")");
  if (cfg.path.empty()) throw config::config_error("path must name the HTML file to write");

  detail::viz_job job;
  job.cfg = &cfg;
  job.model_given = detail::sources_under(sources, "model");
  job.target = detail::open_source(cfg.checkpoint_path, cfg.checkpoint_is_hf, "checkpoint_path", out);
  if (cfg.comparison_model_path)
    job.comparison =
        detail::open_source(*cfg.comparison_model_path, cfg.comparison_is_hf, "comparison_model_path", out);
  // The model type: the given model section, else the checkpoint's, else the Hugging Face directory's.
  ModelChoice choice = cfg.model;
  if (!job.model_given) {
    if (job.target.train_config)
      choice = job.target.train_config->model;
    else if (job.target.hf)
      choice = model_choice_for_hf(*job.target.hf);
    else
      throw config::config_error("checkpoint_path: the checkpoint has no config.yaml; give the model section "
                                 "(--model.type gpt2 --model.hidden_dim ...)");
  }
  const LmDataConfig data_cfg =
      job.target.train_config ? detail::merge_data(cfg.data, job.target.train_config->data, sources) : cfg.data;
  job.tokens = detail::tokenize_validation(data_cfg);
  return with_model(choice, [&]<class M>(std::type_identity<M>, const auto&) {
    return run_viz_logprobs_with<M>(job, out);
  });
}

int viz_logprobs_main(int argc, char** argv) {
  return run_program("viz_logprobs", [&] {
    auto parsed = config::parse_command_line<VizLmConfig>(argc, argv, "{}", "<defaults>");
    if (parsed.help) {
      std::cout << config::help_text<VizLmConfig>("viz_logprobs");
      return 0;
    }
    if (parsed.dry_run) {
      std::cout << parsed.resolved_yaml;
      return 0;
    }
    run_viz_logprobs(parsed.config, parsed.sources, std::cout);
    return 0;
  });
}

}  // namespace levanter
