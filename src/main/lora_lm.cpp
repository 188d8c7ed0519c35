// levanter/main/lora_lm.hpp: the lora_lm program: its config, and the part of a run that does not depend on the
// model (the Trainer over lora::params, compiled once here).
#include <levanter/main/lora_lm.hpp>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include <levanter/data/lm_data.hpp>
#include <levanter/distributed/comm.hpp>
#include <levanter/eval.hpp>
#include <levanter/io/atomic_file.hpp>
#include <levanter/main/programs.hpp>
#include <levanter/main/train_lm.hpp>
#include <levanter/run_metadata.hpp>
#include <levanter/trainer/run.hpp>

namespace levanter {

namespace config {
template LoraLmConfig decode<LoraLmConfig>(const YAML::Node&, const std::string&, const source_map&,
                                           const std::string&);
template std::string to_yaml_string<LoraLmConfig>(const LoraLmConfig&);
template std::string help_text<LoraLmConfig>(const std::string&, const LoraLmConfig&);
template command_line<LoraLmConfig> parse_command_line<LoraLmConfig>(int, const char* const*, const std::string&,
                                                                     const std::string&);
}  // namespace config

lora_lm_plan plan_lora_lm(const LoraLmConfig& cfg, const config::source_map& sources) {
  config::validator v{sources, {}};
  TrainLmConfig t;
  t.data = cfg.data;
  t.trainer = cfg.trainer;
  t.optimizer = cfg.optimizer;
  validate(v, cfg.lora);
  // upstream: train_batch_size -1 is per_device_parallelism x the devices (here: the ranks), without accumulation
  if (t.trainer.train_batch_size.is_constant() && t.trainer.train_batch_size.at(0) == -1 &&
      t.trainer.per_device_parallelism > 0) {
    t.trainer.train_batch_size = t.trainer.per_device_parallelism * distributed::world().size();
    v.note("trainer.train_batch_size", "-1: per_device_parallelism x " + std::to_string(distributed::world().size()) +
                                           " ranks = " + std::to_string(t.trainer.train_batch_size.at(0)));
  }
  config::check_int(v, "max_train_length", cfg.max_train_length, 2, config::bounds::max_seq_len);
  config::check_int(v, "hf_save_steps", cfg.hf_save_steps, 1, std::int64_t{1} << 40, "steps between exports");
  if (cfg.peft_hf_upload.set)
    v.refuse("peft_hf_upload", "uploading to the Hugging Face Hub is not supported (no network here)",
             "remove it; peft_save_path writes the adapters to a local directory", cfg.peft_hf_upload.where);
  if (cfg.merged_hf_upload.set)
    v.refuse("merged_hf_upload", "uploading to the Hugging Face Hub is not supported (no network here)",
             "remove it; merged_hf_save_path writes the merged model to a local directory", cfg.merged_hf_upload.where);
  if (cfg.trust_remote_code)
    v.note("trust_remote_code", "no effect: the model is read by the built-in model its config.json names");
  if (cfg.trainer.model_axis_size > 1)
    v.refuse("trainer.model_axis_size", "tensor parallelism under LoRA is not supported",
             "use data parallelism or FSDP (trainer.fsdp_axis): the adapters and their optimizer state shard over the "
             "ranks, the frozen model is whole on each");
  if (!cfg.initialize_from_hf) {
    v.error("initialize_from_hf", "required: the local Hugging Face directory of the model to adapt (as upstream)");
  } else if (config::url_scheme(*cfg.initialize_from_hf).size() > 0 ||
             !std::filesystem::is_directory(*cfg.initialize_from_hf)) {
    v.error("initialize_from_hf", "'" + *cfg.initialize_from_hf +
                                      "' is not a local directory (the Hugging Face Hub is not reachable here: "
                                      "download the model and give its directory)");
  } else {
    try {
      t.model = model_choice_for_hf(hf::open_dir(*cfg.initialize_from_hf, "initialize_from_hf"));
      t.initialize_from_hf = *cfg.initialize_from_hf;
      t.use_hf_model_config = true;
      t.hf_seq_len = cfg.max_train_length;
    } catch (const hf::error& e) {
      v.error("initialize_from_hf", e.what());
    }
  }
  if (cfg.trainer.initialize_from)
    v.error("trainer.initialize_from", "lora_lm starts from initialize_from_hf; to go on from an earlier lora_lm run, "
                                       "use trainer.load_checkpoint_path");
  // What train_lm checks of the rest: trainer, optimizer, data files, the model's sizes.
  const auto checked = validate_train_lm(t, v.sources);
  for (const auto& e : checked.errors) v.result.errors.push_back(e);
  for (const auto& n : checked.notes) v.result.notes.push_back(n);
  return {cfg, std::move(t), std::move(v.result)};
}

namespace detail {

namespace {

// The trainer section as it applies to the adapters. Its axis mappings name the model's axes (upstream's adapters
// carry the axes of the Linear they adapt); ours are flattened (lora_in, lora_out), and FSDP splits the flattened
// parameters into ranges whatever axis is named. So: a mapping of a model axis to data shards the adapters and
// their optimizer state; compute mappings other than the batch's have no adapter axis to act on.
TrainerConfig adapters_trainer_config(const TrainerConfig& t, const std::set<std::string>& model_axes) {
  auto check = [&](const std::string& key, const std::string& a) {
    if (!model_axes.count(a)) {
      std::string have;
      for (const auto& m : model_axes) have += (have.empty() ? "" : ", ") + m;
      throw config::config_error("trainer." + key + ": '" + a + "' is not an axis of the model's parameters (they "
                                 "have: " + have + ")");
    }
  };
  TrainerConfig out = t;
  bool shard = false;
  for (const auto& a : t.fsdp_axis.items) {
    check("fsdp_axis", a);
    shard = true;
  }
  for (const auto& [axis, to] : t.parameter_axis_resources) {
    check("parameter_axis_resources", axis);
    for (const auto& m : to.items) shard = shard || m == "data";
  }
  out.fsdp_axis.items.clear();
  if (shard) out.fsdp_axis.items.push_back(std::string(lora::LoraIn.name));
  out.parameter_axis_resources.clear();
  out.tensor_parallel_axes.reset();
  std::map<std::string, config::StringOrList> compute;
  for (const auto& [axis, to] : t.axis_resources)
    if (axis == t.batch_axis) compute.emplace(axis, to);
    else check("axis_resources", axis);
  out.axis_resources = std::move(compute);
  return out;
}

}  // namespace

train_result train_lora(const lora_lm_plan& plan, const std::string& resolved_yaml, std::ostream& out,
                        lora_model_part& part) {
  namespace fs = std::filesystem;
  const auto& cfg = plan.lora_lm;
  const auto& t = plan.train.trainer;
  run_context run(t, resolved_yaml, out, "lora_lm");
  auto log = run.logger();
  // Keys as upstream lora_lm: data, loader, model, lora, training.
  const auto keys = haliax::random::split(haliax::random::make_key(static_cast<std::uint64_t>(t.seed)), 5);
  const std::int64_t seq_len = cfg.max_train_length;

  data::lm_data::options dopt;
  dopt.seq_len = seq_len;
  dopt.batch_size = t.train_batch_size.at(0);
  dopt.data_key = keys[0];
  dopt.log = log;
  dopt.epochs = plan.train.epoch;
  data::lm_data data(plan.train.data, dopt);
  const data::tokenizer& tok = data.tok();
  if (part.vocab < tok.vocab_size())
    throw config::config_error("initialize_from_hf: the model's vocabulary (" + std::to_string(part.vocab) +
                               " tokens) is smaller than the tokenizer's (" + std::to_string(tok.vocab_size()) + ", " +
                               tok.name() + ")");
  const std::int64_t eos = tok.eos_id() ? *tok.eos_id() : -1;

  Trainer<lora::params> trainer(adapters_trainer_config(t, part.model_axes), run, part.loss, part.options);
  auto fresh = lora::init(part.spec, keys[3]);
  auto opt = trainer.make_optimizer(plan.train.optimizer, fresh);
  auto state = trainer.initial_state(std::move(fresh), std::move(opt), keys[4]);

  const std::int64_t trainable = lora::parameter_count(part.spec), all = part.base_parameters + trainable;
  const json metadata = run_metadata();
  if (run.writer()) io::write_file_atomic(run.dir() / "run_metadata.json", metadata.dump(2) + "\n");
  json hparams = config_to_json(resolved_yaml);
  hparams["run_metadata"] = metadata;
  run.tracker().log_hyperparameters(hparams);
  run.tracker().log_summary({{"parameter_count", all},
                             {"trainable_parameter_count", trainable},
                             {"fraction_trainable", double(trainable) / double(all)}});
  log("run " + run.id() + " -> " + run.dir().string());
  auto short_number = [](double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%.4g", x);
    return std::string(b);
  };
  log("model " + part.model_type + " from " + *cfg.initialize_from_hf + ": " + std::to_string(part.base_parameters) +
      " parameters, frozen; LoRA r=" + std::to_string(part.spec.r) + " alpha/r=" + short_number(part.spec.scale) +
      " on " + std::to_string(part.spec.targets.size()) + " Linear modules: " + std::to_string(trainable) +
      " trainable parameters (" + short_number(100.0 * double(trainable) / double(all)) + "% of " +
      std::to_string(all) + ")");
  {
    std::string names;
    for (std::size_t i = 0; i < part.spec.targets.size(); ++i)
      names += (i ? ", " : "") + std::to_string(i) + "=" + part.spec.targets[i].module;
    log("adapters (checkpoint name adapters.N): " + names);
  }
  if (trainer.comm().size() > 1) {
    log(trainer.plan().describe() + " (" + trainer.comm().backend() + ")");
    for (const auto& n : trainer.plan().notes) log("note: " + n);
  }
  if (!run.id_given()) log("to resume this run after an interruption, run it again with --trainer.id " + run.id());
  if (part.dropout_applied) {  // after the first step: which adapters the dropout reaches
    auto reported = std::make_shared<bool>(false);
    trainer.add_hook(1, [&, reported](const step_info<lora::params>&) {
      if (*reported) return;
      *reported = true;
      std::string merged_only;
      std::size_t reached = 0;
      for (std::size_t i = 0; i < part.spec.targets.size() && i < part.dropout_applied->size(); ++i) {
        if ((*part.dropout_applied)[i] > 0) ++reached;
        else merged_only += (merged_only.empty() ? "" : ", ") + part.spec.targets[i].module;
      }
      log("lora.dropout " + short_number(cfg.lora.dropout) + " acts on " + std::to_string(reached) + " of " +
          std::to_string(part.spec.targets.size()) + " adapters" +
          (merged_only.empty() ? std::string()
                               : "; not on " + merged_only + " (read as a matrix, not applied as a Linear: its "
                                 "adapter acts through the merged weight, without dropout)"));
    }, false);
  }

  std::optional<double> eval_loss;
  if (!data.validation_sets().empty()) {
    const std::int64_t eval_batch = t.per_device_eval_parallelism > 0 ? t.per_device_eval_parallelism
                                    : t.per_device_parallelism > 0    ? t.per_device_parallelism
                                                                      : t.train_batch_size.at(0);
    const eval::options eo{eval_batch, t.max_eval_batches.value_or(0), eos, plan.train.data.ignore_token_id};
    trainer.add_hook(t.steps_per_eval, [&](const step_info<lora::params>& info) {
      haliax::no_grad_guard ng;
      const auto res = eval::evaluate_tagged(data.validation_sets(), eo, tok, [&](const lm_example& ex) {
        return part.eval_loss(info.eval_model ? *info.eval_model : *info.model, ex);
      });
      if (!res.loss) return;
      run.tracker().log(res.metrics, info.step);
      run.say("eval step " + std::to_string(info.step) + "  " + res.line);
      eval_loss = res.loss;
    });
  }
  // upstream's save_peft_checkpoint_callback / save_merged_hf_checkpoint_callback: not after the first step,
  // `<path>/<run id>/step-<info.step>`
  if (cfg.peft_save_path) {
    const fs::path base = fs::path(*cfg.peft_save_path) / run.id();
    trainer.add_hook(cfg.hf_save_steps, [&, base](const step_info<lora::params>& info) {
      if (info.step == 0) return;
      const auto dir = base / ("step-" + std::to_string(info.step));
      part.save_peft(info.eval_model ? *info.eval_model : *info.model, dir.string());
      log("exported the PEFT adapters to " + dir.string());
    });
  }
  if (cfg.merged_hf_save_path) {
    const fs::path base = fs::path(*cfg.merged_hf_save_path) / run.id();
    const hf::token_ids ids{tok.bos_id(), tok.eos_id()};
    trainer.add_hook(cfg.hf_save_steps, [&, base, ids](const step_info<lora::params>& info) {
      if (info.step == 0) return;
      const auto dir = base / ("step-" + std::to_string(info.step));
      part.save_merged(info.eval_model ? *info.eval_model : *info.model, dir.string(), ids);
      log("exported the merged model to " + dir.string());
    });
  }

  const auto ignore = plan.train.data.ignore_token_id;
  auto res = trainer.train(state, [&](std::int64_t first, std::int64_t count) {
    return detail::training_batch(data, first, count, seq_len, eos, ignore);
  }, data.train_length());

  res.parameters = all;
  write_run_summary(run, res, eval_loss, trainer.comm().size(), json{{"trainable_parameters", trainable}});
  return res;
}

}  // namespace detail

int lora_lm_main(int argc, char** argv) {
  return run_program("lora_lm", [&] {
    distributed::init_world(&argc, &argv);
    struct finalize {
      ~finalize() {
        if (std::uncaught_exceptions() == 0) distributed::finalize_world();
      }
    } at_end;
    auto parsed = config::parse_command_line<LoraLmConfig>(argc, argv, "{}", "<defaults>");
    const bool r0 = distributed::world().rank() == 0;
    if (parsed.help) {
      if (r0) std::cout << config::help_text<LoraLmConfig>("lora_lm");
      return 0;
    }
    auto plan = plan_lora_lm(parsed.config, parsed.sources);
    if (r0)
      for (const auto& n : plan.checked.notes) std::cerr << "lora_lm: note: " << n << "\n";
    if (!plan.checked.errors.empty()) {
      if (r0) {
        std::cerr << "lora_lm: the config cannot be used as it is ("
                  << (parsed.config_path.empty() ? std::string("command line") : parsed.config_path) << "):\n";
        for (const auto& e : plan.checked.errors) std::cerr << "  - " << e << "\n";
      }
      return 2;
    }
    if (parsed.dry_run) {
      dry_run_checks(plan.train);
      if (r0) {
        std::cout << parsed.resolved_yaml;
        std::cerr << "lora_lm: config resolved and valid (--dry_run: not training)\n";
      }
      return 0;
    }
    with_model(plan.train.model, [&]<class M>(std::type_identity<M>, const typename M::config_type& mc) {
      run_lora_lm_with<M>(plan, mc, parsed.resolved_yaml, std::cout);
    });
    return 0;
  });
}

}  // namespace levanter
