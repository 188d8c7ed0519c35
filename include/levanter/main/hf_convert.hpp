// levanter/main/hf_convert.hpp: the `export_lm_to_hf` and `import_hf_to_lm` programs (upstream
// `levanter.main.export_lm_to_hf` and `levanter.main.export_hf_to_lm`), for any model type with a Hugging Face
// adapter (compat/hf.hpp).
//
//   export_lm_to_hf --checkpoint_path checkpoints/RUN --output_dir hf/RUN [--save_dtype bfloat16]
//   import_hf_to_lm --hf_checkpoint DIR --output_path checkpoints/imported [--tokenizer DIR]
//
// The export takes the newest complete checkpoint under checkpoint_path (or that checkpoint itself), and the
// model config from the `model:` section when one is given, else from the config.yaml the checkpoint carries.
// config.json records the tokenizer's BOS and EOS ids (the `tokenizer` key, else the checkpoint's
// data.tokenizer), and with save_tokenizer the tokenizer's files are copied beside the weights. The import
// writes a model-only checkpoint (step 0) that `initialize_from_checkpoint_path` starts a run from.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <levanter/config/cli.hpp>
#include <levanter/data/tokenizer.hpp>
#include <levanter/main/model_loading.hpp>
#include <levanter/main/programs.hpp>
#include <levanter/models/registry.hpp>
#include <levanter/trainer/run.hpp>

namespace levanter {

/// upstream ConvertLmConfig.
struct ConvertLmConfig {
  config::Opaque trainer;
  std::string checkpoint_path;
  std::string output_dir;
  config::Opaque upload_to_hf;
  ModelChoice model;
  bool save_tokenizer = true;
  std::optional<std::string> tokenizer;
  std::optional<int64_t> override_vocab_size;
  config::Opaque config_overrides;
  bool use_cpu = false;
  std::optional<std::string> save_dtype;       ///< ours: float32 (default), bfloat16 or float16
  int64_t max_shard_size = 10'000'000'000LL;   ///< bytes per safetensors shard (upstream's save_pretrained default)
};

/// upstream ImportHfConfig.
struct ImportHfConfig {
  std::string hf_checkpoint;
  std::string output_path;
  ModelChoice model;
  bool use_hf_model_config = true;
  std::optional<std::string> tokenizer;
  std::optional<std::string> dtype = "float32";  ///< upstream defaults to bfloat16; parameters here are float32
  bool resize_vocab_to_match_tokenizer = true;
};

}  // namespace levanter

template <>
struct levanter::config::schema<levanter::ConvertLmConfig> {
  using T = levanter::ConvertLmConfig;
  static constexpr auto fields = std::make_tuple(
      field("trainer", &T::trainer, "trainer section (accepted for upstream compatibility; unused)"),
      field("checkpoint_path", &T::checkpoint_path, "a checkpoint directory, or a directory holding step-N checkpoints (the newest is used)"),
      field("output_dir", &T::output_dir, "directory to write config.json and the safetensors into"),
      field("upload_to_hf", &T::upload_to_hf, "upload to the Hugging Face Hub (not possible here)"),
      field("model", &T::model, "model config; defaults to the one in the checkpoint's config.yaml"),
      field("save_tokenizer", &T::save_tokenizer, "copy the tokenizer's files (tokenizer.json, tokenizer_config.json, special_tokens_map.json) into output_dir"),
      field("tokenizer", &T::tokenizer, "the tokenizer the model was trained with: a local tokenizer.json (or its directory), byte or passthrough (default: the checkpoint's data.tokenizer)"),
      field("override_vocab_size", &T::override_vocab_size, "must equal the checkpoint's vocabulary when set"),
      field("config_overrides", &T::config_overrides, "extra config.json entries (not supported)"),
      field("use_cpu", &T::use_cpu, "run on the CPU (always the case here)"),
      field("save_dtype", &T::save_dtype, "dtype of the safetensors: float32, bfloat16 or float16"),
      field("max_shard_size", &T::max_shard_size, "largest safetensors shard in bytes; bigger models are split with an index"));
};

template <>
struct levanter::config::schema<levanter::ImportHfConfig> {
  using T = levanter::ImportHfConfig;
  static constexpr auto fields = std::make_tuple(
      field("hf_checkpoint", &T::hf_checkpoint, "local Hugging Face directory (config.json + safetensors)"),
      field("output_path", &T::output_path, "checkpoint directory to write (model only, step 0)"),
      field("model", &T::model, "model config, used when use_hf_model_config is false"),
      field("use_hf_model_config", &T::use_hf_model_config, "take the architecture from config.json"),
      field("tokenizer", &T::tokenizer, "a local tokenizer.json (or its directory) to record as the checkpoint's data.tokenizer; must fit the vocabulary"),
      field("dtype", &T::dtype, "dtype of the stored parameters (float32 only)"),
      field("resize_vocab_to_match_tokenizer", &T::resize_vocab_to_match_tokenizer, "accepted; the vocabulary is kept as in the checkpoint"));
};


namespace levanter {

/// export_lm_to_hf. Returns the directory written.
std::string run_export_lm_to_hf(const ConvertLmConfig& cfg, const config::source_map& sources, std::ostream& out);
/// import_hf_to_lm. Returns the checkpoint directory written.
std::string run_import_hf_to_lm(const ImportHfConfig& cfg, std::ostream& out);


namespace detail {

/// What the export knows before the model type is chosen.
struct export_job {
  const ConvertLmConfig* cfg = nullptr;
  checkpoint::checkpoint_info checkpoint;
  std::optional<std::string> tokenizer;  ///< the tokenizer spec (ConvertLmConfig.tokenizer or the checkpoint's)
  hf::token_ids ids;                     ///< its BOS and EOS
  safetensors::dtype dtype = safetensors::dtype::F32;
};

/// Whether `spec` is a tokenizer this machine can open (byte, passthrough, a tokenizer.json or a directory with one).
bool is_local_tokenizer(const std::string& spec);

/// Copies the tokenizer's files into the export (save_tokenizer); returns the names copied.
std::vector<std::string> copy_tokenizer_files(const std::string& spec, const std::string& output_dir);

/// What the import writes: the model-only checkpoint with a train_lm config naming the architecture.
void write_imported_checkpoint(const ImportHfConfig& cfg, std::vector<checkpoint::named_file> files,
                               std::int64_t vocab, std::int64_t parameters, const nlohmann::json& hf_config,
                               std::ostream& out);

}  // namespace detail

/// export_lm_to_hf with model type M and its config `mc` (instantiated once per built-in model type).
template <LmModel M>
std::vector<std::string> export_lm_to_hf_with(const detail::export_job& job, const typename M::config_type& mc,
                                              std::ostream& out) {
  if constexpr (hf::HfConvertible<M>) {
    const auto& cfg = *job.cfg;
    auto loaded = load_lm_from_checkpoint<M>(job.checkpoint, mc);
    const std::int64_t vocab = loaded.model.vocab_size();
    if (cfg.override_vocab_size && *cfg.override_vocab_size != vocab)
      throw config::config_error("override_vocab_size " + std::to_string(*cfg.override_vocab_size) +
                                 " differs from the checkpoint's vocabulary of " + std::to_string(vocab) +
                                 " (resizing is not supported)");
    auto files = hf::save(loaded.model, mc, vocab, cfg.output_dir, job.ids, job.dtype,
                          static_cast<std::uint64_t>(cfg.max_shard_size));
    out << "export_lm_to_hf: " << job.checkpoint.path.string() << " (step " << job.checkpoint.step << ") -> "
        << cfg.output_dir << " (" << files.size() << " files, " << hf::torch_dtype_name(job.dtype) << ")\n";
    return files;
  } else {
    throw config::config_error("model type '" + std::string(M::config_type::type_name) +
                               "' has no Hugging Face adapter, so it cannot be exported");
  }
}

/// import_hf_to_lm with model type M (instantiated once per built-in model type).
template <LmModel M>
void import_hf_to_lm_with(const ImportHfConfig& cfg, const hf::hf_dir& d, const typename M::config_type& given,
                          std::ostream& out) {
  if constexpr (hf::HfConvertible<M>) {
    typename M::config_type mc = given;
    if (cfg.use_hf_model_config)
      mc = hf::config_from_hf<M>(mc, d);
    else
      hf::check_matches<M>(mc, d, "hf_checkpoint '" + cfg.hf_checkpoint + "'");
    check_model_fits(mc.parameter_count(d.vocab_size), 1, "the model of '" + cfg.hf_checkpoint + "'");
    auto model = M::init(mc, d.vocab_size, haliax::random::make_key(0));
    hf::load(d, model, mc);
    ImportHfConfig with_model = cfg;
    with_model.model = as_model_choice(mc);
    auto files = checkpoint::train_state_files<M>(model, nullptr, 0, haliax::random::key{}, 0, "");
    detail::write_imported_checkpoint(with_model, std::move(files), d.vocab_size, haliax::tree::parameter_count(model),
                                      d.config, out);
  } else {
    throw config::config_error("model type '" + std::string(M::config_type::type_name) +
                               "' has no Hugging Face adapter, so it cannot be imported");
  }
}

}  // namespace levanter

// The built-in models (models/builtin.hpp) are instantiated once, in the library (files CMakeLists.txt generates).
#include <levanter/models/builtin_models.hpp>
#define LEVANTER_HF_CONVERT_INSTANCE(M, C, ...)                                                                      \
  template std::vector<std::string> export_lm_to_hf_with<M>(const detail::export_job&, const C&, std::ostream&); \
  template void import_hf_to_lm_with<M>(const ImportHfConfig&, const hf::hf_dir&, const C&, std::ostream&);
#define LEVANTER_HF_CONVERT_EXTERN(M, C, ...)                                                                        \
  extern template std::vector<std::string> export_lm_to_hf_with<M>(const detail::export_job&, const C&,         \
                                                                   std::ostream&);                               \
  extern template void import_hf_to_lm_with<M>(const ImportHfConfig&, const hf::hf_dir&, const C&, std::ostream&);
namespace levanter {
LEVANTER_BUILTIN_MODELS(LEVANTER_HF_CONVERT_EXTERN)
}  // namespace levanter
