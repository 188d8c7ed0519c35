// data/mixture.hpp: upstream's block-deterministic dataset mixture.
#include <algorithm>
#include <cmath>
#include <levanter/data/mixture.hpp>
#include <list>
#include <mutex>
#include <numeric>
#include <stdexcept>

namespace levanter::data {

std::vector<mixture_stage> mixture_stages_from_steps(std::vector<mixture_stage> stages, std::int64_t batch_size,
                                                     std::int64_t block_size) {
  if (batch_size <= 0) throw data_error("mixture: batch size must be positive, got " + std::to_string(batch_size));
  std::int64_t previous_step = 0;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const std::int64_t step = stages[i].start;
    const std::string where = "data.train_weights[" + std::to_string(i) + "]";
    if (step < 0)
      throw data_error(where + ": step " + std::to_string(step) +
                       " is negative; stages start at a training step >= 0 (the first at 0)");
    if (i == 0 && step != 0)
      throw data_error(where + ": the first stage must start at step 0, not " + std::to_string(step));
    const std::int64_t offset = step * batch_size;
    if (i > 0) {
      if (step <= previous_step)
        throw data_error(where + ": stages must be sorted by step; step " + std::to_string(step) +
                         " does not come after step " + std::to_string(previous_step));
      if (block_size > 0 && offset % block_size != 0)
        throw data_error(where + ": stage starts at step " + std::to_string(step) + ", i.e. example " +
                         std::to_string(offset) + " (step x batch size " + std::to_string(batch_size) +
                         "), which is not a multiple of data.mixture_block_size = " + std::to_string(block_size) +
                         "; pick a step that is a multiple of " +
                         std::to_string(block_size / std::gcd(block_size, batch_size)) +
                         " or change mixture_block_size");
    }
    stages[i].start = offset;
    previous_step = step;
  }
  return stages;
}

struct mixture_index::block_cache {
  std::mutex mutex;
  std::list<std::pair<std::int64_t, std::shared_ptr<const std::vector<std::int32_t>>>> entries;
};

stop_strategy parse_stop_strategy(const std::string& name) {
  if (name == "restart") return stop_strategy::restart;
  if (name == "first_exhausted") return stop_strategy::first_exhausted;
  if (name == "all_exhausted") return stop_strategy::all_exhausted;
  throw data_error("data.stop_strategy: unknown stop strategy '" + name +
                   "'; use restart, first_exhausted or all_exhausted");
}

const char* to_string(stop_strategy s) {
  switch (s) {
    case stop_strategy::first_exhausted: return "first_exhausted";
    case stop_strategy::all_exhausted: return "all_exhausted";
    case stop_strategy::restart: break;
  }
  return "restart";
}

mixture_index::mixture_index(std::vector<std::string> names, std::vector<mixture_stage> stages, std::int64_t block_size,
                             haliax::random::key key, std::vector<std::int64_t> lengths, stop_strategy stop)
    : names_(std::move(names)),
      block_size_(block_size),
      key_(key),
      lengths_(std::move(lengths)),
      cache_(std::make_shared<block_cache>()),
      stop_(stop) {
  if (names_.empty()) throw data_error("mixture: data.configs is empty; give at least one dataset");
  if (lengths_.size() != names_.size())
    throw std::invalid_argument("levanter::data::mixture_index: " + std::to_string(names_.size()) + " names but " +
                                std::to_string(lengths_.size()) + " lengths");
  if (stages.empty()) throw data_error("data.train_weights: no weights given; give {name: weight, ...}");
  if (block_size_ <= 0 || block_size_ >= (1 << 16))
    throw data_error("data.mixture_block_size: must be in [1, 65535] (ids pack the index in 16 bits), got " +
                     std::to_string(block_size_));
  const std::size_t n = names_.size();

  // Normalise each stage's weights (upstream _normalize_weights) after checking the names.
  std::vector<std::vector<double>> stage_w;  // per stage, per configured dataset
  for (std::size_t s = 0; s < stages.size(); ++s) {
    const std::string where =
        stages.size() == 1 ? std::string("data.train_weights") : "data.train_weights[" + std::to_string(s) + "]";
    if (s == 0 && stages[s].start != 0)
      throw data_error(where + ": the first stage must start at example 0, not " + std::to_string(stages[s].start));
    if (s > 0 && stages[s].start % block_size_ != 0)
      throw data_error(where + ": stage start " + std::to_string(stages[s].start) +
                       " is not a multiple of data.mixture_block_size = " + std::to_string(block_size_));
    if (s > 0 && stages[s].start <= stages[s - 1].start)
      throw data_error(where + ": stages must be sorted; start " + std::to_string(stages[s].start) +
                       " does not come after " + std::to_string(stages[s - 1].start));
    double total = 0;
    for (const auto& [name, w] : stages[s].weights) {
      if (std::find(names_.begin(), names_.end(), name) == names_.end())
        throw data_error(where + "." + name + ": no dataset '" + name + "' in data.configs (known: " + joined() + ")");
      if (!std::isfinite(w)) throw data_error(where + "." + name + ": weight must be a finite number");
      if (w < 0) throw data_error(where + "." + name + ": weight " + format(w) + " is negative; weights must be >= 0");
      total += w;
    }
    if (total == 0) throw data_error(where + ": the weights sum to 0; give at least one dataset a positive weight");
    std::vector<double> w(n, 0.0);
    for (const auto& [name, wt] : stages[s].weights)
      if (wt > 0) w[position(name)] = wt / total;
    stage_w.push_back(std::move(w));
    starts_.push_back(stages[s].start);
  }

  // Datasets in use: a positive weight in some stage, in config order.
  for (std::size_t i = 0; i < n; ++i) {
    bool any = false;
    for (const auto& w : stage_w) any = any || w[i] > 0;
    if (!any) continue;
    if (lengths_[i] <= 0)
      throw data_error("data.configs." + names_[i] + ": the dataset has no examples (length " +
                       std::to_string(lengths_[i]) + ") but a positive weight in data.train_weights");
    used_.push_back(i);
  }

  // Per-block counts per stage, and the cumulative counts at each stage's end (upstream
  // _initialize_stage_counts).
  const std::size_t u = used_.size();
  std::vector<std::int64_t> cumulative(u, 0);
  for (std::size_t s = 0; s < stage_w.size(); ++s) {
    std::vector<std::int64_t> c(u, 0);
    std::int64_t sum = 0;
    for (std::size_t d = 0; d < u; ++d) {
      c[d] = static_cast<std::int64_t>(stage_w[s][used_[d]] * static_cast<double>(block_size_));
      sum += c[d];
    }
    const std::size_t largest = static_cast<std::size_t>(std::max_element(c.begin(), c.end()) - c.begin());
    c[largest] += block_size_ - sum;
    for (std::size_t d = 0; d < u; ++d)
      if (c[d] == 0 && stage_w[s][used_[d]] > 0)
        warnings_.push_back("mixture: dataset '" + names_[used_[d]] + "' has 0 examples per block of " +
                            std::to_string(block_size_) + " in stage " + std::to_string(s) + " (weight " +
                            format(stage_w[s][used_[d]]) + "); increase data.mixture_block_size");
    if (s + 1 < stage_w.size()) {
      const std::int64_t blocks = (stages[s + 1].start - stages[s].start) / block_size_;
      for (std::size_t d = 0; d < u; ++d) cumulative[d] += c[d] * blocks;
      after_stage_.push_back(cumulative);
    }
    std::vector<std::int32_t> ids;
    ids.reserve(static_cast<std::size_t>(block_size_));
    for (std::size_t d = 0; d < u; ++d)
      for (std::int64_t k = 0; k < c[d]; ++k) ids.push_back(static_cast<std::int32_t>((d << 16) + k));
    unpermuted_.push_back(std::move(ids));
    counts_.push_back(std::move(c));
  }

  // A finite mixture's length (upstream _compute_finite_length_or_none): one past the first (first_exhausted) or
  // the last (all_exhausted) example at which a dataset yields its last example.
  if (stop_ == stop_strategy::restart) return;
  std::optional<std::int64_t> end;
  for (std::size_t pos : used_) {
    const auto at = exhaustion_index(pos, lengths_[pos]);
    if (!at) {
      if (stop_ == stop_strategy::all_exhausted) return;  // this one is never used up: endless
      continue;
    }
    end = !end ? *at : stop_ == stop_strategy::first_exhausted ? std::min(*end, *at) : std::max(*end, *at);
  }
  if (end) length_ = *end + 1;
}

std::optional<std::int64_t> mixture_index::exhaustion_index(std::size_t position, std::int64_t count) const {
  const auto it = std::find(used_.begin(), used_.end(), position);
  if (it == used_.end() || count < 1)
    throw std::invalid_argument("levanter::data::mixture_index::exhaustion_index: dataset " +
                                std::to_string(position) + " is not in use or count " + std::to_string(count) +
                                " < 1");
  const auto d = static_cast<std::size_t>(it - used_.begin());
  for (std::size_t s = 0; s < counts_.size(); ++s) {
    const std::int64_t per_block = counts_[s][d];
    const std::int64_t before = s > 0 ? after_stage_[s - 1][d] : 0;  // its examples drawn before stage s
    if (count <= before || per_block == 0) continue;
    if (s + 1 < counts_.size() && count > before + per_block * ((starts_[s + 1] - starts_[s]) / block_size_))
      continue;  // not reached within this stage
    const std::int64_t blocks_in = (count - before - 1) / per_block;
    const std::int64_t block = starts_[s] / block_size_ + blocks_in;
    std::int64_t occurrence = count - (before + blocks_in * per_block) - 1;  // its how-manieth in that block
    const auto ids = block_ids(block);
    for (std::size_t i = 0; i < ids->size(); ++i)
      if (static_cast<std::size_t>((*ids)[i] >> 16) == d && occurrence-- == 0)
        return block * block_size_ + static_cast<std::int64_t>(i);
    throw std::logic_error("levanter::data::mixture_index: block " + std::to_string(block) + " holds fewer than " +
                           std::to_string(per_block) + " examples of dataset " + std::to_string(position));
  }
  return std::nullopt;
}

std::pair<std::size_t, std::int64_t> mixture_index::operator()(std::int64_t global_index) const {
  if (global_index < 0)
    throw std::out_of_range("levanter::data::mixture_index: negative index " + std::to_string(global_index));
  if (length_ && global_index >= *length_)
    throw data_error("mixture: example " + std::to_string(global_index) + " is past the end of the mixture (" +
                     std::to_string(*length_) + " examples with stop_strategy " + to_string(stop_) + ")");
  const std::int64_t block = global_index / block_size_;
  const auto ids = block_ids(block);
  return resolve((*ids)[static_cast<std::size_t>(global_index % block_size_)], block);
}

std::vector<std::pair<std::size_t, std::int64_t>> mixture_index::batch(std::int64_t start, std::int64_t count) const {
  std::vector<std::pair<std::size_t, std::int64_t>> out;
  out.reserve(static_cast<std::size_t>(std::max<std::int64_t>(count, 0)));
  for (std::int64_t i = start; i < start + count; ++i) out.push_back((*this)(i));
  return out;
}

std::vector<std::int64_t> mixture_index::block_counts(std::int64_t block) const {
  std::vector<std::int64_t> out(names_.size(), 0);
  const auto& c = counts_[stage_of_block(block)];
  for (std::size_t d = 0; d < used_.size(); ++d) out[used_[d]] = c[d];
  return out;
}

std::shared_ptr<const std::vector<std::int32_t>> mixture_index::block_ids(std::int64_t block) const {
  {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    for (auto it = cache_->entries.begin(); it != cache_->entries.end(); ++it)
      if (it->first == block) {
        cache_->entries.splice(cache_->entries.begin(), cache_->entries, it);
        return it->second;
      }
  }
  const auto& base = unpermuted_[stage_of_block(block)];
  namespace tf = haliax::detail::threefry;
  const auto mode =
      haliax::random::threefry_partitionable() ? tf::counter_mode::partitionable : tf::counter_mode::original;
  const auto k = haliax::random::fold_in(key_, static_cast<std::uint32_t>(block));
  const auto perm = haliax::detail::random_dists::permutation(k.data(), base.size(), mode);
  auto ids = std::make_shared<std::vector<std::int32_t>>(base.size());
  for (std::size_t i = 0; i < base.size(); ++i) (*ids)[i] = base[static_cast<std::size_t>(perm[i])];
  std::lock_guard<std::mutex> lock(cache_->mutex);
  cache_->entries.emplace_front(block, ids);
  if (cache_->entries.size() > cache_capacity) cache_->entries.pop_back();
  return ids;
}

std::size_t mixture_index::stage_of_block(std::int64_t block) const {
  const std::int64_t start = block * block_size_;
  const auto it = std::upper_bound(starts_.begin(), starts_.end(), start);
  return it == starts_.begin() ? 0 : static_cast<std::size_t>(it - starts_.begin() - 1);
}

std::pair<std::size_t, std::int64_t> mixture_index::resolve(std::int32_t id, std::int64_t block) const {
  const std::size_t s = stage_of_block(block);
  const auto d = static_cast<std::size_t>(id >> 16);
  const std::int64_t k = id & 0xffff;
  const std::int64_t base = s > 0 ? after_stage_[s - 1][d] : 0;
  const std::int64_t in_stage = (block * block_size_ - starts_[s]) / block_size_;
  const std::int64_t index = k + base + in_stage * counts_[s][d];
  return {used_[d], index % lengths_[used_[d]]};
}

std::size_t mixture_index::position(const std::string& name) const {
  return static_cast<std::size_t>(std::find(names_.begin(), names_.end(), name) - names_.begin());
}

std::string mixture_index::joined() const {
  std::string s;
  for (const auto& n : names_) s += (s.empty() ? "" : ", ") + n;
  return s;
}

std::string mixture_index::format(double w) {
  std::string s = std::to_string(w);
  return s;
}

mixture_keys make_mixture_keys(haliax::random::key data_key, std::size_t datasets_in_use) {
  const auto [mix, shuffle] = haliax::random::split(data_key);
  mixture_keys out{mix, {}};
  auto k = shuffle;
  for (std::size_t i = 0; i < datasets_in_use; ++i) {
    const auto [next, sub] = haliax::random::split(k);
    out.component.push_back(sub);
    k = next;
  }
  return out;
}

}  // namespace levanter::data
