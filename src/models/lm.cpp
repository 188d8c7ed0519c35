// What every language model shares (levanter/models/lm.hpp): examples, the next-token loss and the LM head's
// logits, compiled once for both head layouts.
#include <vector>

#include <haliax/haliax.hpp>
#include <levanter/data/packing.hpp>
#include <levanter/models/lm.hpp>
#include <stdexcept>

namespace levanter {

namespace {

using kv_array = kv_cache::kv_array;
using range = std::pair<std::size_t, std::size_t>;

/// A new buffer {1, capacity, heads, head_size} holding the first `keep` positions of `old` (if any).
kv_array grown(const kv_array* old, std::int64_t keep, std::int64_t capacity, std::int64_t heads, std::int64_t d) {
  auto b = kv_array::allocate({1, capacity, heads, d}, "levanter::kv_cache");
  if (old && keep > 0) {
    const auto n = static_cast<std::size_t>(keep * heads * d);
    Kokkos::deep_copy(Kokkos::subview(b.view(), range(0, n)), Kokkos::subview(old->view(), range(0, n)));
  }
  return b;
}

/// A copy of the first `length` positions of `a`, with as much room as `a` has.
kv_array cloned(const kv_array& a, std::int64_t length) {
  return grown(&a, length, a.size(KeyPos), a.size(Heads), a.size(HeadSize));
}

}  // namespace

kv_cache::kv_cache(const kv_cache& o) : rows(o.rows.size()), max_positions(o.max_positions) {
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const auto& from = o.rows[r];
    auto& to = rows[r];
    to.length = from.length;
    to.appended = from.appended;
    to.limit = from.limit;
    for (const auto& a : from.k) to.k.push_back(cloned(a, from.length));
    for (const auto& a : from.v) to.v.push_back(cloned(a, from.length));
  }
}

kv_cache& kv_cache::operator=(const kv_cache& o) {
  if (this != &o) *this = kv_cache(o);
  return *this;
}

void kv_cache::begin(std::int64_t batch, std::int64_t n, std::int64_t max_positions, const std::string& what) {
  if (rows.empty()) rows.resize(static_cast<std::size_t>(batch));
  this->max_positions = max_positions;
  if (static_cast<std::int64_t>(rows.size()) != batch)
    throw std::invalid_argument("kv_cache: the input has " + std::to_string(batch) + " rows and the cache " +
                                std::to_string(rows.size()) + " sequences; give each sequence its row");
  for (std::size_t r = 0; r < rows.size(); ++r) {
    if (rows[r].length + n > max_positions)
      throw std::invalid_argument(what + ": sequence of " + std::to_string(rows[r].length + n) +
                                  " tokens is longer than seq_len " + std::to_string(max_positions) +
                                  (rows.size() > 1 ? " (batch row " + std::to_string(r) + ")" : std::string()));
    rows[r].appended = 0;
  }
}

std::pair<kv_array, kv_array> kv_cache::append(std::int64_t r, std::int64_t layer, const kv_array& k_new,
                                               const kv_array& v_new) {
  if (r < 0 || r >= static_cast<std::int64_t>(rows.size()))
    throw std::logic_error("kv_cache: row " + std::to_string(r) + " of " + std::to_string(rows.size()));
  auto& s = rows[static_cast<std::size_t>(r)];
  const auto layers = static_cast<std::int64_t>(s.k.size());
  const auto n = k_new.size(KeyPos), H = k_new.size(Heads), D = k_new.size(HeadSize);
  const bool first = s.length == 0 && layer == layers;  // the first pass: the layers come in order
  if (!(first || (layer >= 0 && layer < layers)) || layer != s.appended || k_new.size(Batch) != 1 ||
      v_new.sizes() != k_new.sizes())
    throw std::logic_error("kv_cache: layer " + std::to_string(layer) + " of row " + std::to_string(r) +
                           " does not follow the cache (" + std::to_string(layers) + " layers of " +
                           std::to_string(s.length) + " positions, " + std::to_string(s.appended) +
                           " appended in this pass): the model's forward pass must append every layer of every "
                           "row once per call, one row at a time");
  // Room: twice the first input (at least 64 positions), doubled when full; within the row's limit or the model's
  // positions (so a prefill of most of seq_len does not copy itself at the first decoding step).
  const auto L = s.length;
  const auto most = s.limit > 0 ? s.limit : max_positions;
  auto room = [&](std::int64_t want) { return most > 0 ? std::max(L + n, std::min(want, most)) : want; };
  if (first) {
    const auto cap = room(std::max<std::int64_t>(2 * n, 64));
    s.k.push_back(grown(nullptr, 0, cap, H, D));
    s.v.push_back(grown(nullptr, 0, cap, H, D));
  }
  auto& kb = s.k[static_cast<std::size_t>(layer)];
  auto& vb = s.v[static_cast<std::size_t>(layer)];
  if (kb.size(Heads) != H || kb.size(HeadSize) != D)
    throw std::logic_error("kv_cache: layer " + std::to_string(layer) + " changed its heads or head size");
  if (L + n > kb.size(KeyPos)) {  // double the room: appends copy each position O(1) times on average
    const auto cap = room(std::max(2 * kb.size(KeyPos), L + n));
    kb = grown(&kb, L, cap, H, D);
    vb = grown(&vb, L, cap, H, D);
  }
  const auto row = static_cast<std::size_t>(H * D);
  const range at(static_cast<std::size_t>(L) * row, static_cast<std::size_t>(L + n) * row);
  const range from(0, static_cast<std::size_t>(n) * row);
  Kokkos::deep_copy(Kokkos::subview(kb.view(), at), Kokkos::subview(k_new.view(), from));
  Kokkos::deep_copy(Kokkos::subview(vb.view(), at), Kokkos::subview(v_new.view(), from));
  ++s.appended;
  // Views of exactly the row's positions (an array's buffer is as long as its elements: haliax::copy relies on it).
  const range held(0, static_cast<std::size_t>(L + n) * row);
  return {kv_array(Kokkos::subview(kb.view(), held), {1, L + n, H, D}, kb),
          kv_array(Kokkos::subview(vb.view(), held), {1, L + n, H, D}, vb)};
}

void kv_cache::advance(std::int64_t n) {
  for (std::size_t r = 0; r < rows.size(); ++r) {
    auto& s = rows[r];
    if (s.appended != static_cast<std::int64_t>(s.k.size()) || s.k.empty())
      throw std::logic_error("kv_cache: row " + std::to_string(r) + " appended " + std::to_string(s.appended) +
                             " of its " + std::to_string(s.k.size()) +
                             " layers in this forward pass: every layer must append every row once");
    s.length += n;
    s.appended = 0;
  }
}

void kv_cache::keep_rows(std::span<const std::int64_t> keep) {
  std::vector<sequence> kept;
  kept.reserve(keep.size());
  std::int64_t last = -1;
  for (const auto r : keep) {
    if (r <= last || r >= static_cast<std::int64_t>(rows.size()))
      throw std::out_of_range("kv_cache::keep_rows: row " + std::to_string(r) + " of " +
                              std::to_string(rows.size()) + " (rows ascending)");
    last = r;
    kept.push_back(std::move(rows[static_cast<std::size_t>(r)]));
  }
  rows = std::move(kept);
}

void kv_cache::splice(kv_cache&& other) {
  for (auto& s : other.rows) rows.push_back(std::move(s));
  other.rows.clear();
}

lm_example lm_example::causal(const token_batch& tokens, std::int64_t eos_id, std::int64_t ignore_id) {
  const auto B = tokens.size(Batch), P = tokens.size(Pos);
  auto host = tokens.to_host();
  std::vector<std::int32_t> seg(host.size());
  std::vector<std::uint8_t> keep(host.size());
  for (std::int64_t b = 0; b < B; ++b)
    data::causal_labels(host.data() + b * P, P, eos_id, ignore_id, keep.data() + b * P, seg.data() + b * P);
  return {tokens, hax::from_host(std::vector<bool>(keep.begin(), keep.end()), B * Batch, P * Pos),
          hax::from_host<std::int32_t>(seg, B * Batch, P * Pos)};
}

lm_example lm_example::labelled(const token_batch& tokens, const std::vector<std::uint8_t>& keep,
                                const std::vector<std::int32_t>& segments) {
  const auto B = tokens.size(Batch), P = tokens.size(Pos);
  if (keep.size() != static_cast<std::size_t>(B * P) || segments.size() != keep.size())
    throw std::invalid_argument("lm_example::labelled: the loss mask and segment ids must have batch x position "
                                "entries");
  return {tokens, hax::from_host(std::vector<bool>(keep.begin(), keep.end()), B * Batch, P * Pos),
          hax::from_host<std::int32_t>(segments, B * Batch, P * Pos)};
}

template <LmHeadWeight H>
scalar next_token_loss(const lm_hidden& h, const H& lm_head, const lm_example& ex, const loss_options& o) {
  namespace nn = haliax::nn;
  auto targets = hax::roll(ex.tokens, -1, Pos);
  const hax::where_mask keep{ex.loss_mask};
  if (o.cross_entropy_block_size && !o.logit_soft_cap)
    return nn::blockwise_cross_entropy_loss(h, lm_head, Embed, Vocab, targets, keep, *o.cross_entropy_block_size,
                                            nn::reduce_mean, o.z_loss_weight);
  auto logits = hax::dot(h, lm_head, Embed);
  if (o.logit_soft_cap) logits = hax::tanh(logits / *o.logit_soft_cap) * *o.logit_soft_cap;
  return nn::cross_entropy_loss(logits, Vocab, targets, keep, nn::reduce_mean, o.z_loss_weight);
}

template scalar next_token_loss(const lm_hidden&, const hax::named_array<float, hax::axes<Vocab, Embed>>&,
                                const lm_example&, const loss_options&);
template scalar next_token_loss(const lm_hidden&, const hax::named_array<float, hax::axes<Embed, Vocab>>&,
                                const lm_example&, const loss_options&);

namespace {

template <class H>
lm_logits_array logits_of(const lm_hidden& h, const H& lm_head, std::optional<double> soft_cap) {
  auto z = hax::rearrange<hax::axes<Batch, Pos, Vocab>>(hax::dot(h, lm_head, Embed));
  if (soft_cap) z = hax::tanh(z / *soft_cap) * *soft_cap;
  return z;
}

}  // namespace

lm_logits_array lm_head_logits(const lm_hidden& h, const hax::named_array<float, hax::axes<Vocab, Embed>>& lm_head,
                               std::optional<double> soft_cap) {
  return logits_of(h, lm_head, soft_cap);
}
lm_logits_array lm_head_logits(const lm_hidden& h, const hax::named_array<float, hax::axes<Embed, Vocab>>& lm_head,
                               std::optional<double> soft_cap) {
  return logits_of(h, lm_head, soft_cap);
}

}  // namespace levanter
