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

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace levanter::tensorboard {

// ------------------------------------------------------------------------------------------------------------------
// CRC-32C (reflected polynomial 0x82f63b78), slicing by 8.

/// Continues a CRC-32C: crc32c_extend(crc32c(a), b) == crc32c(a + b); crc32c_extend(0, x) == crc32c(x).
std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t n);

std::uint32_t crc32c(std::string_view data);

/// TFRecord's CRC masking (a CRC of data that itself holds CRCs is weak otherwise).
inline constexpr std::uint32_t mask_crc(std::uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
inline constexpr std::uint32_t unmask_crc(std::uint32_t masked) {
  const std::uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}
std::uint32_t masked_crc32c(std::string_view data);

/// Appends one TFRecord holding `data` to `out`.
void append_record(std::string& out, std::string_view data);

/// One TFRecord holding `data`.
std::string frame_record(std::string_view data);

// ------------------------------------------------------------------------------------------------------------------
// Protobuf wire format (just what the messages above need).

namespace pb {

enum class wire : std::uint32_t { varint = 0, fixed64 = 1, length_delimited = 2, fixed32 = 5 };

void put_varint(std::string& out, std::uint64_t v);
void put_key(std::string& out, std::uint32_t field, wire w);
/// int64/uint64/enum fields: a varint (negative int64 values take ten bytes, as two's complement).
void put_varint_field(std::string& out, std::uint32_t field, std::uint64_t v);
void put_int64_field(std::string& out, std::uint32_t field, std::int64_t v);
void put_fixed64_field(std::string& out, std::uint32_t field, std::uint64_t v);
void put_fixed32_field(std::string& out, std::uint32_t field, std::uint32_t v);
void put_double_field(std::string& out, std::uint32_t field, double v);
void put_float_field(std::string& out, std::uint32_t field, float v);
/// string, bytes, embedded messages and packed repeated fields.
void put_bytes_field(std::string& out, std::uint32_t field, std::string_view bytes);
void put_packed_doubles_field(std::string& out, std::uint32_t field, std::span<const double> values);

// proto3 implicit presence: a field equal to its default (bitwise zero, so -0.0 is written) is left out.
void put_double_if_set(std::string& out, std::uint32_t field, double v);
void put_int64_if_set(std::string& out, std::uint32_t field, std::int64_t v);
void put_string_if_set(std::string& out, std::uint32_t field, std::string_view s);

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
const std::vector<double>& default_bucket_limits();

/// The histogram of `values` with TensorFlow's default buckets; throws std::invalid_argument on NaN or infinity
/// (as TensorFlow's histogram summary does).
histogram make_histogram(std::span<const double> values);
histogram make_histogram(std::span<const float> values);

/// Serialized HistogramProto.
std::string encode_histogram(const histogram& h);

// ------------------------------------------------------------------------------------------------------------------
// Summaries and events.

/// A tensorboard.Summary under construction: one or more tagged values that go into one Event.
class summary {
 public:
  /// Summary.Value{tag, simple_value}: a float32, so `value` is rounded to float (what Scalars() reads back).
  summary& scalar(std::string_view tag, double value);
  /// Summary.Value{tag, histo}.
  summary& histogram(std::string_view tag, const tensorboard::histogram& h);
  /// Summary.Value{tag, tensor: scalar DT_STRING, metadata: plugin "text"}: what tensorboard's text_pb writes;
  /// the text plugin renders it as Markdown.
  summary& text(std::string_view tag, std::string_view text);
  /// A serialized Summary.Value, for kinds not covered above.
  summary& add(std::string_view serialized_value);
  /// The serialized Summary.
  const std::string& bytes() const { return bytes_; }
  bool empty() const { return bytes_.empty(); }

 private:
  std::string bytes_;
};

/// Serialized Event{wall_time, step, summary}.
std::string encode_event(const summary& s, std::int64_t step, double wall_time);

/// Serialized Event{wall_time, file_version, source_metadata{writer}} (the first event of a file; an empty
/// `writer` leaves source_metadata out).
std::string encode_file_version_event(double wall_time, std::string_view writer = "levanter.tensorboard",
                                      std::string_view file_version = "brain.Event:2");

/// Seconds since the Unix epoch, as Python's time.time().
double now_seconds();

// ------------------------------------------------------------------------------------------------------------------
// The writer.

class event_writer {
 public:
  /// Creates `logdir` (and parents) and a new event file in it, holding the file_version event already.
  explicit event_writer(const std::string& logdir, const std::string& filename_suffix = "");
  event_writer(const event_writer&) = delete;
  event_writer& operator=(const event_writer&) = delete;

  /// Writes what is buffered and closes; errors go to stderr (close() throws them instead).
  ~event_writer();

  /// A scalar (stored as a float32 simple_value); wall_time defaults to now.
  void add_scalar(const std::string& tag, double value, std::int64_t step, std::optional<double> wall_time = {});
  /// A histogram of `values` (TensorFlow's default buckets); throws std::invalid_argument on NaN or infinity.
  void add_histogram(const std::string& tag, std::span<const double> values, std::int64_t step,
                     std::optional<double> wall_time = {});
  void add_histogram(const std::string& tag, std::span<const float> values, std::int64_t step,
                     std::optional<double> wall_time = {});
  void add_histogram(const std::string& tag, const histogram& h, std::int64_t step,
                     std::optional<double> wall_time = {});
  /// Text for the text plugin (rendered as Markdown).
  void add_text(const std::string& tag, const std::string& text, std::int64_t step,
                std::optional<double> wall_time = {});
  /// Several values in one event.
  void add_summary(const summary& s, std::int64_t step, std::optional<double> wall_time = {});
  /// A serialized Event.
  void add_event(std::string_view serialized_event);

  /// Writes every buffered record to the file.
  void flush();
  /// Flushes and closes the file (closing it even when the flush fails); later adds throw. Closing twice does
  /// nothing.
  void close();

  const std::string& path() const { return path_; }
  const std::string& logdir() const { return logdir_; }

  static constexpr std::size_t max_buffer_bytes = std::size_t{1} << 20;
  static constexpr std::chrono::seconds flush_interval{120};

 private:
  static std::string file_name(double now);

  void check_open() const;

  // Under mu_. What could not be written stays in the buffer.
  void write_buffer();

  std::string logdir_;
  std::string path_;
  int fd_ = -1;
  std::string buffer_;
  std::chrono::steady_clock::time_point last_write_;
  std::mutex mu_;
};

}  // namespace levanter::tensorboard
