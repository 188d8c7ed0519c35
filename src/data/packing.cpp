// levanter/data/packing.hpp: supervised rows, greedy packing and the per-row loss mask and segment ids.
#include <algorithm>
#include <cctype>
#include <deque>
#include <limits>
#include <levanter/data/permutation.hpp>
#include <stdexcept>
#include <levanter/data/error.hpp>
#include <levanter/data/jinja.hpp>
#include <levanter/data/packing.hpp>
#include <nlohmann/json.hpp>

namespace levanter::data {

std::vector<doc_range> pack_documents(std::span<const std::int64_t> lengths, std::int64_t max_length,
                                      std::optional<std::int64_t> max_segments, bool slice_too_long) {
  if (max_segments && *max_segments <= 0)
    throw data_error("max_segments_per_example must be a positive integer, got " + std::to_string(*max_segments));
  const auto n = static_cast<std::int64_t>(lengths.size());
  for (std::int64_t i = 0; i < n && !slice_too_long; ++i)
    if (lengths[static_cast<std::size_t>(i)] > max_length)
      throw data_error("document " + std::to_string(i) + " has " +
                       std::to_string(lengths[static_cast<std::size_t>(i)]) + " tokens, more than the " +
                       std::to_string(max_length) + " of an example; slice it or raise the length");
  std::vector<doc_range> out;
  for (std::int64_t i = 0; i < n;) {
    const std::int64_t start = i;
    std::int64_t tokens = 0;
    while (i < n && (!max_segments || i - start < *max_segments) &&
           tokens + lengths[static_cast<std::size_t>(i)] <= max_length)
      tokens += lengths[static_cast<std::size_t>(i++)];
    if (i == start) ++i;  // a document longer than max_length (slice_too_long): a pack of its own
    out.push_back({start, i});
  }
  return out;
}

encode_fn make_supervised_encode_fn(tokenizer tok, const supervised_format& f) {
  const std::string sep = f.separate_with.value_or("");
  // Upstream sft's chat rows: EOS after the output unless the tokenizer ends texts with it (checked on "hi there").
  std::string eos_text;
  bool eos_id_after = false;
  if (f.append_eos) {
    if (!tok.eos_id())
      throw data_error("tokenizer '" + tok.name() + "' has no EOS token, which sft appends to every response; use a "
                       "tokenizer with one (or set eos_token in its tokenizer_config.json)");
    const auto probe = tok.encode("hi there");
    if (probe.empty() || probe.back() != *tok.eos_id()) {
      if (tok.eos_token())
        eos_text = *tok.eos_token();
      else
        eos_id_after = true;
    }
  }
  const std::int32_t eos = tok.eos_id().value_or(0);
  return [tok = std::move(tok), sep, eos_text, eos_id_after, eos](std::string_view doc) {
    // decode_document made `doc`: a JSON array of the input and the output string.
    const auto fields = nlohmann::json::parse(doc);
    const std::string source = fields.at(0).get<std::string>() + sep;
    const auto source_ids = tok.encode(source);
    auto ids = tok.encode(source + fields.at(1).get<std::string>() + eos_text);
    if (eos_id_after) ids.push_back(eos);
    std::vector<std::int32_t> row;
    row.reserve(ids.size() + 1);
    row.push_back(static_cast<std::int32_t>(source_ids.size()));
    row.insert(row.end(), ids.begin(), ids.end());
    return row;
  };
}

nlohmann::json supervised_metadata(const tokenizer& tok, const supervised_format& f) {
  nlohmann::json m = {{"tokenizer", tok.name()},
                      {"vocab_size", tok.vocab_size()},
                      {"input_field", f.input_field},
                      {"output_field", f.output_field},
                      {"separate_with", f.separate_with ? nlohmann::json(*f.separate_with) : nlohmann::json()},
                      {"format", "supervised"}};
  if (!tok.is_builtin()) m["tokenizer_hash"] = tok.content_hash();
  if (f.messages_field) m["messages_field"] = *f.messages_field;
  if (f.input_role != "user" || f.output_role != "assistant") {
    m["input_role"] = f.input_role;
    m["output_role"] = f.output_role;
  }
  if (f.append_eos) m["append_eos"] = true;
  return m;
}

std::string chat_template_for(const tokenizer& tok, const chat_format& f, const std::optional<std::string>& data_template) {
  std::string t;
  if (f.chat_template)
    t = *f.chat_template;
  else if (data_template)
    t = *data_template;
  else if (tok.chat_template())
    t = *tok.chat_template();
  else
    throw data_error("chat data: tokenizer '" + tok.name() + "' has no chat template (none in its tokenizer_config.json " +
                     "or chat_template.jinja); set the dataset's format.chat_template or data.chat_template");
  if (f.mask_user_turns) {
    // upstream's check: a `{% generation %}` tag (with optional '-' whitespace control) somewhere in the template
    bool found = false;
    for (std::size_t at = t.find("{%"); at != std::string::npos && !found; at = t.find("{%", at + 2)) {
      std::size_t i = at + 2;
      if (i < t.size() && t[i] == '-') ++i;
      while (i < t.size() && std::isspace(static_cast<unsigned char>(t[i]))) ++i;
      if (t.compare(i, 10, "generation") != 0) continue;
      i += 10;
      while (i < t.size() && std::isspace(static_cast<unsigned char>(t[i]))) ++i;
      if (i < t.size() && t[i] == '-') ++i;
      found = t.compare(i, 2, "%}") == 0;
    }
    if (!found)
      throw data_error("chat data: the chat template has no {% generation %} block, so no assistant token could be "
                       "told from the rest and nothing would be trained; wrap the assistant's text in "
                       "{% generation %}...{% endgeneration %} (format.chat_template) or set mask_user_turns: false");
  }
  return t;
}

encode_fn make_chat_encode_fn(tokenizer tok, const std::string& chat_template, bool require_assistant) {
  auto tmpl = std::make_shared<const jinja::compiled_template>(jinja::compiled_template::parse(chat_template));
  nlohmann::ordered_json base = {{"messages", nlohmann::ordered_json::array()},
                                 {"tools", nullptr},
                                 {"documents", nullptr},
                                 {"add_generation_prompt", false}};
  for (const auto& [k, v] : tok.template_tokens()) base[k] = v;
  return [tok = std::move(tok), tmpl, base, require_assistant](std::string_view doc) {
    nlohmann::ordered_json ctx = base;
    ctx["messages"] = nlohmann::ordered_json::parse(doc);  // decode_document checked it
    std::vector<std::pair<std::size_t, std::size_t>> spans;
    std::string text;
    try {
      text = tmpl->render(ctx, &spans);
    } catch (const jinja::template_error& e) {
      throw data_error(std::string("chat template: ") + e.what() + " (rendering the record " + std::string(doc.substr(0, 200)) +
                       (doc.size() > 200 ? "...)" : ")"));
    }
    const auto ids = tok.encode(text, false);
    const auto ends = tok.token_ends(ids, text);
    const auto n = static_cast<std::int64_t>(ids.size());
    // transformers: the token holding the span's first character through the one holding its last (char_to_token);
    // a span starting past the last token ends the marking, and an end without a token marks to the end.
    auto token_at = [&](std::size_t byte) -> std::int64_t {
      const auto it = std::upper_bound(ends.begin(), ends.end(), static_cast<std::int64_t>(byte));
      return it == ends.end() ? -1 : static_cast<std::int64_t>(it - ends.begin());
    };
    std::vector<std::int32_t> row(static_cast<std::size_t>(1 + 2 * n), 0);
    row[0] = static_cast<std::int32_t>(n);
    std::copy(ids.begin(), ids.end(), row.begin() + 1);
    std::int32_t* mask = row.data() + 1 + n;
    bool any = false;
    for (const auto& [b, e] : spans) {
      const std::int64_t first = token_at(b);
      if (first < 0) break;
      std::int64_t last = -1;
      if (e > 0) {
        std::size_t c = e - 1;  // the first byte of the span's last character
        while (c > b && (static_cast<unsigned char>(text[c]) & 0xC0) == 0x80) --c;
        last = token_at(c);
      }
      const std::int64_t stop = last > 0 ? last + 1 : n;  // (transformers treats token 0 as "none" as well)
      for (std::int64_t t = first; t < stop; ++t) mask[t] = 1, any = true;
    }
    if (require_assistant && !any)
      throw data_error("chat data: a record has no assistant text under the chat template (upstream refuses it): " +
                       std::string(doc.substr(0, 200)) + (doc.size() > 200 ? "..." : ""));
    return row;
  };
}

nlohmann::json chat_metadata(const tokenizer& tok, const std::string& chat_template, const std::string& messages_field) {
  nlohmann::json m = {{"tokenizer", tok.name()},
                      {"vocab_size", tok.vocab_size()},
                      {"chat_template", chat_template},
                      {"messages_field", messages_field},
                      {"format", "chat"}};
  if (!tok.is_builtin()) m["tokenizer_hash"] = tok.content_hash();
  return m;
}

packed_examples::rows packed_examples::read_cache(std::shared_ptr<token_cache> cache) {
  cache->total_tokens();  // waits for the build (upstream packs a finished cache)
  if (!cache->has_sources_len())
    throw data_error("cache '" + cache->dir() + "' holds text rows; supervised examples need a supervised cache");
  rows r;
  r.ends = cache->row_ends();
  r.sources = cache->sources_lens();
  r.cache = std::move(cache);
  return r;
}

packed_examples::packed_examples(std::shared_ptr<token_cache> cache, std::int64_t seq_len, std::int64_t max_segments)
    : seq_len_(seq_len) {
  src_.push_back(read_cache(std::move(cache)));
  const auto& ends = src_.front().ends;
  std::vector<std::int64_t> lengths(ends.size());
  for (std::size_t i = 0; i < ends.size(); ++i) lengths[i] = ends[i] - (i ? ends[i - 1] : 0);
  // Upstream packs the sources_len field too, one value per row within seq_len values: at most seq_len rows.
  packs_ = pack_documents(lengths, seq_len, std::min(max_segments, seq_len), true);
  for (const auto& r : packs_) {
    for (std::int64_t row = r.begin; row < r.end; ++row) {
      const std::int64_t len = lengths[static_cast<std::size_t>(row)];
      const std::int64_t skip = std::max<std::int64_t>(0, len - seq_len_);  // "right": keep the last seq_len
      pieces_.push_back({row, skip, len - skip, static_cast<std::int32_t>(row), 0});
    }
    first_.push_back(static_cast<std::int64_t>(pieces_.size()));
  }
}

packed_examples::packed_examples(std::vector<std::shared_ptr<token_cache>> caches, const prompt_completion_options& o)
    : seq_len_(o.seq_len), pad_id_(o.pad_id) {
  if (o.max_segments <= 0 || o.max_buffered <= 0 || o.seq_len <= 0)
    throw data_error("prompt-completion packing needs a positive seq_len, max_segments and max_buffered");
  if (caches.empty() || (!o.mixture && caches.size() != 1))
    throw data_error("prompt-completion packing takes one cache, or a mixture's");
  if (o.mixture && o.examples <= 0)
    throw data_error("prompt-completion packing of a mixture needs the number of examples to make");
  std::vector<permutation> perms;
  for (auto& c : caches) {
    src_.push_back(read_cache(std::move(c)));
    const auto n = static_cast<std::uint64_t>(src_.back().ends.size());
    if (n == 0 && !o.mixture)  // (a mixture_index refuses an empty dataset in use)
      throw data_error("cache '" + src_.back().cache->dir() + "' holds no rows: there is nothing to train on");
    perms.push_back(n ? permutation::make(permutation_kind::feistel, n, o.key) : permutation{});
  }
  // The stream of rows: one cache read through its permutation `epochs` times, or the mixture of the caches.
  const std::uint64_t single_n = src_.front().ends.size();
  const std::uint64_t stream =
      o.mixture ? std::numeric_limits<std::uint64_t>::max()
                : single_n * static_cast<std::uint64_t>(std::max<std::int64_t>(1, o.epochs));
  const std::int64_t cut = o.max_seq_len > 0 ? std::min(o.seq_len, o.max_seq_len) : o.seq_len;

  struct open_pack {
    std::vector<packed_piece> pieces;
    std::int64_t tokens = 0;
  };
  std::deque<open_pack> open;
  auto emit = [&](open_pack&& p) {
    pieces_.insert(pieces_.end(), p.pieces.begin(), p.pieces.end());
    first_.push_back(static_cast<std::int64_t>(pieces_.size()));
  };
  auto enough = [&] { return o.mixture && size() >= o.examples; };
  for (std::uint64_t i = 0; i < stream && !enough(); ++i) {
    std::size_t d = 0;
    std::int64_t row = 0;
    if (o.mixture) {
      const auto [dataset, k] = (*o.mixture)(static_cast<std::int64_t>(i));
      d = dataset;
      row = static_cast<std::int64_t>(perms[d](static_cast<std::uint64_t>(k)));
    } else {
      row = static_cast<std::int64_t>(perms[0](i % single_n));
    }
    const auto& r = src_[d];
    const std::int64_t len = std::min(r.ends[static_cast<std::size_t>(row)] - r.begin(row), cut);
    const std::int64_t prompt = r.sources[static_cast<std::size_t>(row)];
    if (prompt > o.seq_len - 1 || len <= prompt) {
      ++dropped_;
      continue;
    }
    const packed_piece piece{row, 0, len, static_cast<std::int32_t>(i), static_cast<std::uint32_t>(d)};
    auto fits = std::find_if(open.begin(), open.end(), [&](const open_pack& p) {
      return p.tokens + len <= o.seq_len && static_cast<std::int64_t>(p.pieces.size()) < o.max_segments;
    });
    if (fits != open.end()) {
      fits->pieces.push_back(piece);
      fits->tokens += len;
      if (static_cast<std::int64_t>(fits->pieces.size()) == o.max_segments) {
        emit(std::move(*fits));
        open.erase(fits);
      }
    } else {
      open.push_back({{piece}, len});
    }
    while (static_cast<std::int64_t>(open.size()) >= o.max_buffered && !enough()) {
      emit(std::move(open.front()));
      open.pop_front();
    }
    if (o.mixture && i > 1000 * static_cast<std::uint64_t>(o.examples) + 1000000 && size() == 0)
      throw data_error("sft_mixture: no row of the mixture fits an example of " + std::to_string(o.seq_len) +
                       " tokens (every prompt is too long or every response is cut away)");
  }
  for (auto& p : open) {
    if (enough()) break;
    emit(std::move(p));
  }
}

packed_examples packed_examples::documents(std::shared_ptr<token_cache> cache, std::int64_t seq_len,
                                           std::int64_t max_segments) {
  if (seq_len <= 0 || max_segments <= 0) throw data_error("packing documents needs a positive seq_len and max_segments");
  packed_examples p;
  p.seq_len_ = seq_len;
  cache->total_tokens();  // waits for the build: documents are packed from all of it
  rows r;
  r.ends = cache->row_ends();
  r.cache = std::move(cache);
  std::vector<packed_piece> open;
  std::int64_t tokens = 0;
  auto emit = [&](std::vector<packed_piece>& pieces) {
    if (pieces.empty()) return;
    p.pieces_.insert(p.pieces_.end(), pieces.begin(), pieces.end());
    p.first_.push_back(static_cast<std::int64_t>(p.pieces_.size()));
    pieces.clear();
  };
  for (std::int64_t row = 0; row < static_cast<std::int64_t>(r.ends.size()); ++row) {
    const std::int64_t len = r.ends[static_cast<std::size_t>(row)] - r.begin(row);
    std::int64_t off = 0;
    for (; len - off > seq_len; off += seq_len) {  // whole examples of a long document
      std::vector<packed_piece> one{{row, off, seq_len, static_cast<std::int32_t>(row), 0}};
      emit(one);
    }
    const std::int64_t n = len - off;
    if (n == 0) continue;
    if (tokens + n > seq_len || static_cast<std::int64_t>(open.size()) >= max_segments) {
      emit(open);
      tokens = 0;
    }
    open.push_back({row, off, n, static_cast<std::int32_t>(row), 0});
    tokens += n;
  }
  emit(open);
  p.src_.push_back(std::move(r));
  return p;
}

packed_examples packed_examples::chat(std::shared_ptr<token_cache> cache, std::int64_t seq_len,
                                      std::int64_t max_segments) {
  if (seq_len <= 0 || max_segments <= 0) throw data_error("packing chat rows needs a positive seq_len and max_segments");
  cache->total_tokens();  // waits for the build: rows are packed from all of it
  if (!cache->has_assistant_masks())
    throw data_error("cache '" + cache->dir() + "' holds no chat rows; multi-turn chat examples need a chat cache");
  packed_examples p;
  p.seq_len_ = seq_len;
  p.chat_ = true;
  rows r;
  r.ends = cache->row_ends();
  r.cache = std::move(cache);
  std::vector<std::int64_t> lengths(r.ends.size());
  for (std::size_t i = 0; i < r.ends.size(); ++i) lengths[i] = r.ends[i] - (i ? r.ends[i - 1] : 0);
  // Both of upstream's leaves (input_ids, assistant_masks) have the rows' lengths, so they pack alike.
  p.packs_ = pack_documents(lengths, seq_len, max_segments, true);
  for (const auto& pr : p.packs_) {
    for (std::int64_t row = pr.begin; row < pr.end; ++row) {
      const std::int64_t len = lengths[static_cast<std::size_t>(row)];
      p.pieces_.push_back({row, 0, std::min(len, seq_len), static_cast<std::int32_t>(row), 0});  // "left"
    }
    p.first_.push_back(static_cast<std::int64_t>(p.pieces_.size()));
  }
  p.src_.push_back(std::move(r));
  return p;
}

std::span<const packed_piece> packed_examples::pieces(std::int64_t k) const {
  if (k < 0 || k >= size()) throw std::out_of_range("packed example " + std::to_string(k) + " of " + std::to_string(size()));
  const auto b = static_cast<std::size_t>(first_[static_cast<std::size_t>(k)]),
             e = static_cast<std::size_t>(first_[static_cast<std::size_t>(k) + 1]);
  return std::span<const packed_piece>(pieces_.data() + b, e - b);
}

void packed_examples::example(std::int64_t k, bool mask_inputs, std::int32_t* tokens, std::uint8_t* keep,
                              std::int32_t* segment) const {
  std::fill(tokens, tokens + seq_len_, pad_id_);
  std::fill(segment, segment + seq_len_, -1);
  std::fill(keep, keep + seq_len_, 0);
  std::int64_t at = 0;
  for (const auto& piece : pieces(k)) {
    const auto& r = src_[piece.source];
    r.cache->read_tokens(r.begin(piece.row) + piece.skip, piece.n, tokens + at);
    if (chat_) {  // the assistant masks: position at + j is trained when token j + 1 of the piece is the assistant's
      std::uint8_t* m = keep + at;  // (read into keep, then shifted by one in place)
      r.cache->read_masks(r.begin(piece.row) + piece.skip, piece.n, m);
      for (std::int64_t j = 0; j < piece.n; ++j) {
        segment[at + j] = piece.segment;
        m[j] = j + 1 < piece.n && (!mask_inputs || m[j + 1]);
      }
      at += piece.n;
      continue;
    }
    const std::int64_t prompt = r.sources.empty() ? 0 : r.sources[static_cast<std::size_t>(piece.row)];
    for (std::int64_t j = 0; j < piece.n; ++j) {
      segment[at + j] = piece.segment;
      // position at + j predicts token j + 1 of the piece, which is token skip + j + 1 of its row
      keep[at + j] = j + 1 < piece.n && (!mask_inputs || piece.skip + j + 1 >= prompt);
    }
    at += piece.n;
  }
}

}  // namespace levanter::data
