// levanter/main/hf_convert.hpp: the `export_lm_to_hf` and `import_hf_to_lm` programs (upstream
// `levanter.main.export_lm_to_hf` and `levanter.main.export_hf_to_lm`).
//
//   export_lm_to_hf --checkpoint_path checkpoints/RUN --output_dir hf/RUN [--save_dtype bfloat16]
//   import_hf_to_lm --hf_checkpoint DIR --output_path checkpoints/imported
//
// The export takes the newest complete checkpoint under checkpoint_path (or that checkpoint itself), and the
// model config from the `model:` section when one is given, else from the config.yaml the checkpoint carries.
// The import writes a model-only checkpoint (step 0) that `initialize_from_checkpoint_path` starts a run from.
#pragma once

#include <filesystem>
#include <ostream>
#include <string>

#include <levanter/checkpoint/train_state.hpp>
#include <levanter/compat/hf_gpt2.hpp>
#include <levanter/config/cli.hpp>
#include <levanter/config/train_lm_config.hpp>
#include <levanter/config/yaml.hpp>
#include <levanter/data/text.hpp>

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
      field("save_tokenizer", &T::save_tokenizer, "save tokenizer files (the byte tokenizer has none)"),
      field("tokenizer", &T::tokenizer, "tokenizer (byte only here)"),
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
      field("hf_checkpoint", &T::hf_checkpoint, "local Hugging Face GPT-2 directory (config.json + safetensors)"),
      field("output_path", &T::output_path, "checkpoint directory to write (model only, step 0)"),
      field("model", &T::model, "model config, used when use_hf_model_config is false"),
      field("use_hf_model_config", &T::use_hf_model_config, "take the architecture from config.json"),
      field("tokenizer", &T::tokenizer, "tokenizer (unused: the vocabulary size comes from config.json)"),
      field("dtype", &T::dtype, "dtype of the stored parameters (float32 only)"),
      field("resize_vocab_to_match_tokenizer", &T::resize_vocab_to_match_tokenizer, "accepted; the vocabulary is kept as in the checkpoint"));
};

namespace levanter {

namespace detail {
inline bool set_under(const config::source_map& sources, const std::string& prefix) {
  auto it = sources.lower_bound(prefix);
  return it != sources.end() && it->first.compare(0, prefix.size(), prefix) == 0 &&
         (it->first.size() == prefix.size() || it->first[prefix.size()] == '.');
}
}  // namespace detail

/// export_lm_to_hf. Returns the directory written.
inline std::string run_export_lm_to_hf(const ConvertLmConfig& cfg, const config::source_map& sources, std::ostream& out) {
  namespace fs = std::filesystem;
  if (cfg.checkpoint_path.empty()) throw config::config_error("checkpoint_path is required");
  if (cfg.output_dir.empty()) throw config::config_error("output_dir is required");
  if (cfg.upload_to_hf.set) throw config::config_error("upload_to_hf: uploading to the Hugging Face Hub is not possible here");
  if (cfg.config_overrides.set) throw config::config_error("config_overrides is not supported");
  if (cfg.max_shard_size <= 0) throw config::config_error("max_shard_size must be positive");
  const auto dt = hf::dtype_from_config(cfg.save_dtype);

  std::optional<checkpoint::checkpoint_info> found;
  const auto d = checkpoint::discover(cfg.checkpoint_path);
  for (const auto& p : d.problems) out << "export_lm_to_hf: skipping " << p << "\n";
  for (const auto& c : d.checkpoints) {
    try {
      checkpoint::verify_files(c);
      found = c;
      break;
    } catch (const checkpoint::error& e) {
      out << "export_lm_to_hf: " << e.what() << "; trying an older one\n";
    }
  }
  if (!found) throw checkpoint::error("no complete checkpoint under '" + cfg.checkpoint_path + "'");

  Gpt2Config mc;
  if (detail::set_under(sources, "model")) {
    const auto* g = cfg.model.get_if<Gpt2Config>();
    if (!g) throw config::config_error("model: only type gpt2 can be exported");
    mc = *g;
  } else {
    const fs::path saved = found->path / "config.yaml";
    if (!fs::exists(saved))
      throw config::config_error("the checkpoint has no config.yaml; give the model section (--model.type gpt2 "
                                 "--model.hidden_dim ...)");
    const auto train_cfg = config::decode<TrainLmConfig>(YAML::LoadFile(saved.string()));
    const auto* g = train_cfg.model.get_if<Gpt2Config>();
    if (!g) throw config::config_error(saved.string() + ": the model is not a gpt2");
    mc = *g;
  }
  checkpoint::reader r((found->path / "model.h5").string());
  const auto dims = r.dims("embeddings.token_embeddings.weight");
  if (dims.size() != 2) throw checkpoint::error("model.h5: embeddings.token_embeddings.weight is not 2-D");
  const std::int64_t vocab = dims[0];
  if (cfg.override_vocab_size && *cfg.override_vocab_size != vocab)
    throw config::config_error("override_vocab_size " + std::to_string(*cfg.override_vocab_size) +
                               " differs from the checkpoint's vocabulary of " + std::to_string(vocab) +
                               " (resizing is not supported)");
  auto model = gpt2::LMHeadModel::init(mc, vocab, haliax::random::make_key(0));
  r.read_tree("", model);
  const std::optional<std::int64_t> eos =
      vocab >= data::byte_tokenizer::vocab_size ? std::optional<std::int64_t>(data::byte_tokenizer::eos_id) : std::nullopt;
  const auto files = hf::save_gpt2(model, mc, vocab, cfg.output_dir, dt, static_cast<std::uint64_t>(cfg.max_shard_size), eos);
  out << "export_lm_to_hf: " << found->path.string() << " (step " << found->step << ") -> " << cfg.output_dir << " ("
      << files.size() << " files, " << hf::torch_dtype_name(dt) << ")\n";
  return cfg.output_dir;
}

/// import_hf_to_lm. Returns the checkpoint directory written.
inline std::string run_import_hf_to_lm(const ImportHfConfig& cfg, std::ostream& out) {
  if (cfg.hf_checkpoint.empty()) throw config::config_error("hf_checkpoint is required");
  if (cfg.output_path.empty()) throw config::config_error("output_path is required");
  if (cfg.dtype && *cfg.dtype != "float32" && *cfg.dtype != "f32" && *cfg.dtype != "fp32")
    throw config::config_error("dtype '" + *cfg.dtype + "': parameters are stored in float32 here; use dtype: float32");
  auto d = hf::open_gpt2_dir(cfg.hf_checkpoint, "hf_checkpoint");
  const auto* g = cfg.model.get_if<Gpt2Config>();
  if (!g) throw config::config_error("model: only type gpt2 can be imported");
  Gpt2Config mc = *g;
  if (cfg.use_hf_model_config)
    mc = hf::merge_hf_config(mc, d.config, cfg.hf_checkpoint + "/config.json");
  else
    hf::check_matches(mc, d.config, "hf_checkpoint '" + cfg.hf_checkpoint + "'");
  auto model = gpt2::LMHeadModel::init(mc, d.vocab_size, haliax::random::make_key(0));
  hf::load_gpt2(d, model);
  // The checkpoint carries a train_lm config whose model section is this architecture, so export_lm_to_hf and
  // initialize_from_checkpoint_path need nothing else.
  TrainLmConfig tc;
  tc.model.value = mc;
  tc.data.vocab_size = d.vocab_size;
  auto files = checkpoint::train_state_files<gpt2::LMHeadModel>(model, nullptr, 0, haliax::random::key{}, 0,
                                                                config::to_yaml_string(tc));
  const auto bytes = checkpoint::write_checkpoint(cfg.output_path, files, 0, false, std::chrono::system_clock::now(),
                                                  {{"source", cfg.hf_checkpoint}});
  out << "import_hf_to_lm: " << cfg.hf_checkpoint << " -> " << cfg.output_path << " (" << bytes / 1000 << " kB, "
      << haliax::tree::parameter_count(model) << " parameters)\n";
  return cfg.output_path;
}

}  // namespace levanter
