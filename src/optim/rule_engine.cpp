// The model-independent half of every rule optimizer (levanter/optim/rule.hpp): compiled once here instead of once
// per model in each program that instantiates rule_optimizer<M>.
#include <levanter/optim/rule.hpp>

namespace levanter::optim {

rule_engine::rule_engine(rule_def rule, const OptimizerConfig& cfg, std::int64_t num_train_steps,
                         std::vector<leaf_desc> descs, const std::optional<std::vector<bool>>& mask)
    : rule_(std::move(rule)),
      schedule_(make_lr_schedule(cfg, num_train_steps)),
      descs_(std::move(descs)),
      skip_(skip_steps_of(cfg)) {
  detail::check_rule_placement(rule_.type);
  if (skip_) {
    skip_losses_ = rolling_window::with_capacity(skip_->rolling_interval_length);
    skip_grad_norms_ = rolling_window::with_capacity(skip_->rolling_interval_length);
  }
  if (cfg.update_rms_clipping && *cfg.update_rms_clipping <= 0)
    throw std::invalid_argument("optimizer.update_rms_clipping: must be a positive number or unset");
  if (cfg.update_rms_clipping && cfg.clip_update_norm)
    throw std::invalid_argument(
        "optimizer.clip_update_norm: cannot be used together with update_rms_clipping; unset one of them");
  if (cfg.clip_update_norm && cfg.clip_update_norm->rolling_interval_length < 1)
    throw std::invalid_argument("optimizer.clip_update_norm.rolling_interval_length: must be at least 1");
  rms_clip_ = cfg.update_rms_clipping;
  clip_norm_ = cfg.clip_update_norm;
  if (clip_norm_) update_norms_ = rolling_window::with_capacity(clip_norm_->rolling_interval_length);
  if (rule_.buffers.size() > 4) throw std::logic_error("rule_optimizer: at most 4 state buffers");
  if (rule_.groups.empty()) throw std::logic_error("rule_optimizer: a rule needs a group");
  for (const auto& d : descs_) {
    const std::size_t g = rule_.label ? rule_.label(d) : 0;
    if (g >= rule_.groups.size()) throw std::logic_error("rule_optimizer: a label names no group");
    group_.push_back(g);
  }
  for (std::size_t i = 0; i < descs_.size(); ++i) {
    const auto& g = rule_.groups[group_[i]];
    leaf_state_.push_back(g.leaf_state ? g.leaf_state(descs_[i]) : leaf_arrays{});
  }
  words_ = rule_.words;
  for (const auto& g : rule_.groups) {
    wd_.push_back(g.weight_decay.value_or(cfg.weight_decay));
    if (g.peak_lr) {
      OptimizerConfig own = cfg;
      own.learning_rate = *g.peak_lr;
      schedules_.push_back(make_lr_schedule(own, num_train_steps));
    } else {
      schedules_.push_back(schedule_);
    }
    has_leaf_work_ = has_leaf_work_ || static_cast<bool>(g.leaf) || static_cast<bool>(g.leaf_with_state);
  }
  if (mask && mask->size() != descs_.size()) throw std::logic_error("rule_engine: the mask does not match the leaves");
  for (std::size_t i = 0; i < descs_.size(); ++i) decay_.push_back(wd_[group_[i]] > 0 && (!mask || (*mask)[i]));
}

void rule_engine::save_scalars(checkpoint::snapshot& s) const {
  s.add_scalar("count", count_);
  for (const auto& [name, v] : words_) s.add_scalar(name, v);
  if (clip_norm_) detail::add_window(s, "update_norms", update_norms_);
  for (std::size_t l = 0; l < leaf_state_.size(); ++l)
    for (const auto& [name, v] : leaf_state_[l].arrays) s.add_vector(name + "." + descs_[l].path, v);
  if (!skip_) return;
  s.add_scalar("applied", applied_);
  detail::add_window(s, "skip_losses", skip_losses_);
  detail::add_window(s, "skip_grad_norms", skip_grad_norms_);
}
void rule_engine::load_scalars(const checkpoint::reader& r) {
  count_ = r.scalar<std::int64_t>("count");
  applied_ = count_;
  for (auto& [name, v] : words_) v = r.scalar<std::int64_t>(name);
  if (clip_norm_) detail::read_window(r, "update_norms", update_norms_);
  for (std::size_t l = 0; l < leaf_state_.size(); ++l)
    for (auto& [name, v] : leaf_state_[l].arrays) {
      const std::string key = name + "." + descs_[l].path;
      auto got = r.vector<float>(key);
      if (got.size() != v.size())
        throw checkpoint::error("'" + key + "' holds " + std::to_string(got.size()) + " values but optimizer '" +
                                std::string(rule_.type) + "' needs " + std::to_string(v.size()) +
                                " for this model: the checkpoint was written for another model or optimizer "
                                "config");
      v = std::move(got);
    }
  if (!skip_) return;
  applied_ = r.scalar<std::int64_t>("applied");
  detail::read_window(r, "skip_losses", skip_losses_);
  detail::read_window(r, "skip_grad_norms", skip_grad_norms_);
}
void rule_engine::check_tensor_parallel() const {
  if (rms_clip_)
    throw std::invalid_argument(
        "optimizer.update_rms_clipping: not supported with tensor parallelism "
        "(trainer.model_axis_size > 1); use clip_update_norm or max_grad_norm");
  if (rule_.probe)
    throw std::invalid_argument("optimizer.type '" + std::string(rule_.type) +
                                "': not supported with tensor parallelism (trainer.model_axis_size > 1) yet: its "
                                "Hessian probes are drawn over whole leaves; use model_axis_size: 1 (FSDP and "
                                "ZeRO-1 work)");
  if (has_leaf_work_)
    throw std::invalid_argument("optimizer.type '" + std::string(rule_.type) +
                                "': not supported with tensor parallelism (trainer.model_axis_size > 1): its update "
                                "needs each matrix whole on one rank; use model_axis_size: 1 (FSDP and ZeRO-1 work)");
}

update_stats rule_engine::run(std::vector<layout::leaf_ref>& leaves, float* p_flat, const float* g_flat, double loss,
                              const placement& where) {
  const auto* sh = where.sh;
  const auto* ts = where.ts;
  if (ts && ts->split.size() != leaves.size())
    throw std::invalid_argument("levanter::optim: the tensor split does not match the parameters");
  std::size_t num_slices = 0;
  const auto chunks = layout::make_chunks(leaves, &num_slices);
  std::size_t c_lo = 0, c_hi = chunks.size();
  if (sh) {
    while (c_lo < chunks.size() && chunks[c_lo].flat < sh->lo()) ++c_lo;
    c_hi = c_lo;
    while (c_hi < chunks.size() && chunks[c_hi].flat < sh->hi()) ++c_hi;
  }
  const std::int64_t lo = sh ? sh->lo() : 0;
  const std::size_t ng = rule_.groups.size();
  auto group_of = [&](std::size_t ci) { return group_[chunks[ci].leaf]; };
  // One chunk's pointers: sharded state lives in the flat buffers at the chunk's offset in this rank's range.
  auto at = [&](std::size_t ci) {
    const auto& ch = chunks[ci];
    const auto& l = leaves[ch.leaf];
    rule_chunk c{};
    c.n = ch.end - ch.begin;
    c.decay = decay_[ch.leaf] != 0;
    if (p_flat) {
      c.p = p_flat + (ch.flat - lo);
      c.g = g_flat + (ch.flat - lo);
    } else {
      c.p = l.p + ch.begin;
      c.g = l.g + ch.begin;
    }
    for (std::size_t b = 0; b < rule_.buffers.size(); ++b)
      c.s[b] = sh ? where.state[b][0] + (ch.flat - lo) : where.state[b][ch.leaf] + ch.begin;
    c.x = scratch_.empty() ? nullptr : scratch_.data() + ch.flat;
    c.aux = where.aux ? where.aux + (ch.flat - where.aux_lo) : nullptr;
    return c;
  };
  auto all_chunks = [&](std::vector<double> part) {
    return sh ? distributed::allgather_doubles(*sh->comm, part) : part;
  };
  // Per group: the chunks' values summed in chunk order (a split leaf's over the model group).
  auto totals = [&](const std::vector<double>& sq) {
    std::vector<double> rep(ng, 0.0), spl(ng, 0.0);
    for (std::size_t i = 0; i < sq.size(); ++i) (ts && ts->split[chunks[i].leaf] ? spl : rep)[group_of(i)] += sq[i];
    if (ts)
      for (std::size_t g = 0; g < ng; ++g) rep[g] += distributed::allreduce_sum(*ts->group, spl[g]);
    return rep;
  };
  auto sum_of = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s;
  };
  // Runs `f(group, chunk)` for this rank's chunks whose group has `has`, in parallel; values in chunk order.
  const std::size_t mine = c_hi - c_lo;
  auto each_chunk = [&](auto has, auto&& f) {
    return all_chunks(layout::per_chunk(mine, [&](std::int64_t i) -> double {
      const std::size_t ci = c_lo + static_cast<std::size_t>(i);
      const auto& grp = rule_.groups[group_of(ci)];
      return has(grp) ? f(grp, ci) : 0.0;
    }));
  };

  update_stats stats;
  const auto gsq = totals(each_chunk([](const rule_group&) { return true; },
                                     [&](const rule_group&, std::size_t ci) {
                                       const auto c = at(ci);
                                       double s = 0;
                                       for (std::int64_t k = 0; k < c.n; ++k) s += static_cast<double>(c.g[k]) * c.g[k];
                                       return s;
                                     }));
  stats.grad_norm = std::sqrt(ng == 1 ? gsq[0] : sum_of(gsq));
  stats.learning_rate = schedule_(count_);
  if (skip_) stats.skipped = skip_step(*skip_, skip_losses_, skip_grad_norms_, loss, stats.grad_norm);
  if (stats.skipped) {  // the schedule advances; the parameters, the state and the rule's count do not
    ++count_;
    return stats;
  }

  std::vector<rule_step> st(ng);
  for (std::size_t gi = 0; gi < ng; ++gi) {
    const auto& grp = rule_.groups[gi];
    auto& s = st[gi];
    const double lr = schedules_[gi](count_);
    s.lr = static_cast<float>(lr) * static_cast<float>(grp.lr_factor);
    s.neg_lr = -s.lr;
    s.wd = static_cast<float>(wd_[gi]);
    s.t = applied_ + 1;
    s.leaves = leaves.size();
    const double norm = std::sqrt(gsq[gi]);
    const bool clip_on = grp.max_grad_norm && (*grp.max_grad_norm != 0.0 || grp.clip_at_zero);
    s.clip = clip_on && !(static_cast<float>(norm) < static_cast<float>(*grp.max_grad_norm));
    s.clip_num = clip_on ? static_cast<float>(*grp.max_grad_norm) : 1.0f;
    s.clip_den = static_cast<float>(norm);
    if (grp.constants) grp.constants(s);
  }
  ++count_;
  ++applied_;
  if (rule_.begin) {
    std::uint64_t w[4] = {};
    rule_.begin(applied_, words_, w);
    for (auto& s : st) std::copy(std::begin(w), std::end(w), s.w);
  }
  auto has_norm = [](const rule_group& g) { return g.norm_loop != nullptr; };
  if (std::any_of(rule_.groups.begin(), rule_.groups.end(), has_norm)) {
    const auto nsq = totals(each_chunk(
        has_norm, [&](const rule_group& g, std::size_t ci) { return g.norm_loop(st[group_of(ci)], at(ci)); }));
    for (std::size_t gi = 0; gi < ng; ++gi)
      if (has_norm(rule_.groups[gi])) {
        st[gi].rule_norm = std::sqrt(nsq[gi]);
        if (rule_.groups[gi].constants) rule_.groups[gi].constants(st[gi]);  // again, now with the norm
      }
  }
  std::vector<float> leaf_mean(leaves.size(), 0.0f);
  auto has_leaf_loop = [](const rule_group& g) { return g.leaf_loop != nullptr; };
  if (std::any_of(rule_.groups.begin(), rule_.groups.end(), has_leaf_loop)) {
    // per leaf: the chunks' sums in chunk order (a split leaf's over the model group), over the leaf's size
    const auto part = each_chunk(
        has_leaf_loop, [&](const rule_group& g, std::size_t ci) { return g.leaf_loop(st[group_of(ci)], at(ci)); });
    std::vector<double> sum(leaves.size(), 0.0), size(leaves.size(), 0.0);
    for (std::size_t i = 0; i < part.size(); ++i) sum[chunks[i].leaf] += part[i];
    for (std::size_t l = 0; l < leaves.size(); ++l) size[l] = static_cast<double>(leaves[l].n);
    if (ts)
      for (std::size_t l = 0; l < leaves.size(); ++l)
        if (ts->split[l]) {
          sum[l] = distributed::allreduce_sum(*ts->group, sum[l]);
          size[l] = distributed::allreduce_sum(*ts->group, size[l]);
        }
    for (std::size_t l = 0; l < leaves.size(); ++l)
      leaf_mean[l] = static_cast<float>(sum[l]) / static_cast<float>(size[l]);
  }
  if (has_leaf_work_) prepare(leaves, chunks, c_lo, mine, st, sh, at);
  auto every = [](const rule_group&) { return true; };
  if (!rms_clip_ && !clip_norm_) {
    const auto usq = totals(each_chunk(every, [&](const rule_group& g, std::size_t ci) {
      auto c = at(ci);
      c.leaf_mean = leaf_mean[chunks[ci].leaf];
      return g.loop(st[group_of(ci)], c);
    }));
    stats.update_norm = std::sqrt(sum_of(usq));
    return stats;
  }
  // Clipping the update (upstream's AdamW chain: after add_decayed_weights, before the learning rate): the loop
  // records its direction, the decay is added, the norms are taken (per slice: a Stacked leaf's layer), then the
  // clipped step is applied.
  const std::int64_t range = sh ? sh->hi() - sh->lo() : [&] {
    std::int64_t t = 0;
    for (const auto& l : leaves) t += l.n;
    return t;
  }();
  record_.assign(static_cast<std::size_t>(range), 0.0f);
  auto rec = [&](std::size_t ci) { return record_.data() + (chunks[ci].flat - lo); };
  each_chunk(every, [&](const rule_group& g, std::size_t ci) {
    auto c = at(ci);
    c.leaf_mean = leaf_mean[chunks[ci].leaf];
    c.p = rec(ci);
    c.decay = false;
    rule_step s = st[group_of(ci)];
    s.wd = 0;
    s.neg_lr = -1;
    g.loop(s, c);
    return 0.0;
  });
  const auto sq = each_chunk(every, [&](const rule_group&, std::size_t ci) {
    auto c = at(ci);
    c.x = rec(ci);
    return detail::finish_recorded(st[group_of(ci)], c);
  });
  std::vector<float> slice_div(num_slices, 1.0f);
  float mul = 1.0f;
  if (rms_clip_) {
    // scan_aware_clip_by_block_rms: u / max(1, rms(u) / threshold), per leaf or per Stacked layer
    std::vector<double> slice_sq(num_slices, 0.0);
    std::vector<std::size_t> slice_leaf(num_slices, 0);
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      slice_sq[chunks[i].slice] += sq[i];
      slice_leaf[chunks[i].slice] = chunks[i].leaf;
    }
    for (std::size_t k = 0; k < num_slices; ++k) {
      const auto& l = leaves[slice_leaf[k]];
      const double rms = std::sqrt(slice_sq[k] / static_cast<double>(l.n / l.slices));
      slice_div[k] = std::max(1.0f, static_cast<float>(rms / *rms_clip_));
    }
  } else {
    // clip_update_by_historical_norm: scale by threshold / norm when the norm exceeds the history's
    // mean + sigma * std; the unclipped norm joins the history
    const double norm = std::sqrt(sum_of(totals(sq)));
    const double max_norm = update_norms_.ready() ? update_norms_.threshold(clip_norm_->sigma_factor)
                                                  : std::numeric_limits<double>::infinity();
    if (norm > max_norm) mul = static_cast<float>(max_norm / std::max(norm, 1e-6));
    update_norms_.push(norm);
  }
  const auto usq = totals(each_chunk(every, [&](const rule_group&, std::size_t ci) {
    auto c = at(ci);
    c.x = rec(ci);
    rule_step s = st[group_of(ci)];
    s.k[0] = slice_div[chunks[ci].slice];
    s.k[1] = mul;
    return detail::apply_recorded(s, c);
  }));
  stats.update_norm = std::sqrt(sum_of(usq));
  return stats;
}

// The groups' `prep` over this rank's chunks into the scratch (the whole model's size, at flat offsets), the
// scratch gathered from every rank when the state is split, then each group's leaf work on every whole leaf that
// this rank updates part of (a leaf that straddles two ranks is computed by both, identically).
void rule_engine::prepare(const std::vector<layout::leaf_ref>& leaves, const std::vector<layout::chunk>& chunks,
                          std::size_t c_lo, std::size_t mine, const std::vector<rule_step>& st, const shard* sh,
                          const std::function<rule_chunk(std::size_t)>& at) {
  std::int64_t total = 0;
  for (const auto& l : leaves) total += l.n;
  if (static_cast<std::int64_t>(scratch_.size()) != total) scratch_.assign(static_cast<std::size_t>(total), 0.0f);
  layout::per_chunk(mine, [&](std::int64_t i) -> double {
    const std::size_t ci = c_lo + static_cast<std::size_t>(i);
    const std::size_t gi = group_[chunks[ci].leaf];
    const auto& g = rule_.groups[gi];
    return g.prep ? g.prep(st[gi], at(ci)) : 0.0;
  });
  if (sh && sh->comm->size() > 1) distributed::allgather_ranges(*sh->comm, scratch_.data(), sh->bounds);
  const std::int64_t lo = sh ? sh->lo() : 0, hi = sh ? sh->hi() : total;
  std::int64_t off = 0;
  for (std::size_t l = 0; l < leaves.size(); ++l) {
    const auto& g = rule_.groups[group_[l]];
    if (g.leaf && off < hi && off + leaves[l].n > lo) g.leaf(st[group_[l]], descs_[l], scratch_.data() + off);
    if (g.leaf_with_state) g.leaf_with_state(st[group_[l]], descs_[l], l, scratch_.data() + off, leaf_state_[l]);
    off += leaves[l].n;
  }
}

}  // namespace levanter::optim
