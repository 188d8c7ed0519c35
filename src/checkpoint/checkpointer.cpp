// checkpoint/checkpointer.hpp: checkpoint directories and upstream's Checkpointer policy.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <levanter/checkpoint/checkpointer.hpp>
#include <levanter/io/json_limits.hpp>
#include <regex>
#include <tuple>
#include <zlib.h>

namespace levanter::checkpoint {

namespace detail {
namespace {

void fsync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) throw error("cannot open '" + p.string() + "' to fsync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw error("fsync of '" + p.string() + "' failed (disk full or I/O error?)");
}

void write_text_synced(const fs::path& p, const std::string& text) {
  {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    if (!out) throw error("cannot create '" + p.string() + "'");
    out << text;
    out.flush();
    if (!out) throw error("writing '" + p.string() + "' failed (disk full?)");
    out.close();
    if (!out) throw error("writing '" + p.string() + "' failed (disk full?)");
  }
  fsync_path(p);
}

/// ISO 8601 UTC with microseconds: sorts as text in time order.
std::string iso_timestamp(std::chrono::system_clock::time_point t) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lld", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(us % 1000000));
  return buf;
}

}  // namespace

std::string crc32_text(std::uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "crc32:%08x", crc);
  return buf;
}

std::uint32_t crc32_of(std::string_view bytes) {
  uLong crc = ::crc32_z(0L, Z_NULL, 0);
  return static_cast<std::uint32_t>(
      ::crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<z_size_t>(bytes.size())));
}

std::uint32_t crc32_of_file(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw error("cannot open '" + p.string() + "' to check its contents (" + std::strerror(errno) + ")");
  std::vector<unsigned char> buf(std::size_t{4} << 20);
  uLong crc = ::crc32_z(0L, Z_NULL, 0);
  while (true) {
    const auto n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw error("cannot read '" + p.string() + "' (" + std::strerror(err) + ")");
    }
    if (n == 0) break;
    crc = ::crc32_z(crc, buf.data(), static_cast<z_size_t>(n));
  }
  ::close(fd);
  return static_cast<std::uint32_t>(crc);
}

}  // namespace detail

std::optional<checkpoint_info> read_metadata(const fs::path& dir) {
  const fs::path meta = dir / "metadata.json";
  std::error_code ec;
  if (!fs::is_regular_file(meta, ec)) return std::nullopt;
  nlohmann::json j;
  try {
    // metadata.json is a few hundred bytes; a large or deeply nested one is not ours.
    const auto size = fs::file_size(meta, ec);
    if (ec || size > (std::uintmax_t{1} << 24)) throw error("larger than 16 MiB or unreadable");
    std::ifstream in(meta, std::ios::binary);
    std::string text(static_cast<std::size_t>(size), '\0');
    if (!in.read(text.data(), static_cast<std::streamsize>(size))) throw error("cannot read it");
    if (io::json_depth(text, 16) > 16) throw error("nested deeper than 16 levels");
    j = nlohmann::json::parse(text);
    checkpoint_info info;
    info.path = dir;
    if (!j.is_object()) throw error("not a JSON object");
    const auto step = j.contains("step") ? io::json_int(j["step"]) : std::nullopt;
    if (!step || *step < 0) throw error("'step' is not a non-negative integer");
    info.step = *step;
    info.timestamp = j.value("timestamp", std::string());
    info.is_temporary = j.value("is_temporary", false);
    // The file lists are checked here, so that later code can trust their types.
    for (const char* key : {"files", "checksums"}) {
      if (!j.contains(key)) continue;
      if (!j[key].is_object()) throw error(std::string("'") + key + "' is not an object");
      for (const auto& [name, v] : j[key].items()) {
        if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
            name == "metadata.json")
          throw error(std::string("'") + key + "' names an invalid file '" + name + "'");
        if (std::string_view(key) == "files" ? !io::json_int(v) || v.get<std::int64_t>() < 0 : !v.is_string())
          throw error(std::string("'") + key + "." + name + "' has the wrong type");
      }
    }
    info.metadata = j;
    return info;
  } catch (const std::exception& e) {
    throw error("'" + meta.string() + "' is corrupt (" + e.what() + ")");
  }
}

void verify_files(const checkpoint_info& info, bool check_contents) {
  const auto& m = info.metadata;
  if (!m.contains("files")) return;
  // The manifest vouches for every file the loaders read: one the directory holds but metadata.json does not list
  // has no recorded size or checksum, so its bytes are unchecked; that is damage, like a wrong checksum.
  if (!m["files"].contains("model.h5"))
    throw error("checkpoint '" + info.path.string() + "' is damaged: metadata.json does not list 'model.h5', which "
                "every checkpoint has");
  for (const char* name : format_files()) {
    std::error_code ec;
    if (fs::exists(info.path / name, ec) && !m["files"].contains(name))
      throw error("checkpoint '" + info.path.string() + "' is damaged: '" + name + "' is in the directory but "
                  "metadata.json does not list it, so nothing vouches for its bytes");
  }
  for (const auto& [name, size] : m["files"].items()) {
    const fs::path p = info.path / name;
    std::error_code ec;
    const auto actual = fs::file_size(p, ec);
    if (ec) throw error("checkpoint '" + info.path.string() + "' is torn: '" + name + "' is missing");
    if (actual != size.get<std::uint64_t>())
      throw error("checkpoint '" + info.path.string() + "' is torn: '" + name + "' has " + std::to_string(actual) +
                  " bytes, metadata.json says " + std::to_string(size.get<std::uint64_t>()));
  }
  if (!check_contents || !m.contains("checksums")) return;  // checkpoints of format_version 1 have no checksums
  for (const auto& [name, size] : m["files"].items()) {
    if (!m["checksums"].contains(name))
      throw error("checkpoint '" + info.path.string() + "' is damaged: metadata.json has no checksum for '" + name +
                  "'");
    const auto want = m["checksums"][name].get<std::string>();
    const auto got = detail::crc32_text(detail::crc32_of_file(info.path / name));
    if (got != want)
      throw error("checkpoint '" + info.path.string() + "' is damaged: the contents of '" + name +
                  "' do not match their checksum in metadata.json (" + got + ", recorded " + want +
                  "); the file changed after it was written (disk or copy error)");
  }
}

discovery discover(const fs::path& path) {
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
  static const std::regex step_dir("step-[0-9]+");
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    const auto name = entry.path().filename().string();
    if (!entry.is_directory(ec)) {
      // Where a step's directory should be there is something else: say so rather than pass over it.
      if (std::regex_match(name, step_dir))
        out.problems.push_back("'" + entry.path().string() + "' is not a directory (a checkpoint is a directory "
                               "holding metadata.json); move it away");
      continue;
    }
    if (name.empty() || name[0] == '.') continue;
    const auto before = out.checkpoints.size() + out.problems.size();
    consider(entry.path());
    if (out.checkpoints.size() + out.problems.size() == before && std::regex_match(name, step_dir))
      out.incomplete.push_back(entry.path().string());
  }
  std::sort(out.incomplete.begin(), out.incomplete.end());
  std::sort(out.checkpoints.begin(), out.checkpoints.end(),
            [](const auto& a, const auto& b) { return std::tie(a.timestamp, a.step) > std::tie(b.timestamp, b.step); });
  return out;
}

std::uint64_t write_checkpoint(const fs::path& dir, const std::vector<named_file>& files, std::int64_t step,
                               bool is_temporary, std::chrono::system_clock::time_point when,
                               const nlohmann::json& extra) {
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
  meta["format_version"] = 2;
  nlohmann::json sizes = nlohmann::json::object(), sums = nlohmann::json::object();
  std::uint64_t total = 0;
  try {
    for (const auto& f : files) {
      const fs::path p = tmp / f.name;
      std::uint32_t crc = 0;
      if (f.text) {
        detail::write_text_synced(p, *f.text);
        crc = detail::crc32_of(*f.text);
      } else {
        f.data.write(p.string());
        // Read back after the fsync: the checksum is of the bytes the file system holds.
        crc = detail::crc32_of_file(p);
      }
      const auto size = fs::file_size(p, ec);
      if (ec) throw error("cannot read the size of '" + p.string() + "': " + ec.message());
      sizes[f.name] = size;
      sums[f.name] = detail::crc32_text(crc);
      total += size;
    }
    meta["files"] = sizes;
    meta["checksums"] = sums;
    detail::write_text_synced(tmp / "metadata.json", meta.dump(2) + "\n");
    detail::fsync_path(tmp);
  } catch (...) {
    // Nothing of a failed write stays behind: a full disk gets its space back, and no committed checkpoint changed.
    fs::remove_all(tmp, ec);
    throw;
  }

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

policy policy_from_config(const CheckpointerConfig& c, const std::string& run_id) {
  policy p;
  p.base_path = c.append_run_id_to_base_path ? fs::path(c.base_path) / run_id : fs::path(c.base_path);
  p.save_interval = std::chrono::duration<double>(c.save_interval.seconds);
  p.keep = c.keep;
  p.delete_old_temp_checkpoints = c.delete_old_temp_checkpoints;
  return p;
}

checkpointer::checkpointer(policy p, clock_fn now, log_fn log)
    : p_(std::move(p)),
      now_(now ? std::move(now) : clock_fn([] { return std::chrono::system_clock::now(); })),
      log_(log ? std::move(log) : log_fn([](const std::string&) {})) {
  for (std::size_t i = 1; i < p_.keep.size(); ++i) {
    if (!p_.keep[i - 1].until) throw error("trainer.checkpointer.keep: only the last policy may omit 'until'");
    if (p_.keep[i].until && *p_.keep[i - 1].until >= *p_.keep[i].until)
      throw error("trainer.checkpointer.keep: policies must be sorted by increasing 'until'");
  }
  last_save_time_ = now_();
  try {
    lock_ = io::dir_lock(p_.base_path);
  } catch (const std::exception& e) {
    throw error(std::string("checkpoint directory ") + e.what());
  }
  remove_abandoned_writes();
  const auto found = discover(p_.base_path);
  if (!found.checkpoints.empty() && p_.delete_old_temp_checkpoints && found.checkpoints.front().is_temporary) {
    last_temporary_ = found.checkpoints.front().path;
    log_("checkpointer: found temporary checkpoint " + last_temporary_->string() +
         "; it is deleted after the next checkpoint commits");
  }
}

checkpointer::~checkpointer() {
  try {
    wait();
  } catch (...) {
  }
}

std::optional<std::int64_t> checkpointer::step_interval(std::int64_t step) const {
  for (const auto& k : p_.keep)
    if (!k.until || *k.until >= step) return k.every;
  return std::nullopt;
}

bool checkpointer::on_step(std::int64_t step, const std::function<std::vector<named_file>()>& make_files, bool force,
                           const nlohmann::json& extra) {
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

void checkpointer::save_now(std::int64_t step, std::vector<named_file> files, bool is_temporary,
                            const nlohmann::json& extra) {
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
  if (snapshot_seconds_ >= 0)
    std::snprintf(copied, sizeof copied, " (state copied in %.3f s; written in the background)", snapshot_seconds_);
  log_(std::string("checkpointer: saving ") + (is_temporary ? "temporary " : "") + "checkpoint " + dest.string() +
       copied);
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

void checkpointer::wait() {
  if (worker_.joinable()) worker_.join();
  busy_ = false;
  rethrow_failure();
}

void checkpointer::delete_if_still_temporary(const fs::path& dir) {
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

void checkpointer::remove_abandoned_writes() {
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

void checkpointer::rethrow_failure() {
  std::exception_ptr f;
  {
    std::lock_guard lk(mu_);
    f = std::exchange(failure_, nullptr);
  }
  if (f) std::rethrow_exception(f);
}

}  // namespace levanter::checkpoint
