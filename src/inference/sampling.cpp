// Sampling (levanter/inference/generate.hpp): temperature, top-k, top-p and a counter-based draw, so that a token
// depends only on the logits, the options, the seed and its index.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include <levanter/inference/generate.hpp>

namespace levanter {

namespace {

// SplitMix64 of (seed, index): a uniform double in [0, 1) per generated token.
double uniform01(std::uint64_t seed, std::int64_t index) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(index) + 0x632BE59BD9B4E019ull;
  for (int r = 0; r < 2; ++r) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
  }
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

}  // namespace

std::pair<std::int32_t, double> choose_token(std::span<const float> logits, const sampling_options& s,
                                             std::int64_t index) {
  if (!(s.temperature >= 0)) throw std::invalid_argument("temperature must be at least 0");
  if (s.top_k < 0) throw std::invalid_argument("top_k must be at least 0 (0 keeps every token)");
  if (!(s.top_p > 0 && s.top_p <= 1)) throw std::invalid_argument("top_p must be in (0, 1]");
  const auto n = logits.size();
  if (n == 0) throw std::invalid_argument("no logits to sample from");
  // Tokens by logit, highest first (ties: lower id first); NaN logits are never chosen.
  std::vector<std::int32_t> order;
  order.reserve(n);
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isnan(logits[i]) && logits[i] > -std::numeric_limits<float>::infinity())
      order.push_back(static_cast<std::int32_t>(i));
  if (order.empty()) throw std::invalid_argument("every logit is -inf or NaN: no token can be chosen");
  const auto by_logit = [&](std::int32_t a, std::int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (s.temperature == 0) {
    const auto best = *std::min_element(order.begin(), order.end(), by_logit);
    // greedy: the token's probability under the plain softmax
    double z = 0;
    for (auto i : order) z += std::exp(static_cast<double>(logits[i]) - logits[best]);
    return {best, -std::log(z)};
  }
  std::size_t keep = order.size();
  if (s.top_k > 0 && static_cast<std::size_t>(s.top_k) < keep) {
    std::partial_sort(order.begin(), order.begin() + s.top_k, order.end(), by_logit);
    keep = static_cast<std::size_t>(s.top_k);
  } else {
    std::sort(order.begin(), order.end(), by_logit);
  }
  order.resize(keep);
  std::vector<double> p(keep);
  const double top = logits[order[0]] / s.temperature;
  double z = 0;
  for (std::size_t i = 0; i < keep; ++i) z += p[i] = std::exp(logits[order[i]] / s.temperature - top);
  for (auto& x : p) x /= z;
  if (s.top_p < 1) {  // the smallest prefix whose mass reaches top_p (at least one token)
    double c = 0;
    std::size_t m = 0;
    while (m < keep && (m == 0 || c < s.top_p)) c += p[m++];
    keep = m;
    p.resize(keep);
    for (auto& x : p) x /= c;
  }
  const double u = uniform01(s.seed, index);
  double c = 0;
  std::size_t pick = keep - 1;
  for (std::size_t i = 0; i < keep; ++i) {
    c += p[i];
    if (u < c) {
      pick = i;
      break;
    }
  }
  return {order[pick], std::log(p[pick])};
}

bool ends_generation(std::span<const std::int32_t> tokens, const sampling_options& s) {
  if (tokens.empty()) return false;
  if (std::find(s.stop_tokens.begin(), s.stop_tokens.end(), tokens.back()) != s.stop_tokens.end()) return true;
  for (const auto& q : s.stop_sequences)
    if (!q.empty() && q.size() <= tokens.size() && std::equal(q.rbegin(), q.rend(), tokens.rbegin())) return true;
  return false;
}

decoder::decoder(logits_fn logits, std::int64_t positions, std::vector<std::int32_t> prompt, sampling_options s)
    : logits_(std::move(logits)), positions_(positions), all_(std::move(prompt)), s_(std::move(s)) {
  if (all_.empty()) throw std::invalid_argument("generate: the prompt has no tokens");
  prompt_len_ = static_cast<std::int64_t>(all_.size());
  if (prompt_len_ > positions_)
    throw std::invalid_argument("generate: the prompt has " + std::to_string(prompt_len_) + " tokens, more than the " +
                                std::to_string(positions_) + " positions of the model");
  out_.finish_reason = "length";
  if (s_.max_new_tokens <= 0) done_ = true;
}

bool decoder::step() {
  if (done_) return false;
  if (!logits_) throw std::logic_error("decoder: no logits function; the caller runs the forward passes (accept)");
  return accept(logits_(cache_, next_input(), 1));
}

std::span<const std::int32_t> decoder::next_input() const {
  // The prefill runs the whole prompt; each later step the token chosen last.
  if (out_.tokens.empty()) return all_;
  return std::span<const std::int32_t>(&all_.back(), 1);
}

bool decoder::accept(std::span<const float> logits) {
  if (done_) return false;
  const std::int64_t i = static_cast<std::int64_t>(out_.tokens.size());
  const auto [id, lp] = choose_token(logits, s_, i);
  out_.tokens.push_back(id);
  out_.logprobs.push_back(lp);
  all_.push_back(id);
  if (ends_generation(out_.tokens, s_)) {
    out_.finish_reason = "stop";
    done_ = true;
  } else if (i + 1 == s_.max_new_tokens || static_cast<std::int64_t>(all_.size()) >= positions_) {
    done_ = true;
  }
  return !done_;
}

std::vector<generation> generate_batch(const logits_fn& logits, std::int64_t positions,
                                       const std::vector<std::vector<std::int32_t>>& prompts,
                                       const std::vector<sampling_options>& options, std::int64_t max_batch) {
  if (prompts.size() != options.size())
    throw std::invalid_argument("generate_batch: " + std::to_string(prompts.size()) + " prompts and " +
                                std::to_string(options.size()) + " sampling options");
  if (max_batch <= 0) throw std::invalid_argument("generate_batch: the batch must hold at least one sequence");
  std::vector<decoder> ds;
  ds.reserve(prompts.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) ds.emplace_back(logits_fn{}, positions, prompts[i], options[i]);
  kv_cache batch;
  std::vector<std::size_t> live;  // the decoder of each batch row
  std::size_t next = 0;
  while (next < ds.size() || !live.empty()) {
    // Prefill the next prompts alone, and let the unfinished ones join the batch.
    while (next < ds.size() && static_cast<std::int64_t>(live.size()) < max_batch) {
      auto& d = ds[next];
      if (!d.done()) {
        kv_cache own;
        if (d.accept(logits(own, d.next_input(), 1))) {
          batch.splice(std::move(own));
          live.push_back(next);
        }
      }
      ++next;
    }
    if (live.empty()) continue;
    std::vector<std::int32_t> ids;
    for (const auto k : live) ids.push_back(ds[k].next_input().front());
    const auto out = logits(batch, ids, static_cast<std::int64_t>(live.size()));
    const std::size_t vocab = out.size() / live.size();
    std::vector<std::int64_t> keep;
    std::vector<std::size_t> still;
    for (std::size_t r = 0; r < live.size(); ++r)
      if (ds[live[r]].accept(std::span<const float>(out.data() + r * vocab, vocab))) {
        keep.push_back(static_cast<std::int64_t>(r));
        still.push_back(live[r]);
      }
    if (still.size() != live.size()) batch.keep_rows(keep);
    live = std::move(still);
  }
  std::vector<generation> results;
  results.reserve(ds.size());
  for (const auto& d : ds) results.push_back(d.result());
  return results;
}

void decoder::finish(std::string reason) {
  out_.finish_reason = std::move(reason);
  done_ = true;
}

}  // namespace levanter
