// levanter/main/serve_lm.hpp: the `serve_lm` program (upstream `inference_repl`'s server mode, `InferenceServerConfig`):
// an OpenAI-compatible HTTP server over a trained model (levanter/inference/server.hpp, docs/generation.md).
//
//   serve_lm --checkpoint_path checkpoints/RUN --port 8000
//   serve_lm --hf_checkpoint path/to/hf_dir --service.max_seqs 32
//   curl localhost:8000/v1/completions -d '{"model": "RUN", "prompt": "Once upon", "max_tokens": 32}'
//
// The model and tokenizer come as in sample_lm (checkpoint_path or a local hf_checkpoint; the tokenizer given, else
// the directory's own, else the checkpoint's data.tokenizer). Chat requests render the tokenizer's chat template.
// It listens on localhost unless `host` says otherwise, and runs until SIGINT or SIGTERM.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include <levanter/inference/server.hpp>
#include <levanter/main/sample_lm.hpp>

namespace levanter {

/// upstream InferenceServerConfig (with the REPL's model keys) and the server's limits.
struct ServeLmConfig {
  std::optional<std::string> checkpoint_path;
  std::optional<std::string> hf_checkpoint;
  TrainerConfig trainer;
  ModelChoice model;
  std::optional<std::string> tokenizer;
  InferenceEngineConfig service;
  double temperature = 0.7;
  std::int64_t seed = 42;
  double batch_timeout = 0.1;
  std::string host = "localhost";
  std::int64_t port = 0;
  std::optional<std::string> model_name;
  std::int64_t max_body_bytes = 1 << 20;
  std::int64_t max_tokens = 1024;
  std::int64_t default_max_tokens = 16;
  std::int64_t max_queued_requests = 256;
  std::int64_t threads = 64;
  bool batch_decode = true;
};

}  // namespace levanter

template <>
struct levanter::config::schema<levanter::ServeLmConfig> {
  using T = levanter::ServeLmConfig;
  static constexpr auto fields = std::make_tuple(
      field("checkpoint_path", &T::checkpoint_path, "a train_lm checkpoint, or a directory holding step-N checkpoints (the newest is used)"),
      field("hf_checkpoint", &T::hf_checkpoint, "a local Hugging Face model directory (instead of checkpoint_path)"),
      field("trainer", &T::trainer, "trainer section (accepted for upstream compatibility; generation runs in f32)"),
      field("model", &T::model, "model config (default: the checkpoint's config.yaml, or config.json of hf_checkpoint)"),
      field("tokenizer", &T::tokenizer, "tokenizer: a local tokenizer.json or its directory, byte or passthrough (default: the checkpoint's data.tokenizer, or hf_checkpoint's tokenizer.json)"),
      field("service", &T::service, "upstream's engine section: max_seqs and max_stop_seqs apply, the paged cache's sizes are read only"),
      field("temperature", &T::temperature, "a request's temperature when it gives none"),
      field("seed", &T::seed, "a request's seed when it gives none"),
      field("batch_timeout", &T::batch_timeout, "upstream's batching wait (read, not used: requests join between steps)"),
      field("host", &T::host, "address to listen on (localhost: loopback only)"),
      field("port", &T::port, "port to listen on; 0: any free port (printed)"),
      field("model_name", &T::model_name, "the model id clients give (default: the checkpoint or directory name)"),
      field("max_body_bytes", &T::max_body_bytes, "largest request body; larger ones are answered 413"),
      field("max_tokens", &T::max_tokens, "most new tokens one sequence of a request may ask for"),
      field("default_max_tokens", &T::default_max_tokens, "a completion's max_tokens when it gives none (OpenAI: 16)"),
      field("max_queued_requests", &T::max_queued_requests, "requests that may wait for room; more are answered 429"),
      field("threads", &T::threads, "connections served at once"),
      field("batch_decode", &T::batch_decode, "run sequences admitted together with prompts of equal length as one batch (the same tokens as alone, faster; docs/generation.md)"));
};

namespace levanter {

namespace detail {
/// The server options of a config, with the model's name.
server_options serve_options(const ServeLmConfig& cfg, const std::string& model_name);
}  // namespace detail

/// serve_lm with model type M (instantiated once per built-in model type in the library).
template <LmModel M>
void run_serve_lm_with(const detail::model_source& src, const ServeLmConfig& cfg, std::ostream& out) {
  const loaded_lm<M> mdl = detail::load_source_model<M>(src);
  out << "serve_lm: model " << mdl.name << (mdl.step ? " (step " + std::to_string(*mdl.step) + ")" : "") << "\n";
  serve(detail::serve_options(cfg, mdl.name), src.tok, make_logits_fn(mdl.model, mdl.config), mdl.config.seq_len, out);
}

/// serve_lm: serves until SIGINT/SIGTERM. Throws config::config_error, data::data_error, checkpoint::error or
/// hf::error with a message for the user.
void run_serve_lm(const ServeLmConfig& cfg, const config::source_map& sources, std::ostream& out);

}  // namespace levanter

#define LEVANTER_SERVE_LM_INSTANCE(M, C, ...) \
  template void run_serve_lm_with<M>(const detail::model_source&, const ServeLmConfig&, std::ostream&);
#define LEVANTER_SERVE_LM_EXTERN(M, C, ...) extern LEVANTER_SERVE_LM_INSTANCE(M, C)
namespace levanter {
LEVANTER_BUILTIN_MODELS(LEVANTER_SERVE_LM_EXTERN)
}  // namespace levanter
