// levanter/optim/optimizer.hpp: what the Trainer needs of an optimizer, whatever its kind: one update of the
// parameters from their gradients, and its state as a checkpoint stores it. `make_optimizer` turns the
// `optimizer:` choice (optim/config.hpp) into one; each kind keeps its own state (upstream's optax state).
//
//   auto opt = levanter::optim::make_optimizer(cfg.optimizer, cfg.trainer.num_train_steps, model);
//   auto stats = opt->update(model, grads, loss);        // model updated in place
//   opt->save_state(snapshot);                           // opt_state.h5
//
// Adding an optimizer: its config to OptimizerChoice, its rule (optim/rules.hpp, src/optim/rules.cpp) and a line in
// make_optimizer; placement (ZeRO-1, FSDP, tensor parallelism), checkpoints and trainer.watch come from
// placed_optimizer (optim/placement.hpp). docs/architecture.md, "Adding an optimizer".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <levanter/optim/adamw.hpp>
#include <levanter/optim/config.hpp>
#include <levanter/optim/placement.hpp>
#include <levanter/optim/rule.hpp>
#include <levanter/optim/rules.hpp>

namespace levanter::optim {

/// `optimizer: {type: adam}`: AdamW (optim/adamw.hpp) and its state. opt_state.h5 holds `mu.<path>`, `nu.<path>`,
/// `count`, `adam_count` and the skip/clip history windows.
template <class M>
class adamw_optimizer final : public placed_optimizer<M> {
 public:
  /// With `comm` of more than one rank and `sharded`, the moments are split over the ranks (ZeRO-1).
  adamw_optimizer(const AdamConfig& cfg, std::int64_t num_train_steps, const M& params,
                  distributed::communicator* comm = nullptr, bool sharded = false)
      : placed_optimizer<M>(params, comm, sharded), opt_(cfg, num_train_steps) {
    state_ = opt_.init(params, this->sh());
  }

  std::string_view type_name() const override { return AdamConfig::type_name; }
  update_stats update(M& params, const M& grads, double loss) override {
    this->average_begin(&params, nullptr);
    const auto stats = opt_.update(params, grads, state_, loss, this->sh(), this->ts());
    this->average_end(&params, nullptr);
    return stats;
  }
  double next_learning_rate() const override { return opt_.schedule()(state_.count); }
  update_stats update_range(float* params, const float* grads, double loss) override {
    if (!this->shard_) return optimizer<M>::update_range(params, grads, loss);
    this->average_begin(nullptr, params);
    const auto stats = opt_.update_range(this->shapes_, params, grads, state_, loss, *this->shard_, this->ts());
    this->average_end(nullptr, params);
    return stats;
  }

  const adamw& rule() const { return opt_; }
  const adamw_state<M>& state() const { return state_; }

 private:
  std::vector<state_buffer<M>> buffers() override {
    return {{"mu", &state_.mu, &state_.mu_flat}, {"nu", &state_.nu, &state_.nu_flat}};
  }
  void save_scalars(checkpoint::snapshot& s) const override {
    s.add_scalar("count", static_cast<std::int64_t>(state_.count));
    s.add_scalar("adam_count", static_cast<std::int64_t>(state_.adam_count));
    detail::add_window(s, "skip_losses", state_.skip_losses);
    detail::add_window(s, "skip_grad_norms", state_.skip_grad_norms);
    detail::add_window(s, "update_norms", state_.update_norms);
  }
  void load_scalars(const checkpoint::reader& r) override {
    state_.count = r.scalar<std::int64_t>("count");
    state_.adam_count = r.scalar<std::int64_t>("adam_count");
    detail::read_window(r, "skip_losses", state_.skip_losses);
    detail::read_window(r, "skip_grad_norms", state_.skip_grad_norms);
    detail::read_window(r, "update_norms", state_.update_norms);
  }
  void check_tensor_parallel() const override {
    if (opt_.config().update_rms_clipping)
      throw std::invalid_argument("optimizer.update_rms_clipping: not supported with tensor parallelism "
                                  "(trainer.model_axis_size > 1); unset it");
  }

  adamw opt_;
  adamw_state<M> state_;
};

/// The optimizer the `optimizer:` section asks for, with fresh state shaped like `params`. Throws
/// std::invalid_argument naming the key for settings the optimizer refuses.
/// With `comm` and `sharded`, the state is split over the ranks (ZeRO-1).
template <class M>
std::unique_ptr<optimizer<M>> make_optimizer(const OptimizerChoice& choice, std::int64_t num_train_steps,
                                             const M& params, distributed::communicator* comm = nullptr,
                                             bool sharded = false) {
  if (const auto* adam = choice.get_if<AdamConfig>())
    return std::make_unique<adamw_optimizer<M>>(*adam, num_train_steps, params, comm, sharded);
  auto rule = [&](rule_def r, const OptimizerConfig& base) -> std::unique_ptr<optimizer<M>> {
    return std::make_unique<rule_optimizer<M>>(std::move(r), base, num_train_steps, params, comm, sharded);
  };
  if (const auto* c = choice.get_if<LionConfig>()) return rule(lion_rule(*c), *c);
  if (const auto* c = choice.get_if<AdoptConfig>()) return rule(adopt_rule(*c), *c);
  if (const auto* c = choice.get_if<RMSPropMomentumConfig>()) return rule(rmsprop_rule(*c), *c);
  if (const auto* c = choice.get_if<CautiousConfig>()) return rule(cautious_rule(*c), *c);
  if (const auto* c = choice.get_if<MarsConfig>()) return rule(mars_rule(*c), *c);
  if (const auto* c = choice.get_if<MuonConfig>()) return rule(muon_rule(*c), *c);
  if (const auto* c = choice.get_if<ScionConfig>()) return rule(scion_rule(*c), *c);
  if (const auto* c = choice.get_if<MiniConfig>()) return rule(mini_rule(*c), *c);
  if (const auto* c = choice.get_if<SoapConfig>()) return rule(soap_rule(*c), *c);
  if (const auto* c = choice.get_if<KronConfig>()) return rule(kron_rule(*c), *c);
  if (const auto* c = choice.get_if<SophiaHConfig>()) return rule(sophia_h_rule(*c), *c);
  throw std::invalid_argument("optimizer.type '" + std::string(choice.type_name()) + "' is not supported");
}

}  // namespace levanter::optim
