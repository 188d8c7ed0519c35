// levanter/inference/server.hpp: an OpenAI-compatible HTTP server over a language model (upstream
// `inference/openai.py`): `GET /health`, `GET /v1/models`, `POST /v1/completions` and `POST /v1/chat/completions`,
// answered whole or streamed as server-sent events. The `serve_lm` program (levanter/main/serve_lm.hpp) loads the
// model and calls serve().
//
// Requests are tokenized and queued; one engine thread runs every admitted sequence a token per round (`decoder`,
// levanter/inference/generate.hpp) and admits queued requests between rounds while it has room for their `n`
// sequences (at most `service.max_seqs` at once): a long generation does not hold back a short one, and every
// stream moves. With `batch_decode` (on by default) the engine batches continuously: sequences admitted in the same
// round with prompts of equal length are prefilled together, then join the one decoding batch, whose rows sit at
// different positions of one cache (kv_cache): one forward pass per round for every running sequence. Each has its
// own seed, and a row's logits do not depend on the rows beside it (make_logits_fn), so its tokens are those of
// generate() alone whatever else runs (tests/test_serve.cpp, tests/test_generate.cpp).
// The HTTP side is cpp-httplib (Debian's libcpp-httplib-dev): a thread per connection, with the request-size limit,
// keep-alive and chunked responses the streams need, in one header and a small library; Boost.Beast would mean
// writing the connection handling ourselves for the same result.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>

#include <levanter/config/types.hpp>
#include <levanter/data/tokenizer.hpp>
#include <levanter/inference/generate.hpp>

namespace levanter {

/// upstream InferenceEngineConfig. The keys that limit work apply: max_seqs (sequences generated at once; a request's
/// `n` counts n), max_stop_seqs (stop strings per request) and the cache's pages: a sequence reserves
/// ceil((prompt + max_tokens) / page_size) pages when admitted, at most max_pages_per_seq, and with max_pages the
/// running sequences' pages stay within it (requests wait in the queue for pages). The pages are an accounting of
/// each sequence's own buffers (kv_cache), not a shared pool of blocks: no page is shared between sequences.
struct InferenceEngineConfig {
  std::optional<std::int64_t> max_pages;
  std::int64_t max_seqs = 16;
  std::int64_t page_size = 128;
  std::int64_t max_pages_per_seq = 64;
  std::string compute_dtype = "bfloat16";
  std::int64_t max_queued_tokens = 512;
  std::int64_t max_seqs_in_prefill = 16;
  std::optional<std::int64_t> max_prefill_size;
  std::optional<std::int64_t> max_tokens_per_round;
  std::int64_t max_rounds = 8;
  std::int64_t max_stop_seqs = 4;
  std::int64_t max_stop_tokens = 16;
  std::int64_t seed = 0;
  bool enable_logprobs = false;
};

/// What serve() needs besides the model: upstream InferenceServerConfig's serving keys and our limits.
struct server_options {
  InferenceEngineConfig service;
  double temperature = 0.7;  ///< a request's default
  std::int64_t seed = 42;    ///< a request's default seed
  std::string host = "localhost";
  std::int64_t port = 0;  ///< 0: any free port (printed)
  std::string model_name;  ///< the id clients name in `model` (and /v1/models lists)
  std::int64_t max_body_bytes = 1 << 20;
  std::int64_t max_tokens = 1024;         ///< most new tokens a request may ask for (per sequence)
  std::int64_t default_max_tokens = 16;   ///< a completion's max_tokens when not given (OpenAI's 16)
  std::int64_t max_queued_requests = 256;  ///< waiting requests beyond this are answered 429
  std::int64_t threads = 64;               ///< connections served at once
  /// Continuous batching: every running sequence, whatever its length, decodes in one forward pass per round (the
  /// prefills of a round's equal-length prompts in one more): the weights are read once per round (GPT-2 124M, 2
  /// cores: 16 rows in about 90 ms against 53 ms for one). The same tokens either way: each row's products are
  /// computed as they would be alone (haliax::independent_rows_scope). Off: one forward pass per sequence.
  bool batch_decode = true;
  std::function<void(int port)> on_listening;  ///< called once the port is bound (tests start clients there)
};

/// Serves the model until SIGINT or SIGTERM (or until `stop` returns true, checked every 100 ms). `positions`: the
/// model's seq_len. Prints "serve_lm: listening on http://HOST:PORT" to `out` once the port is bound. Throws
/// config::config_error for options out of range or an address it cannot bind.
void serve(const server_options& opts, const data::tokenizer& tok, logits_fn logits, std::int64_t positions,
           std::ostream& out, const std::function<bool()>& stop = {});

}  // namespace levanter

template <>
struct levanter::config::schema<levanter::InferenceEngineConfig> {
  using T = levanter::InferenceEngineConfig;
  static constexpr auto fields = std::make_tuple(
      field("max_pages", &T::max_pages, "cache pages of all running sequences (unset: no bound); requests wait for pages"),
      field("max_seqs", &T::max_seqs, "sequences generated at once (a request's n counts n); more wait in the queue"),
      field("page_size", &T::page_size, "positions per cache page"),
      field("max_pages_per_seq", &T::max_pages_per_seq, "most cache pages one sequence (prompt + max_tokens) may take"),
      field("compute_dtype", &T::compute_dtype, "compute dtype (read, not used: f32)"),
      field("max_queued_tokens", &T::max_queued_tokens, "upstream's token queue (read, not used)"),
      field("max_seqs_in_prefill", &T::max_seqs_in_prefill, "upstream's prefill batch (read, not used)"),
      field("max_prefill_size", &T::max_prefill_size, "upstream's prefill size (read, not used)"),
      field("max_tokens_per_round", &T::max_tokens_per_round, "upstream's decode round (read, not used)"),
      field("max_rounds", &T::max_rounds, "upstream's decode rounds per call (read, not used)"),
      field("max_stop_seqs", &T::max_stop_seqs, "most stop strings a request may give"),
      field("max_stop_tokens", &T::max_stop_tokens, "upstream's stop-token limit (read, not used)"),
      field("seed", &T::seed, "upstream's engine seed (read, not used: the server's seed is the default)"),
      field("enable_logprobs", &T::enable_logprobs, "upstream's switch (read, not used: logprobs are always available)"));
};
