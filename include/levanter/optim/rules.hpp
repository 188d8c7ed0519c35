// levanter/optim/rules.hpp: the optimizers written as rules (levanter/optim/rule.hpp), each from its `optimizer:`
// config, with upstream's chain (src/levanter/optim/*.py, optax):
//
//   lion      clip_by_global_norm -> scale_by_lion(b1, b2)                          -> add_decayed_weights -> -lr
//   adopt     clip_by_global_norm -> scale_by_adopt(b1, b2, eps)                    -> add_decayed_weights -> -lr
//   rmsprop   clip_by_global_norm -> scale_by_rmsprop_momentum(b1, b2, eps)         -> add_decayed_weights -> -lr
//   cautious  clip_by_global_norm -> scale_by_cautious(b1, b2, eps)                 -> add_decayed_weights -> -lr
//   mars      scale_by_mars(b1, b2, gamma, eps, max_grad_norm: its own global clip) -> add_decayed_weights -> -lr
//   sophia-h  scale_by_sophia (momentum / max(gamma h, eps), clipped; h from v ⊙ H v) -> add_decayed_weights -> -lr
//
// and the ones whose leaves fall in groups (optax.multi_transform), each group with its own chain:
//
//   muon   Linear weights: scale_with_muon (momentum, Newton-Schulz)      -> add_decayed_weights -> -lr
//          the rest:       clip (its own norm) -> scale_by_adam           -> add_decayed_weights -> -adam_lr
//   scion  Linear weights: scale_with_scion (momentum, Newton-Schulz)     -> add_decayed_weights -> -lr
//          the rest:       clip (its own norm) -> scale_by_signum         -> add_decayed_weights -> -lr * ratio
//   mini   by path: embedding, query, key, value, output, lm_head, linear: scale_with_mini (second moment averaged
//          over the group's axes) -> add_decayed_weights -> -lr; the rest: clip -> scale_by_adam -> ... -> -lr
//
// Newton-Schulz needs each matrix whole: under ZeRO-1 and FSDP the scratch it works on is gathered (one copy of the
// matrices' size per step, as FSDP's parameter gather) and every rank computes the matrices it updates part of.
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
rule_def muon_rule(const MuonConfig& c);
rule_def scion_rule(const ScionConfig& c);
rule_def mini_rule(const MiniConfig& c);
rule_def soap_rule(const SoapConfig& c);  // src/optim/preconditioned.cpp
rule_def kron_rule(const KronConfig& c);  // src/optim/preconditioned.cpp
rule_def sophia_h_rule(const SophiaHConfig& c);

/// upstream's zeropower_via_newtonschulz5 on `layers` row-major rows x cols matrices at x, in place, each scaled by
/// `scale` after `steps` iterations (coefficients 3.4445, -4.7750, 2.0315; x / (|x|_F + eps) first).
void newton_schulz(float* x, int64_t layers, int64_t rows, int64_t cols, int steps, float eps, float scale);

}  // namespace levanter::optim
