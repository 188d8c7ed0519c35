// levanter/optim/rules.hpp: the optimizers written as rules (levanter/optim/rule.hpp), each from its `optimizer:`
// config, with upstream's chain (src/levanter/optim/*.py, optax):
//
//   lion      clip_by_global_norm -> scale_by_lion(b1, b2)                          -> add_decayed_weights -> -lr
//   adopt     clip_by_global_norm -> scale_by_adopt(b1, b2, eps)                    -> add_decayed_weights -> -lr
//   rmsprop   clip_by_global_norm -> scale_by_rmsprop_momentum(b1, b2, eps)         -> add_decayed_weights -> -lr
//   cautious  clip_by_global_norm -> scale_by_cautious(b1, b2, eps)                 -> add_decayed_weights -> -lr
//   mars      scale_by_mars(b1, b2, gamma, eps, max_grad_norm: its own global clip) -> add_decayed_weights -> -lr
//
// Adding one: its config (optim/config.hpp), a function here returning its rule_def, the element loop in
// src/optim/rules.cpp, and one line in make_optimizer (optim/optimizer.hpp).
#pragma once

#include <levanter/optim/config.hpp>
#include <levanter/optim/rule.hpp>

namespace levanter::optim {

rule_def lion_rule(const LionConfig& c);
rule_def adopt_rule(const AdoptConfig& c);
rule_def rmsprop_rule(const RMSPropMomentumConfig& c);
rule_def cautious_rule(const CautiousConfig& c);
rule_def mars_rule(const MarsConfig& c);

}  // namespace levanter::optim
