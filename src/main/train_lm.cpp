// levanter/main/train_lm.hpp: the train_lm program's driver, its config checks and its model-independent helpers.
#include <levanter/main/train_lm.hpp>

#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>

#include <levanter/data/jinja.hpp>
#include <levanter/distributed/comm.hpp>

#include <levanter/main/programs.hpp>

namespace levanter {

namespace config {
template TrainLmConfig decode<TrainLmConfig>(const YAML::Node&, const std::string&, const source_map&,
                                             const std::string&);
template YAML::Node encode<TrainLmConfig>(const TrainLmConfig&);
template std::string to_yaml_string<TrainLmConfig>(const TrainLmConfig&);
template std::string help_text<TrainLmConfig>(const std::string&, const TrainLmConfig&);
template command_line<TrainLmConfig> parse_command_line<TrainLmConfig>(int, const char* const*, const std::string&,
                                                                       const std::string&);
}  // namespace config

config::validation_result validate_train_lm(const TrainLmConfig& cfg, const config::source_map& sources) {
  config::validator v{sources, {}};
  validate(v, cfg.data);
  if (cfg.viz.every < 0) v.error("viz.every", "must be >= 0 (0 turns the heatmap off)");
  if (cfg.viz.every > 0 && cfg.viz.num_docs <= 0) v.error("viz.num_docs", "must be positive");
  validate(v, cfg.trainer);
  std::visit([&](const auto& m) { validate(v, m); }, cfg.model.value);
  std::visit([&](const auto& o) { validate(v, o); }, cfg.optimizer.value);
  // Newton-Schulz, Adam-mini's means and the SOAP and Kron preconditioners need each matrix whole on one rank.
  for (const char* t : {"muon", "scion", "mini", "soap", "kron"})
    if (cfg.optimizer.type_name() == t && cfg.trainer.model_axis_size > 1)
      v.error("optimizer.type", std::string(t) + " is not supported with tensor parallelism (trainer.model_axis_size " +
                                    std::to_string(cfg.trainer.model_axis_size) +
                                    "): its update needs each matrix whole on one rank; use model_axis_size: 1 "
                                    "(FSDP and ZeRO-1 work)");
  if (cfg.optimizer.type_name() == "sophia-h" && cfg.trainer.model_axis_size > 1)
    v.error("optimizer.type", "sophia-h is not supported with tensor parallelism (trainer.model_axis_size " +
                                  std::to_string(cfg.trainer.model_axis_size) +
                                  ") yet: its Hessian probes are drawn over whole leaves; use model_axis_size: 1 "
                                  "(FSDP and ZeRO-1 work)");
  // OLMo 2's QK norms run over every head's features at once: a rank holding some heads cannot compute them.
  if (cfg.model.type_name() == "olmo2" && cfg.trainer.model_axis_size > 1)
    v.error("model.type", "olmo2 is not supported with tensor parallelism (trainer.model_axis_size " +
                              std::to_string(cfg.trainer.model_axis_size) +
                              ") yet: its QK norms need every head on one rank; use model_axis_size: 1 (FSDP and "
                              "ZeRO-1 work)");
  // Mixtral's experts are grouped matmuls over the tokens routed to them, not Linears that sum over the model group.
  if (cfg.model.type_name() == "mixtral" && cfg.trainer.model_axis_size > 1)
    v.error("model.type", "mixtral is not supported with tensor parallelism (trainer.model_axis_size " +
                              std::to_string(cfg.trainer.model_axis_size) +
                              ") yet: its experts are not split over the model axis; use model_axis_size: 1 (FSDP "
                              "and ZeRO-1 work)");
  // The optimizer and its schedule for this run's length, built as training would build them, so that a warmup or
  // decay that does not fit trainer.num_train_steps fails here (exit 2; --dry_run says so) and not at step 0.
  if (cfg.trainer.num_train_steps > 0 && v.result.errors.empty()) {
    std::visit(
        [&](const auto& o) {
          try {
            if constexpr (std::is_same_v<std::decay_t<decltype(o)>, AdamConfig>) {
              optim::adamw check(o, cfg.trainer.num_train_steps);
              (void)check;
            } else {
              (void)optim::make_lr_schedule(o, cfg.trainer.num_train_steps);
            }
          } catch (const std::invalid_argument& e) {
            const std::string what = e.what();
            const auto colon = what.find(": ");
            if (what.rfind("optimizer.", 0) == 0 && colon != std::string::npos)
              v.error(what.substr(0, colon), what.substr(colon + 2) + " (with trainer.num_train_steps " +
                                                 std::to_string(cfg.trainer.num_train_steps) + ")");
            else
              v.error("optimizer", what);
          }
        },
        cfg.optimizer.value);
  }
  // Training needs training data: an empty list (or null) would fail only when the first batch is asked for.
  if (v.result.errors.empty()) {
    bool any = false;
    try {
      for (const auto& spec : data::dataset_specs(cfg.data)) any = any || !spec.train_urls.empty();
    } catch (const std::exception&) {
      any = true;  // a malformed mixture is validate(data)'s to report
    }
    if (!any) v.error("data.train_urls", "no training files: give at least one .jsonl/.txt file or pattern");
  }

  if (auto* b = std::get_if<bool>(&cfg.initialize_from_hf); b && *b)
    v.refuse("initialize_from_hf", "initialize_from_hf: true downloads the model's reference checkpoint from the "
             "Hugging Face Hub, which is not reachable here",
             "download it (huggingface-cli download gpt2 --local-dir DIR) and set initialize_from_hf: DIR");
  if (auto* s = std::get_if<std::string>(&cfg.initialize_from_hf))
    config::check_remote(v, "initialize_from_hf", *s, "directory");
  if (cfg.use_hf_model_config && !std::holds_alternative<std::string>(cfg.initialize_from_hf))
    v.error("use_hf_model_config", "takes the model config from initialize_from_hf, which is not set to a directory");
  if (cfg.hf_save_path) check_remote(v, "hf_save_path", *cfg.hf_save_path, "directory");
  if (cfg.hf_save_steps <= 0) v.error("hf_save_steps", "must be positive");
  if (cfg.hf_save_dtype && *cfg.hf_save_dtype != "float32" && *cfg.hf_save_dtype != "bfloat16" &&
      *cfg.hf_save_dtype != "float16" && *cfg.hf_save_dtype != "f32" && *cfg.hf_save_dtype != "bf16" &&
      *cfg.hf_save_dtype != "f16" && *cfg.hf_save_dtype != "fp32" && *cfg.hf_save_dtype != "fp16")
    v.error("hf_save_dtype", "unknown dtype '" + *cfg.hf_save_dtype + "': use float32, bfloat16 or float16");
  if (cfg.hf_upload.set)
    v.refuse("hf_upload", "uploading to the Hugging Face hub is not supported (no network here)", "remove hf_upload",
             cfg.hf_upload.where);
  if (cfg.eval_harness.set)
    v.refuse("eval_harness", "lm-eval-harness evaluation is not supported", "remove eval_harness",
             cfg.eval_harness.where);
  if (cfg.log_entropy) v.refuse("log_entropy", "entropy histograms are not supported yet", "set log_entropy: false");
  if (cfg.initialize_from_checkpoint_path)
    config::check_remote(v, "initialize_from_checkpoint_path", *cfg.initialize_from_checkpoint_path, "directory");
  if (cfg.epoch < 0 || cfg.epoch > (1 << 20))
    v.error("epoch", "must be in [0, 1048576] (0: no end; N: the run stops after N passes over the data), got " +
                         std::to_string(cfg.epoch));
  else if (cfg.epoch > 0 && cfg.data.configs.set)  // as upstream's LMMixtureDatasetConfig
    v.error("epoch", "epochs are not supported for mixture datasets (data.configs); end a mixture with "
                     "data.stop_strategy: first_exhausted or all_exhausted, or set epoch: 0");
  // A weight on logsumexp^2 (upstream's configs use 1e-4): above 1 it outweighs the loss itself.
  if (!(cfg.z_loss_weight >= 0 && cfg.z_loss_weight <= 1))
    v.error("z_loss_weight", "must be between 0 and 1 (upstream uses 1e-4; got " + config::fmt_num(cfg.z_loss_weight) + ")");
  if (cfg.hf_save_dtype && !cfg.hf_save_path) v.note("hf_save_dtype", "ignored (no hf_save_path)");
  return v.result;
}

void dry_run_checks(const TrainLmConfig& cfg) {
  for (const auto& spec : data::dataset_specs(cfg.data)) {
    const std::string of = spec.name.empty() ? "" : " of '" + spec.name + "'";
    for (const auto& [key, urls] : {std::pair{"data.train_urls", &spec.train_urls},
                                    std::pair{"data.validation_urls", &spec.validation_urls}}) {
      try {
        for (const auto& f : data::expand_urls(*urls))
          if (!std::ifstream(f, std::ios::binary))
            throw data::data_error("data file '" + f + "' cannot be opened for reading (" + std::strerror(errno) + ")");
      } catch (const data::data_error& e) {
        throw data::data_error(std::string(key) + of + ": " + e.what());
      }
    }
  }
  const auto tok = data::make_tokenizer(cfg.data);
  for (const auto& spec : data::dataset_specs(cfg.data)) {  // chat data: its template is found and parses
    if (!spec.chat) continue;
    const std::string key = spec.name.empty() ? "data.format" : "data.configs." + spec.name + ".format";
    try {
      data::make_chat_encode_fn(tok, data::chat_template_for(tok, *spec.chat, cfg.data.chat_template),
                                spec.chat->mask_user_turns);
    } catch (const data::jinja::template_error& e) {
      throw data::data_error(key + ": the chat template does not parse: " + e.what());
    } catch (const data::data_error& e) {
      throw data::data_error(key + ": " + e.what());
    }
  }
  if (std::get_if<std::string>(&cfg.initialize_from_hf) && cfg.use_hf_model_config) return;  // sizes from config.json
  const std::int64_t vocab = cfg.data.vocab_size.value_or(tok.vocab_size());
  with_model(cfg.model, [&]<class M>(std::type_identity<M>, const typename M::config_type& mc) {
    check_model_fits(mc.parameter_count(vocab), distributed::world().size(),
                     "model (type " + std::string(M::config_type::type_name) + ")");
  });
}

namespace detail {

viz::token_text_fn token_text_of(const data::tokenizer& tok) {
  if (tok.name() == "byte") return viz::byte_token_text;
  if (tok.name() == "passthrough") return [](std::int32_t id) { return std::to_string(id) + " "; };
  return [&tok](std::int32_t id) {
    auto s = tok.token_text(id);
    return s.empty() ? "<|" + std::to_string(id) + "|>" : s;
  };
}

std::vector<std::vector<std::int32_t>> train_viz_documents(const data::lm_data& data, const TrainVizConfig& v,
                                                           std::int64_t seq_len) {
  if (data.validation_sets().empty())
    throw config::config_error("viz.every is set but there is no validation data to show (data.validation_urls)");
  const auto& w = *data.validation_sets().front().windows;
  const std::int64_t n = w.final_size();
  const std::int64_t k = std::min<std::int64_t>(v.num_docs, n);
  std::optional<data::example_order> order;
  if (v.data_seed)
    order.emplace(data::example_order::full(data::permutation_kind::feistel, static_cast<std::uint64_t>(n),
                                            haliax::random::make_key(static_cast<std::uint64_t>(*v.data_seed))));
  std::vector<std::vector<std::int32_t>> docs;
  for (std::int64_t i = 0; i < k; ++i) {
    std::vector<std::int32_t> doc(static_cast<std::size_t>(seq_len));
    w.window(order ? static_cast<std::int64_t>((*order)(static_cast<std::uint64_t>(i))) : i, doc.data());
    docs.push_back(std::move(doc));
  }
  return docs;
}

lm_example training_batch(const data::lm_data& data, std::int64_t first, std::int64_t count, std::int64_t seq_len,
                          std::int64_t eos, std::int64_t ignore_id) {
  // Waits only if the cache has not reached these windows. Text windows get upstream LmExample.causal's mask and
  // segments; packed supervised ones their own.
  const auto b = data.batch(first, count, eos, ignore_id);
  return lm_example::labelled(haliax::from_host<std::int32_t>(b.tokens, count * Batch, seq_len * Pos), b.keep,
                              b.segments);
}

std::string describe_run(std::string_view model_type, std::int64_t parameters, std::int64_t vocab,
                         const data::lm_data& data, std::int64_t seq_len) {
  return std::string(model_type) + " " + std::to_string(parameters) + " parameters, vocab " + std::to_string(vocab) +
         " (tokenizer " + data.tok().name() + "), sequences of " + std::to_string(seq_len) + " tokens" +
         (data.is_mixture() ? ", a mixture of " + std::to_string(data.specs().size()) + " datasets" : "") + ", " +
         std::to_string(data.validation_sets().size()) + " validation set(s)";
}

void write_run_summary(run_context& run, train_result& res, std::optional<double> eval_loss, int ranks,
                       const json& extra) {
  json summary = {{"run_id", run.id()},
                  {"steps", res.steps},
                  {"parameters", res.parameters},
                  {"first_loss", res.first_loss},
                  {"final_loss", res.final_loss},
                  {"total_tokens", res.tokens},
                  {"seconds", res.seconds},
                  {"tokens_per_second", res.seconds > 0 ? double(res.tokens) / res.seconds : 0.0},
                  {"openblas_core", openblas_core()},
                  {"threads", haliax::num_threads()},
                  {"ranks", ranks}};
  for (const auto& el : extra.items()) summary[el.key()] = el.value();
  if (eval_loss) summary["eval_loss"] = *eval_loss;
  if (res.start_step > 0) summary["start_step"] = res.start_step;
  if (res.resumed_from) summary["resumed_from"] = *res.resumed_from;
  if (res.last_checkpoint) summary["checkpoint"] = *res.last_checkpoint;
  run.tracker().log_summary(summary);
  run.tracker().finish();
  if (run.writer()) io::write_file_atomic(run.dir() / "summary.json", summary.dump(2) + "\n");
  run.logger()("done, " + std::to_string(res.steps) + " steps in " + human_duration(res.seconds) + ", loss " +
               std::to_string(res.first_loss) + " -> " + std::to_string(res.final_loss) + "; summary in " +
               (run.dir() / "summary.json").string());
  res.eval_loss = eval_loss;
}

}  // namespace detail

int train_lm_main(int argc, char** argv, const char* default_yaml, const char* default_name) {
  return run_program("train_lm", [&] {
    // Under mpirun: MPI, and each rank's share of the node's cores (docs/distributed.md).
    distributed::init_world(&argc, &argv);
    struct finalize {
      ~finalize() {
        if (std::uncaught_exceptions() == 0) distributed::finalize_world();
      }
    } at_end;
    auto parsed = config::parse_command_line<TrainLmConfig>(argc, argv, default_yaml, default_name);
    if (parsed.help) {
      if (distributed::world().rank() == 0) std::cout << config::help_text<TrainLmConfig>("train_lm");
      return 0;
    }
    const auto checked = validate_train_lm(parsed.config, parsed.sources);
    const bool r0 = distributed::world().rank() == 0;  // the ranks see the same config: one of them speaks
    if (r0)
      for (const auto& n : checked.notes) std::cerr << "train_lm: note: " << n << "\n";
    if (!checked.errors.empty()) {
      if (r0) {
        std::cerr << "train_lm: the config cannot be used as it is (" << parsed.config_path << "):\n";
        for (const auto& e : checked.errors) std::cerr << "  - " << e << "\n";
      }
      return 2;
    }
    if (parsed.dry_run) {
      // Every check that needs no training data: the data files exist, the tokenizer loads, the model fits.
      dry_run_checks(parsed.config);
      if (r0) {
        std::cout << parsed.resolved_yaml;
        std::cerr << "train_lm: config resolved and valid (--dry_run: not training)\n";
      }
      return 0;
    }
    with_model(parsed.config.model, [&]<class M>(std::type_identity<M>, const typename M::config_type& mc) {
      run_train_lm<M>(parsed.config, mc, parsed.resolved_yaml, std::cout);
    });
    return 0;
  });
}

}  // namespace levanter
