// data/text.hpp: windows of seq_len tokens over a token stream.
#include <haliax/random.hpp>
#include <levanter/data/text.hpp>
#include <stdexcept>

namespace levanter::data {

token_windows::token_windows(std::vector<std::int32_t> tokens, std::int64_t seq_len)
    : tokens_(std::move(tokens)), seq_len_(seq_len) {
  if (seq_len <= 0) throw std::invalid_argument("token_windows: seq_len must be positive");
  count_ = static_cast<std::int64_t>(tokens_.size()) / seq_len;
}

void token_windows::shuffle(haliax::random::key key) {
  auto p = haliax::random::permutation(key, count_ * Examples).to_host();
  order_.assign(p.begin(), p.end());
}

void token_windows::window(std::int64_t i, std::int32_t* out) const {
  std::int64_t w = i % count_;
  if (!order_.empty()) w = order_[static_cast<std::size_t>(w)];
  std::copy_n(tokens_.data() + w * seq_len_, seq_len_, out);
}

std::vector<std::int32_t> token_windows::examples(std::int64_t first, std::int64_t n) const {
  std::vector<std::int32_t> out(static_cast<std::size_t>(n * seq_len_));
  for (std::int64_t r = 0; r < n; ++r) window(first + r, out.data() + r * seq_len_);
  return out;
}

}  // namespace levanter::data
