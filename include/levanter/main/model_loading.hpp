// levanter/main/model_loading.hpp: how programs find a trained model: the newest complete checkpoint under a path
// (with the train_lm config it carries), or a Hugging Face directory, and which model type it holds. Shared by
// viz_logprobs and export_lm_to_hf (and any program that evaluates a model).
//
//   auto ck = levanter::find_checkpoint("checkpoints/run", "checkpoint_path", log);
//   auto loaded = levanter::load_lm_from_checkpoint<M>(ck, model_config);   // model, config, step, name
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <levanter/checkpoint/train_state.hpp>
#include <levanter/compat/hf.hpp>
#include <levanter/main/train_lm_config.hpp>
#include <levanter/models/lm.hpp>
#include <levanter/trainer/run.hpp>

namespace levanter {

/// The newest complete checkpoint under `path` (or `path` itself); unreadable or torn ones are skipped and told to
/// `log`. `what` names the setting in the error when there is none.
checkpoint::checkpoint_info find_checkpoint(const std::string& path, const std::string& what,
                                            const std::function<void(const std::string&)>& log);

/// The train_lm config a checkpoint carries (its config.yaml), if it has one.
std::optional<TrainLmConfig> checkpoint_train_config(const checkpoint::checkpoint_info& c);

/// The size of the `vocab` axis of the model a checkpoint holds (from the axis names stored with model.h5).
std::int64_t checkpoint_vocab_size(const checkpoint::checkpoint_info& c);

/// The `model:` choice for a Hugging Face directory: the model type whose adapter reads its model_type, with that
/// type's default settings. Throws hf::error naming the model_type when no built-in model reads it.
ModelChoice model_choice_for_hf(const hf::hf_dir& d);

/// A model loaded for a program.
template <LmModel M>
struct loaded_lm {
  M model;
  typename M::config_type config;
  std::string name;                 ///< the checkpoint or directory it came from
  std::optional<std::int64_t> step;  ///< the checkpoint's step (none for a Hugging Face directory)
};

/// The model of checkpoint `c`, with architecture `mc`. Throws checkpoint::error when it does not match.
template <LmModel M>
loaded_lm<M> load_lm_from_checkpoint(const checkpoint::checkpoint_info& c, const typename M::config_type& mc) {
  const std::int64_t vocab = checkpoint_vocab_size(c);
  check_model_fits(mc.parameter_count(vocab), 1, "the model of checkpoint '" + c.path.string() + "'");
  loaded_lm<M> out{M::init(mc, vocab, haliax::random::make_key(0)), mc, c.path.string(), std::nullopt};
  out.step = checkpoint::load_train_state<M>(c, out.model, nullptr, false).step;
  return out;
}

/// The model of a Hugging Face directory; its architecture comes from config.json, the rest of `base`.
template <LmModel M>
loaded_lm<M> load_lm_from_hf(const hf::hf_dir& d, const typename M::config_type& base) {
  if constexpr (hf::HfConvertible<M>) {
    const auto mc = hf::config_from_hf<M>(base, d);
    check_model_fits(mc.parameter_count(d.vocab_size), 1, "the model of '" + d.dir + "'");
    loaded_lm<M> out{M::init(mc, d.vocab_size, haliax::random::make_key(0)), mc, d.dir, std::nullopt};
    hf::load(d, out.model, mc);
    return out;
  } else {
    throw hf::error("model type '" + std::string(M::config_type::type_name) + "' has no Hugging Face adapter");
  }
}

}  // namespace levanter
