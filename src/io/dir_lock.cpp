// levanter/io/dir_lock.hpp.
#include <levanter/io/dir_lock.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

namespace levanter::io {

namespace {

std::string host_name() {
  char buf[256] = "";
  if (::gethostname(buf, sizeof buf - 1) != 0) return "an unknown host";
  return buf;
}

std::string holder_text(int fd) {
  char buf[512];
  const auto n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string s = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  for (auto& c : s)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  return s.empty() ? "a process that has not written its name yet" : s;
}

}  // namespace

dir_lock::dir_lock(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create the directory '" + dir.string() + "' (" + ec.message() + ")");
  const auto path = dir / ".lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw std::runtime_error("cannot create the lock file '" + path.string() + "' (" + std::strerror(errno) + ")");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string who = holder_text(fd_);
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      throw lock_error("'" + dir.string() + "' is in use by another process (" + who +
                       "); two processes must not write one run: wait for it to end, stop it, or choose another "
                       "run id");
    throw std::runtime_error("cannot lock '" + path.string() + "' (" + std::strerror(err) + ")");
  }
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  const std::string text = "pid " + std::to_string(::getpid()) + " on " + host_name() + ", since " + when + "\n";
  // Who holds the lock is information for the next process, not part of the lock: a failed write is harmless.
  const bool named = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, text.data(), text.size(), 0) > 0;
  (void)named;
}

dir_lock& dir_lock::operator=(dir_lock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

dir_lock::~dir_lock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace levanter::io
