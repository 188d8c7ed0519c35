// levanter/io/dir_lock.hpp: one process at a time per directory. A run's log directory and its checkpoint
// directory are each locked by the process writing them, so a second process started with the same run id (or the
// same base path) is refused instead of interleaving its files with the first one's.
//
//   levanter::io::dir_lock lock(run_dir);   // throws lock_error naming the holder's pid and host
//
// The lock is an flock(2) on `<dir>/.lock`, which the kernel releases when the process ends however it ends (a
// SIGKILL included), so a restart after a crash is never refused. The file's text says who holds it.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>

namespace levanter::io {

/// Another process holds the lock; the message names the directory and the holder (pid, host, start time).
struct lock_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class dir_lock {
 public:
  dir_lock() = default;
  /// Creates `dir` if needed and locks it. Throws lock_error when another process (or another dir_lock of this
  /// process) holds it, std::runtime_error when the lock file cannot be created.
  explicit dir_lock(const std::filesystem::path& dir);
  dir_lock(dir_lock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  dir_lock& operator=(dir_lock&& o) noexcept;
  dir_lock(const dir_lock&) = delete;
  dir_lock& operator=(const dir_lock&) = delete;
  ~dir_lock();

  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace levanter::io
