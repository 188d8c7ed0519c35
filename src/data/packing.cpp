// levanter/data/packing.hpp: supervised rows, greedy packing and the per-row loss mask and segment ids.
#include <algorithm>
#include <levanter/data/error.hpp>
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
  return [tok = std::move(tok), sep](std::string_view doc) {
    // decode_document made `doc`: a JSON array of the input and the output string.
    const auto fields = nlohmann::json::parse(doc);
    const std::string source = fields.at(0).get<std::string>() + sep;
    const auto source_ids = tok.encode(source);
    auto ids = tok.encode(source + fields.at(1).get<std::string>());
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
  return m;
}

packed_examples::packed_examples(std::shared_ptr<token_cache> cache, std::int64_t seq_len, std::int64_t max_segments)
    : cache_(std::move(cache)), seq_len_(seq_len) {
  cache_->total_tokens();  // waits for the build (upstream packs a finished cache)
  if (!cache_->has_sources_len())
    throw data_error("cache '" + cache_->dir() + "' holds text rows; supervised examples need a supervised cache");
  ends_ = cache_->row_ends();
  sources_ = cache_->sources_lens();
  std::vector<std::int64_t> lengths(ends_.size());
  for (std::size_t i = 0; i < ends_.size(); ++i) lengths[i] = ends_[i] - (i ? ends_[i - 1] : 0);
  // Upstream packs the sources_len field too, one value per row within seq_len values: at most seq_len rows.
  packs_ = pack_documents(lengths, seq_len, std::min(max_segments, seq_len), true);
}

void packed_examples::example(std::int64_t k, bool mask_inputs, std::int32_t* tokens, std::uint8_t* keep,
                              std::int32_t* segment) const {
  const auto& r = packs_.at(static_cast<std::size_t>(k));
  std::fill(tokens, tokens + seq_len_, 0);
  std::fill(segment, segment + seq_len_, -1);
  std::fill(keep, keep + seq_len_, 0);
  std::vector<std::int64_t> index(static_cast<std::size_t>(seq_len_), 0);  // each token's index in its whole row
  std::int64_t at = 0;
  for (std::int64_t row = r.begin; row < r.end; ++row) {
    const std::int64_t begin = row ? ends_[static_cast<std::size_t>(row - 1)] : 0,
                       end = ends_[static_cast<std::size_t>(row)];
    const std::int64_t skip = std::max<std::int64_t>(0, end - begin - seq_len_);  // "right": keep the last seq_len
    const std::int64_t n = end - begin - skip;
    cache_->read_tokens(begin + skip, n, tokens + at);
    for (std::int64_t j = 0; j < n; ++j) {
      segment[at + j] = static_cast<std::int32_t>(row);
      index[static_cast<std::size_t>(at + j)] = skip + j;
    }
    at += n;
  }
  for (std::int64_t p = 0; p + 1 < at; ++p) {
    if (segment[p + 1] != segment[p]) continue;
    keep[p] = !mask_inputs || index[static_cast<std::size_t>(p + 1)] >= sources_[static_cast<std::size_t>(segment[p])];
  }
}

}  // namespace levanter::data
