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
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

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

/// Runs `prompt` through `model` and then generates up to `s.max_new_tokens` tokens, one at a time over a kv_cache.
/// The prompt plus the new tokens must fit the model's positions (`seq_len` of models with learned positions):
/// generation stops with finish_reason "length" there. Throws std::invalid_argument for an empty prompt, and
/// std::logic_error if the model's forward pass does not keep the cache (a model written for training only).
template <LmModel M>
generation generate(const M& model, const typename M::config_type& cfg, std::span<const std::int32_t> prompt,
                    const sampling_options& s) {
  if (prompt.empty()) throw std::invalid_argument("generate: the prompt has no tokens");
  namespace hx = haliax;
  kv_cache cache;
  forward_options o;
  o.cache = &cache;
  std::vector<std::int32_t> all(prompt.begin(), prompt.end());
  generation out;
  auto run = [&](std::span<const std::int32_t> ids) {
    const auto n = static_cast<std::int64_t>(ids.size());
    const auto before = cache.length;
    const auto tokens = hx::from_host<std::int32_t>(ids, 1 * Batch, n * Pos);
    const auto h = model.activations(cfg, tokens, hx::zeros<std::int32_t>(1 * Batch, n * Pos), o);
    if (cache.length != before + n || cache.k.empty())
      throw std::logic_error(std::string("generate: the model '") + std::string(M::class_name) +
                             "' does not keep a kv_cache in its forward pass (forward_options::cache)");
    const auto logits = lm_head_logits(hx::slice(h, Pos, n - 1, 1), model.get_lm_head(), final_logit_soft_cap_of(cfg));
    return logits.to_host();
  };
  const std::int64_t limit = cfg.seq_len;
  if (static_cast<std::int64_t>(all.size()) > limit)
    throw std::invalid_argument("generate: the prompt has " + std::to_string(all.size()) + " tokens, more than the " +
                                std::to_string(limit) + " positions of the model");
  auto logits = run(prompt);
  out.finish_reason = "length";
  for (std::int64_t i = 0; i < s.max_new_tokens; ++i) {
    const auto [id, lp] = choose_token(logits, s, i);
    out.tokens.push_back(id);
    out.logprobs.push_back(lp);
    all.push_back(id);
    if (ends_generation(out.tokens, s)) {
      out.finish_reason = "stop";
      break;
    }
    if (i + 1 == s.max_new_tokens || static_cast<std::int64_t>(all.size()) >= limit) break;
    logits = run(std::span<const std::int32_t>(&all.back(), 1));
  }
  return out;
}

}  // namespace levanter
