// What every language model shares (levanter/models/lm.hpp): examples, the next-token loss and the LM head's
// logits, compiled once for both head layouts.
#include <vector>

#include <haliax/haliax.hpp>
#include <levanter/data/packing.hpp>
#include <levanter/models/lm.hpp>
#include <stdexcept>

namespace levanter {

std::pair<const kv_cache::kv_array&, const kv_cache::kv_array&> kv_cache::append(std::int64_t layer,
                                                                                 const kv_array& k_new,
                                                                                 const kv_array& v_new) {
  const auto n = static_cast<std::int64_t>(k.size());
  if (length == 0 && layer == n) {  // the first pass: the layers come in order
    k.push_back(k_new);
    v.push_back(v_new);
  } else if (layer >= 0 && layer < n && k[static_cast<std::size_t>(layer)].size(KeyPos) == length) {
    auto& kl = k[static_cast<std::size_t>(layer)];
    auto& vl = v[static_cast<std::size_t>(layer)];
    kl = hax::concatenate(KeyPos, kl, k_new);
    vl = hax::concatenate(KeyPos, vl, v_new);
  } else {
    throw std::logic_error("kv_cache: layer " + std::to_string(layer) + " does not follow the cache (" +
                           std::to_string(n) + " layers of " + std::to_string(length) +
                           " positions): the model's forward pass must append every layer once per call");
  }
  return {k[static_cast<std::size_t>(layer)], v[static_cast<std::size_t>(layer)]};
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
