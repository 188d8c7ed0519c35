// levanter/eval.hpp: evaluation of a language model on the validation sets (upstream `levanter.eval`,
// TaggedEvaluator): the next-token loss over every validation window, per dataset name and tag, and bits per byte.
// The model enters through one function, the mean loss of a batch, so this compiles once for every model.
//
//   auto r = levanter::eval::evaluate_tagged(data.validation_sets(), opts, data.tok(),
//       [&](const levanter::lm_example& ex) { return levanter::compute_next_token_loss(model, mc, ex).item(); });
//   tracker.log(r.metrics, step);     // eval/loss, eval/bpb, eval/<tag>/loss, eval/<tag>/bpb, eval/macro_loss
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <levanter/data/lm_data.hpp>
#include <levanter/models/lm.hpp>
#include <levanter/tracker/tracker.hpp>

namespace levanter::eval {

/// What an evaluation adds up: the summed next-token loss (nats), the predicted tokens, and the UTF-8 bytes they
/// stand for (for bits per byte).
struct totals {
  double nll = 0;
  double targets = 0;
  double bytes = 0;
  double loss() const { return targets > 0 ? nll / targets : std::nan(""); }
  double bpb() const { return bytes > 0 ? nll / std::log(2.0) / bytes : std::nan(""); }
  totals& operator+=(const totals& o) {
    nll += o.nll;
    targets += o.targets;
    bytes += o.bytes;
    return *this;
  }
};

struct options {
  std::int64_t batch_size = 1;   ///< windows per batch
  std::int64_t max_batches = 0;  ///< batches per validation set at most (0: all)
  std::int64_t eos_id = -1;      ///< segment boundaries (-1: none)
  std::int64_t ignore_id = -100;
};

/// The mean next-token loss of a batch (over its kept tokens).
using batch_loss_fn = std::function<double(const lm_example&)>;

/// The loss over the windows of one validation set, in batches of `batch_size`; the last batch holds the windows
/// left over (upstream pads it and masks the padding out, which adds up to the same).
totals evaluate(const data::cache_windows& windows, const options& o, const data::tokenizer& tok,
                const batch_loss_fn& loss);

/// One evaluation of every validation set, as upstream's TaggedEvaluator reports it.
struct report {
  std::optional<double> loss;  ///< eval/loss (none when there is no validation data)
  json metrics;                ///< eval/loss, eval/bpb, eval/<tag>/loss, eval/<tag>/bpb, eval/macro_loss
  std::string line;            ///< "eval loss 4.2 bpb 3.1  tag 4.0 ..." for the log
};
report evaluate_tagged(const std::vector<data::validation_set>& sets, const options& o, const data::tokenizer& tok,
                       const batch_loss_fn& loss);

}  // namespace levanter::eval
