// levanter/io/atomic_file.hpp: the atomic file replacement every subsystem uses.
#include <levanter/io/atomic_file.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <system_error>

namespace levanter::io {

namespace {

std::string reason(int err) {
  std::string r = std::strerror(err);
  if (err == ENOSPC) r += "; the disk is full";
  if (err == EDQUOT) r += "; the disk quota is exhausted";
  return r;
}

struct temp_file {
  int fd = -1;
  std::string name;
  bool keep = false;
  ~temp_file() {
    if (fd >= 0) ::close(fd);
    if (!keep && !name.empty()) ::unlink(name.c_str());
  }
};

}  // namespace

void write_file_atomic(const std::filesystem::path& path, std::span<const std::string_view> pieces,
                       const atomic_write_options& o) {
  namespace fs = std::filesystem;
  const fs::path parent = path.has_parent_path() ? path.parent_path() : fs::path(".");
  if (o.create_parent) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) throw io_error("cannot create the directory '" + parent.string() + "' for '" + path.string() + "': " +
                           ec.message());
  }
  static std::atomic<unsigned> counter{0};
  temp_file tmp;
  for (int attempt = 0; tmp.fd < 0; ++attempt) {
    tmp.name = (parent / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                          std::to_string(counter++)))
                   .string();
    tmp.fd = ::open(tmp.name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (tmp.fd < 0) {
      const int err = errno;
      tmp.name.clear();
      if (err != EEXIST || attempt == 100)
        throw io_error("cannot write '" + path.string() + "': cannot create a temporary file in '" + parent.string() +
                       "' (" + reason(err) + ")");
    }
  }
  for (auto piece : pieces) {
    while (!piece.empty()) {
      const auto n = ::write(tmp.fd, piece.data(), piece.size() < (std::size_t{1} << 30) ? piece.size() : (std::size_t{1} << 30));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw io_error("cannot write '" + path.string() + "' (" + reason(errno) + ")");
      piece.remove_prefix(static_cast<std::size_t>(n));
    }
  }
  if (o.sync && ::fsync(tmp.fd) != 0) throw io_error("cannot write '" + path.string() + "' (fsync: " + reason(errno) + ")");
  const int fd = tmp.fd;
  tmp.fd = -1;
  if (::close(fd) != 0) throw io_error("cannot write '" + path.string() + "' (" + reason(errno) + ")");
  if (::rename(tmp.name.c_str(), path.c_str()) != 0)
    throw io_error("cannot move '" + tmp.name + "' over '" + path.string() + "' (" + reason(errno) + ")");
  tmp.keep = true;
  if (o.sync) {
    const int dfd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) throw io_error("cannot open the directory '" + parent.string() + "' (" + reason(errno) + ")");
    // Some file systems cannot fsync a directory (EINVAL); the rename is then as durable as they make it.
    const int rc = ::fsync(dfd), err = errno;
    ::close(dfd);
    if (rc != 0 && err != EINVAL)
      throw io_error("cannot fsync the directory '" + parent.string() + "' (" + reason(err) + ")");
  }
}

}  // namespace levanter::io
