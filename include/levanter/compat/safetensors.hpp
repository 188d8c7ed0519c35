// levanter/compat/safetensors.hpp: a strict reader and an atomic writer for Hugging Face's safetensors format,
// and for Hugging Face model directories (`model.safetensors`, or shards listed by `model.safetensors.index.json`).
//
// A file is an 8-byte little-endian header length N, N bytes of UTF-8 JSON mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data buffer) plus an optional
// "__metadata__" string-to-string map, then the data buffer. Files come from strangers, so `parse` accepts no more
// than the reference implementation does (and rejects duplicate keys and unknown fields besides), never reads
// outside the bytes it is given, and allocates at most about ten times N (a metadata map of tiny strings is the
// worst case).
//
//   auto w = levanter::safetensors::encode_floats(values, levanter::safetensors::dtype::BF16);
//   levanter::safetensors::write_file("model.safetensors", {{"wte", dtype::BF16, {vocab, embed}, w}});
//   std::vector<float> wte = levanter::safetensors::file("model.safetensors").read_f32("wte");
#pragma once
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace levanter::safetensors {

/// A malformed or unreadable file, or one that cannot be written; the message names the file and the problem.
struct format_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Element types, spelled as in the file ("F32", "BF16", ...).
enum class dtype { BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, I64, U64, F64 };

/// "F32" for dtype::F32; "?" for a value outside the enumeration.
std::string_view dtype_name(dtype t);
/// The dtype spelled `name` (case-sensitive, as in files), or nullopt.
std::optional<dtype> dtype_from_name(std::string_view name);
/// Bytes per element; 0 for a value outside the enumeration.
std::size_t dtype_size(dtype t);

/// One tensor of a parsed header; [begin, end) are byte offsets into the data buffer.
struct tensor_info {
  std::string name;
  dtype type = dtype::F32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;
  std::int64_t numel() const {
    std::uint64_t n = 1;
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    return static_cast<std::int64_t>(n);
  }
};

/// A validated header: tensors sorted by begin offset (then end, then header order); data_start = 8 + N.
struct header_info {
  std::vector<tensor_info> tensors;
  std::map<std::string, std::string> metadata;
  std::uint64_t data_start = 0;
};

/// Strict parse of a whole file image; `what` names the file in messages. Throws format_error for anything the
/// format does not allow.
header_info parse(std::span<const unsigned char> file_bytes, const std::string& what);

namespace detail {
/// The elements of `t` (whose bytes are `b`) as float: F32, F16, BF16 or F64; format_error naming `what` otherwise.
std::vector<float> to_f32(const tensor_info& t, std::span<const unsigned char> b, const std::string& what);
}  // namespace detail

/// An opened, validated .safetensors file, memory-mapped (read into memory where mapping fails). Copies share
/// the mapping. As with every mmap reader, a file truncated by another process while mapped raises SIGBUS.
class file {
 public:
  explicit file(const std::string& path);

  const header_info& header() const { return header_; }
  /// The tensor called `name`, or nullptr.
  const tensor_info* find(std::string_view name) const;
  /// The raw little-endian bytes of `t`, which must come from this file's header.
  std::span<const unsigned char> bytes(const tensor_info& t) const;
  /// The elements of tensor `name` converted to float (F32, F16, BF16 or F64), in row-major order.
  std::vector<float> read_f32(std::string_view name) const;

 private:
  std::string path_;
  std::shared_ptr<const unsigned char> image_;
  std::size_t size_ = 0;
  header_info header_;
  std::vector<std::size_t> by_name_;  // indices into header_.tensors, sorted by name
};

/// A tensor to write: `data` holds numel * dtype_size(type) bytes, little-endian, already in `type`.
struct tensor_to_write {
  std::string name;
  dtype type = dtype::F32;
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> data;
};

/// `values` as little-endian F32, F16 or BF16 (rounded to nearest, ties to even; NaN stays NaN) or F64.
/// Throws std::invalid_argument for any other dtype.
std::vector<unsigned char> encode_floats(std::span<const float> values, dtype type);

/// Writes one .safetensors file atomically: header keys and data in the order given, "__metadata__" first (left
/// out when `metadata` is empty), the header padded with spaces to a multiple of 8 bytes. Throws
/// std::invalid_argument for an invalid tensor (name empty, repeated or "__metadata__", data of the wrong size)
/// and format_error naming the file when the file system fails (the file is written with io::write_file_atomic,
/// file and directory fsynced).
void write_file(const std::string& path, const std::vector<tensor_to_write>& tensors,
                const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

/// Writes a Hugging Face model directory (created if missing): `model.safetensors` when the data fits in
/// `max_shard_bytes`, else shards `model-00001-of-0000N.safetensors`, ... filled greedily in the given order (a
/// tensor larger than the limit gets a shard of its own) and `model.safetensors.index.json` = {"metadata":
/// {"total_size": bytes}, "weight_map": {name: shard}}, written last. Files of the other layout or stale shards
/// left by an earlier write are removed, as Hugging Face's save_pretrained does, so readers never see a mix.
/// Returns the names of the files written.
std::vector<std::string> write_hf_dir(const std::string& dir, const std::vector<tensor_to_write>& tensors,
                                      std::uint64_t max_shard_bytes,
                                      const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

/// A Hugging Face model directory in either layout. With an index, every shard it names must be a plain file
/// name inside the directory, every listed tensor must be in the shard the index names, and every tensor of every
/// shard must be listed, once.
class hf_dir {
 public:
  explicit hf_dir(const std::string& dir);

  /// Every tensor name, sorted.
  std::vector<std::string> names() const;
  const tensor_info* find(std::string_view name) const;
  std::vector<std::int64_t> shape(std::string_view name) const { return get(name).shape; }
  std::vector<float> read_f32(std::string_view name) const;

 private:
  std::string dir_;
  std::vector<file> files_;
  std::vector<std::string> file_names_;
  std::map<std::string, std::pair<std::size_t, std::size_t>, std::less<>> where_;  // name -> (file, tensor)

  const tensor_info& get(std::string_view name) const;
  void add(const std::string& path, const std::string& name);
  void read_index(const std::string& path);
};

}  // namespace levanter::safetensors
