// levanter/main/viz_lm.hpp: the `viz_logprobs` program (upstream `levanter.main.viz_logprobs`): the per-token
// log-probabilities of a model on validation documents as an HTML heatmap (viz/logprobs_html.hpp), or, with a
// comparison model, also the page of their differences.
//
//   viz_logprobs --checkpoint_path checkpoints/RUN [--path logprobs.html] [--num_docs 32]
//   viz_logprobs --checkpoint_path hf/gpt2 --checkpoint_is_hf true --data.validation_urls '["v.jsonl"]'
//   viz_logprobs --checkpoint_path checkpoints/B --comparison_model_path checkpoints/A   # + logprobs_diff.html
//
// The newest complete checkpoint under checkpoint_path is used (or that checkpoint itself). The `model:` and
// `data:` sections default to those of the config.yaml the checkpoint carries (keys given on the command line
// or in a file override it key by key), so a train_lm checkpoint needs nothing else. The documents are the
// validation set's windows of seq_len tokens (as train_lm evaluates them), permuted with data_seed (upstream
// shuffles with PRNGKey(data_seed); null keeps the file order), the first num_docs of them. Each token is
// coloured by log p(token | the tokens before it in its window); the first token of a window has no value.
//
// train_lm calls write_logprobs_for_model with its live model to refresh a page during training.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <haliax/autodiff.hpp>
#include <levanter/checkpoint/train_state.hpp>
#include <levanter/compat/hf_gpt2.hpp>
#include <levanter/config/cli.hpp>
#include <levanter/config/train_lm_config.hpp>
#include <levanter/config/yaml.hpp>
#include <levanter/data/cache.hpp>
#include <levanter/data/sources.hpp>
#include <levanter/data/text.hpp>
#include <levanter/data/tokenizer.hpp>
#include <levanter/models/gpt2.hpp>
#include <levanter/viz/logprobs_html.hpp>

namespace levanter {

/// upstream VizLmConfig.
struct VizLmConfig {
  std::string checkpoint_path;
  std::string path = "logprobs.html";
  TrainerConfig trainer;
  LmDataConfig data;
  ModelChoice model;
  int64_t num_docs = 32;
  bool checkpoint_is_hf = false;
  std::optional<int64_t> data_seed = 0;
  std::optional<std::string> comparison_model_path;
  bool comparison_is_hf = false;
};

}  // namespace levanter

template <>
struct levanter::config::schema<levanter::VizLmConfig> {
  using T = levanter::VizLmConfig;
  static constexpr auto fields = std::make_tuple(
      field("checkpoint_path", &T::checkpoint_path, "a train_lm checkpoint, or a directory holding step-N checkpoints (the newest is used); a Hugging Face GPT-2 directory with checkpoint_is_hf"),
      field("path", &T::path, "HTML file to write (.html is appended if missing); the diff page goes next to it as *_diff.html"),
      field("trainer", &T::trainer, "trainer section (per_device_eval_parallelism sets the batch; the rest is accepted for upstream compatibility)"),
      field("data", &T::data, "data section; the validation_urls give the documents (default: the checkpoint's config.yaml)"),
      field("model", &T::model, "model config (default: the checkpoint's config.yaml; config.json for Hugging Face directories)"),
      field("num_docs", &T::num_docs, "number of validation windows to show"),
      field("checkpoint_is_hf", &T::checkpoint_is_hf, "checkpoint_path is a local Hugging Face GPT-2 directory"),
      field("data_seed", &T::data_seed, "seed of the permutation the documents are taken from (null: file order)"),
      field("comparison_model_path", &T::comparison_model_path, "a second model: also write the page of the log-prob differences"),
      field("comparison_is_hf", &T::comparison_is_hf, "comparison_model_path is a local Hugging Face GPT-2 directory"));
};

namespace levanter {

namespace viz {

/// The display text of one token id as raw bytes (the page repairs characters split across tokens).
using token_text_fn = std::function<std::string(std::int32_t)>;

/// The byte tokenizer's token text: the byte itself for 0–255, `<|endoftext|>` for EOS.
inline std::string byte_token_text(std::int32_t id) {
  if (id >= 0 && id < 256) return std::string(1, static_cast<char>(id));
  if (id == data::byte_tokenizer::eos_id) return "<|endoftext|>";
  return "<|" + std::to_string(id) + "|>";
}

/// Per-token scores of one document: logprob[i] = log p(ids[i] | ids[0..i)) (NaN at i = 0), and the model's most
/// likely token for position i with its log-prob.
struct scored_doc {
  std::vector<double> logprob;
  std::vector<std::int32_t> top;
  std::vector<double> top_logprob;
};

/// Runs `model` (no gradients, no dropout) on `docs` and returns each token's log-prob given the tokens before
/// it in its document. Documents of equal length are batched, at most `batch` at a time (<= 0: as many as fit
/// in about 128 MB of logits). Segments restart after each EOS, as in training. Throws viz_error for an empty
/// document, one longer than seq_len, or a token id outside the vocabulary.
inline std::vector<scored_doc> score_documents(const gpt2::LMHeadModel& model, const Gpt2Config& mc,
                                               const std::vector<std::vector<std::int32_t>>& docs,
                                               std::int64_t eos_id, std::int64_t batch = 0) {
  haliax::no_grad_guard ng;
  const std::int64_t V = model.vocab_size();
  for (std::size_t d = 0; d < docs.size(); ++d) {
    const auto n = static_cast<std::int64_t>(docs[d].size());
    if (n == 0) throw viz_error("score_documents: document " + std::to_string(d) + " is empty");
    if (n > mc.seq_len)
      throw viz_error("score_documents: document " + std::to_string(d) + " has " + std::to_string(n) +
                      " tokens, more than the model's seq_len " + std::to_string(mc.seq_len));
    for (auto id : docs[d])
      if (id < 0 || id >= V)
        throw viz_error("score_documents: document " + std::to_string(d) + " holds token id " + std::to_string(id) +
                        " outside the model's vocabulary of " + std::to_string(V) + " (wrong tokenizer?)");
  }
  std::vector<scored_doc> out(docs.size());
  std::size_t first = 0;
  while (first < docs.size()) {
    const auto P = static_cast<std::int64_t>(docs[first].size());
    const std::int64_t cap = batch > 0 ? batch : std::max<std::int64_t>(1, (std::int64_t{1} << 25) / (P * V));
    std::size_t last = first + 1;
    while (last < docs.size() && static_cast<std::int64_t>(last - first) < cap &&
           static_cast<std::int64_t>(docs[last].size()) == P)
      ++last;
    const auto B = static_cast<std::int64_t>(last - first);
    std::vector<std::int32_t> host;
    host.reserve(static_cast<std::size_t>(B * P));
    for (std::size_t d = first; d < last; ++d) host.insert(host.end(), docs[d].begin(), docs[d].end());
    auto tokens = haliax::from_host<std::int32_t>(host, B * Batch, P * Pos);
    const auto ex = lm_example::causal(tokens, eos_id);
    const auto logits = model.logits(mc, ex.tokens, ex.segment_ids).to_host();  // {batch, position, vocab}
    for (std::int64_t b = 0; b < B; ++b) {
      auto& s = out[first + static_cast<std::size_t>(b)];
      s.logprob.assign(static_cast<std::size_t>(P), std::nan(""));
      s.top.assign(static_cast<std::size_t>(P), -1);
      s.top_logprob.assign(static_cast<std::size_t>(P), std::nan(""));
      for (std::int64_t p = 0; p + 1 < P; ++p) {
        const float* row = logits.data() + (b * P + p) * V;
        const std::int64_t arg = std::max_element(row, row + V) - row;
        double sum = 0;
        for (std::int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - double(row[arg]));
        const double lse = double(row[arg]) + std::log(sum);
        const auto target = host[static_cast<std::size_t>(b * P + p + 1)];
        s.logprob[static_cast<std::size_t>(p + 1)] = double(row[target]) - lse;
        s.top[static_cast<std::size_t>(p + 1)] = static_cast<std::int32_t>(arg);
        s.top_logprob[static_cast<std::size_t>(p + 1)] = double(row[arg]) - lse;
      }
    }
    first = last;
  }
  return out;
}

/// The page's documents: token texts (characters split across tokens shown on their first token), log-probs,
/// the comparison's when given, the model's top prediction in each title, EOS marked special.
inline std::vector<document> make_documents(const std::vector<std::vector<std::int32_t>>& docs,
                                            const std::vector<scored_doc>& scores,
                                            const std::vector<scored_doc>* comparison, const token_text_fn& text,
                                            std::int64_t eos_id) {
  std::vector<document> out;
  for (std::size_t d = 0; d < docs.size(); ++d) {
    std::vector<std::string> raw;
    for (auto id : docs[d]) raw.push_back(text(id));
    document doc;
    doc.name = "document " + std::to_string(d);
    doc.tokens = utf8_cells(raw);
    for (std::size_t i = 0; i < docs[d].size(); ++i) {
      auto& c = doc.tokens[i];
      c.special = docs[d][i] == eos_id;
      const double lp = scores[d].logprob[i];
      if (std::isnan(lp)) continue;
      c.logprob = lp;
      if (comparison) c.comparison = (*comparison)[d].logprob[i];
      const auto top_cells = utf8_cells({text(scores[d].top[i])});
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.3f", scores[d].top_logprob[i]);
      c.note = "| top: '" + visible_text(top_cells[0].text, true) + "' " + buf;
    }
    out.push_back(std::move(doc));
  }
  return out;
}

/// What train_lm (or another caller) tells the page about the model.
struct page_info {
  std::string model_name;                 ///< shown in the header (a run id, a checkpoint path)
  std::int64_t eos_id = data::byte_tokenizer::eos_id;
  std::string title = "Token log-probabilities";
};

/// Scores `docs` with the live `model` and writes the heatmap to `path` atomically (a browser showing the page
/// sees the old one or the new one). For train_lm's periodic refresh: call it every N steps after the update.
inline void write_logprobs_for_model(const gpt2::LMHeadModel& model, const Gpt2Config& mc,
                                     const std::vector<std::vector<std::int32_t>>& docs, const token_text_fn& text,
                                     const std::string& path, std::int64_t step, const page_info& info = {}) {
  const auto scores = score_documents(model, mc, docs, info.eos_id);
  html_options o;
  o.title = info.title;
  o.model_name = info.model_name;
  o.step = step;
  write_logprobs_html(path, make_documents(docs, scores, nullptr, text, info.eos_id), o);
}

/// The first `num_docs` windows of `windows` after permuting them with `data_seed` (none: file order), as
/// upstream's `dataset.shuffle(PRNGKey(data_seed)).slice_dataset(0, num_docs)`.
inline std::vector<std::vector<std::int32_t>> select_documents(data::token_windows windows, std::int64_t num_docs,
                                                               std::optional<std::int64_t> data_seed) {
  if (data_seed) windows.shuffle(haliax::random::make_key(static_cast<std::uint64_t>(*data_seed)));
  const std::int64_t n = std::min(num_docs, windows.size());
  std::vector<std::vector<std::int32_t>> out;
  for (std::int64_t i = 0; i < n; ++i) {
    std::vector<std::int32_t> w(static_cast<std::size_t>(windows.seq_len()));
    windows.window(i, w.data());
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace viz

namespace detail {

/// A model to visualise, loaded from a train_lm checkpoint or a Hugging Face directory.
struct viz_model {
  gpt2::LMHeadModel model;
  Gpt2Config config;
  std::string name;
  std::optional<std::int64_t> step;
  std::optional<TrainLmConfig> train_config;  ///< the checkpoint's config.yaml
};

inline viz_model load_viz_model(const std::string& path, bool is_hf, const std::optional<Gpt2Config>& model_override,
                                const std::string& key, std::ostream& out) {
  viz_model m;
  if (is_hf) {
    auto d = hf::open_gpt2_dir(path, key);
    m.config = hf::merge_hf_config(model_override.value_or(Gpt2Config{}), d.config, path + "/config.json");
    m.model = gpt2::LMHeadModel::init(m.config, d.vocab_size, haliax::random::make_key(0));
    hf::load_gpt2(d, m.model);
    m.name = path;
    return m;
  }
  std::optional<checkpoint::checkpoint_info> found;
  const auto disc = checkpoint::discover(path);
  for (const auto& p : disc.problems) out << "viz_logprobs: skipping " << p << "\n";
  for (const auto& c : disc.checkpoints) {
    try {
      checkpoint::verify_files(c);
      found = c;
      break;
    } catch (const checkpoint::error& e) {
      out << "viz_logprobs: " << e.what() << "; trying an older one\n";
    }
  }
  if (!found)
    throw checkpoint::error(key + ": no complete checkpoint under '" + path +
                            "' (give a train_lm checkpoint or its run directory; for a Hugging Face directory set " +
                            (key == "checkpoint_path" ? "checkpoint_is_hf" : "comparison_is_hf") + ": true)");
  const std::filesystem::path saved = found->path / "config.yaml";
  if (std::filesystem::exists(saved)) m.train_config = config::decode<TrainLmConfig>(YAML::LoadFile(saved.string()));
  if (model_override) {
    m.config = *model_override;
  } else if (m.train_config) {
    const auto* g = m.train_config->model.get_if<Gpt2Config>();
    if (!g) throw config::config_error(saved.string() + ": the model is not a gpt2");
    m.config = *g;
  } else {
    throw config::config_error(key + ": the checkpoint has no config.yaml; give the model section (--model.type gpt2 "
                               "--model.hidden_dim ...)");
  }
  std::int64_t vocab = 0;
  {
    checkpoint::reader r((found->path / "model.h5").string());
    const auto dims = r.dims("embeddings.token_embeddings.weight");
    if (dims.size() != 2) throw checkpoint::error("model.h5: embeddings.token_embeddings.weight is not 2-D");
    vocab = dims[0];
  }
  m.model = gpt2::LMHeadModel::init(m.config, vocab, haliax::random::make_key(0));
  const auto loaded = checkpoint::load_train_state<gpt2::LMHeadModel>(*found, m.model, nullptr, false);
  m.step = loaded.step;
  m.name = found->path.string();
  return m;
}

/// Tokens of the validation documents with the data section's tokenizer; also the token-text function and EOS.
struct viz_tokens {
  std::vector<std::int32_t> ids;
  viz::token_text_fn text;
  std::int64_t eos_id = -1;
};

inline viz_tokens tokenize_validation(const LmDataConfig& d) {
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
inline bool sources_under(const config::source_map& sources, const std::string& prefix) {
  auto it = sources.lower_bound(prefix);
  return it != sources.end() && it->first.compare(0, prefix.size(), prefix) == 0 &&
         (it->first.size() == prefix.size() || it->first[prefix.size()] == '.');
}

/// `given`, with every data key the user did not set (per `sources`) taken from `base`.
inline LmDataConfig merge_data(const LmDataConfig& given, const LmDataConfig& base, const config::source_map& sources) {
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

}  // namespace detail

/// viz_logprobs. `sources` (from parse_command_line) says which keys were given; the rest of `model:` and
/// `data:` come from the checkpoint's config.yaml. Returns the pages written. Throws config::config_error,
/// data::data_error, checkpoint::error, hf::error or viz::viz_error with a message for the user.
inline std::vector<std::string> run_viz_logprobs(const VizLmConfig& cfg, const config::source_map& sources = {},
                                                 std::ostream& out = std::cout) {
  namespace fs = std::filesystem;
  if (cfg.checkpoint_path.empty()) throw config::config_error("checkpoint_path is required");
  if (cfg.num_docs <= 0) throw config::config_error("num_docs must be positive (got " + std::to_string(cfg.num_docs) + ")");
  if (cfg.path.empty()) throw config::config_error("path must name the HTML file to write");

  std::optional<Gpt2Config> model_override;
  if (detail::sources_under(sources, "model")) {
    const auto* g = cfg.model.get_if<Gpt2Config>();
    if (!g) throw config::config_error("model: only type gpt2 is supported");
    model_override = *g;
  }
  auto mdl = detail::load_viz_model(cfg.checkpoint_path, cfg.checkpoint_is_hf, model_override, "checkpoint_path", out);
  out << "viz_logprobs: model " << mdl.name << (mdl.step ? " (step " + std::to_string(*mdl.step) + ")" : "") << ", "
      << haliax::tree::parameter_count(mdl.model) << " parameters\n";

  std::optional<detail::viz_model> cmp;
  if (cfg.comparison_model_path) {
    cmp.emplace(detail::load_viz_model(*cfg.comparison_model_path, cfg.comparison_is_hf, model_override,
                                       "comparison_model_path", out));
    if (cmp->model.vocab_size() != mdl.model.vocab_size())
      throw config::config_error("comparison_model_path: its vocabulary (" + std::to_string(cmp->model.vocab_size()) +
                                 " tokens) differs from the model's (" + std::to_string(mdl.model.vocab_size()) + ")");
  }

  const LmDataConfig data_cfg =
      mdl.train_config ? detail::merge_data(cfg.data, mdl.train_config->data, sources) : cfg.data;
  const auto toks = detail::tokenize_validation(data_cfg);
  std::int64_t seq_len = mdl.config.seq_len;
  if (cmp) seq_len = std::min<std::int64_t>(seq_len, cmp->config.seq_len);
  data::token_windows windows(toks.ids, seq_len);
  if (windows.size() == 0)
    throw data::data_error("the validation data holds " + std::to_string(windows.num_tokens()) +
                           " tokens, fewer than one window of seq_len " + std::to_string(seq_len));
  const auto docs = viz::select_documents(windows, cfg.num_docs, cfg.data_seed);
  if (static_cast<std::int64_t>(docs.size()) < cfg.num_docs)
    out << "viz_logprobs: the validation data has only " << docs.size() << " windows of " << seq_len << " tokens\n";

  const std::int64_t batch = cfg.trainer.per_device_eval_parallelism > 0 ? cfg.trainer.per_device_eval_parallelism : 0;
  const auto scores = viz::score_documents(mdl.model, mdl.config, docs, toks.eos_id, batch);

  std::string path = cfg.path;
  if (!data::ends_with(path, ".html")) path += ".html";
  viz::html_options o;
  o.model_name = mdl.name;
  o.step = mdl.step;
  viz::write_logprobs_html(path, viz::make_documents(docs, scores, nullptr, toks.text, toks.eos_id), o);
  std::vector<std::string> written{path};
  if (cmp) {
    const auto cscores = viz::score_documents(cmp->model, cmp->config, docs, toks.eos_id, batch);
    const std::string diff_path = path.substr(0, path.size() - 5) + "_diff.html";
    o.diff = true;
    o.title = "Token log-probability differences";
    o.comparison_name = cmp->name + (cmp->step ? " (step " + std::to_string(*cmp->step) + ")" : "");
    viz::write_logprobs_html(diff_path, viz::make_documents(docs, scores, &cscores, toks.text, toks.eos_id), o);
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

}  // namespace levanter
