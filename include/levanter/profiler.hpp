// levanter/profiler.hpp: `trainer.profiler` — a per-op time breakdown of some training steps.
//
// Every haliax op runs as a labelled Kokkos kernel (elementwise ops, reductions, losses, copies) or inside a
// named region (GEMMs as "dot {axes} x {axes}" with their FLOP count, the flash-attention kernels, the forward
// and backward passes); train_lm adds regions for the data, the optimizer update and the logging. The profiler
// listens through Kokkos' profiling callbacks on the training thread and keeps, per name and phase (forward /
// backward / other): calls, inclusive time, self time (minus nested entries) and FLOPs. Kernels that haliax's
// worker threads launch are inside a region of the training thread and are counted there.
//
//   profiler p;  p.start();  ...steps...;  p.stop();  p.write(run_dir, steps, seconds);
//
// writes `profile.txt` (a table sorted by self time) and `profile.json`. When it is not started, the callbacks
// are not installed and ops pay only Kokkos' "is a tool loaded" test.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace levanter {

/// One row of the breakdown.
struct profile_entry {
  std::string phase;  ///< forward, backward, or other
  std::string op;     ///< kernel label or region name ("dot", "haliax::exp", ...)
  std::string axes;   ///< the operands' axes where known ("{batch,position,embed} x {embed,mlp}"), else ""
  std::int64_t calls = 0;
  double total_seconds = 0;  ///< inclusive
  double self_seconds = 0;   ///< minus nested entries
  double flops = 0;
};

/// The op profiler. Its state is process-wide (Kokkos has one set of callbacks): one profiler runs at a time.
class profiler {
 public:
  /// Installs the callbacks; the calling thread is the one profiled. The table keeps what earlier runs added.
  void start();
  /// Removes the callbacks.
  void stop();
  bool running() const;

  /// The rows, sorted by self time (largest first).
  std::vector<profile_entry> entries() const;

  /// Empties the table.
  void reset();

  /// Writes `profile.txt` and `profile.json` into `dir`; `seconds` is the wall time of the profiled `steps`.
  void write(const std::filesystem::path& dir, std::int64_t first_step, std::int64_t steps, double seconds) const;
};

}  // namespace levanter
