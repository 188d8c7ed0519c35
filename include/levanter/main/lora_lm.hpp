// levanter/main/lora_lm.hpp: the `lora_lm` program (upstream `levanter.main.lora_lm`, LoraLmConfig): LoRA fine-tuning
// of a Hugging Face model (levanter/lora.hpp).
//
//   lora_lm lora.yaml
//   lora_lm --config_path tests/upstream-config/lora_llama2.yaml --initialize_from_hf path/to/Llama-2-7b-hf --data.train_urls ...
//
// The model comes from a local Hugging Face directory (`initialize_from_hf`: its config.json gives the architecture,
// `max_train_length` the sequence length) and stays frozen; the adapters `lora` names are trained on `data` (train_lm's
// data section) by train_lm's Trainer and `optimizer`. Checkpoints (trainer.checkpointer) hold the adapters and
// their optimizer state only, and resume bitwise. Every `hf_save_steps` steps and at the end, `peft_save_path` gets a
// PEFT adapter (`<peft_save_path>/<run id>/step-N/adapter_config.json` + `adapter_model.safetensors`, loadable with
// peft's PeftModel.from_pretrained on the base model) and `merged_hf_save_path` the model with the adapters merged
// (a Hugging Face directory). Data parallel and FSDP runs shard the adapters and their optimizer state over the ranks
// as train_lm shards a model; the frozen model is whole on every rank.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include <levanter/config/types.hpp>
#include <levanter/config/validate.hpp>
#include <levanter/lora.hpp>
#include <levanter/main/model_loading.hpp>
#include <levanter/main/train_lm_config.hpp>
#include <levanter/models/lm.hpp>
#include <levanter/trainer/trainer.hpp>

namespace levanter {

/// upstream LoraLmConfig (main/lora_lm.py), its keys and defaults.
struct LoraLmConfig {
  std::optional<std::string> initialize_from_hf;  ///< required: a local Hugging Face model directory
  LoraConfig lora;
  LmDataConfig data;
  TrainerConfig trainer;
  OptimizerChoice optimizer;
  std::optional<std::string> peft_save_path;
  config::Opaque peft_hf_upload;
  std::int64_t hf_save_steps = 1000;
  std::optional<std::string> merged_hf_save_path;
  config::Opaque merged_hf_upload;
  bool trust_remote_code = false;
  std::int64_t max_train_length = 2048;
};

/// The train_lm config a lora_lm config trains as (its data, trainer, optimizer, the model of initialize_from_hf with
/// max_train_length tokens), and what the check found: every error at once, notes for keys accepted and ignored.
struct lora_lm_plan {
  LoraLmConfig lora_lm;
  TrainLmConfig train;
  config::validation_result checked;
};
lora_lm_plan plan_lora_lm(const LoraLmConfig& cfg, const config::source_map& sources);

namespace detail {

/// What the model-specific part of lora_lm gives the rest (which is compiled once, for `lora::params`).
struct lora_model_part {
  lora::spec spec;
  std::string model_type;
  std::int64_t vocab = 0;
  std::int64_t base_parameters = 0;
  std::set<std::string> model_axes;  ///< the axis names of the model's parameters (the trainer's mappings name them)
  trainer_options options;
  Trainer<lora::params>::loss_fn loss;
  std::function<double(const lora::params&, const lm_example&)> eval_loss;
  std::function<void(const lora::params&, const std::string& dir)> save_peft;
  std::function<void(const lora::params&, const std::string& dir, const hf::token_ids&)> save_merged;
  /// With lora.dropout > 0: how many times each adapter ran beside its Linear in the last training forward pass
  /// (zero for one the model reads as a matrix, which keeps the merged form).
  std::shared_ptr<std::vector<std::int64_t>> dropout_applied;
};

/// Trains the adapters of `part` as `plan` says (the run directory, data, Trainer, hooks and summary).
train_result train_lora(const lora_lm_plan& plan, const std::string& resolved_yaml, std::ostream& out,
                        lora_model_part& part);

}  // namespace detail

/// lora_lm with model type M (the type initialize_from_hf's config.json names).
template <LmModel M>
train_result run_lora_lm_with(const lora_lm_plan& plan, const typename M::config_type& base_config,
                              const std::string& resolved_yaml, std::ostream& out) {
  if constexpr (hf::HfConvertible<M>) {
    using C = typename M::config_type;
    const auto& cfg = plan.lora_lm;
    const std::string dir = *cfg.initialize_from_hf;
    const auto d = hf::open_dir(dir, "initialize_from_hf");
    C mc = hf::config_from_hf<M>(base_config, d);
    mc.seq_len = cfg.max_train_length;
    auto loaded = load_lm_from_hf<M>(d, mc);
    auto base = std::make_shared<const M>(std::move(loaded.model));
    detail::lora_model_part part;
    part.spec = lora::make_spec(*base, cfg.lora);
    part.model_type = std::string(model_type_name(mc));
    part.vocab = d.vocab_size;
    part.base_parameters = haliax::tree::parameter_count(*base);
    haliax::tree::for_each_leaf_type<M>([&](const auto& names) {
      for (const auto& n : names) part.model_axes.insert(std::string(n));
    });
    part.options = trainer_options{3.0 * mc.flops_per_token(d.vocab_size), static_cast<std::int64_t>(mc.seq_len),
                                   checkpoint_policy_of(mc), matmul_shapes_of(mc, d.vocab_size),
                                   recomputed_flops_per_token(mc, d.vocab_size)};
    const lora::spec spec = part.spec;
    const double dropout = cfg.lora.dropout;
    if (dropout > 0) part.dropout_applied = std::make_shared<std::vector<std::int64_t>>();
    part.loss = [base, mc, spec, dropout, applied = part.dropout_applied](const lora::params& p, const lm_example& ex,
                                                                         const forward_options& fo) {
      const M m = lora::merged(*base, p, spec);
      if (dropout == 0 || fo.inference) return compute_next_token_loss(m, mc, ex, 0.0, fo);
      // the adapters beside each Linear call, on its input with dropout (upstream's LoraLinear)
      haliax::ambient_scope adapters(
          lora::dropout_side(lora::adapted_weights(m, spec), p, spec, dropout, fo.key, applied));
      return compute_next_token_loss(m, mc, ex, 0.0, fo);
    };
    part.eval_loss = [base, mc, spec](const lora::params& p, const lm_example& ex) {
      haliax::no_grad_guard ng;
      return static_cast<double>(compute_next_token_loss(lora::merged(*base, p, spec), mc, ex).item());
    };
    const LoraConfig lc = cfg.lora;
    part.save_peft = [spec, lc, dir](const lora::params& p, const std::string& to) {
      lora::save_peft<M>(p, spec, lc, dir, to);
    };
    const std::int64_t vocab = d.vocab_size;
    part.save_merged = [base, mc, spec, vocab](const lora::params& p, const std::string& to, const hf::token_ids& ids) {
      haliax::no_grad_guard ng;
      hf::save(lora::merged(*base, p, spec), mc, vocab, to, ids);
    };
    return detail::train_lora(plan, resolved_yaml, out, part);
  } else {
    throw config::config_error("initialize_from_hf: model type '" + std::string(M::config_type::type_name) +
                               "' has no Hugging Face adapter");
  }
}

/// The whole program: parses its command line, answers --help and --dry_run, trains; returns the exit code of
/// levanter/main/programs.hpp.
int lora_lm_main(int argc, char** argv);

}  // namespace levanter

template <>
struct levanter::config::schema<levanter::LoraLmConfig> {
  using T = levanter::LoraLmConfig;
  static constexpr auto fields = std::make_tuple(
      field("initialize_from_hf", &T::initialize_from_hf,
            "the model to adapt: a local Hugging Face directory (config.json and safetensors)"),
      field("lora", &T::lora, "the adapters: target_modules, r, alpha, dropout"),
      field("data", &T::data, "training (and validation) data, as train_lm's"),
      field("trainer", &T::trainer, "training loop settings"),
      field("optimizer", &T::optimizer, "optimizer of the adapters, and the learning-rate schedule"),
      field("peft_save_path", &T::peft_save_path,
            "export PEFT adapters to <peft_save_path>/<run id>/step-N every hf_save_steps and at the end"),
      field("peft_hf_upload", &T::peft_hf_upload, "upload the PEFT adapters to the Hub (not supported: no network)"),
      field("hf_save_steps", &T::hf_save_steps, "steps between PEFT and merged exports"),
      field("merged_hf_save_path", &T::merged_hf_save_path,
            "export the model with the adapters merged to <merged_hf_save_path>/<run id>/step-N"),
      field("merged_hf_upload", &T::merged_hf_upload, "upload the merged model to the Hub (not supported: no network)"),
      field("trust_remote_code", &T::trust_remote_code, "Hugging Face remote code (no effect: the built-in models are used)"),
      field("max_train_length", &T::max_train_length, "the sequence length of training examples"));
};

// The model-specific part, instantiated once per built-in model in the library (tools_<stem>.cpp).
#include <levanter/models/builtin_models.hpp>
#define LEVANTER_LORA_LM_INSTANCE(M, C, ...)                                                                  \
  template train_result run_lora_lm_with<M>(const lora_lm_plan&, const C&, const std::string&, std::ostream&);
#define LEVANTER_LORA_LM_EXTERN(M, C, ...) extern LEVANTER_LORA_LM_INSTANCE(M, C)
namespace levanter {
LEVANTER_BUILTIN_MODELS(LEVANTER_LORA_LM_EXTERN)
}  // namespace levanter
