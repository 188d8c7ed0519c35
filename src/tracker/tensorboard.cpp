// tracker/tensorboard.hpp: TensorBoard event files (TFRecord framing, CRC-32C, the protobuf subset, histograms).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <levanter/tracker/tensorboard.hpp>
#include <limits>
#include <stdexcept>
#include <system_error>

namespace levanter::tensorboard {

namespace detail {
namespace {

constexpr std::array<std::array<std::uint32_t, 256>, 8> make_crc32c_tables() {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    t[0][i] = c;
  }
  for (std::size_t s = 1; s < 8; ++s)
    for (std::size_t i = 0; i < 256; ++i) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xffu];
  return t;
}

constexpr auto crc32c_tables = make_crc32c_tables();

}  // namespace
}  // namespace detail

std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t n) {
  const auto& t = detail::crc32c_tables;
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    const std::uint32_t lo =
        c ^ (std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 | std::uint32_t{p[3]} << 24);
    c = t[7][lo & 0xffu] ^ t[6][(lo >> 8) & 0xffu] ^ t[5][(lo >> 16) & 0xffu] ^ t[4][lo >> 24] ^ t[3][p[4]] ^
        t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
  }
  for (; n > 0; --n, ++p) c = (c >> 8) ^ t[0][(c ^ *p) & 0xffu];
  return ~c;
}

std::uint32_t crc32c(std::string_view data) { return crc32c_extend(0, data.data(), data.size()); }

std::uint32_t masked_crc32c(std::string_view data) { return mask_crc(crc32c(data)); }

namespace detail {
namespace {
void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
}
}  // namespace
}  // namespace detail

void append_record(std::string& out, std::string_view data) {
  std::string header;
  detail::put_le(header, data.size(), 8);
  out += header;
  detail::put_le(out, masked_crc32c(header), 4);
  out.append(data);
  detail::put_le(out, masked_crc32c(data), 4);
}

std::string frame_record(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  append_record(out, data);
  return out;
}

namespace pb {

void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7fu) | 0x80u));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, std::uint32_t field, wire w) {
  put_varint(out, (std::uint64_t{field} << 3) | static_cast<std::uint32_t>(w));
}

void put_varint_field(std::string& out, std::uint32_t field, std::uint64_t v) {
  put_key(out, field, wire::varint);
  put_varint(out, v);
}

void put_int64_field(std::string& out, std::uint32_t field, std::int64_t v) {
  put_varint_field(out, field, static_cast<std::uint64_t>(v));
}

void put_fixed64_field(std::string& out, std::uint32_t field, std::uint64_t v) {
  put_key(out, field, wire::fixed64);
  detail::put_le(out, v, 8);
}

void put_fixed32_field(std::string& out, std::uint32_t field, std::uint32_t v) {
  put_key(out, field, wire::fixed32);
  detail::put_le(out, v, 4);
}

void put_double_field(std::string& out, std::uint32_t field, double v) {
  put_fixed64_field(out, field, std::bit_cast<std::uint64_t>(v));
}

void put_float_field(std::string& out, std::uint32_t field, float v) {
  put_fixed32_field(out, field, std::bit_cast<std::uint32_t>(v));
}

void put_bytes_field(std::string& out, std::uint32_t field, std::string_view bytes) {
  put_key(out, field, wire::length_delimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

void put_packed_doubles_field(std::string& out, std::uint32_t field, std::span<const double> values) {
  put_key(out, field, wire::length_delimited);
  put_varint(out, values.size() * 8);
  for (double v : values) detail::put_le(out, std::bit_cast<std::uint64_t>(v), 8);
}

void put_double_if_set(std::string& out, std::uint32_t field, double v) {
  if (std::bit_cast<std::uint64_t>(v) != 0) put_double_field(out, field, v);
}

void put_int64_if_set(std::string& out, std::uint32_t field, std::int64_t v) {
  if (v != 0) put_int64_field(out, field, v);
}

void put_string_if_set(std::string& out, std::uint32_t field, std::string_view s) {
  if (!s.empty()) put_bytes_field(out, field, s);
}

}  // namespace pb

const std::vector<double>& default_bucket_limits() {
  static const std::vector<double> limits = [] {
    std::vector<double> pos;
    for (double v = 1.0e-12; v < 1.0e20; v *= 1.1) pos.push_back(v);
    pos.push_back(std::numeric_limits<double>::max());
    std::vector<double> all;
    all.reserve(2 * pos.size() + 1);
    for (auto it = pos.rbegin(); it != pos.rend(); ++it) all.push_back(-*it);
    all.push_back(0.0);
    all.insert(all.end(), pos.begin(), pos.end());
    return all;
  }();
  return limits;
}

namespace detail {
namespace {
template <class T>
histogram make_histogram(std::span<const T> values, std::string_view tag) {
  const auto& limits = default_bucket_limits();
  std::vector<double> counts(limits.size(), 0.0);
  histogram h;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double v = static_cast<double>(values[i]);
    if (!std::isfinite(v))
      throw std::invalid_argument("tensorboard: histogram" +
                                  (tag.empty() ? std::string() : " '" + std::string(tag) + "'") + ": value #" +
                                  std::to_string(i) + " is " + (std::isnan(v) ? "NaN" : "infinite"));
    // First limit > v; v == DBL_MAX falls past the end and goes in the last bucket.
    auto b = static_cast<std::size_t>(std::upper_bound(limits.begin(), limits.end(), v) - limits.begin());
    counts[std::min(b, limits.size() - 1)] += 1.0;
    if (v < h.min) h.min = v;
    if (v > h.max) h.max = v;
    h.num += 1.0;
    h.sum += v;
    h.sum_squares += v * v;
  }
  for (std::size_t i = 0; i < counts.size();) {
    double end = limits[i];
    double count = counts[i];
    ++i;
    if (count <= 0.0) {
      while (i < counts.size() && counts[i] <= 0.0) {
        end = limits[i];
        count = counts[i];
        ++i;
      }
    }
    h.bucket_limit.push_back(end);
    h.bucket.push_back(count);
  }
  return h;
}
}  // namespace
}  // namespace detail

histogram make_histogram(std::span<const double> values) { return detail::make_histogram(values, {}); }
histogram make_histogram(std::span<const float> values) { return detail::make_histogram(values, {}); }

std::string encode_histogram(const histogram& h) {
  std::string out;
  pb::put_double_if_set(out, 1, h.min);
  pb::put_double_if_set(out, 2, h.max);
  pb::put_double_if_set(out, 3, h.num);
  pb::put_double_if_set(out, 4, h.sum);
  pb::put_double_if_set(out, 5, h.sum_squares);
  if (!h.bucket_limit.empty()) pb::put_packed_doubles_field(out, 6, h.bucket_limit);
  if (!h.bucket.empty()) pb::put_packed_doubles_field(out, 7, h.bucket);
  return out;
}

summary& summary::scalar(std::string_view tag, double value) {
  std::string v;
  pb::put_string_if_set(v, 1, tag);
  pb::put_float_field(v, 2, static_cast<float>(value));  // a oneof member: written even when 0
  return add(v);
}

summary& summary::histogram(std::string_view tag, const tensorboard::histogram& h) {
  std::string v;
  pb::put_string_if_set(v, 1, tag);
  pb::put_bytes_field(v, 5, encode_histogram(h));
  return add(v);
}

summary& summary::text(std::string_view tag, std::string_view text) {
  std::string tensor;
  pb::put_varint_field(tensor, 1, 7);  // dtype: DT_STRING
  pb::put_bytes_field(tensor, 2, {});  // tensor_shape: {} (a scalar), present but empty
  pb::put_bytes_field(tensor, 8, text);
  std::string plugin_data;
  pb::put_bytes_field(plugin_data, 1, "text");  // plugin_name; content (an empty TextPluginData) left out
  std::string metadata;
  pb::put_bytes_field(metadata, 1, plugin_data);
  std::string v;
  pb::put_string_if_set(v, 1, tag);
  pb::put_bytes_field(v, 8, tensor);
  pb::put_bytes_field(v, 9, metadata);
  return add(v);
}

summary& summary::add(std::string_view serialized_value) {
  pb::put_bytes_field(bytes_, 1, serialized_value);
  return *this;
}

std::string encode_event(const summary& s, std::int64_t step, double wall_time) {
  std::string out;
  pb::put_double_if_set(out, 1, wall_time);
  pb::put_int64_if_set(out, 2, step);
  pb::put_bytes_field(out, 5, s.bytes());  // a oneof member: written even when empty
  return out;
}

std::string encode_file_version_event(double wall_time, std::string_view writer, std::string_view file_version) {
  std::string out;
  pb::put_double_if_set(out, 1, wall_time);
  pb::put_bytes_field(out, 3, file_version);
  if (!writer.empty()) {
    std::string source;
    pb::put_bytes_field(source, 1, writer);
    pb::put_bytes_field(out, 10, source);
  }
  return out;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

event_writer::event_writer(const std::string& logdir, const std::string& filename_suffix) : logdir_(logdir) {
  if (logdir.empty()) throw std::invalid_argument("tensorboard: empty log directory");
  std::error_code ec;
  std::filesystem::create_directories(logdir, ec);
  if (ec) throw std::runtime_error("tensorboard: cannot create log directory '" + logdir + "': " + ec.message());
  const double now = now_seconds();
  path_ = (std::filesystem::path(logdir) / file_name(now)).string() + filename_suffix;
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error("tensorboard: cannot create '" + path_ + "': " + std::strerror(errno));
  last_write_ = std::chrono::steady_clock::now();
  try {
    add_event(encode_file_version_event(now));
    flush();
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

event_writer::~event_writer() {
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
}

void event_writer::add_scalar(const std::string& tag, double value, std::int64_t step,
                              std::optional<double> wall_time) {
  add_summary(summary().scalar(tag, value), step, wall_time);
}

void event_writer::add_histogram(const std::string& tag, std::span<const double> values, std::int64_t step,
                                 std::optional<double> wall_time) {
  add_histogram(tag, detail::make_histogram(values, tag), step, wall_time);
}

void event_writer::add_histogram(const std::string& tag, std::span<const float> values, std::int64_t step,
                                 std::optional<double> wall_time) {
  add_histogram(tag, detail::make_histogram(values, tag), step, wall_time);
}

void event_writer::add_histogram(const std::string& tag, const histogram& h, std::int64_t step,
                                 std::optional<double> wall_time) {
  add_summary(summary().histogram(tag, h), step, wall_time);
}

void event_writer::add_text(const std::string& tag, const std::string& text, std::int64_t step,
                            std::optional<double> wall_time) {
  add_summary(summary().text(tag, text), step, wall_time);
}

void event_writer::add_summary(const summary& s, std::int64_t step, std::optional<double> wall_time) {
  add_event(encode_event(s, step, wall_time.value_or(now_seconds())));
}

void event_writer::add_event(std::string_view serialized_event) {
  std::lock_guard lock(mu_);
  check_open();
  append_record(buffer_, serialized_event);
  if (buffer_.size() >= max_buffer_bytes || std::chrono::steady_clock::now() - last_write_ >= flush_interval)
    write_buffer();
}

void event_writer::flush() {
  std::lock_guard lock(mu_);
  check_open();
  write_buffer();
}

void event_writer::close() {
  std::lock_guard lock(mu_);
  if (fd_ < 0) return;
  std::string error;
  try {
    write_buffer();
  } catch (const std::exception& e) {
    error = e.what();
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 && error.empty()) error = "tensorboard: closing '" + path_ + "' failed: " + std::strerror(errno);
  if (!error.empty()) throw std::runtime_error(error);
}

std::string event_writer::file_name(double now) {
  static std::atomic<std::uint64_t> counter{0};
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) != 0) host[0] = '\0';
  char buf[64];
  std::snprintf(buf, sizeof buf, "%010lld", static_cast<long long>(now));
  return "events.out.tfevents." + std::string(buf) + "." + std::string(host.data()) + "." + std::to_string(::getpid()) +
         "." + std::to_string(counter.fetch_add(1));
}

void event_writer::check_open() const {
  if (fd_ < 0) throw std::runtime_error("tensorboard: '" + path_ + "' is closed");
}

void event_writer::write_buffer() {
  std::size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      buffer_.erase(0, done);
      throw std::runtime_error("tensorboard: writing '" + path_ + "' failed: " + std::strerror(err));
    }
    done += static_cast<std::size_t>(n);
  }
  buffer_.clear();
  last_write_ = std::chrono::steady_clock::now();
}

}  // namespace levanter::tensorboard
