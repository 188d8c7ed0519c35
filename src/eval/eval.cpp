// levanter/eval.hpp: validation loss, per tag, and bits per byte.
#include <levanter/eval.hpp>

#include <algorithm>
#include <map>

#include <haliax/haliax.hpp>

namespace levanter::eval {

totals evaluate(const data::cache_windows& windows, const options& o, const data::tokenizer& tok,
                const batch_loss_fn& loss) {
  const std::int64_t n = windows.final_size();
  totals tot;
  if (n <= 0 || o.batch_size <= 0) return tot;
  const std::int64_t available = (n + o.batch_size - 1) / o.batch_size;
  const std::int64_t nb = o.max_batches > 0 ? std::min(available, o.max_batches) : available;
  const std::int64_t L = windows.seq_len();
  std::vector<std::int32_t> host, seg;
  std::vector<std::uint8_t> keep;
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::int64_t rows = std::min(o.batch_size, n - b * o.batch_size);
    const auto size = static_cast<std::size_t>(rows * L);
    host.assign(size, 0), keep.assign(size, 0), seg.assign(size, 0);
    for (std::int64_t r = 0; r < rows; ++r)
      windows.example(b * o.batch_size + r, o.eos_id, o.ignore_id, host.data() + r * L, keep.data() + r * L,
                      seg.data() + r * L);
    auto tokens = haliax::from_host<std::int32_t>(host, rows * Batch, L * Pos);
    const double mean = loss(lm_example::labelled(tokens, keep, seg));
    double targets = 0, bytes = 0;  // the trained positions and the bytes of the tokens they predict
    for (std::size_t i = 0; i < size; ++i) {
      if (!keep[i]) continue;
      targets += 1;
      bytes += double(tok.token_byte_length(host[i + 1]));
    }
    tot += totals{mean * targets, targets, bytes};
  }
  return tot;
}

report evaluate_tagged(const std::vector<data::validation_set>& sets, const options& o, const data::tokenizer& tok,
                       const batch_loss_fn& loss) {
  report out;
  out.metrics = json::object();
  if (sets.empty()) return out;
  totals all;
  std::map<std::string, totals> by_tag;
  std::vector<std::string> tag_order;
  for (const auto& v : sets) {
    const auto e = evaluate(*v.windows, o, tok, loss);
    all += e;
    for (const auto& tag : v.tags) {
      if (!by_tag.count(tag)) tag_order.push_back(tag);
      by_tag[tag] += e;
    }
  }
  if (all.targets == 0) return out;
  out.loss = all.loss();
  out.metrics = {{"eval/loss", all.loss()}, {"eval/bpb", all.bpb()}};
  double macro = 0;
  for (const auto& tag : tag_order) {
    out.metrics["eval/" + tag + "/loss"] = by_tag[tag].loss();
    out.metrics["eval/" + tag + "/bpb"] = by_tag[tag].bpb();
    macro += by_tag[tag].loss();
  }
  if (!tag_order.empty()) out.metrics["eval/macro_loss"] = macro / double(tag_order.size());
  out.line = "loss " + std::to_string(all.loss()) + "  bpb " + std::to_string(all.bpb());
  for (const auto& tag : tag_order) out.line += "  " + tag + " " + std::to_string(by_tag[tag].loss());
  return out;
}

}  // namespace levanter::eval
