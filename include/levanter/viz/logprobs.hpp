// levanter/viz/logprobs.hpp: the per-token log-probabilities of any language model on documents, and the heatmap
// pages made of them (viz/logprobs_html.hpp). Used by `viz_logprobs` and by train_lm's `viz:` refresh. The model
// enters through its logits, so all but the two small templates at the end compile once (src/viz/logprobs.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <levanter/data/text.hpp>
#include <levanter/data/tokenizer.hpp>
#include <levanter/models/lm.hpp>
#include <levanter/viz/logprobs_html.hpp>

namespace levanter::viz {

/// The display text of one token id as raw bytes (the page repairs characters split across tokens).
using token_text_fn = std::function<std::string(std::int32_t)>;

/// The byte tokenizer's token text: the byte itself for 0–255, `<|endoftext|>` for EOS.
std::string byte_token_text(std::int32_t id);

/// Per-token scores of one document: logprob[i] = log p(ids[i] | ids[0..i)) (NaN at i = 0), and the model's most
/// likely token for position i with its log-prob.
struct scored_doc {
  std::vector<double> logprob;
  std::vector<std::int32_t> top;
  std::vector<double> top_logprob;
};

/// A model's logits {batch, position, vocab} for a batch (no gradients, no dropout).
using logits_fn = std::function<lm_logits_array(const lm_example&)>;

/// Scores `docs` with `logits_of` and returns each token's log-prob given the tokens before it in its document.
/// Documents of equal length are batched, at most `batch` at a time (<= 0: as many as fit in about 128 MB of
/// logits). Segments restart after each EOS, as in training. Throws viz_error for an empty document, one longer
/// than `seq_len`, or a token id outside the vocabulary of `vocab` tokens.
std::vector<scored_doc> score_documents(const logits_fn& logits_of, std::int64_t vocab, std::int64_t seq_len,
                                        const std::vector<std::vector<std::int32_t>>& docs, std::int64_t eos_id,
                                        std::int64_t batch = 0);

/// `score_documents` with a model (levanter::LmModel).
template <LmModel M>
std::vector<scored_doc> score_documents(const M& model, const typename M::config_type& mc,
                                        const std::vector<std::vector<std::int32_t>>& docs, std::int64_t eos_id,
                                        std::int64_t batch = 0) {
  return score_documents(
      [&](const lm_example& ex) { return lm_logits(model, mc, ex.tokens, ex.segment_ids); }, model.vocab_size(),
      mc.seq_len, docs, eos_id, batch);
}

/// The page's documents: token texts (characters split across tokens shown on their first token), log-probs,
/// the comparison's when given, the model's top prediction in each title, EOS marked special.
std::vector<document> make_documents(const std::vector<std::vector<std::int32_t>>& docs,
                                     const std::vector<scored_doc>& scores, const std::vector<scored_doc>* comparison,
                                     const token_text_fn& text, std::int64_t eos_id);

/// What train_lm (or another caller) tells the page about the model.
struct page_info {
  std::string model_name;  ///< shown in the header (a run id, a checkpoint path)
  std::int64_t eos_id = data::byte_tokenizer::eos_id;
  std::string title = "Token log-probabilities";
};

/// Writes the heatmap of scored documents to `path` atomically (a browser showing the page sees the old one or the
/// new one).
void write_logprobs_page(const std::vector<std::vector<std::int32_t>>& docs, const std::vector<scored_doc>& scores,
                         const token_text_fn& text, const std::string& path, std::int64_t step,
                         const page_info& info = {});

/// Scores `docs` with the live `model` and writes the heatmap to `path` (train_lm's refresh every N steps).
template <LmModel M>
void write_logprobs_for_model(const M& model, const typename M::config_type& mc,
                              const std::vector<std::vector<std::int32_t>>& docs, const token_text_fn& text,
                              const std::string& path, std::int64_t step, const page_info& info = {}) {
  write_logprobs_page(docs, score_documents(model, mc, docs, info.eos_id), text, path, step, info);
}

/// The first `num_docs` windows of `windows` after permuting them with `data_seed` (none: file order), as
/// upstream's `dataset.shuffle(PRNGKey(data_seed)).slice_dataset(0, num_docs)`.
std::vector<std::vector<std::int32_t>> select_documents(data::token_windows windows, std::int64_t num_docs,
                                                        std::optional<std::int64_t> data_seed);

}  // namespace levanter::viz
