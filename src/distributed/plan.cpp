// levanter/distributed/plan.hpp.
#include <levanter/distributed/plan.hpp>

#include <algorithm>

#include <levanter/config/types.hpp>

namespace levanter::distributed {

namespace {

std::string join(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : ", ") + x;
  return out;
}

bool is_mesh_axis(const std::string& a) { return a == "data" || a == "replica" || a == "model"; }

}  // namespace

std::int64_t plan::local_batch(std::int64_t step) const {
  return trainer->train_batch_size.at(step) / (mesh.replica * mesh.data);
}

std::int64_t plan::micro_batch(std::int64_t step) const {
  const std::int64_t local = local_batch(step);
  return trainer->per_device_parallelism > 0 ? std::min(trainer->per_device_parallelism, local) : local;
}

std::string plan::describe() const {
  std::string s = std::to_string(world) + (world == 1 ? " rank" : " ranks") + ": mesh replica " +
                  std::to_string(mesh.replica) + " x data " + std::to_string(mesh.data) + " x model " +
                  std::to_string(mesh.model) + "; batch split over data";
  if (shard_parameters)
    s += "; parameters and optimizer state sharded over data (FSDP, from fsdp_axis)";
  else if (shard_optimizer)
    s += "; optimizer state sharded over data (ZeRO-1, from fsdp_axis with shard_parameters: false)";
  else if (mesh.data > 1)
    s += "; parameters and optimizer state replicated (pure data parallel)";
  if (mesh.model > 1) {
    s += "; tensor parallel over model:";
    for (const auto& a : model_axes) s += " " + a;
  }
  return s;
}

plan make_plan(const TrainerConfig& t, int world, const std::set<std::string>& model_axes) {
  plan p;
  p.world = world;
  p.trainer = &t;
  auto fail = [](const std::string& key, const std::string& what) {
    throw config::config_error("trainer." + key + ": " + what + " (docs/distributed.md)");
  };
  if (t.model_axis_size < 1) fail("model_axis_size", "must be at least 1");
  if (world % t.model_axis_size != 0)
    fail("model_axis_size", std::to_string(t.model_axis_size) + " does not divide the " + std::to_string(world) +
                                " ranks; the ranks form data x model groups");
  const int replica = static_cast<int>(t.replica_ici_axis_size) *
                      static_cast<int>(t.replica_dcn_axis_size == -1 ? 1 : t.replica_dcn_axis_size);
  if (replica != 1) fail("replica_ici_axis_size", "replica mesh axes are not implemented; use 1");
  p.mesh.model = static_cast<int>(t.model_axis_size);
  p.mesh.replica = 1;
  p.mesh.data = world / p.mesh.model;

  if (t.batch_axis != "batch")
    fail("batch_axis", "'" + t.batch_axis + "': the models' batch axis is named 'batch'");

  auto check_axis = [&](const std::string& key, const std::string& a) {
    if (!model_axes.count(a))
      fail(key, "'" + a + "' is not an axis of the model's parameters (they have: " + join(model_axes) + ")");
  };
  for (const auto& a : t.fsdp_axis.items) {
    check_axis("fsdp_axis", a);
    p.fsdp_axes.push_back(a);
  }
  if (t.tensor_parallel_axes)
    for (const auto& a : *t.tensor_parallel_axes) {
      check_axis("tensor_parallel_axes", a);
      if (p.mesh.model > 1) p.model_axes.push_back(a);
    }
  for (const auto& [axis, to] : t.parameter_axis_resources) {
    check_axis("parameter_axis_resources", axis);
    for (const auto& m : to.items) {
      if (!is_mesh_axis(m))
        fail("parameter_axis_resources." + axis, "'" + m + "' is not a mesh axis (replica, data or model)");
      if (m == "data" && std::find(p.fsdp_axes.begin(), p.fsdp_axes.end(), axis) == p.fsdp_axes.end())
        p.fsdp_axes.push_back(axis);
      if (m == "model" && p.mesh.model > 1 &&
          std::find(p.model_axes.begin(), p.model_axes.end(), axis) == p.model_axes.end())
        p.model_axes.push_back(axis);
    }
  }
  for (const auto& [axis, to] : t.axis_resources) {
    if (axis != t.batch_axis) check_axis("axis_resources", axis);
    for (const auto& m : to.items) {
      if (!is_mesh_axis(m)) fail("axis_resources." + axis, "'" + m + "' is not a mesh axis (replica, data or model)");
      if (axis != t.batch_axis && m == "data" && world > 1)
        fail("axis_resources." + axis,
             "only the batch axis can be split over data in compute (sequence or activation sharding is not "
             "implemented)");
    }
  }
  if (p.mesh.model > 1) {
    if (p.model_axes.empty())
      fail("model_axis_size", std::to_string(p.mesh.model) +
                                  " needs trainer.tensor_parallel_axes (e.g. [mlp, heads]): the axes split over the "
                                  "model mesh axis");
    // Grouped-query attention: the key/value heads split with the query heads.
    if (std::find(p.model_axes.begin(), p.model_axes.end(), "heads") != p.model_axes.end() &&
        model_axes.count("kv_head") &&
        std::find(p.model_axes.begin(), p.model_axes.end(), "kv_head") == p.model_axes.end())
      p.model_axes.push_back("kv_head");
    std::string names;
    for (const auto& a : p.model_axes) names += (names.empty() ? "" : ", ") + a;
    p.notes.push_back("tensor parallelism: " + names + " split over " + std::to_string(p.mesh.model) +
                      " model ranks (column-parallel Linear where an output axis is split, row-parallel where an "
                      "input axis is)");
  }
  if (!p.fsdp_axes.empty() && p.mesh.data > 1) {
    p.shard_optimizer = true;
    p.shard_parameters = t.shard_parameters;
    if (p.shard_parameters)
      p.notes.push_back("trainer.fsdp_axis maps parameter axes to data: each of the " + std::to_string(p.mesh.data) +
                        " ranks keeps one contiguous share of the flattened parameters and of their optimizer state "
                        "(in AdamW's 32768-element chunks, whatever the axis named); layers are gathered just in time");
    else
      p.notes.push_back("trainer.shard_parameters is false: the optimizer state is sharded over the " +
                        std::to_string(p.mesh.data) + " data ranks (ZeRO-1); the parameters stay whole on every rank");
  }

  // Every batch size of the schedule divides over the data ranks, and the local batch over per_device_parallelism.
  const int data = p.mesh.data;
  for (const auto& s : t.train_batch_size.steps) {
    if (s.value % data != 0)
      fail("train_batch_size", std::to_string(s.value) + " (from step " + std::to_string(s.start) +
                                   ") does not divide over " + std::to_string(data) +
                                   (data == world ? " ranks; use a multiple of the rank count"
                                                  : " data ranks; use a multiple of the data axis size"));
    const std::int64_t local = s.value / data;
    if (t.per_device_parallelism > 0 && local > t.per_device_parallelism && local % t.per_device_parallelism != 0)
      fail("per_device_parallelism", std::to_string(t.per_device_parallelism) + " does not divide the " +
                                         std::to_string(local) + " examples each of the " + std::to_string(data) +
                                         " data ranks computes at batch size " + std::to_string(s.value));
  }
  return p;
}

}  // namespace levanter::distributed
