// levanter/distributed/plan.hpp: how a run's work is laid over its ranks, derived from upstream's trainer keys
// (batch_axis, fsdp_axis, tensor_parallel_axes, axis_resources, parameter_axis_resources, model_axis_size,
// replica_*_axis_size) and the number of ranks. docs/distributed.md explains the choices.
//
//   auto plan = levanter::distributed::make_plan(cfg.trainer, world.size(), model_axis_names);
//   plan.mesh.data;              // ranks the batch is split over
//   plan.shard_optimizer;        // optimizer state split over `data`: fsdp_axis names a parameter axis
//   plan.shard_parameters;       // the parameters too (FSDP), unless trainer.shard_parameters is false
//   plan.local_batch(step);      // examples each rank computes at `step`
//
// The mesh has upstream's physical axes `replica`, `data` and `model`. The compute mapping sends `batch` to
// (`replica`, `data`): each rank takes a contiguous slice of the global batch. The parameter mapping adds
// `fsdp_axis -> data`: the parameters and their optimizer state are split over the data ranks in AdamW's fixed
// chunks (FSDP, levanter/distributed/fsdp.hpp), or only the optimizer state with `shard_parameters: false`
// (ZeRO-1). `tensor_parallel_axes -> model` splits those axes over each model group of `model_axis_size` ranks
// (levanter/distributed/tensor_parallel.hpp). Replica axes are refused, never silently dropped.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <levanter/trainer/config.hpp>

namespace levanter::distributed {

struct mesh_shape {
  int replica = 1, data = 1, model = 1;
  int size() const { return replica * data * model; }
};

struct plan {
  mesh_shape mesh;
  int world = 1;
  /// Optimizer state split over the data ranks (fsdp_axis or parameter_axis_resources map a parameter axis to
  /// `data` and there is more than one data rank).
  bool shard_optimizer = false;
  /// Parameters split over the data ranks too (FSDP): shard_optimizer and trainer.shard_parameters.
  bool shard_parameters = false;
  /// The parameter axes mapped to `data` (fsdp_axis, then parameter_axis_resources).
  std::vector<std::string> fsdp_axes;
  /// Tensor parallelism (mesh.model > 1): the axes split over the model ranks (tensor_parallel_axes, entries of
  /// parameter_axis_resources mapped to `model`, and `kv_head` with `heads` for grouped-query attention).
  std::vector<std::string> model_axes;
  /// Lines worth printing once (what the mapping asked for that this version does differently).
  std::vector<std::string> notes;
  const TrainerConfig* trainer = nullptr;

  /// Examples each rank computes at `step` (the global batch divided over the data ranks; the ranks of one model
  /// group compute the same examples).
  std::int64_t local_batch(std::int64_t step) const;
  /// Examples per forward/backward on one rank at `step` (per_device_parallelism, or the whole local batch).
  std::int64_t micro_batch(std::int64_t step) const;
  /// "2 ranks: data 2 (batch split), optimizer state sharded over data (ZeRO-1) ...".
  std::string describe() const;
};

/// The plan for `world` ranks. `model_axes`: the axis names of the model's parameters (for checking fsdp_axis and
/// the mappings). Throws config::config_error naming the key when the mapping cannot be honoured: an axis the model
/// does not have, tensor parallelism (model_axis_size > 1), a batch that does not divide over the ranks.
plan make_plan(const TrainerConfig& t, int world, const std::set<std::string>& model_axes);

}  // namespace levanter::distributed
