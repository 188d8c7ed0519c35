// compat/safetensors.hpp: the strict safetensors reader and the atomic writer.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
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
#include <fstream>
#include <levanter/compat/safetensors.hpp>
#include <levanter/io/atomic_file.hpp>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

namespace levanter::safetensors {

namespace detail {
namespace {
struct dtype_row {
  std::string_view name;
  std::size_t size;
};
constexpr std::array<dtype_row, 15> dtypes{{{"BOOL", 1},
                                            {"U8", 1},
                                            {"I8", 1},
                                            {"F8_E5M2", 1},
                                            {"F8_E4M3", 1},
                                            {"I16", 2},
                                            {"U16", 2},
                                            {"F16", 2},
                                            {"BF16", 2},
                                            {"I32", 4},
                                            {"U32", 4},
                                            {"F32", 4},
                                            {"I64", 8},
                                            {"U64", 8},
                                            {"F64", 8}}};
constexpr std::uint64_t max_header_bytes = 100'000'000;  // the reference implementation's limit
constexpr int max_depth = 3;                             // root object > tensor entry > shape array
// numpy's limit; without one, `[0,0,...]` would cost 8 bytes of shape per 2 bytes of header.
constexpr std::size_t max_rank = 64;
}  // namespace
}  // namespace detail

std::string_view dtype_name(dtype t) {
  auto i = static_cast<std::size_t>(t);
  return i < detail::dtypes.size() ? detail::dtypes[i].name : std::string_view("?");
}

std::optional<dtype> dtype_from_name(std::string_view name) {
  for (std::size_t i = 0; i < detail::dtypes.size(); ++i)
    if (detail::dtypes[i].name == name) return static_cast<dtype>(i);
  return std::nullopt;
}

std::size_t dtype_size(dtype t) {
  auto i = static_cast<std::size_t>(t);
  return i < detail::dtypes.size() ? detail::dtypes[i].size : 0;
}

namespace detail {
namespace {

// Names in messages come from the file: quote them, escape what a terminal would interpret, and cut them short.
std::string quote(std::string_view s, std::size_t keep = 80) {
  std::string out = "'";
  for (std::size_t i = 0; i < s.size() && i < keep; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f || c == '\\' || c == '\'') {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > keep) out += "...";
  return out + "'";
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i == 8) return out + ", ... (" + std::to_string(shape.size()) + " dims)]";
    out += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return out + "]";
}

[[noreturn]] inline void fail(const std::string& what, const std::string& problem) {
  throw format_error("safetensors: " + quote(what, 4096) + ": " + problem);
}

bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return false;
  out = a * b;
  return true;
}

// Offset of the first byte that does not belong to a well-formed UTF-8 sequence (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or npos.
std::size_t utf8_error(std::span<const unsigned char> s) {
  std::size_t i = 0;
  while (i < s.size()) {
    unsigned c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    if (c < 0xc2 || c > 0xf4) return i;
    const std::size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
    const unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;  // the second byte's range (Unicode table 3-7)
    const unsigned hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    if (s.size() - i < len || s[i + 1] < lo || s[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k)
      if (s[i + k] < 0x80 || s[i + k] > 0xbf) return i;
    i += len;
  }
  return std::string_view::npos;
}
bool valid_utf8(std::string_view s) {
  return utf8_error({reinterpret_cast<const unsigned char*>(s.data()), s.size()}) == std::string_view::npos;
}

// Checks the header against the schema while nlohmann's parser reads it, so nothing is built that a valid header
// would not need: a DOM of `[0,0,0,...]` would cost 16 bytes per 2 bytes of input.
class header_sax {
 public:
  using json = nlohmann::json;
  std::string error;  // the first problem; parsing stops there
  std::vector<tensor_info> tensors;
  std::map<std::string, std::string> metadata;

  bool null() { return mistyped("null"); }
  bool boolean(bool) { return mistyped("a boolean"); }
  bool number_integer(std::int64_t v) {
    return v < 0 ? mistyped("a negative integer") : integer(static_cast<std::uint64_t>(v));
  }
  bool number_unsigned(std::uint64_t v) { return integer(v); }
  bool number_float(double, const std::string&) { return mistyped("a non-integer or out-of-range number"); }
  bool binary(json::binary_t&) { return mistyped("binary"); }
  bool string(std::string& s) {
    if (at_ == at::entry && field_ == "dtype") {
      auto t = dtype_from_name(s);
      if (!t) return fail(entry() + "unknown dtype " + quote(s));
      tensors.back().type = *t;
      return true;
    }
    if (at_ == at::metadata) {
      metadata.emplace(std::move(field_), std::move(s));
      return true;
    }
    return mistyped("a string");
  }
  bool start_object(std::size_t) {
    if (++depth_ > max_depth) return too_deep();
    if (at_ == at::top) {
      at_ = at::root;
    } else if (at_ == at::root && name_ == "__metadata__") {
      if (have_metadata_) return fail("duplicate key '__metadata__'");
      have_metadata_ = true;
      at_ = at::metadata;
    } else if (at_ == at::root) {
      tensors.push_back({std::move(name_), dtype::F32, {}, 0, 0});
      seen_ = 0;
      at_ = at::entry;
    } else {
      return mistyped("an object");
    }
    return true;
  }
  bool key(std::string& k) {
    if (at_ == at::root) {
      if (k.empty()) return fail("empty tensor name");
      name_ = std::move(k);
    } else if (at_ == at::entry) {
      unsigned bit = k == "dtype" ? 1u : k == "shape" ? 2u : k == "data_offsets" ? 4u : 0u;
      if (!bit) return fail(entry() + "unexpected field " + quote(k));
      if (seen_ & bit) return fail(entry() + "duplicate field " + quote(k));
      seen_ |= bit;
      field_ = std::move(k);
    } else {  // metadata
      if (metadata.count(k)) return fail("duplicate __metadata__ key " + quote(k));
      field_ = std::move(k);
    }
    return true;
  }
  bool end_object() {
    --depth_;
    if (at_ == at::entry) {
      at_ = at::root;
      return complete(tensors.back());
    }
    at_ = at_ == at::metadata ? at::root : at::end;
    return true;
  }
  bool start_array(std::size_t) {
    if (++depth_ > max_depth) return too_deep();
    if (at_ == at::entry && field_ == "shape") {
      at_ = at::shape;
    } else if (at_ == at::entry && field_ == "data_offsets") {
      at_ = at::offsets;
      offsets_ = 0;
    } else {
      return mistyped("an array");
    }
    return true;
  }
  bool end_array() {
    --depth_;
    if (at_ == at::offsets && offsets_ != 2)
      return fail(entry() + "data_offsets has " + std::to_string(offsets_) + " entries, not 2");
    at_ = at::entry;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    return fail(std::string("header is not valid JSON: ") + e.what());
  }

 private:
  enum class at { top, root, entry, metadata, shape, offsets, end };
  at at_ = at::top;
  int depth_ = 0;
  std::string name_;   // the root key whose value comes next
  std::string field_;  // the entry field or metadata key whose value comes next
  unsigned seen_ = 0;  // entry fields seen: dtype 1, shape 2, data_offsets 4
  bool have_metadata_ = false;
  int offsets_ = 0;

  bool fail(std::string problem) {
    if (error.empty()) error = std::move(problem);
    return false;
  }
  std::string entry() const { return "tensor " + quote(tensors.back().name) + ": "; }
  bool too_deep() { return fail("JSON nesting deeper than " + std::to_string(max_depth) + " levels"); }
  bool mistyped(const std::string& got) {
    switch (at_) {
      case at::top:
        return fail("header is " + got + ", not a JSON object");
      case at::root:
        if (name_ == "__metadata__") return fail("__metadata__ is " + got + ", not an object");
        return fail("tensor " + quote(name_) + ": entry is " + got + ", not an object");
      case at::entry:
        return fail(entry() + field_ + " is " + got + ", not " + (field_ == "dtype" ? "a string" : "an array"));
      case at::metadata:
        return fail("__metadata__ value for key " + quote(field_) + " is " + got + ", not a string");
      case at::shape:
      case at::offsets:
        return fail(entry() + (at_ == at::shape ? "shape" : "data_offsets") + " entry is " + got +
                    ", not a non-negative integer");
      case at::end:
        break;
    }
    return fail("unexpected " + got + " after the header object");
  }
  bool integer(std::uint64_t v) {
    if (at_ == at::shape) {
      if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        return fail(entry() + "shape entry " + std::to_string(v) + " overflows int64");
      if (tensors.back().shape.size() == max_rank)
        return fail(entry() + "shape has more than " + std::to_string(max_rank) + " dimensions");
      tensors.back().shape.push_back(static_cast<std::int64_t>(v));
      return true;
    }
    if (at_ == at::offsets) {
      if (offsets_ == 2) return fail(entry() + "data_offsets has more than 2 entries");
      (offsets_++ == 0 ? tensors.back().begin : tensors.back().end) = v;
      return true;
    }
    return mistyped("an integer");
  }
  bool complete(const tensor_info& t) {
    static constexpr const char* field_names[] = {"dtype", "shape", "data_offsets"};
    for (unsigned i = 0; i < 3; ++i)
      if (!(seen_ & (1u << i))) return fail(entry() + "missing field '" + field_names[i] + "'");
    std::uint64_t numel = 1, bytes = 0;
    for (auto d : t.shape)
      if (!checked_mul(numel, static_cast<std::uint64_t>(d), numel) ||
          numel > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        return fail(entry() + "shape " + shape_string(t.shape) + " overflows the element count");
    if (!checked_mul(numel, dtype_size(t.type), bytes))
      return fail(entry() + "shape " + shape_string(t.shape) + " overflows the byte count");
    if (t.begin > t.end)
      return fail(entry() + "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                  "] begin after end");
    if (t.end - t.begin != bytes)
      return fail(entry() + "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] hold " +
                  std::to_string(t.end - t.begin) + " bytes, but " + std::string(dtype_name(t.type)) + " " +
                  shape_string(t.shape) + " needs " + std::to_string(bytes));
    return true;
  }
};

std::uint64_t load_le(const unsigned char* p, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
void store_le(unsigned char* p, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i, v >>= 8) p[i] = static_cast<unsigned char>(v & 0xff);
}

float f16_to_f32(std::uint32_t h) {
  std::uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0) {
    float v = std::ldexp(static_cast<float>(m), -24);
    return sign ? -v : v;
  }
  std::uint32_t bits = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112) << 23) | (m << 13));
  return std::bit_cast<float>(bits);
}

// Round to nearest, ties to even; NaN stays NaN (quiet, keeping the top payload bits).
std::uint16_t f32_to_f16(float f) {
  auto x = std::bit_cast<std::uint32_t>(f);
  std::uint32_t sign = (x >> 16) & 0x8000u, e = (x >> 23) & 0xff, m = x & 0x7fffff;
  if (e == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00u | (m ? 0x200u | (m >> 13) : 0u));
  auto round = [](std::uint32_t v, unsigned shift) {
    std::uint32_t q = v >> shift, r = v & ((1u << shift) - 1), half = 1u << (shift - 1);
    return q + (r > half || (r == half && (q & 1)));
  };
  if (e >= 143) return static_cast<std::uint16_t>(sign | 0x7c00u);                           // >= 2^16: infinity
  if (e >= 113) return static_cast<std::uint16_t>(sign | round(((e - 112) << 23) | m, 13));  // carry may reach inf
  if (e < 102) return static_cast<std::uint16_t>(sign);  // below half the smallest subnormal
  return static_cast<std::uint16_t>(sign | round(m | 0x800000u, 126 - e));
}

std::uint16_t f32_to_bf16(float f) {
  auto x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

}  // namespace
}  // namespace detail

header_info parse(std::span<const unsigned char> file_bytes, const std::string& what) {
  using detail::fail;
  using detail::quote;
  if (file_bytes.size() < 8)
    fail(what, "file shorter than 8 bytes (" + std::to_string(file_bytes.size()) + "): no header length");
  const std::uint64_t n = detail::load_le(file_bytes.data(), 8);
  if (n > detail::max_header_bytes)
    fail(what, "header length " + std::to_string(n) + " exceeds the limit of " +
                   std::to_string(detail::max_header_bytes) + " bytes");
  if (n > file_bytes.size() - 8)
    fail(what, "header length " + std::to_string(n) + " exceeds the " + std::to_string(file_bytes.size() - 8) +
                   " bytes after the length field");
  auto text = file_bytes.subspan(8, static_cast<std::size_t>(n));
  if (auto bad = detail::utf8_error(text); bad != std::string_view::npos)
    fail(what, "header is not valid UTF-8 (byte " + std::to_string(bad) + " of the header)");
  // nlohmann's lexer takes a NUL byte for the end of input, which would let `{}\0junk` through; JSON text never
  // holds a raw NUL.
  if (auto nul = std::find(text.begin(), text.end(), 0); nul != text.end())
    fail(what, "header is not valid JSON: NUL byte at byte " + std::to_string(nul - text.begin()) + " of the header");
  // The reference implementation refuses leading whitespace and byte-order marks, and so do we.
  if (text.empty() || text[0] != '{') fail(what, "header is not a JSON object (it does not start with '{')");

  detail::header_sax sax;
  if (!nlohmann::json::sax_parse(text.begin(), text.end(), &sax) || !sax.error.empty())
    fail(what, sax.error.empty() ? "header is not valid JSON" : sax.error);

  header_info h;
  h.metadata = std::move(sax.metadata);
  h.tensors = std::move(sax.tensors);
  h.data_start = 8 + n;
  const std::uint64_t data_size = file_bytes.size() - h.data_start;

  std::vector<const tensor_info*> by_name;
  by_name.reserve(h.tensors.size());
  for (auto& t : h.tensors) by_name.push_back(&t);
  std::sort(by_name.begin(), by_name.end(), [](auto* a, auto* b) { return a->name < b->name; });
  for (std::size_t i = 1; i < by_name.size(); ++i)
    if (by_name[i]->name == by_name[i - 1]->name) fail(what, "duplicate tensor name " + quote(by_name[i]->name));

  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const tensor_info& a, const tensor_info& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  std::uint64_t covered = 0;
  const tensor_info* previous = nullptr;
  for (const auto& t : h.tensors) {
    auto range = "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + ")";
    if (t.begin > covered)
      fail(what, "gap in the data buffer: bytes [" + std::to_string(covered) + ", " + std::to_string(t.begin) +
                     ") belong to no tensor (next is " + quote(t.name) + " at " + range + ")");
    if (t.begin < covered)
      fail(what, "tensor " + quote(t.name) + " at " + range + " overlaps tensor " + quote(previous->name) +
                     ", which ends at " + std::to_string(covered));
    covered = t.end;
    previous = &t;
  }
  if (covered != data_size)
    fail(what, "tensors cover " + std::to_string(covered) + " bytes of the data buffer, but it holds " +
                   std::to_string(data_size) + (covered < data_size ? " (trailing bytes)" : " (truncated file)"));
  return h;
}

namespace detail {
std::vector<float> to_f32(const tensor_info& t, std::span<const unsigned char> b, const std::string& what) {
  const auto n = static_cast<std::size_t>(t.numel());
  if (b.size() != n * dtype_size(t.type))
    fail(what, "tensor " + quote(t.name) + " has " + std::to_string(b.size()) + " bytes for " + std::to_string(n) +
                   " elements of " + std::string(dtype_name(t.type)));
  std::vector<float> out(n);
  const unsigned char* p = b.data();
  switch (t.type) {
    case dtype::F32:
      for (std::size_t i = 0; i < n; ++i)
        out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(load_le(p + 4 * i, 4)));
      break;
    case dtype::F16:
      for (std::size_t i = 0; i < n; ++i) out[i] = f16_to_f32(static_cast<std::uint32_t>(load_le(p + 2 * i, 2)));
      break;
    case dtype::BF16:
      for (std::size_t i = 0; i < n; ++i)
        out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(load_le(p + 2 * i, 2) << 16));
      break;
    case dtype::F64:
      for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(std::bit_cast<double>(load_le(p + 8 * i, 8)));
      break;
    default:
      fail(what, "tensor " + quote(t.name) + " is " + std::string(dtype_name(t.type)) +
                     "; read_f32 converts only F32, F16, BF16 and F64");
  }
  return out;
}
}  // namespace detail

file::file(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) detail::fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } close_on_exit{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) detail::fail(path, std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) detail::fail(path, "not a regular file");
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m != MAP_FAILED) {
      image_ = std::shared_ptr<const unsigned char>(
          static_cast<const unsigned char*>(m),
          [n = size_](const unsigned char* p) { ::munmap(const_cast<unsigned char*>(p), n); });
    } else {
      std::shared_ptr<unsigned char> buf(new unsigned char[size_], std::default_delete<unsigned char[]>());
      for (std::size_t got = 0; got < size_;) {
        auto r = ::pread(fd, buf.get() + got, size_ - got, static_cast<off_t>(got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) detail::fail(path, r == 0 ? "file shrank while being read" : std::strerror(errno));
        got += static_cast<std::size_t>(r);
      }
      image_ = std::move(buf);
    }
  }
  header_ = parse({image_.get(), size_}, path);
  by_name_.resize(header_.tensors.size());
  for (std::size_t i = 0; i < by_name_.size(); ++i) by_name_[i] = i;
  std::sort(by_name_.begin(), by_name_.end(),
            [&](std::size_t a, std::size_t b) { return header_.tensors[a].name < header_.tensors[b].name; });
}

const tensor_info* file::find(std::string_view name) const {
  auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                             [&](std::size_t i, std::string_view n) { return header_.tensors[i].name < n; });
  return it != by_name_.end() && header_.tensors[*it].name == name ? &header_.tensors[*it] : nullptr;
}

std::span<const unsigned char> file::bytes(const tensor_info& t) const {
  if (t.begin > t.end || t.end > size_ - header_.data_start)
    detail::fail(path_, "tensor " + detail::quote(t.name) + " does not lie inside this file's data buffer");
  return {image_.get() + header_.data_start + t.begin, static_cast<std::size_t>(t.end - t.begin)};
}

std::vector<float> file::read_f32(std::string_view name) const {
  const tensor_info* t = find(name);
  if (!t) detail::fail(path_, "no tensor " + detail::quote(name));
  return detail::to_f32(*t, bytes(*t), path_);
}

std::vector<unsigned char> encode_floats(std::span<const float> values, dtype type) {
  if (type != dtype::F32 && type != dtype::F16 && type != dtype::BF16 && type != dtype::F64)
    throw std::invalid_argument("levanter::safetensors::encode_floats: dtype " + std::string(dtype_name(type)) +
                                " is not F32, F16, BF16 or F64");
  const std::size_t size = dtype_size(type);
  std::vector<unsigned char> out(values.size() * size);
  unsigned char* p = out.data();
  for (float v : values) {
    switch (type) {
      case dtype::F32:
        detail::store_le(p, std::bit_cast<std::uint32_t>(v), 4);
        break;
      case dtype::F16:
        detail::store_le(p, detail::f32_to_f16(v), 2);
        break;
      case dtype::BF16:
        detail::store_le(p, detail::f32_to_bf16(v), 2);
        break;
      case dtype::F64:
        detail::store_le(p, std::bit_cast<std::uint64_t>(static_cast<double>(v)), 8);
        break;
      default:
        break;
    }
    p += size;
  }
  return out;
}

namespace detail {
namespace {

void check_to_write(const std::vector<tensor_to_write>& tensors, const std::map<std::string, std::string>& meta,
                    const char* fn) {
  auto bad = [&](const std::string& problem) { throw std::invalid_argument(std::string(fn) + ": " + problem); };
  std::set<std::string_view> names;
  for (const auto& t : tensors) {
    auto who = "tensor " + quote(t.name) + ": ";
    if (t.name.empty()) bad("empty tensor name");
    if (t.name == "__metadata__") bad("'__metadata__' is reserved, not a tensor name");
    if (!valid_utf8(t.name)) bad(who + "name is not valid UTF-8");
    if (!names.insert(t.name).second) bad("duplicate tensor name " + quote(t.name));
    if (dtype_size(t.type) == 0) bad(who + "invalid dtype");
    std::uint64_t bytes = dtype_size(t.type);
    for (auto d : t.shape)
      if (d < 0 || !checked_mul(bytes, static_cast<std::uint64_t>(d), bytes))
        bad(who + "invalid shape " + shape_string(t.shape));
    if (bytes != t.data.size())
      bad(who + std::string(dtype_name(t.type)) + " " + shape_string(t.shape) + " needs " + std::to_string(bytes) +
          " bytes, data holds " + std::to_string(t.data.size()));
  }
  for (const auto& [k, v] : meta)
    if (!valid_utf8(k) || !valid_utf8(v)) bad("metadata key or value " + quote(k) + " is not valid UTF-8");
}

std::string header_json(const std::vector<const tensor_to_write*>& tensors,
                        const std::map<std::string, std::string>& meta) {
  using json = nlohmann::json;
  std::string h = "{";
  if (!meta.empty()) h += "\"__metadata__\":" + json(meta).dump();
  std::uint64_t offset = 0;
  for (const auto* t : tensors) {
    if (h.size() > 1) h += ',';
    h += json(t->name).dump() + ":{\"dtype\":\"" + std::string(dtype_name(t->type)) +
         "\",\"shape\":" + json(t->shape).dump() + ",\"data_offsets\":[" + std::to_string(offset) + ",";
    offset += t->data.size();
    h += std::to_string(offset) + "]}";
  }
  h += '}';
  h.append((8 - h.size() % 8) % 8, ' ');  // keeps the data buffer 8-byte aligned
  return h;
}

// Writes `pieces` with io::write_file_atomic (fsync of the file, rename, fsync of the directory), so `path` is either
// the old file or the complete new one, even across a crash. A failure is a format_error naming `fn` and the file.
void write_atomic(const std::string& path, std::span<const std::string_view> pieces, const char* fn) {
  try {
    io::write_file_atomic(path, pieces, {.sync = true});
  } catch (const io::io_error& e) {
    throw format_error(std::string(fn) + ": " + e.what());
  }
}

void write_tensors(const std::string& path, const std::vector<const tensor_to_write*>& tensors,
                   const std::map<std::string, std::string>& meta, const char* fn) {
  const std::string header = header_json(tensors, meta);
  unsigned char length[8];
  store_le(length, header.size(), 8);
  std::vector<std::string_view> pieces{{reinterpret_cast<const char*>(length), 8}, header};
  for (const auto* t : tensors) pieces.emplace_back(reinterpret_cast<const char*>(t->data.data()), t->data.size());
  write_atomic(path, pieces, fn);
}

}  // namespace
}  // namespace detail

void write_file(const std::string& path, const std::vector<tensor_to_write>& tensors,
                const std::map<std::string, std::string>& metadata) {
  constexpr const char* fn = "levanter::safetensors::write_file";
  detail::check_to_write(tensors, metadata, fn);
  std::vector<const tensor_to_write*> all;
  for (const auto& t : tensors) all.push_back(&t);
  detail::write_tensors(path, all, metadata, fn);
}

std::vector<std::string> write_hf_dir(const std::string& dir, const std::vector<tensor_to_write>& tensors,
                                      std::uint64_t max_shard_bytes,
                                      const std::map<std::string, std::string>& metadata) {
  namespace fs = std::filesystem;
  constexpr const char* fn = "levanter::safetensors::write_hf_dir";
  detail::check_to_write(tensors, metadata, fn);
  fs::create_directories(dir);
  std::uint64_t total = 0;
  std::vector<std::vector<const tensor_to_write*>> shards;
  std::uint64_t in_shard = 0;
  for (const auto& t : tensors) {
    total += t.data.size();
    if (shards.empty() || (!shards.back().empty() && in_shard + t.data.size() > max_shard_bytes)) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&t);
    in_shard += t.data.size();
  }
  std::vector<std::string> written;
  if (total <= max_shard_bytes || shards.size() <= 1) {
    std::vector<const tensor_to_write*> all;
    for (const auto& t : tensors) all.push_back(&t);
    detail::write_tensors((fs::path(dir) / "model.safetensors").string(), all, metadata, fn);
    written.push_back("model.safetensors");
  } else {
    char name[64];
    nlohmann::json weight_map = nlohmann::json::object();
    for (std::size_t i = 0; i < shards.size(); ++i) {
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      detail::write_tensors((fs::path(dir) / name).string(), shards[i], metadata, fn);
      for (const auto* t : shards[i]) weight_map[t->name] = name;
      written.push_back(name);
    }
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", std::move(weight_map)}};
    const std::string text = index.dump(2) + "\n";
    const std::string_view index_text = text;
    detail::write_atomic((fs::path(dir) / "model.safetensors.index.json").string(), {&index_text, 1}, fn);
    written.push_back("model.safetensors.index.json");
  }
  auto is_shard_name = [](const std::string& n) {  // model-DDDDD-of-DDDDD.safetensors
    if (n.size() != 32 || n.compare(0, 6, "model-") != 0 || n.compare(11, 4, "-of-") != 0 ||
        n.compare(20, 12, ".safetensors") != 0)
      return false;
    auto digit = [](char c) { return c >= '0' && c <= '9'; };
    return std::all_of(n.begin() + 6, n.begin() + 11, digit) && std::all_of(n.begin() + 15, n.begin() + 20, digit);
  };
  for (const auto& entry : fs::directory_iterator(dir)) {
    auto n = entry.path().filename().string();
    bool stale = (is_shard_name(n) || n == "model.safetensors" || n == "model.safetensors.index.json") &&
                 std::find(written.begin(), written.end(), n) == written.end();
    if (stale) fs::remove(entry.path());
  }
  return written;
}

hf_dir::hf_dir(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  const fs::path d(dir);
  const fs::path index_path = d / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    read_index(index_path.string());
  } else if (fs::exists(d / "model.safetensors", ec)) {
    add((d / "model.safetensors").string(), "model.safetensors");
  } else {
    detail::fail(dir, "neither model.safetensors nor model.safetensors.index.json is in this directory");
  }
}

std::vector<std::string> hf_dir::names() const {
  std::vector<std::string> out;
  for (const auto& [name, where] : where_) out.push_back(name);
  return out;
}

const tensor_info* hf_dir::find(std::string_view name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : &files_[it->second.first].header().tensors[it->second.second];
}

std::vector<float> hf_dir::read_f32(std::string_view name) const {
  auto it = where_.find(name);
  if (it == where_.end()) detail::fail(dir_, "no tensor " + detail::quote(name));
  return files_[it->second.first].read_f32(name);
}

const tensor_info& hf_dir::get(std::string_view name) const {
  const tensor_info* t = find(name);
  if (!t) detail::fail(dir_, "no tensor " + detail::quote(name));
  return *t;
}

void hf_dir::add(const std::string& path, const std::string& name) {
  files_.emplace_back(path);
  file_names_.push_back(name);
  const auto& tensors = files_.back().header().tensors;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    auto [it, fresh] = where_.emplace(tensors[i].name, std::pair{files_.size() - 1, i});
    if (!fresh)
      detail::fail(dir_, "tensor " + detail::quote(tensors[i].name) + " is in both " +
                             detail::quote(file_names_[it->second.first]) + " and " + detail::quote(name));
  }
}

void hf_dir::read_index(const std::string& path) {
  using json = nlohmann::json;
  std::error_code ec;
  auto size = std::filesystem::file_size(path, ec);
  if (ec) detail::fail(path, "cannot read: " + ec.message());
  if (size > detail::max_header_bytes)
    detail::fail(path, "index of " + std::to_string(size) + " bytes exceeds the limit of " +
                           std::to_string(detail::max_header_bytes));
  std::string text(size, '\0');
  std::ifstream in(path, std::ios::binary);
  if (!in.read(text.data(), static_cast<std::streamsize>(size))) detail::fail(path, "cannot read");

  std::vector<std::set<std::string>> keys;  // keys of each open object, to catch duplicates
  json index;
  try {
    index = json::parse(text, [&](int depth, json::parse_event_t event, json& parsed) {
      if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) && depth >= 4)
        detail::fail(path, "JSON nesting deeper than 4 levels");
      if (event == json::parse_event_t::object_start) keys.emplace_back();
      if (event == json::parse_event_t::object_end) keys.pop_back();
      if (event == json::parse_event_t::key && !keys.back().insert(parsed.get<std::string>()).second)
        detail::fail(path, "duplicate key " + detail::quote(parsed.get<std::string>()));
      return true;
    });
  } catch (const json::exception& e) {
    detail::fail(path, std::string("not valid JSON: ") + e.what());
  }
  if (!index.is_object()) detail::fail(path, "not a JSON object");
  if (index.contains("metadata") && !index.at("metadata").is_object()) detail::fail(path, "metadata is not an object");
  if (!index.contains("weight_map") || !index.at("weight_map").is_object())
    detail::fail(path, "weight_map is missing or not an object");
  const json& weight_map = index.at("weight_map");

  std::map<std::string, std::size_t> shard_index;
  for (const auto& [name, shard] : weight_map.items()) {
    if (!shard.is_string()) detail::fail(path, "weight_map[" + detail::quote(name) + "] is not a string");
    const auto& s = shard.get_ref<const std::string&>();
    // Hugging Face caches link shards to blobs elsewhere, so "inside" is a property of the name, not of the target.
    if (s.empty() || s == "." || s == ".." || s.find('/') != std::string::npos || s.find('\0') != std::string::npos)
      detail::fail(path, "weight_map[" + detail::quote(name) + "] = " + detail::quote(s) +
                             " is not a file name inside the directory");
    if (!shard_index.count(s)) {
      shard_index.emplace(s, files_.size());
      add((std::filesystem::path(dir_) / s).string(), s);
    }
  }
  for (const auto& [name, shard] : weight_map.items()) {
    const auto& s = shard.get_ref<const std::string&>();
    auto it = where_.find(name);
    if (it == where_.end())
      detail::fail(path,
                   "weight_map lists " + detail::quote(name) + " in " + detail::quote(s) + ", but no shard holds it");
    if (it->second.first != shard_index.at(s))
      detail::fail(path, "weight_map lists " + detail::quote(name) + " in " + detail::quote(s) + ", but it is in " +
                             detail::quote(file_names_[it->second.first]));
  }
  if (where_.size() != weight_map.size())
    for (const auto& [name, where] : where_)
      if (!weight_map.contains(name))
        detail::fail(path, detail::quote(file_names_[where.first]) + " holds " + detail::quote(name) +
                               ", which weight_map does not list");
}

}  // namespace levanter::safetensors
