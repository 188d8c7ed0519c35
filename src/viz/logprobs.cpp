// levanter/viz/logprobs.hpp: scoring documents with a model's logits, and the heatmap's documents.
#include <levanter/viz/logprobs.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <haliax/haliax.hpp>

namespace levanter::viz {

std::string byte_token_text(std::int32_t id) {
  if (id >= 0 && id < 256) return std::string(1, static_cast<char>(id));
  if (id == data::byte_tokenizer::eos_id) return "<|endoftext|>";
  return "<|" + std::to_string(id) + "|>";
}

std::vector<scored_doc> score_documents(const logits_fn& logits_of, std::int64_t vocab, std::int64_t seq_len,
                                        const std::vector<std::vector<std::int32_t>>& docs, std::int64_t eos_id,
                                        std::int64_t batch) {
  haliax::no_grad_guard ng;
  const std::int64_t V = vocab;
  for (std::size_t d = 0; d < docs.size(); ++d) {
    const auto n = static_cast<std::int64_t>(docs[d].size());
    if (n == 0) throw viz_error("score_documents: document " + std::to_string(d) + " is empty");
    if (n > seq_len)
      throw viz_error("score_documents: document " + std::to_string(d) + " has " + std::to_string(n) +
                      " tokens, more than the model's seq_len " + std::to_string(seq_len));
    for (auto id : docs[d])
      if (id < 0 || id >= V)
        throw viz_error("score_documents: document " + std::to_string(d) + " holds token id " + std::to_string(id) +
                        " outside the model's vocabulary of " + std::to_string(V) + " (wrong tokenizer?)");
  }
  std::vector<scored_doc> out(docs.size());
  std::size_t first = 0;
  while (first < docs.size()) {
    const auto P = static_cast<std::int64_t>(docs[first].size());
    const std::int64_t cap = batch > 0 ? batch : std::max<std::int64_t>(1, (std::int64_t{1} << 25) / (P * V));
    std::size_t last = first + 1;
    while (last < docs.size() && static_cast<std::int64_t>(last - first) < cap &&
           static_cast<std::int64_t>(docs[last].size()) == P)
      ++last;
    const auto B = static_cast<std::int64_t>(last - first);
    std::vector<std::int32_t> host;
    host.reserve(static_cast<std::size_t>(B * P));
    for (std::size_t d = first; d < last; ++d) host.insert(host.end(), docs[d].begin(), docs[d].end());
    auto tokens = haliax::from_host<std::int32_t>(host, B * Batch, P * Pos);
    const auto ex = lm_example::causal(tokens, eos_id);
    const auto logits = logits_of(ex).to_host();  // {batch, position, vocab}
    for (std::int64_t b = 0; b < B; ++b) {
      auto& s = out[first + static_cast<std::size_t>(b)];
      s.logprob.assign(static_cast<std::size_t>(P), std::nan(""));
      s.top.assign(static_cast<std::size_t>(P), -1);
      s.top_logprob.assign(static_cast<std::size_t>(P), std::nan(""));
      for (std::int64_t p = 0; p + 1 < P; ++p) {
        const float* row = logits.data() + (b * P + p) * V;
        const std::int64_t arg = std::max_element(row, row + V) - row;
        double sum = 0;
        for (std::int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - double(row[arg]));
        const double lse = double(row[arg]) + std::log(sum);
        const auto target = host[static_cast<std::size_t>(b * P + p + 1)];
        s.logprob[static_cast<std::size_t>(p + 1)] = double(row[target]) - lse;
        s.top[static_cast<std::size_t>(p + 1)] = static_cast<std::int32_t>(arg);
        s.top_logprob[static_cast<std::size_t>(p + 1)] = double(row[arg]) - lse;
      }
    }
    first = last;
  }
  return out;
}

std::vector<document> make_documents(const std::vector<std::vector<std::int32_t>>& docs,
                                    const std::vector<scored_doc>& scores,
                                    const std::vector<scored_doc>* comparison, const token_text_fn& text,
                                    std::int64_t eos_id) {
  std::vector<document> out;
  for (std::size_t d = 0; d < docs.size(); ++d) {
    std::vector<std::string> raw;
    for (auto id : docs[d]) raw.push_back(text(id));
    document doc;
    doc.name = "document " + std::to_string(d);
    doc.tokens = utf8_cells(raw);
    for (std::size_t i = 0; i < docs[d].size(); ++i) {
      auto& c = doc.tokens[i];
      c.special = docs[d][i] == eos_id;
      const double lp = scores[d].logprob[i];
      if (std::isnan(lp)) continue;
      c.logprob = lp;
      if (comparison) c.comparison = (*comparison)[d].logprob[i];
      const auto top_cells = utf8_cells({text(scores[d].top[i])});
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.3f", scores[d].top_logprob[i]);
      c.note = "| top: '" + visible_text(top_cells[0].text, true) + "' " + buf;
    }
    out.push_back(std::move(doc));
  }
  return out;
}

void write_logprobs_page(const std::vector<std::vector<std::int32_t>>& docs, const std::vector<scored_doc>& scores,
                         const token_text_fn& text, const std::string& path, std::int64_t step, const page_info& info) {
  html_options o;
  o.title = info.title;
  o.model_name = info.model_name;
  o.step = step;
  write_logprobs_html(path, make_documents(docs, scores, nullptr, text, info.eos_id), o);
}

std::vector<std::vector<std::int32_t>> select_documents(data::token_windows windows, std::int64_t num_docs,
                                                        std::optional<std::int64_t> data_seed) {
  if (data_seed) windows.shuffle(haliax::random::make_key(static_cast<std::uint64_t>(*data_seed)));
  const std::int64_t n = std::min(num_docs, windows.size());
  std::vector<std::vector<std::int32_t>> out;
  for (std::int64_t i = 0; i < n; ++i) {
    std::vector<std::int32_t> w(static_cast<std::size_t>(windows.seq_len()));
    windows.window(i, w.data());
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace levanter::viz
