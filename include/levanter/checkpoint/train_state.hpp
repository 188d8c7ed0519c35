// levanter/checkpoint/train_state.hpp: what a training checkpoint holds (upstream TrainerState's saveable
// state) and how it is loaded back, newest complete checkpoint first.
//
//   model.h5           one dataset per parameter, by parameter path, with its axis names
//   opt_state.h5       the optimizer's state (AdamW: mu.<path>, nu.<path>, count, adam_count, and the skip/clip
//                      history windows; optim/optimizer.hpp)
//   training_state.h5  step, training_key (uint32[2]), data_offset (examples consumed; batches are a pure
//                      function of config, seed and step, so this is a check, not state)
//   config.yaml        the resolved config of the run that wrote it
//   metadata.json      written last (see checkpointer.hpp)
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <haliax/random.hpp>
#include <levanter/checkpoint/checkpointer.hpp>
#include <levanter/optim/optimizer.hpp>

namespace levanter::checkpoint {

/// The in-memory snapshot of a training state (taken on the training thread; cheap next to a step).
template <class M>
std::vector<named_file> train_state_files(const M& model, const optim::optimizer<M>* opt, std::int64_t step,
                                          haliax::random::key training_key, std::int64_t data_offset,
                                          const std::string& resolved_config) {
  std::vector<named_file> files;
  files.push_back({"model.h5", {}, {}});
  files.back().data.add_tree("", model);
  if (opt) {
    files.push_back({"opt_state.h5", {}, {}});
    opt->save_state(files.back().data, model);
  }
  files.push_back({"training_state.h5", {}, {}});
  auto& t = files.back().data;
  t.add_scalar("step", step);
  t.add_vector("training_key", std::vector<std::uint32_t>{training_key.k0, training_key.k1});
  t.add_scalar("data_offset", data_offset);
  if (!resolved_config.empty()) files.push_back({"config.yaml", {}, resolved_config});
  return files;
}

/// What was loaded.
struct loaded_state {
  checkpoint_info info;
  std::int64_t step = 0;
  std::optional<haliax::random::key> training_key;
  std::vector<std::string> missing;  ///< leaves kept at their initial values (allow_partial)
  bool had_opt_state = false;
};

/// Loads `info` into `model` (and `opt` when given and present). Throws `error` when the checkpoint is torn,
/// unreadable or does not match the model. A checkpoint without opt_state.h5 (e.g. an HF import) loads the
/// model only.
template <class M>
loaded_state load_train_state(const checkpoint_info& info, M& model, optim::optimizer<M>* opt, bool allow_partial) {
  verify_files(info);
  loaded_state out;
  out.info = info;
  out.step = info.step;
  {
    reader r((info.path / "model.h5").string());
    out.missing = r.read_tree("", model, allow_partial);
  }
  const fs::path opt_path = info.path / "opt_state.h5";
  if (opt && fs::exists(opt_path)) {
    reader r(opt_path.string());
    auto m = opt->load_state(r, allow_partial, model);
    out.missing.insert(out.missing.end(), m.begin(), m.end());
    out.had_opt_state = true;
  }
  const fs::path ts_path = info.path / "training_state.h5";
  if (fs::exists(ts_path)) {
    reader r(ts_path.string());
    out.step = r.scalar<std::int64_t>("step");
    if (out.step != info.step)
      throw error("checkpoint '" + info.path.string() + "': training_state.h5 says step " + std::to_string(out.step) +
                  " but metadata.json says " + std::to_string(info.step));
    const auto k = r.vector<std::uint32_t>("training_key");
    if (k.size() != 2) throw error("checkpoint '" + info.path.string() + "': training_key is not uint32[2]");
    out.training_key = haliax::random::key(k[0], k[1]);
  }
  return out;
}

/// The outcome of looking for a checkpoint to resume from: "none there" and "none loadable" are different.
enum class resume_outcome { none_found, loaded };

/// Tries the checkpoints under `path` newest first (`load` loads one and throws `error` when it cannot), telling
/// `log` why each unreadable one is skipped. Returns none_found only when there is no checkpoint at all; throws
/// `error` when there are some and none loads (step directories without metadata.json count), so a run never
/// silently restarts at step 0 over them.
inline resume_outcome resume_newest(const fs::path& path, const std::function<void(const checkpoint_info&)>& load,
                                    const std::function<void(const std::string&)>& log) {
  const auto found = discover(path);
  for (const auto& p : found.problems) log("checkpoint: skipping " + p);
  for (const auto& d : found.incomplete)
    log("checkpoint: skipping " + d + ": it has no metadata.json (damaged: a committed checkpoint always has one)");
  if (found.checkpoints.empty()) {
    if (!found.problems.empty())
      throw error("every checkpoint under '" + path.string() + "' is unreadable (" + found.problems.front() +
                  "); fix or remove them, or set trainer.load_checkpoint: false to start over");
    if (!found.incomplete.empty())
      throw error("'" + path.string() + "' holds " + std::to_string(found.incomplete.size()) +
                  " step directories without metadata.json (" + found.incomplete.front() +
                  (found.incomplete.size() > 1 ? ", ..." : "") +
                  ") and no complete checkpoint; they are damaged and starting at step 0 would overwrite them: "
                  "move them away, or set trainer.load_checkpoint: false to start over");
    return resume_outcome::none_found;
  }
  std::string reasons;
  for (const auto& c : found.checkpoints) {
    try {
      load(c);
      return resume_outcome::loaded;
    } catch (const error& e) {
      log(std::string("checkpoint: cannot load ") + c.path.string() + ": " + e.what() + "; trying an older one");
      reasons += std::string("\n  ") + c.path.string() + ": " + e.what();
    }
  }
  throw error("found " + std::to_string(found.checkpoints.size()) + " checkpoint(s) under '" + path.string() +
              "' but none could be loaded:" + reasons +
              "\nFix or remove them, or set trainer.load_checkpoint: false to start over.");
}

}  // namespace levanter::checkpoint
