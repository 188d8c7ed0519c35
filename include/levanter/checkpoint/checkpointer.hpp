// levanter/checkpoint/checkpointer.hpp: checkpoint directories and upstream's Checkpointer policy.
//
// A checkpoint is a directory `<base>/step-N/` holding HDF5 files and `metadata.json` ({"step", "timestamp",
// "is_temporary", "files": {name: bytes}, "checksums": {name: "crc32:<hex>"}}). It is built under a hidden
// temporary name, every file fsynced, metadata.json written last, then renamed into place and the parent fsynced:
// a crash at any point leaves either no `step-N` or a complete one; a failed write (a full disk) removes its hidden
// directory. Readers only consider directories that hold metadata.json, and check that every file it lists has the
// recorded size and checksum before trusting it. One process at a time writes under a base path (a lock file).
//
// Policy (upstream `Checkpointer.on_step`): a permanent checkpoint every `keep[i].every` steps (the first policy
// whose `until` is unset or >= step), else a temporary one when `save_interval` has passed since the last save.
// The previous temporary checkpoint is deleted once the next checkpoint has committed, and only if its
// metadata.json still says temporary. Nothing is saved at step 0 unless forced. Writes run on a background
// thread from an in-memory snapshot, one at a time.
#pragma once

#include <array>

#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <levanter/checkpoint/config.hpp>
#include <levanter/checkpoint/h5.hpp>
#include <levanter/io/dir_lock.hpp>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace levanter::checkpoint {

namespace fs = std::filesystem;

/// One file of a checkpoint: an HDF5 snapshot, or text (e.g. the resolved config).
struct named_file {
  std::string name;
  snapshot data;
  std::optional<std::string> text;  ///< when set, written as-is instead of `data`
};

/// A committed checkpoint as its metadata.json describes it.
struct checkpoint_info {
  fs::path path;
  std::int64_t step = 0;
  std::string timestamp;
  bool is_temporary = false;
  nlohmann::json metadata;
};

/// The checkpoint in `dir` per its metadata.json; nullopt when `dir` holds none (not a checkpoint, or one whose
/// write never committed). Throws `error` when metadata.json exists but cannot be parsed.
std::optional<checkpoint_info> read_metadata(const fs::path& dir);

/// The files a checkpoint of this format may hold besides metadata.json (model.h5 always; the others when the run
/// had them): `train_state_files` writes them, the loaders read them.
inline constexpr std::array<const char*, 4> format_files() {
  return {"model.h5", "opt_state.h5", "training_state.h5", "config.yaml"};
}

/// Checks that every file metadata.json lists exists with its recorded size and, when `check_contents`, that its
/// bytes match the CRC-32 recorded under "checksums" (format_version 2; version 1 checkpoints have none); and, for
/// checkpoints with a file list, that the list names model.h5 and every one of `format_files()` the directory holds.
/// Throws `error` naming the checkpoint, the file and what is wrong.
void verify_files(const checkpoint_info& info, bool check_contents = true);

/// What `discover` found under a path.
struct discovery {
  std::vector<checkpoint_info> checkpoints;  ///< newest first: by (timestamp, step), as upstream
  std::vector<std::string> problems;         ///< directories with an unreadable metadata.json
  /// `step-N` directories without metadata.json. A write never leaves one (it commits by renaming a complete
  /// hidden directory), so each is a damaged checkpoint: reported, never silently trained over.
  std::vector<std::string> incomplete;
};

/// `path` itself if it is a checkpoint, and its immediate subdirectories that are (hidden ones, i.e. writes in
/// progress, skipped). Upstream's discover_latest_checkpoint, returning every candidate so a caller can fall
/// back to an older one.
discovery discover(const fs::path& path);

/// Writes `files` as the checkpoint directory `dir` (atomic: see the top of this file). `extra` is merged into
/// metadata.json. Returns the bytes written.
std::uint64_t write_checkpoint(const fs::path& dir, const std::vector<named_file>& files, std::int64_t step,
                               bool is_temporary, std::chrono::system_clock::time_point when,
                               const nlohmann::json& extra = nlohmann::json::object());

/// The checkpointer's policy settings (from `trainer.checkpointer`).
struct policy {
  fs::path base_path;  ///< run id already appended when configured
  std::chrono::duration<double> save_interval{15 * 60.0};
  std::vector<KeepPolicy> keep{KeepPolicy{}};
  bool delete_old_temp_checkpoints = true;
};

/// Upstream's Checkpointer: decides when to save, writes in the background, deletes the previous temporary
/// checkpoint after the next one commits. `now` is injectable for tests. Constructing one locks the base path
/// (io::dir_lock); a second checkpointer on it, in any process, throws `error` naming the holder.
class checkpointer {
 public:
  using clock_fn = std::function<std::chrono::system_clock::time_point()>;
  using log_fn = std::function<void(const std::string&)>;

  explicit checkpointer(policy p, clock_fn now = {}, log_fn log = {});
  checkpointer(const checkpointer&) = delete;
  checkpointer& operator=(const checkpointer&) = delete;
  ~checkpointer();

  const policy& settings() const { return p_; }

  /// The `every` of the step policy that applies at `step`, or nullopt after the last `until`.
  std::optional<std::int64_t> step_interval(std::int64_t step) const;

  /// Called after `step` updates. Saves (in the background) when the policy says so or `force`; `make_files`
  /// builds the in-memory snapshot on the calling thread and is only called when saving. Returns whether a save
  /// started. Rethrows the error of a failed earlier write.
  bool on_step(std::int64_t step, const std::function<std::vector<named_file>()>& make_files, bool force = false,
               const nlohmann::json& extra = nlohmann::json::object());

  /// Saves `files` as `step-<step>` now (in the background).
  void save_now(std::int64_t step, std::vector<named_file> files, bool is_temporary,
                const nlohmann::json& extra = nlohmann::json::object());

  /// Blocks until the background write (if any) has finished; rethrows its error.
  void wait();

  std::int64_t last_save_step() const { return last_save_step_; }
  /// After resuming from `step-N`: that step counts as saved (a forced save at N is skipped).
  void resumed_at(std::int64_t step) {
    last_save_step_ = step;
    saved_any_ = true;
  }
  double last_write_seconds() const { return last_write_seconds_; }
  /// Time the last on_step spent building the in-memory snapshot: what training waited for.
  double last_snapshot_seconds() const { return last_snapshot_seconds_; }
  std::uint64_t last_write_bytes() const { return last_write_bytes_; }

 private:
  void delete_if_still_temporary(const fs::path& dir);
  /// Hidden `.step-N.tmp-PID` / `.step-N.old-PID` directories left by a process that died while writing (its
  /// PID no longer runs) are removed; they never held a committed checkpoint.
  void remove_abandoned_writes();
  void rethrow_failure();

  policy p_;
  io::dir_lock lock_;  ///< held from construction: one writer per base path
  clock_fn now_;
  log_fn log_;
  std::chrono::system_clock::time_point last_save_time_;
  std::int64_t last_save_step_ = 0;
  bool saved_any_ = false;
  std::optional<fs::path> last_temporary_;
  std::thread worker_;
  bool busy_ = false;
  std::mutex mu_;
  std::exception_ptr failure_;
  double last_write_seconds_ = 0;
  std::uint64_t last_write_bytes_ = 0;
  double snapshot_seconds_ = -1;
  double last_snapshot_seconds_ = 0;
};

/// The checkpointer settings of a trainer config for a run id.
policy policy_from_config(const CheckpointerConfig& c, const std::string& run_id);

}  // namespace levanter::checkpoint
