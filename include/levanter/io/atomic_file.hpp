// levanter/io/atomic_file.hpp: the one way levanter replaces a file: write a fresh temporary file beside it, make
// it durable if asked, then rename it over the target, so a reader (a resumed run, a browser refreshing a page,
// another process reading a cache ledger) sees the old file or the new one, never half of one.
//
//   levanter::io::write_file_atomic(run_dir / "summary.json", text);
//   levanter::io::write_file_atomic(path, {header, body}, {.sync = true});   // fsync file and directory
#pragma once

#include <filesystem>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace levanter::io {

/// A file that could not be written; the message names it and the system's reason.
struct io_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct atomic_write_options {
  bool sync = false;           ///< fsync the file before the rename and the directory after it
  bool create_parent = false;  ///< create the parent directory first
};

/// Writes the concatenation of `pieces` to `path` atomically. The temporary file (`.<name>.tmp-<pid>-<n>` in the
/// same directory, created exclusively) is removed on failure. Throws io_error naming the file and the reason
/// (a full disk says so).
void write_file_atomic(const std::filesystem::path& path, std::span<const std::string_view> pieces,
                       const atomic_write_options& o = {});

inline void write_file_atomic(const std::filesystem::path& path, std::string_view text,
                              const atomic_write_options& o = {}) {
  write_file_atomic(path, std::span<const std::string_view>(&text, 1), o);
}

inline void write_file_atomic(const std::filesystem::path& path, std::initializer_list<std::string_view> pieces,
                              const atomic_write_options& o = {}) {
  write_file_atomic(path, std::span<const std::string_view>(pieces.begin(), pieces.size()), o);
}

}  // namespace levanter::io
