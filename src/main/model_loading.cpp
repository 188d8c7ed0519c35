// levanter/main/model_loading.hpp.
#include <levanter/main/model_loading.hpp>

#include <filesystem>

#include <levanter/models/builtin_models.hpp>
#include <levanter/models/registry.hpp>

namespace levanter {

checkpoint::checkpoint_info find_checkpoint(const std::string& path, const std::string& what,
                                            const std::function<void(const std::string&)>& log) {
  const auto found = checkpoint::discover(path);
  for (const auto& p : found.problems) log("skipping " + p);
  for (const auto& d : found.incomplete) log("skipping " + d + ": it has no metadata.json (a damaged checkpoint)");
  for (const auto& c : found.checkpoints) {
    try {
      checkpoint::verify_files(c);
      return c;
    } catch (const checkpoint::error& e) {
      log(std::string(e.what()) + "; trying an older one");
    }
  }
  throw checkpoint::error(what + ": no complete checkpoint under '" + path +
                          "' (give a train_lm checkpoint directory, or the run directory holding step-N checkpoints)");
}

std::optional<TrainLmConfig> checkpoint_train_config(const checkpoint::checkpoint_info& c) {
  const std::filesystem::path saved = c.path / "config.yaml";
  if (!std::filesystem::exists(saved)) return std::nullopt;
  try {
    return config::decode<TrainLmConfig>(YAML::LoadFile(saved.string()), "", {}, saved.string());
  } catch (const YAML::Exception& e) {
    throw checkpoint::error("'" + saved.string() + "' is not valid YAML (" + e.what() + ")");
  }
}

std::int64_t checkpoint_vocab_size(const checkpoint::checkpoint_info& c) {
  const checkpoint::reader r((c.path / "model.h5").string());
  for (const auto& name : r.dataset_names()) {
    const auto axes = r.axes(name);
    const auto dims = r.dims(name);
    for (std::size_t i = 0; i < axes.size() && i < dims.size(); ++i)
      if (axes[i] == "vocab") return dims[i];
  }
  throw checkpoint::error("'" + r.path() + "' has no parameter with a 'vocab' axis (is it a language model's "
                          "checkpoint?)");
}

ModelChoice model_choice_for_hf(const hf::hf_dir& d) {
  ModelChoice out;
  bool found = false;
  std::string known;
  auto try_one = [&]<class C>(std::type_identity<C>) {
    using M = model_of_t<C>;
    if constexpr (hf::HfConvertible<M>) {
      constexpr std::string_view t = hf::hf_model_type_for<C, M>();
      known += (known.empty() ? "" : ", ") + std::string(t);
      if (!found && d.model_type == t) {
        out.value = C{};
        found = true;
      }
    }
  };
  [&]<class... C>(std::type_identity<config::Choice<C...>>) { (try_one(std::type_identity<C>{}), ...); }(
      std::type_identity<ModelChoice>{});
  if (!found)
    throw hf::error("'" + d.dir + "/config.json' has model_type '" + d.model_type +
                    "', which no built-in model reads (supported: " + known + ")");
  return out;
}

}  // namespace levanter
