// levanter/checkpoint/checkpointer.hpp: checkpoint directories and upstream's Checkpointer policy.
//
// A checkpoint is a directory `<base>/step-N/` holding HDF5 files and `metadata.json` ({"step", "timestamp",
// "is_temporary", "files": {name: bytes}}). It is built under a hidden temporary name, every file fsynced,
// metadata.json written last, then renamed into place and the parent fsynced: a crash at any point leaves either
// no `step-N` or a complete one. Readers only consider directories that hold metadata.json, and check that every
// file it lists has the recorded size before trusting it.
//
// Policy (upstream `Checkpointer.on_step`): a permanent checkpoint every `keep[i].every` steps (the first policy
// whose `until` is unset or >= step), else a temporary one when `save_interval` has passed since the last save.
// The previous temporary checkpoint is deleted once the next checkpoint has committed, and only if its
// metadata.json still says temporary. Nothing is saved at step 0 unless forced. Writes run on a background
// thread from an in-memory snapshot, one at a time.
#pragma once

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <levanter/checkpoint/h5.hpp>
#include <levanter/checkpoint/config.hpp>

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

namespace detail {

inline void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) throw error("cannot open '" + p.string() + "' to fsync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw error("fsync of '" + p.string() + "' failed (disk full or I/O error?)");
}

inline void write_text_synced(const fs::path& p, const std::string& text) {
  {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    if (!out) throw error("cannot create '" + p.string() + "'");
    out << text;
    out.flush();
    if (!out) throw error("writing '" + p.string() + "' failed (disk full?)");
  }
  fsync_path(p);
}

/// ISO 8601 UTC with microseconds: sorts as text in time order.
inline std::string iso_timestamp(std::chrono::system_clock::time_point t) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lld", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(us % 1000000));
  return buf;
}

}  // namespace detail

/// The checkpoint in `dir` per its metadata.json; nullopt when `dir` holds none (not a checkpoint, or one whose
/// write never committed). Throws `error` when metadata.json exists but cannot be parsed.
inline std::optional<checkpoint_info> read_metadata(const fs::path& dir) {
  const fs::path meta = dir / "metadata.json";
  std::error_code ec;
  if (!fs::is_regular_file(meta, ec)) return std::nullopt;
  std::ifstream in(meta);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
    checkpoint_info info;
    info.path = dir;
    info.step = j.at("step").get<std::int64_t>();
    info.timestamp = j.value("timestamp", std::string());
    info.is_temporary = j.value("is_temporary", false);
    info.metadata = j;
    return info;
  } catch (const std::exception& e) {
    throw error("'" + meta.string() + "' is corrupt (" + e.what() + ")");
  }
}

/// Checks that every file metadata.json lists exists with its recorded size.
inline void verify_files(const checkpoint_info& info) {
  if (!info.metadata.contains("files")) return;
  for (const auto& [name, size] : info.metadata["files"].items()) {
    const fs::path p = info.path / name;
    std::error_code ec;
    const auto actual = fs::file_size(p, ec);
    if (ec) throw error("checkpoint '" + info.path.string() + "' is torn: '" + name + "' is missing");
    if (actual != size.get<std::uint64_t>())
      throw error("checkpoint '" + info.path.string() + "' is torn: '" + name + "' has " + std::to_string(actual) +
                  " bytes, metadata.json says " + std::to_string(size.get<std::uint64_t>()));
  }
}

/// What `discover` found under a path.
struct discovery {
  std::vector<checkpoint_info> checkpoints;  ///< newest first: by (timestamp, step), as upstream
  std::vector<std::string> problems;         ///< directories with an unreadable metadata.json
};

/// `path` itself if it is a checkpoint, and its immediate subdirectories that are (hidden ones, i.e. writes in
/// progress, skipped). Upstream's discover_latest_checkpoint, returning every candidate so a caller can fall
/// back to an older one.
inline discovery discover(const fs::path& path) {
  discovery out;
  auto consider = [&](const fs::path& dir) {
    try {
      if (auto info = read_metadata(dir)) out.checkpoints.push_back(std::move(*info));
    } catch (const error& e) {
      out.problems.emplace_back(e.what());
    }
  };
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return out;
  consider(path);
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    if (!entry.is_directory(ec)) continue;
    const auto name = entry.path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    consider(entry.path());
  }
  std::sort(out.checkpoints.begin(), out.checkpoints.end(), [](const auto& a, const auto& b) {
    return std::tie(a.timestamp, a.step) > std::tie(b.timestamp, b.step);
  });
  return out;
}

/// Writes `files` as the checkpoint directory `dir` (atomic: see the top of this file). `extra` is merged into
/// metadata.json. Returns the bytes written.
inline std::uint64_t write_checkpoint(const fs::path& dir, const std::vector<named_file>& files, std::int64_t step,
                                      bool is_temporary, std::chrono::system_clock::time_point when,
                                      const nlohmann::json& extra = nlohmann::json::object()) {
  const fs::path parent = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
  const std::string name = dir.filename().string();
  const std::string tag = std::to_string(::getpid());
  const fs::path tmp = parent / ("." + name + ".tmp-" + tag);
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) throw error("cannot create checkpoint directory '" + parent.string() + "': " + ec.message());
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  if (ec) throw error("cannot create '" + tmp.string() + "': " + ec.message());

  nlohmann::json meta = extra;
  meta["step"] = step;
  meta["timestamp"] = detail::iso_timestamp(when);
  meta["is_temporary"] = is_temporary;
  meta["format"] = "levanter-cpp-checkpoint";
  meta["format_version"] = 1;
  nlohmann::json sizes = nlohmann::json::object();
  std::uint64_t total = 0;
  for (const auto& f : files) {
    const fs::path p = tmp / f.name;
    if (f.text)
      detail::write_text_synced(p, *f.text);
    else
      f.data.write(p.string());
    const auto size = fs::file_size(p);
    sizes[f.name] = size;
    total += size;
  }
  meta["files"] = sizes;
  detail::write_text_synced(tmp / "metadata.json", meta.dump(2) + "\n");
  detail::fsync_path(tmp);

  // An older directory of the same name (a rerun over an existing step) is moved aside, then removed.
  const fs::path old = parent / ("." + name + ".old-" + tag);
  const bool had_old = fs::exists(dir, ec);
  if (had_old) {
    fs::remove_all(old, ec);
    fs::rename(dir, old, ec);
    if (ec) throw error("cannot replace existing checkpoint '" + dir.string() + "': " + ec.message());
  }
  fs::rename(tmp, dir, ec);
  if (ec) throw error("cannot commit checkpoint '" + dir.string() + "': " + ec.message());
  detail::fsync_path(parent);
  if (had_old) fs::remove_all(old, ec);
  return total;
}

/// The checkpointer's policy settings (from `trainer.checkpointer`).
struct policy {
  fs::path base_path;                      ///< run id already appended when configured
  std::chrono::duration<double> save_interval{15 * 60.0};
  std::vector<KeepPolicy> keep{KeepPolicy{}};
  bool delete_old_temp_checkpoints = true;
};

/// Upstream's Checkpointer: decides when to save, writes in the background, deletes the previous temporary
/// checkpoint after the next one commits. `now` is injectable for tests.
class checkpointer {
 public:
  using clock_fn = std::function<std::chrono::system_clock::time_point()>;
  using log_fn = std::function<void(const std::string&)>;

  explicit checkpointer(policy p, clock_fn now = {}, log_fn log = {})
      : p_(std::move(p)), now_(now ? std::move(now) : clock_fn([] { return std::chrono::system_clock::now(); })),
        log_(log ? std::move(log) : log_fn([](const std::string&) {})) {
    for (std::size_t i = 1; i < p_.keep.size(); ++i) {
      if (!p_.keep[i - 1].until) throw error("trainer.checkpointer.keep: only the last policy may omit 'until'");
      if (p_.keep[i].until && *p_.keep[i - 1].until >= *p_.keep[i].until)
        throw error("trainer.checkpointer.keep: policies must be sorted by increasing 'until'");
    }
    last_save_time_ = now_();
    remove_abandoned_writes();
    const auto found = discover(p_.base_path);
    if (!found.checkpoints.empty() && p_.delete_old_temp_checkpoints && found.checkpoints.front().is_temporary) {
      last_temporary_ = found.checkpoints.front().path;
      log_("checkpointer: found temporary checkpoint " + last_temporary_->string() +
           "; it is deleted after the next checkpoint commits");
    }
  }
  checkpointer(const checkpointer&) = delete;
  checkpointer& operator=(const checkpointer&) = delete;
  ~checkpointer() {
    try {
      wait();
    } catch (...) {
    }
  }

  const policy& settings() const { return p_; }

  /// The `every` of the step policy that applies at `step`, or nullopt after the last `until`.
  std::optional<std::int64_t> step_interval(std::int64_t step) const {
    for (const auto& k : p_.keep)
      if (!k.until || *k.until >= step) return k.every;
    return std::nullopt;
  }

  /// Called after `step` updates. Saves (in the background) when the policy says so or `force`; `make_files`
  /// builds the in-memory snapshot on the calling thread and is only called when saving. Returns whether a save
  /// started. Rethrows the error of a failed earlier write.
  bool on_step(std::int64_t step, const std::function<std::vector<named_file>()>& make_files, bool force = false,
               const nlohmann::json& extra = nlohmann::json::object()) {
    rethrow_failure();
    if (step == 0) {
      last_save_time_ = now_();
      if (!force) return false;
    }
    if (step == last_save_step_ && (saved_any_ || !force)) return false;
    bool save = force, permanent = force;
    const auto every = step_interval(step);
    if (every && *every > 0 && step % *every == 0) {
      save = true;
      permanent = true;
    } else if (!save && p_.save_interval.count() > 0 && now_() - last_save_time_ >= p_.save_interval) {
      save = true;
      permanent = false;
    }
    if (!save) return false;
    wait();  // one write at a time
    const auto t0 = std::chrono::steady_clock::now();
    auto files = make_files();
    snapshot_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    last_snapshot_seconds_ = snapshot_seconds_;
    save_now(step, std::move(files), !permanent, extra);
    return true;
  }

  /// Saves `files` as `step-<step>` now (in the background).
  void save_now(std::int64_t step, std::vector<named_file> files, bool is_temporary,
                const nlohmann::json& extra = nlohmann::json::object()) {
    wait();  // one write at a time; also rethrows
    const fs::path dest = p_.base_path / ("step-" + std::to_string(step));
    std::optional<fs::path> previous_temp = last_temporary_;
    last_temporary_ = is_temporary ? std::optional<fs::path>(dest) : std::nullopt;
    if (previous_temp && *previous_temp == dest) previous_temp.reset();
    last_save_step_ = step;
    saved_any_ = true;
    last_save_time_ = now_();
    const auto when = last_save_time_;
    char copied[96] = "";
    if (snapshot_seconds_ >= 0) std::snprintf(copied, sizeof copied, " (state copied in %.3f s; written in the background)", snapshot_seconds_);
    log_(std::string("checkpointer: saving ") + (is_temporary ? "temporary " : "") + "checkpoint " + dest.string() + copied);
    snapshot_seconds_ = -1;
    busy_ = true;
    worker_ = std::thread([this, dest, files = std::move(files), step, is_temporary, when, extra, previous_temp] {
      try {
        const auto t0 = std::chrono::steady_clock::now();
        const auto bytes = write_checkpoint(dest, files, step, is_temporary, when, extra);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        last_write_seconds_ = secs;
        last_write_bytes_ = bytes;
        char buf[160];
        std::snprintf(buf, sizeof buf, "checkpointer: committed %s (%.1f MB in %.2f s)", dest.string().c_str(),
                      double(bytes) / 1e6, secs);
        log_(buf);
        if (previous_temp) delete_if_still_temporary(*previous_temp);
      } catch (...) {
        std::lock_guard lk(mu_);
        failure_ = std::current_exception();
      }
    });
  }

  /// Blocks until the background write (if any) has finished; rethrows its error.
  void wait() {
    if (worker_.joinable()) worker_.join();
    busy_ = false;
    rethrow_failure();
  }

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
  void delete_if_still_temporary(const fs::path& dir) {
    try {
      const auto info = read_metadata(dir);
      if (!info) {
        log_("checkpointer: previous temporary checkpoint " + dir.string() + " is gone; nothing to delete");
        return;
      }
      if (!info->is_temporary) {
        log_("checkpointer: not deleting " + dir.string() + ": it is no longer temporary");
        return;
      }
      std::error_code ec;
      fs::remove_all(dir, ec);
      log_("checkpointer: deleted previous temporary checkpoint " + dir.string());
    } catch (const std::exception& e) {
      log_(std::string("checkpointer: could not delete ") + dir.string() + ": " + e.what());
    }
  }
  /// Hidden `.step-N.tmp-PID` / `.step-N.old-PID` directories left by a process that died while writing (its
  /// PID no longer runs) are removed; they never held a committed checkpoint.
  void remove_abandoned_writes() {
    std::error_code ec;
    if (!fs::is_directory(p_.base_path, ec)) return;
    for (const auto& entry : fs::directory_iterator(p_.base_path, ec)) {
      const auto name = entry.path().filename().string();
      if (name.empty() || name[0] != '.') continue;
      auto pos = name.rfind(".tmp-");
      if (pos == std::string::npos) pos = name.rfind(".old-");
      if (pos == std::string::npos) continue;
      const std::string pid_text = name.substr(pos + 5);
      if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
      const auto pid = static_cast<pid_t>(std::stol(pid_text));
      if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
      fs::remove_all(entry.path(), ec);
      if (!ec) log_("checkpointer: removed " + entry.path().string() + ", an unfinished write of a process that died");
    }
  }
  void rethrow_failure() {
    std::exception_ptr f;
    {
      std::lock_guard lk(mu_);
      f = std::exchange(failure_, nullptr);
    }
    if (f) std::rethrow_exception(f);
  }

  policy p_;
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
inline policy policy_from_config(const CheckpointerConfig& c, const std::string& run_id) {
  policy p;
  p.base_path = c.append_run_id_to_base_path ? fs::path(c.base_path) / run_id : fs::path(c.base_path);
  p.save_interval = std::chrono::duration<double>(c.save_interval.seconds);
  p.keep = c.keep;
  p.delete_old_temp_checkpoints = c.delete_old_temp_checkpoints;
  return p;
}

}  // namespace levanter::checkpoint
