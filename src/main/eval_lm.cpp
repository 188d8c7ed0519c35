// levanter/main/eval_lm.hpp: the eval_lm program's driver: where the model and the data come from, the evaluation,
// the entropy / top-2 gap / parameter analyses, and the report.
#include <levanter/main/eval_lm.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <tuple>

#include <levanter/data/cache.hpp>
#include <levanter/data/lm_data.hpp>
#include <levanter/data/sources.hpp>
#include <levanter/eval.hpp>
#include <levanter/io/atomic_file.hpp>
#include <levanter/main/programs.hpp>
#include <levanter/run_metadata.hpp>
#include <levanter/trainer/run.hpp>

namespace levanter {

namespace config {
template EvalLmConfig decode<EvalLmConfig>(const YAML::Node&, const std::string&, const source_map&,
                                           const std::string&);
template std::string help_text<EvalLmConfig>(const std::string&, const EvalLmConfig&);
template command_line<EvalLmConfig> parse_command_line<EvalLmConfig>(int, const char* const*, const std::string&,
                                                                     const std::string&);
}  // namespace config

namespace detail {

bool given_under(const config::source_map& sources, const std::string& prefix) {
  return config::validator{sources, {}}.set_under(prefix);
}

checkpoint::error checkpoint_mismatch(const eval_job& job, const checkpoint::error& e) {
  if (!given_under(job.sources, "model")) return e;
  return checkpoint::error(std::string(e.what()) + " (the model section given on the command line or in the config "
                           "does not describe the checkpoint's model; leave it out to use the checkpoint's)");
}

std::function<double(const lm_example&)> chunked_loss(std::function<double(const lm_example&)> loss,
                                                      std::int64_t max_rows) {
  return [loss = std::move(loss), max_rows](const lm_example& ex) {
    const std::int64_t rows = ex.tokens.size(Batch), L = ex.tokens.size(Pos);
    if (rows <= max_rows) return loss(ex);
    const auto host = ex.tokens.to_host();
    const auto mask = ex.loss_mask.to_host();
    const auto segments = ex.segment_ids.to_host();
    double nll = 0, kept = 0;
    for (std::int64_t first = 0; first < rows; first += max_rows) {
      const std::int64_t n = std::min(max_rows, rows - first);
      const auto from = static_cast<std::size_t>(first * L), to = static_cast<std::size_t>((first + n) * L);
      const std::vector<std::int32_t> part(host.begin() + from, host.begin() + to);
      const std::vector<std::uint8_t> keep(mask.begin() + from, mask.begin() + to);
      const std::vector<std::int32_t> seg(segments.begin() + from, segments.begin() + to);
      const double k = static_cast<double>(std::count(keep.begin(), keep.end(), std::uint8_t{1}));  // trained positions
      if (k == 0) continue;
      nll += k * loss(lm_example::labelled(haliax::from_host<std::int32_t>(part, n * Batch, L * Pos), keep, seg));
      kept += k;
    }
    return kept > 0 ? nll / kept : std::nan("");
  };
}

namespace {

/// Floats of logits one forward pass may hold (1 GiB): larger evaluation batches are evaluated in parts.
constexpr std::int64_t max_logits_per_pass = std::int64_t{1} << 28;

/// `given`, with every `data.` key the user did not set taken from `base` (the checkpoint's).
LmDataConfig merge_data(const LmDataConfig& given, const LmDataConfig& base, const config::source_map& sources) {
  LmDataConfig out = given;
  std::apply(
      [&](const auto&... f) {
        ((!given_under(sources, "data." + std::string(f.name)) ? void(out.*(f.member) = base.*(f.member)) : void()),
         ...);
      },
      config::schema<LmDataConfig>::fields);
  return out;
}

/// `given`, with the evaluation batch keys the user did not set taken from `base`: the batches train_lm evaluated
/// in, so the loss is the one it reported.
TrainerConfig merge_trainer(const TrainerConfig& given, const TrainerConfig& base, const config::source_map& sources) {
  TrainerConfig out = given;
  auto take = [&](const char* key, auto member) {
    if (!given_under(sources, std::string("trainer.") + key)) out.*member = base.*member;
  };
  take("train_batch_size", &TrainerConfig::train_batch_size);
  take("per_device_parallelism", &TrainerConfig::per_device_parallelism);
  take("per_device_eval_parallelism", &TrainerConfig::per_device_eval_parallelism);
  take("max_eval_batches", &TrainerConfig::max_eval_batches);
  take("mp", &TrainerConfig::mp);
  return out;
}

/// The sets to evaluate: each dataset's validation split (tagged with its name and tags, as train_lm's
/// evaluation tags them), or with eval_on_train its training split (tagged with its name, as upstream). Only the
/// caches of that split are opened (and built, in the background, when missing).
struct eval_data {
  data::tokenizer tok;
  std::vector<data::validation_set> sets;
};

eval_data open_eval_sets(const LmDataConfig& d, std::int64_t seq_len, bool train,
                         const std::function<void(const std::string&)>& log) {
  eval_data out{data::make_tokenizer(d), {}};
  // Each dataset's split as train_lm reads it (text windows, packed text, packed supervised or chat rows), its
  // caches reused as they are.
  const char* split = train ? "train" : "validation";
  for (const auto& s : data::dataset_specs(d)) {
    const auto& urls = train ? s.train_urls : s.validation_urls;
    if (urls.empty()) continue;
    std::vector<std::string> tags;
    if (!s.name.empty()) tags.push_back(s.name);
    if (!train) tags.insert(tags.end(), s.tags.begin(), s.tags.end());
    out.sets.push_back({s.name, tags, data::open_split(d, out.tok, s, urls, split, seq_len, log)});
  }
  return out;
}

/// Per-token predictive entropy (nats) and gap between the two largest logits, over the first `windows` windows
/// of `w`, at most `max_tokens` tokens (upstream compute_entropy_histogram's default cap), every position of a
/// window included as upstream flattens them.
struct token_stats {
  std::vector<float> entropy, top2_gap;
};

token_stats analyse_tokens(const data::cache_windows& w, std::int64_t windows, std::int64_t batch,
                           const eval_model& m, std::int64_t eos, std::int64_t ignore, bool entropy, bool gap) {
  constexpr std::int64_t max_tokens = 1024 * 1024;
  const std::int64_t L = w.seq_len(), V = m.vocab;
  const std::int64_t rows_per_pass =
      std::clamp<std::int64_t>(max_logits_per_pass / std::max<std::int64_t>(1, L * V), 1, batch);
  token_stats out;
  std::vector<std::int32_t> host;
  std::int64_t tokens = 0;
  for (std::int64_t first = 0; first < windows && tokens < max_tokens; first += rows_per_pass) {
    const std::int64_t rows = std::min(rows_per_pass, windows - first);
    host.assign(static_cast<std::size_t>(rows * L), 0);
    for (std::int64_t r = 0; r < rows; ++r) w.window(first + r, host.data() + r * L);
    const auto ex = lm_example::causal(haliax::from_host<std::int32_t>(host, rows * Batch, L * Pos), eos, ignore);
    const std::vector<float> logits = m.logits(ex.tokens, ex.segment_ids);
    for (std::int64_t t = 0; t < rows * L; ++t) {
      const float* l = logits.data() + t * V;
      if (entropy) {
        const double mx = *std::max_element(l, l + V);
        double z = 0;
        for (std::int64_t v = 0; v < V; ++v) z += std::exp(double(l[v]) - mx);
        const double log_z = mx + std::log(z);
        double expected = 0;  // Σ p·logit
        for (std::int64_t v = 0; v < V; ++v) expected += std::exp(double(l[v]) - log_z) * double(l[v]);
        out.entropy.push_back(static_cast<float>(log_z - expected));
      }
      if (gap) {
        float top1 = -INFINITY, top2 = -INFINITY;
        for (std::int64_t v = 0; v < V; ++v) {
          if (l[v] > top1) {
            top2 = top1;
            top1 = l[v];
          } else if (l[v] > top2) {
            top2 = l[v];
          }
        }
        out.top2_gap.push_back(V > 1 ? top1 - top2 : 0.0f);
      }
    }
    tokens += rows * L;
  }
  return out;
}

/// A tracker that passes everything on and keeps the summaries of the histograms it sees, for the results file.
class recording_tracker final : public tracker {
 public:
  explicit recording_tracker(tracker& inner) : inner_(inner) {}
  void log_hyperparameters(const json& h) override { inner_.log_hyperparameters(h); }
  void log(const json& m, std::int64_t s) override { inner_.log(m, s); }
  void log_summary(const json& m) override { inner_.log_summary(m); }
  void log_artifact(const std::string& p, const std::string& n, const std::string& t) override {
    inner_.log_artifact(p, n, t);
  }
  void finish() override { inner_.finish(); }
  void log_histogram(const std::string& tag, std::span<const float> v, std::int64_t s) override {
    inner_.log_histogram(tag, v, s);
    histograms[tag] = histogram_summary(v);
  }
  json histograms = json::object();

 private:
  tracker& inner_;
};

/// Python's repr of a float, as upstream's print shows the loss.
std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

[[noreturn]] void throw_errors(const std::string& what, const config::validation_result& r) {
  std::string msg = what;
  for (const auto& e : r.errors) msg += "\n  - " + e;
  throw config::config_error(msg);
}

}  // namespace

eval_lm_result evaluate_model(const eval_job& job, const eval_model& m, std::ostream& out) {
  const EvalLmConfig& cfg = *job.cfg;
  const TrainerConfig& t = job.trainer;
  run_context run(cfg.trainer, job.resolved_yaml, out, "eval_lm");
  auto log = run.logger();
  // trainer.mp as train_lm applies it: bfloat16 products where this machine runs them.
  haliax::matmul_precision_scope precision(matmul_precision_of(t));
  log("model " + m.name + (m.step ? " (step " + std::to_string(*m.step) + ")" : "") + ": " + m.type + ", " +
      std::to_string(m.parameters) + " parameters, vocab " + std::to_string(m.vocab) + ", sequences of " +
      std::to_string(m.seq_len) + " tokens");

  const auto d = open_eval_sets(job.data, m.seq_len, cfg.eval_on_train, log);
  if (d.tok.vocab_size() > m.vocab)
    throw config::config_error("data.tokenizer: '" + d.tok.name() + "' has " + std::to_string(d.tok.vocab_size()) +
                               " tokens, more than the model's vocabulary of " + std::to_string(m.vocab) +
                               " (is it the tokenizer the model was trained with?)");
  if (d.sets.empty())
    throw config::config_error(cfg.eval_on_train
                                   ? "eval_on_train: the data section has no training files (data.train_urls is empty)"
                                   : "data.validation_urls is empty: there is nothing to evaluate on (give validation "
                                     "files, e.g. --data.validation_urls '[\"valid.jsonl\"]', or set eval_on_train)");

  {
    json hparams = config_to_json(job.resolved_yaml);
    hparams["run_metadata"] = run_metadata();
    run.tracker().log_hyperparameters(hparams);
  }

  // The evaluation train_lm runs (its batch size rule included), at step 0 as upstream logs it.
  const std::int64_t batch = t.per_device_eval_parallelism > 0 ? t.per_device_eval_parallelism
                             : t.per_device_parallelism > 0    ? t.per_device_parallelism
                                                               : t.train_batch_size.at(0);
  const std::int64_t eos = d.tok.eos_id() ? *d.tok.eos_id() : -1;
  const std::int64_t ignore = job.data.ignore_token_id;
  const eval::options eo{batch, t.max_eval_batches.value_or(0), eos, ignore};
  log("evaluating on " + std::to_string(d.sets.size()) + (cfg.eval_on_train ? " training" : " validation") +
      " set(s) in batches of " + std::to_string(batch) +
      (eo.max_batches > 0 ? ", at most " + std::to_string(eo.max_batches) + " batches each" : ""));
  const std::int64_t max_rows =
      std::max<std::int64_t>(1, max_logits_per_pass / std::max<std::int64_t>(1, m.seq_len * m.vocab));
  if (batch > max_rows)
    log("each batch is evaluated " + std::to_string(max_rows) + " windows at a time (1 GiB of logits at most)");
  const auto r = eval::evaluate_tagged(d.sets, eo, d.tok, chunked_loss(m.loss, max_rows));
  if (!r.loss) {
    std::string sizes;
    for (const auto& s : d.sets)
      sizes += (sizes.empty() ? "" : ", ") + (s.name.empty() ? std::string("the") : "'" + s.name + "':") + " " +
               std::to_string(s.windows->cache().total_tokens()) + " tokens";
    throw data::data_error(std::string(cfg.eval_on_train ? "the training data" : "the validation data") +
                           " holds fewer tokens than one window of seq_len " + std::to_string(m.seq_len) + " (" +
                           sizes + ")");
  }
  run.tracker().log(r.metrics, 0);
  run.say("eval_lm: " + r.line);
  run.say("Loss: " + float_repr(*r.loss));  // as upstream prints it

  json metrics = r.metrics;
  recording_tracker rec(run.tracker());
  json analysis = json::object();
  if (cfg.log_entropy || cfg.log_top2_gap) {
    log(std::string("computing ") + (cfg.log_entropy ? "entropy" : "") +
        (cfg.log_entropy && cfg.log_top2_gap ? " and " : "") + (cfg.log_top2_gap ? "top-2 gaps" : "") + "...");
    for (const auto& s : d.sets) {
      const std::int64_t n = s.windows->final_size();
      const std::int64_t windows = eo.max_batches > 0 ? std::min(n, eo.max_batches * batch) : n;
      const auto st = analyse_tokens(*s.windows, windows, batch, m, eos, ignore, cfg.log_entropy, cfg.log_top2_gap);
      auto add = [&](const std::string& what, const std::vector<float>& v) {
        if (v.empty()) return;
        const std::string tag = "analysis/" + s.name + "/" + what;  // upstream's names ("analysis//entropy" unnamed)
        rec.log_histogram(tag, v, 0);
        double sum = 0;
        for (float x : v) sum += x;
        analysis[tag + "_mean"] = sum / double(v.size());
      };
      add("entropy", st.entropy);
      add("top2_gap", st.top2_gap);
    }
  }
  if (cfg.log_param_stats) {
    log("computing parameter statistics...");
    m.param_stats(analysis, rec);
  }
  if (!analysis.empty() || !rec.histograms.empty()) run.tracker().log(analysis, 0);
  metrics.update(analysis);
  metrics.update(rec.histograms);
  run.tracker().finish();

  eval_lm_result res;
  res.loss = r.loss;
  res.metrics = metrics;
  res.run_dir = run.dir().string();
  res.output_path = cfg.output_path ? *cfg.output_path : (run.dir() / "eval_results.json").string();
  json model = {{"source", m.name},
                {"kind", job.hf ? "hf_checkpoint" : "checkpoint"},
                {"type", m.type},
                {"parameters", m.parameters},
                {"vocab", m.vocab},
                {"seq_len", m.seq_len}};
  model["step"] = m.step ? json(*m.step) : json(nullptr);
  json sets = json::array();
  for (const auto& s : d.sets)
    sets.push_back({{"name", s.name},
                    {"tags", s.tags},
                    {"windows", s.windows->final_size()},
                    {"windows_evaluated", eo.max_batches > 0 ? std::min(s.windows->final_size(), eo.max_batches * batch)
                                                             : s.windows->final_size()}});
  const json report = {{"program", "eval_lm"},
                       {"run_id", run.id()},
                       {"model", model},
                       {"eval_on_train", cfg.eval_on_train},
                       {"tokenizer", d.tok.name()},
                       {"batch_size", batch},
                       {"max_eval_batches", eo.max_batches > 0 ? json(eo.max_batches) : json(nullptr)},
                       {"sets", sets},
                       {"loss", *r.loss},
                       {"metrics", metrics}};
  io::write_file_atomic(res.output_path, report.dump(2) + "\n");
  log("results in " + res.output_path);
  return res;
}

}  // namespace detail

config::validation_result validate_eval_lm(const EvalLmConfig& cfg, const config::source_map& sources) {
  config::validator v{sources, {}};
  if (!cfg.checkpoint_path && !cfg.hf_checkpoint)
    v.error("checkpoint_path", "no model given: set checkpoint_path (a train_lm checkpoint or its run directory) or "
                               "hf_checkpoint (a local Hugging Face directory)");
  if (cfg.checkpoint_path && cfg.hf_checkpoint)
    v.error("hf_checkpoint", "checkpoint_path and hf_checkpoint are both set; give only one of them");
  if (cfg.checkpoint_path) {
    if (cfg.checkpoint_path->empty()) v.error("checkpoint_path", "is empty");
    config::check_remote(v, "checkpoint_path", *cfg.checkpoint_path, "directory");
  }
  if (cfg.hf_checkpoint) {
    if (cfg.hf_checkpoint->empty()) v.error("hf_checkpoint", "is empty");
    config::check_remote(v, "hf_checkpoint", *cfg.hf_checkpoint, "directory");
  }
  if (cfg.output_path) {
    if (cfg.output_path->empty()) v.error("output_path", "is empty (leave it out for <run dir>/eval_results.json)");
    config::check_remote(v, "output_path", *cfg.output_path, "file");
  }
  validate(v, cfg.trainer);
  return v.result;
}

eval_lm_result run_eval_lm(const EvalLmConfig& cfg, const config::source_map& sources,
                           const std::string& resolved_yaml, std::ostream& out) {
  if (const auto checked = validate_eval_lm(cfg, sources); !checked.ok())
    detail::throw_errors("the config cannot be used as it is:", checked);

  detail::eval_job job;
  job.cfg = &cfg;
  job.resolved_yaml = resolved_yaml;
  job.sources = sources;
  job.model = cfg.model;
  job.data = cfg.data;
  job.trainer = cfg.trainer;
  const bool model_given = detail::given_under(sources, "model");
  if (cfg.checkpoint_path) {
    job.checkpoint = find_checkpoint(*cfg.checkpoint_path, "checkpoint_path",
                                     [&](const std::string& m) { out << "eval_lm: " << m << "\n"; });
    job.train_config = checkpoint_train_config(*job.checkpoint);
    if (job.train_config) {
      if (!model_given) job.model = job.train_config->model;
      job.data = detail::merge_data(cfg.data, job.train_config->data, sources);
      job.trainer = detail::merge_trainer(cfg.trainer, job.train_config->trainer, sources);
    } else if (!model_given) {
      throw config::config_error("checkpoint_path: the checkpoint '" + job.checkpoint->path.string() +
                                 "' has no config.yaml; give the model section (--model.type gpt2 "
                                 "--model.hidden_dim ...) and the data section");
    }
  } else {
    job.hf.emplace(hf::open_dir(*cfg.hf_checkpoint, "hf_checkpoint"));
    // use_hf_model_config: the model type (and architecture) is the directory's.
    const ModelChoice hf_choice = model_choice_for_hf(*job.hf);
    if (model_given && cfg.model.type_name() != hf_choice.type_name())
      throw config::config_error("model.type: '" + std::string(cfg.model.type_name()) + "' given, but '" +
                                 *cfg.hf_checkpoint + "/config.json' holds a '" + job.hf->model_type +
                                 "' model (leave the model section out to use the directory's)");
    if (!model_given) job.model = hf_choice;
    if (!detail::given_under(sources, "data.tokenizer")) {
      if (!std::filesystem::exists(std::filesystem::path(*cfg.hf_checkpoint) / "tokenizer.json"))
        throw config::config_error("data.tokenizer: not given, and '" + *cfg.hf_checkpoint +
                                   "' has no tokenizer.json; give the tokenizer the model was trained with "
                                   "(--data.tokenizer PATH, byte or passthrough)");
      job.data.tokenizer = *cfg.hf_checkpoint;
    }
  }
  // The data and model sections as they will be used (the checkpoint's defaults merged in).
  config::validator v{sources, {}};
  validate(v, job.data);
  std::visit([&](const auto& m) { validate(v, m); }, job.model.value);
  if (!v.result.ok()) detail::throw_errors("the data or model section cannot be used as it is:", v.result);
  for (const auto& n : v.result.notes) out << "eval_lm: note: " << n << "\n";

  return with_model(job.model, [&]<class M>(std::type_identity<M>, const auto&) {
    return run_eval_lm_with<M>(job, out);
  });
}

int eval_lm_main(int argc, char** argv) {
  return run_program("eval_lm", [&] {
    auto parsed = config::parse_command_line<EvalLmConfig>(argc, argv, "{}", "<defaults>");
    if (parsed.help) {
      const EvalLmConfig defaults;
      std::cout << config::help_text<EvalLmConfig>("eval_lm", defaults);
      return 0;
    }
    const auto checked = validate_eval_lm(parsed.config, parsed.sources);
    for (const auto& n : checked.notes) std::cerr << "eval_lm: note: " << n << "\n";
    if (!checked.ok()) {
      std::cerr << "eval_lm: the config cannot be used as it is"
                << (parsed.config_path.empty() ? "" : " (" + parsed.config_path + ")") << ":\n";
      for (const auto& e : checked.errors) std::cerr << "  - " << e << "\n";
      return 2;
    }
    if (parsed.dry_run) {
      std::cout << parsed.resolved_yaml;
      std::cerr << "eval_lm: config resolved (--dry_run: not evaluating)\n";
      return 0;
    }
    run_eval_lm(parsed.config, parsed.sources, parsed.resolved_yaml, std::cout);
    return 0;
  });
}

}  // namespace levanter
