// levanter/inference/generate.hpp: text generation with a KV cache (upstream `inference/engine.py`, as far as one
// sequence at a time goes): the prompt is run once (prefill), each new token then reads the keys and values of every
// earlier position from a kv_cache (levanter/models/lm.hpp) instead of recomputing them. Sampling as upstream's
// and transformers': temperature (0 = greedy), top-k, top-p, a seed, stop tokens and stop sequences,
// `max_new_tokens`, the log-probability of every chosen token.
//
// Reproducible: a token is drawn from a counter-based generator keyed by (seed, index of the token), over the
// probabilities in a fixed order, so the same seed and prompt give the same tokens on any machine and thread count.
//
//   levanter::sampling_options s;  s.max_new_tokens = 32;  s.temperature = 0;   // greedy
//   auto out = levanter::generate(model, cfg, prompt_ids, s);                     // out.tokens, out.logprobs
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <haliax/ops/indexing.hpp>
#include <haliax/precision.hpp>
#include <levanter/models/lm.hpp>

namespace levanter {

/// How tokens are chosen (upstream SampleLmConfig / the OpenAI API's names in comments).
struct sampling_options {
  std::int64_t max_new_tokens = 192;  ///< `max_tokens`
  double temperature = 0.7;           ///< 0: greedy (the most probable token, the lowest id among equals)
  std::int64_t top_k = 0;             ///< keep the k most probable tokens; 0: all
  double top_p = 1.0;                 ///< keep the most probable tokens whose probabilities sum to at least p
  std::uint64_t seed = 0;
  std::vector<std::int32_t> stop_tokens;                 ///< generation ends after one of these (it is kept)
  std::vector<std::vector<std::int32_t>> stop_sequences;  ///< ends when the output ends with one (it is kept)
};

/// One generation: the new tokens (the prompt excluded), the natural log of each one's probability under the
/// distribution it was drawn from (after temperature, top-k and top-p), and why it ended: "stop" (a stop token or
/// sequence) or "length" (max_new_tokens or the model's seq_len).
struct generation {
  std::vector<std::int32_t> tokens;
  std::vector<double> logprobs;
  std::string finish_reason;
};

/// The token chosen from `logits` (one position's, over the vocabulary) for new token number `index` of a
/// generation, and its log-probability (see generation::logprobs). Throws std::invalid_argument for options out of
/// range (negative temperature or top_k, top_p outside (0, 1]) or logits that are all -inf or NaN.
std::pair<std::int32_t, double> choose_token(std::span<const float> logits, const sampling_options& s,
                                             std::int64_t index);

/// Whether `tokens` now ends a generation under `s` (its last token is a stop token, or it ends with a stop
/// sequence).
bool ends_generation(std::span<const std::int32_t> tokens, const sampling_options& s);

/// The logits of the last position of each row after running `ids` (`rows` rows of ids.size() / rows tokens,
/// row-major) through a model that appends them to `cache` (row r's tokens are the next positions of the cache's
/// row r, after its length(r); rows may be at different lengths): rows x vocabulary floats. make_logits_fn makes one
/// for a model; decoder and the server call it. A row's logits do not depend on the other rows (each row's attention
/// reads its own keys; the GEMMs compute each row as they would alone: make_logits_fn runs under
/// haliax::independent_rows_scope), so a sequence generates the same tokens alone or batched with others of any
/// lengths, bit for bit (tests/test_generate.cpp, tests/test_serve.cpp).
using logits_fn =
    std::function<std::vector<float>(kv_cache& cache, std::span<const std::int32_t> ids, std::int64_t rows)>;

/// One sequence being generated, a step at a time: the first step runs the prompt (prefill), each later one the
/// last chosen token; every step chooses one token. `generate` runs the steps to the end over the decoder's own
/// cache (step()); the server (serve_lm) runs the forward passes of many decoders as one batch over a shared cache
/// and gives each its row of logits (next_input(), accept()). Neither changes any sequence's tokens: a token depends
/// only on its sequence's logits, options and index.
class decoder {
 public:
  /// `positions`: the model's positions (seq_len); generation ends there with finish_reason "length". `logits` may
  /// be empty when the caller runs the forward passes (accept()). Throws std::invalid_argument for an empty prompt
  /// or one longer than `positions`.
  decoder(logits_fn logits, std::int64_t positions, std::vector<std::int32_t> prompt, sampling_options s);
  /// Runs the next forward pass over the decoder's own cache and chooses a token (appended to result().tokens).
  /// Returns whether more steps remain. Throws std::logic_error if the model did not keep the cache, and what
  /// choose_token throws.
  bool step();
  /// The ids the next forward pass takes: the prompt first, then the token chosen last.
  std::span<const std::int32_t> next_input() const;
  /// Chooses the next token from the logits of the forward pass over next_input(); returns whether more steps remain.
  bool accept(std::span<const float> logits);
  bool done() const { return done_; }
  const generation& result() const { return out_; }
  const sampling_options& options() const { return s_; }
  std::int64_t prompt_tokens() const { return prompt_len_; }
  /// Ends the sequence early with `reason` (a stop string the caller found in the text, a client that left).
  void finish(std::string reason);

 private:
  logits_fn logits_;
  std::int64_t positions_ = 0, prompt_len_ = 0;
  std::vector<std::int32_t> all_;
  sampling_options s_;
  kv_cache cache_;
  generation out_;
  bool done_ = false;
};

/// Generates a continuation of every prompt (prompts[i] with options[i]) as one batch: each prompt is prefilled on
/// its own, then every step decodes all running sequences (at most `max_batch`) in one forward pass over a cache
/// whose rows are at different lengths; a finished sequence leaves and the next prompt joins. Each result is what
/// generate() makes of that prompt alone, bit for bit (`logits` must be make_logits_fn's, whose rows do not depend
/// on each other). `positions`: the model's seq_len. Throws std::invalid_argument for an empty prompt, one longer
/// than `positions`, or options and prompts of different counts.
std::vector<generation> generate_batch(const logits_fn& logits, std::int64_t positions,
                                       const std::vector<std::vector<std::int32_t>>& prompts,
                                       const std::vector<sampling_options>& options, std::int64_t max_batch);

/// The logits_fn of `model`: its forward pass over the rows with the cache, then the LM head on the last position.
/// The model and config are referenced, not copied: they must outlive the function.
template <LmModel M>
logits_fn make_logits_fn(const M& model, const typename M::config_type& cfg) {
  return [&model, &cfg](kv_cache& cache, std::span<const std::int32_t> ids, std::int64_t rows) {
    namespace hx = haliax;
    hx::independent_rows_scope alone;  // each row's products as in a forward pass of that row alone
    forward_options o;
    o.cache = &cache;
    const auto n = static_cast<std::int64_t>(ids.size()) / rows;
    if (rows <= 0 || n <= 0 || n * rows != static_cast<std::int64_t>(ids.size()))
      throw std::invalid_argument("generate: " + std::to_string(ids.size()) + " ids do not make " +
                                  std::to_string(rows) + " equal rows");
    std::vector<std::int64_t> before;
    for (const auto& r : cache.rows) before.push_back(r.length);
    const auto tokens = hx::from_host<std::int32_t>(ids, rows * Batch, n * Pos);
    const auto h = model.activations(cfg, tokens, hx::zeros<std::int32_t>(rows * Batch, n * Pos), o);
    bool kept = !cache.empty() && cache.rows.size() == static_cast<std::size_t>(rows);
    for (std::size_t r = 0; kept && r < before.size(); ++r) kept = cache.rows[r].length == before[r] + n;
    if (!kept)
      throw std::logic_error(std::string("generate: the model '") + std::string(M::class_name) +
                             "' does not keep a kv_cache in its forward pass (forward_options::cache)");
    return lm_head_logits(hx::slice(h, Pos, n - 1, 1), model.get_lm_head(), final_logit_soft_cap_of(cfg)).to_host();
  };
}

/// Runs `prompt` through `model` and then generates up to `s.max_new_tokens` tokens, one at a time over a kv_cache.
/// The prompt plus the new tokens must fit the model's positions (`seq_len` of models with learned positions):
/// generation stops with finish_reason "length" there. Throws std::invalid_argument for an empty prompt, and
/// std::logic_error if the model's forward pass does not keep the cache (a model written for training only).
template <LmModel M>
generation generate(const M& model, const typename M::config_type& cfg, std::span<const std::int32_t> prompt,
                    const sampling_options& s) {
  decoder d(make_logits_fn(model, cfg), cfg.seq_len, std::vector<std::int32_t>(prompt.begin(), prompt.end()), s);
  while (d.step()) {
  }
  return d.result();
}

}  // namespace levanter
