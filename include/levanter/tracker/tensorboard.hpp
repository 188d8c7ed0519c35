// levanter/tracker/tensorboard.hpp: TensorBoard event files written without TensorFlow or a protobuf library.
//
// An event file is a sequence of TFRecords, each holding one serialized `tensorboard.Event` protobuf
// (tensorboard/compat/proto/event.proto). A record is
//     uint64 length (little endian) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
// with masked_crc32c(x) = rotate_right(crc32c(x), 15) + 0xa282ead8 (CRC-32C, Castagnoli polynomial).
//
// The protobuf subset encoded here (field numbers from event.proto, summary.proto, histogram.proto, tensor.proto,
// tensor_shape.proto):
//     Event           wall_time=1 double, step=2 int64, file_version=3 string, summary=5 Summary,
//                     source_metadata=10 SourceMetadata{writer=1 string}
//     Summary         value=1 repeated Summary.Value
//     Summary.Value   tag=1 string, simple_value=2 float, histo=5 HistogramProto, tensor=8 TensorProto,
//                     metadata=9 SummaryMetadata{plugin_data=1 PluginData{plugin_name=1 string}}
//     HistogramProto  min=1, max=2, num=3, sum=4, sum_squares=5 double; bucket_limit=6, bucket=7 packed double
//     TensorProto     dtype=1 enum (DT_STRING = 7), tensor_shape=2 TensorShapeProto, string_val=8 repeated bytes
// Fields are written in field-number order and proto3 defaults (bitwise zero) are left out, except members of a
// oneof (Event.file_version/summary, Summary.Value.simple_value/histo/tensor), which are always written: the bytes
// are those of the Python `tensorboard` package's own protos (tests/oracle/gen_tensorboard_golden.py).
//
// Histograms use TensorFlow's default buckets (tensorflow/core/lib/histogram/histogram.cc): limits
// -DBL_MAX, -1e20 > ... > -1e-12, 0, 1e-12 < 1e-12*1.1 < ... < 1e20, DBL_MAX (each 1.1 times the last), a value v
// counted in the first bucket whose limit is > v, and runs of empty buckets collapsed into one (the limit of the
// run's last bucket, count 0). TensorBoard's histogram plugin turns these into [left, right, count] bins with the
// data's min and max as the outer edges.
//
// event_writer names its file `events.out.tfevents.<unix seconds, 10 digits>.<hostname>.<pid>.<counter><suffix>`
// as tensorboard's EventFileWriter does, starts it with an Event{file_version: "brain.Event:2"}, buffers records
// and writes them on flush(), when the buffer passes 1 MiB, when 120 s have passed since the last write (checked
// when a record is added), and on close() or destruction. Errors throw std::runtime_error naming the file; the
// destructor, which cannot throw, prints them to stderr instead (call close() to see them as exceptions).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace levanter::tensorboard {

// ------------------------------------------------------------------------------------------------------------------
// CRC-32C (reflected polynomial 0x82f63b78), slicing by 8.

namespace detail {

inline constexpr std::array<std::array<std::uint32_t, 256>, 8> make_crc32c_tables() {
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

inline constexpr auto crc32c_tables = make_crc32c_tables();

}  // namespace detail

/// Continues a CRC-32C: crc32c_extend(crc32c(a), b) == crc32c(a + b); crc32c_extend(0, x) == crc32c(x).
inline std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t n) {
  const auto& t = detail::crc32c_tables;
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    const std::uint32_t lo = c ^ (std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 |
                                  std::uint32_t{p[3]} << 24);
    c = t[7][lo & 0xffu] ^ t[6][(lo >> 8) & 0xffu] ^ t[5][(lo >> 16) & 0xffu] ^ t[4][lo >> 24] ^ t[3][p[4]] ^
        t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
  }
  for (; n > 0; --n, ++p) c = (c >> 8) ^ t[0][(c ^ *p) & 0xffu];
  return ~c;
}

inline std::uint32_t crc32c(std::string_view data) { return crc32c_extend(0, data.data(), data.size()); }

/// TFRecord's CRC masking (a CRC of data that itself holds CRCs is weak otherwise).
inline constexpr std::uint32_t mask_crc(std::uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
inline constexpr std::uint32_t unmask_crc(std::uint32_t masked) {
  const std::uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}
inline std::uint32_t masked_crc32c(std::string_view data) { return mask_crc(crc32c(data)); }

namespace detail {
inline void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
}
}  // namespace detail

/// Appends one TFRecord holding `data` to `out`.
inline void append_record(std::string& out, std::string_view data) {
  std::string header;
  detail::put_le(header, data.size(), 8);
  out += header;
  detail::put_le(out, masked_crc32c(header), 4);
  out.append(data);
  detail::put_le(out, masked_crc32c(data), 4);
}

/// One TFRecord holding `data`.
inline std::string frame_record(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  append_record(out, data);
  return out;
}

// ------------------------------------------------------------------------------------------------------------------
// Protobuf wire format (just what the messages above need).

namespace pb {

enum class wire : std::uint32_t { varint = 0, fixed64 = 1, length_delimited = 2, fixed32 = 5 };

inline void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7fu) | 0x80u));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
inline void put_key(std::string& out, std::uint32_t field, wire w) {
  put_varint(out, (std::uint64_t{field} << 3) | static_cast<std::uint32_t>(w));
}
/// int64/uint64/enum fields: a varint (negative int64 values take ten bytes, as two's complement).
inline void put_varint_field(std::string& out, std::uint32_t field, std::uint64_t v) {
  put_key(out, field, wire::varint);
  put_varint(out, v);
}
inline void put_int64_field(std::string& out, std::uint32_t field, std::int64_t v) {
  put_varint_field(out, field, static_cast<std::uint64_t>(v));
}
inline void put_fixed64_field(std::string& out, std::uint32_t field, std::uint64_t v) {
  put_key(out, field, wire::fixed64);
  detail::put_le(out, v, 8);
}
inline void put_fixed32_field(std::string& out, std::uint32_t field, std::uint32_t v) {
  put_key(out, field, wire::fixed32);
  detail::put_le(out, v, 4);
}
inline void put_double_field(std::string& out, std::uint32_t field, double v) {
  put_fixed64_field(out, field, std::bit_cast<std::uint64_t>(v));
}
inline void put_float_field(std::string& out, std::uint32_t field, float v) {
  put_fixed32_field(out, field, std::bit_cast<std::uint32_t>(v));
}
/// string, bytes, embedded messages and packed repeated fields.
inline void put_bytes_field(std::string& out, std::uint32_t field, std::string_view bytes) {
  put_key(out, field, wire::length_delimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}
inline void put_packed_doubles_field(std::string& out, std::uint32_t field, std::span<const double> values) {
  put_key(out, field, wire::length_delimited);
  put_varint(out, values.size() * 8);
  for (double v : values) detail::put_le(out, std::bit_cast<std::uint64_t>(v), 8);
}

// proto3 implicit presence: a field equal to its default (bitwise zero, so -0.0 is written) is left out.
inline void put_double_if_set(std::string& out, std::uint32_t field, double v) {
  if (std::bit_cast<std::uint64_t>(v) != 0) put_double_field(out, field, v);
}
inline void put_int64_if_set(std::string& out, std::uint32_t field, std::int64_t v) {
  if (v != 0) put_int64_field(out, field, v);
}
inline void put_string_if_set(std::string& out, std::uint32_t field, std::string_view s) {
  if (!s.empty()) put_bytes_field(out, field, s);
}

}  // namespace pb

// ------------------------------------------------------------------------------------------------------------------
// Histograms.

/// tensorboard.HistogramProto.
struct histogram {
  double min = std::numeric_limits<double>::max();
  double max = -std::numeric_limits<double>::max();
  double num = 0;
  double sum = 0;
  double sum_squares = 0;
  std::vector<double> bucket_limit;  // bucket i holds the values in [bucket_limit[i-1], bucket_limit[i])
  std::vector<double> bucket;        // counts
};

/// TensorFlow's default bucket limits: 1551 values, -DBL_MAX ... 0 ... DBL_MAX, sorted.
inline const std::vector<double>& default_bucket_limits() {
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
}  // namespace detail

/// The histogram of `values` with TensorFlow's default buckets; throws std::invalid_argument on NaN or infinity
/// (as TensorFlow's histogram summary does).
inline histogram make_histogram(std::span<const double> values) { return detail::make_histogram(values, {}); }
inline histogram make_histogram(std::span<const float> values) { return detail::make_histogram(values, {}); }

/// Serialized HistogramProto.
inline std::string encode_histogram(const histogram& h) {
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

// ------------------------------------------------------------------------------------------------------------------
// Summaries and events.

/// A tensorboard.Summary under construction: one or more tagged values that go into one Event.
class summary {
 public:
  /// Summary.Value{tag, simple_value}: a float32, so `value` is rounded to float (what Scalars() reads back).
  summary& scalar(std::string_view tag, double value) {
    std::string v;
    pb::put_string_if_set(v, 1, tag);
    pb::put_float_field(v, 2, static_cast<float>(value));  // a oneof member: written even when 0
    return add(v);
  }
  /// Summary.Value{tag, histo}.
  summary& histogram(std::string_view tag, const tensorboard::histogram& h) {
    std::string v;
    pb::put_string_if_set(v, 1, tag);
    pb::put_bytes_field(v, 5, encode_histogram(h));
    return add(v);
  }
  /// Summary.Value{tag, tensor: scalar DT_STRING, metadata: plugin "text"}: what tensorboard's text_pb writes;
  /// the text plugin renders it as Markdown.
  summary& text(std::string_view tag, std::string_view text) {
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
  /// A serialized Summary.Value, for kinds not covered above.
  summary& add(std::string_view serialized_value) {
    pb::put_bytes_field(bytes_, 1, serialized_value);
    return *this;
  }
  /// The serialized Summary.
  const std::string& bytes() const { return bytes_; }
  bool empty() const { return bytes_.empty(); }

 private:
  std::string bytes_;
};

/// Serialized Event{wall_time, step, summary}.
inline std::string encode_event(const summary& s, std::int64_t step, double wall_time) {
  std::string out;
  pb::put_double_if_set(out, 1, wall_time);
  pb::put_int64_if_set(out, 2, step);
  pb::put_bytes_field(out, 5, s.bytes());  // a oneof member: written even when empty
  return out;
}

/// Serialized Event{wall_time, file_version, source_metadata{writer}} (the first event of a file; an empty
/// `writer` leaves source_metadata out).
inline std::string encode_file_version_event(double wall_time, std::string_view writer = "levanter.tensorboard",
                                             std::string_view file_version = "brain.Event:2") {
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

/// Seconds since the Unix epoch, as Python's time.time().
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// ------------------------------------------------------------------------------------------------------------------
// The writer.

class event_writer {
 public:
  /// Creates `logdir` (and parents) and a new event file in it, holding the file_version event already.
  explicit event_writer(const std::string& logdir, const std::string& filename_suffix = "") : logdir_(logdir) {
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
  event_writer(const event_writer&) = delete;
  event_writer& operator=(const event_writer&) = delete;

  /// Writes what is buffered and closes; errors go to stderr (close() throws them instead).
  ~event_writer() {
    try {
      close();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
    }
  }

  /// A scalar (stored as a float32 simple_value); wall_time defaults to now.
  void add_scalar(const std::string& tag, double value, std::int64_t step, std::optional<double> wall_time = {}) {
    add_summary(summary().scalar(tag, value), step, wall_time);
  }
  /// A histogram of `values` (TensorFlow's default buckets); throws std::invalid_argument on NaN or infinity.
  void add_histogram(const std::string& tag, std::span<const double> values, std::int64_t step,
                     std::optional<double> wall_time = {}) {
    add_histogram(tag, detail::make_histogram(values, tag), step, wall_time);
  }
  void add_histogram(const std::string& tag, std::span<const float> values, std::int64_t step,
                     std::optional<double> wall_time = {}) {
    add_histogram(tag, detail::make_histogram(values, tag), step, wall_time);
  }
  void add_histogram(const std::string& tag, const histogram& h, std::int64_t step,
                     std::optional<double> wall_time = {}) {
    add_summary(summary().histogram(tag, h), step, wall_time);
  }
  /// Text for the text plugin (rendered as Markdown).
  void add_text(const std::string& tag, const std::string& text, std::int64_t step,
                std::optional<double> wall_time = {}) {
    add_summary(summary().text(tag, text), step, wall_time);
  }
  /// Several values in one event.
  void add_summary(const summary& s, std::int64_t step, std::optional<double> wall_time = {}) {
    add_event(encode_event(s, step, wall_time.value_or(now_seconds())));
  }
  /// A serialized Event.
  void add_event(std::string_view serialized_event) {
    std::lock_guard lock(mu_);
    check_open();
    append_record(buffer_, serialized_event);
    if (buffer_.size() >= max_buffer_bytes || std::chrono::steady_clock::now() - last_write_ >= flush_interval)
      write_buffer();
  }

  /// Writes every buffered record to the file.
  void flush() {
    std::lock_guard lock(mu_);
    check_open();
    write_buffer();
  }
  /// Flushes and closes the file (closing it even when the flush fails); later adds throw. Closing twice does
  /// nothing.
  void close() {
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
    if (::close(fd) != 0 && error.empty())
      error = "tensorboard: closing '" + path_ + "' failed: " + std::strerror(errno);
    if (!error.empty()) throw std::runtime_error(error);
  }

  const std::string& path() const { return path_; }
  const std::string& logdir() const { return logdir_; }

  static constexpr std::size_t max_buffer_bytes = std::size_t{1} << 20;
  static constexpr std::chrono::seconds flush_interval{120};

 private:
  static std::string file_name(double now) {
    static std::atomic<std::uint64_t> counter{0};
    std::array<char, 256> host{};
    if (::gethostname(host.data(), host.size() - 1) != 0) host[0] = '\0';
    char buf[64];
    std::snprintf(buf, sizeof buf, "%010lld", static_cast<long long>(now));
    return "events.out.tfevents." + std::string(buf) + "." + std::string(host.data()) + "." +
           std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  }

  void check_open() const {
    if (fd_ < 0) throw std::runtime_error("tensorboard: '" + path_ + "' is closed");
  }

  // Under mu_. What could not be written stays in the buffer.
  void write_buffer() {
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

  std::string logdir_;
  std::string path_;
  int fd_ = -1;
  std::string buffer_;
  std::chrono::steady_clock::time_point last_write_;
  std::mutex mu_;
};

}  // namespace levanter::tensorboard
