// levanter/checkpoint/config.hpp: `trainer.checkpointer` (upstream CheckpointerConfig), beside the checkpointer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <levanter/config/types.hpp>

namespace levanter {

// ---- checkpointer --------------------------------------------------------------------------------------------
struct KeepPolicy {
  int64_t every = 10000;
  std::optional<int64_t> until;
};
struct CheckpointerConfig {
  std::string base_path = "checkpoints/";
  config::Duration save_interval = config::Duration::minutes(15);
  std::vector<KeepPolicy> keep{KeepPolicy{}};
  bool append_run_id_to_base_path = true;
  bool delete_old_temp_checkpoints = true;
};

}  // namespace levanter

template <>
struct levanter::config::schema<levanter::KeepPolicy> {
  using T = levanter::KeepPolicy;
  static constexpr auto fields = std::make_tuple(
      field("every", &T::every, "keep a permanent checkpoint every this many steps"),
      field("until", &T::until, "up to this step (only the last policy may omit it)"));
};
template <>
struct levanter::config::schema<levanter::CheckpointerConfig> {
  using T = levanter::CheckpointerConfig;
  static constexpr auto fields = std::make_tuple(
      field("base_path", &T::base_path, "directory under which checkpoints are written"),
      field("save_interval", &T::save_interval, "time between temporary checkpoints (e.g. 15m)"),
      field("keep", &T::keep, "permanent checkpoint policies: list of {every, until}"),
      field("append_run_id_to_base_path", &T::append_run_id_to_base_path, "write under <base_path>/<run id>"),
      field("delete_old_temp_checkpoints", &T::delete_old_temp_checkpoints, "delete the previous temporary checkpoint once a new one commits"));
};
