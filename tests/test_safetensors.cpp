// Tests for levanter/compat/safetensors.hpp: round trips of every dtype and shape, the F16/BF16 encoders against
// known bit patterns, every class of malformed header (each rejected naming the file and the problem), Hugging
// Face model directories in both layouts, and a replay of tests/golden/safetensors-bad/ (handcrafted bad files and
// the fuzzer's crashers, see scripts/fuzz.sh).
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <levanter/compat/safetensors.hpp>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace st = levanter::safetensors;
namespace fs = std::filesystem;
using bytes_t = std::vector<unsigned char>;

namespace {

// A file image: the header length, `header` verbatim, then `data_bytes` zero bytes.
bytes_t image(std::string_view header, std::size_t data_bytes = 0) {
  bytes_t out(8 + header.size() + data_bytes);
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<unsigned char>(header.size() >> (8 * i));
  std::copy(header.begin(), header.end(), out.begin() + 8);
  return out;
}

// parse must throw format_error naming the file, with `problem` in the message.
void rejects(const bytes_t& file, const std::string& problem) {
  CAPTURE(problem);
  try {
    st::parse(file, "bad.safetensors");
    FAIL("parse accepted the file");
  } catch (const st::format_error& e) {
    const std::string message = e.what();
    CHECK_MESSAGE(message.rfind("safetensors: 'bad.safetensors': ", 0) == 0, message);
    CHECK_MESSAGE(message.find(problem) != std::string::npos, message);
  }
}
void rejects(std::string_view header, std::size_t data_bytes, const std::string& problem) {
  CAPTURE(header);
  rejects(image(header, data_bytes), problem);
}

// One entry of a hand-written header.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, std::uint64_t begin,
                  std::uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name)
      : path(fs::temp_directory_path() / ("levanter_test_safetensors_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& f) const { return (path / f).string(); }
};

bytes_t read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return bytes_t(std::istreambuf_iterator<char>(in), {});
}
void write_all(const std::string& path, std::string_view text) { std::ofstream(path, std::ios::binary) << text; }

st::tensor_to_write floats(const std::string& name, std::vector<std::int64_t> shape, const std::vector<float>& v,
                           st::dtype type = st::dtype::F32) {
  return {name, type, std::move(shape), st::encode_floats(v, type)};
}

std::uint16_t bits16(float f, st::dtype t) {
  auto b = st::encode_floats(std::span<const float>(&f, 1), t);
  REQUIRE(b.size() == 2);
  return static_cast<std::uint16_t>(b[0] | (b[1] << 8));
}
float decode16(std::uint16_t h, st::dtype t) {
  st::tensor_info info{"x", t, {}, 0, 2};
  bytes_t b{static_cast<unsigned char>(h & 0xff), static_cast<unsigned char>(h >> 8)};
  return st::detail::to_f32(info, b, "test")[0];
}

}  // namespace

TEST_CASE("dtype names, sizes and lookup") {
  CHECK(st::dtype_name(st::dtype::BF16) == "BF16");
  CHECK(st::dtype_name(st::dtype::F8_E4M3) == "F8_E4M3");
  CHECK(st::dtype_size(st::dtype::BOOL) == 1);
  CHECK(st::dtype_size(st::dtype::F16) == 2);
  CHECK(st::dtype_size(st::dtype::U32) == 4);
  CHECK(st::dtype_size(st::dtype::F64) == 8);
  for (int i = 0; i <= static_cast<int>(st::dtype::F64); ++i) {
    auto t = static_cast<st::dtype>(i);
    CHECK(st::dtype_from_name(st::dtype_name(t)) == t);
  }
  CHECK_FALSE(st::dtype_from_name("f32"));
  CHECK_FALSE(st::dtype_from_name("F128"));
  CHECK_FALSE(st::dtype_from_name(""));
}

TEST_CASE("round trip of every dtype and of 0-d and zero-size shapes") {
  temp_dir dir("roundtrip");
  std::vector<st::tensor_to_write> ts;
  unsigned char next = 1;
  const std::vector<std::vector<std::int64_t>> shapes{{}, {3}, {2, 3}, {0}, {4, 0, 2}, {1, 1, 2, 1}};
  for (int i = 0; i <= static_cast<int>(st::dtype::F64); ++i) {
    auto t = static_cast<st::dtype>(i);
    const auto& shape = shapes[static_cast<std::size_t>(i) % shapes.size()];
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    bytes_t data(static_cast<std::size_t>(n) * st::dtype_size(t));
    for (auto& b : data) b = next++;
    ts.push_back({"layer." + std::string(st::dtype_name(t)), t, shape, data});
  }
  const std::string path = dir / "all.safetensors";
  st::write_file(path, ts);

  const bytes_t raw = read_all(path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | raw[static_cast<std::size_t>(i)];
  CHECK(n % 8 == 0);
  const std::string header(raw.begin() + 8, raw.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  CHECK(header.rfind("{\"__metadata__\":{\"format\":\"pt\"},\"layer.BOOL\":", 0) == 0);
  CHECK(header.find("layer.U8") < header.find("layer.I8"));  // keys in the order given
  CHECK(header.find("layer.I8") < header.find("layer.F64"));

  st::file f(path);
  CHECK(f.header().data_start == 8 + n);
  CHECK(f.header().metadata == std::map<std::string, std::string>{{"format", "pt"}});
  REQUIRE(f.header().tensors.size() == ts.size());
  std::uint64_t offset = 0;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const st::tensor_info& got = f.header().tensors[i];  // data in the order given; ties keep header order
    CAPTURE(ts[i].name);
    CHECK(got.name == ts[i].name);
    CHECK(got.type == ts[i].type);
    CHECK(got.shape == ts[i].shape);
    CHECK(got.begin == offset);
    offset = got.end;
    CHECK(f.find(ts[i].name) == &got);
    auto b = f.bytes(got);
    CHECK(bytes_t(b.begin(), b.end()) == ts[i].data);
  }
  CHECK(f.find("layer.BOOL")->numel() == 1);  // 0-d
  CHECK(f.find("layer.F8_E4M3")->numel() == 0);
  CHECK(f.find("absent") == nullptr);
  CHECK(offset == raw.size() - f.header().data_start);
}

TEST_CASE("read_f32 converts F32, F16, BF16 and F64 and refuses the rest") {
  temp_dir dir("read_f32");
  const std::vector<float> v{0.0f, -1.5f, 3.25f, 1024.0f, -0.125f, 7.0f};
  const std::string path = dir / "f.safetensors";
  st::write_file(path, {floats("f32", {2, 3}, v),
                        floats("f16", {6}, v, st::dtype::F16),
                        floats("bf16", {3, 2}, v, st::dtype::BF16),
                        floats("f64", {1, 6}, v, st::dtype::F64),
                        {"i32", st::dtype::I32, {1}, bytes_t(4)},
                        floats("scalar", {}, {2.5f})});
  st::file f(path);
  for (const char* name : {"f32", "f16", "bf16", "f64"}) CHECK(f.read_f32(name) == v);
  CHECK(f.read_f32("scalar") == std::vector<float>{2.5f});
  CHECK_THROWS_WITH_AS(f.read_f32("i32"), doctest::Contains("'i32' is I32"), st::format_error);
  CHECK_THROWS_WITH_AS(f.read_f32("nope"), doctest::Contains("no tensor 'nope'"), st::format_error);
}

TEST_CASE("F16 and BF16 encoding matches known bit patterns") {
  using st::dtype;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct row {
    float value;
    std::uint16_t f16, bf16;
  };
  const row rows[] = {
      {1.0f, 0x3c00, 0x3f80},
      {-2.0f, 0xc000, 0xc000},
      {0.0f, 0x0000, 0x0000},
      {-0.0f, 0x8000, 0x8000},
      {0.1f, 0x2e66, 0x3dcd},                               // 0x3dcccccd rounds up in both
      {1.0f / 3.0f, 0x3555, 0x3eab},                        //
      {65504.0f, 0x7bff, 0x4780},                           // largest F16
      {65519.0f, 0x7bff, 0x4780},                           // just below the F16 rounding threshold
      {65520.0f, 0x7c00, 0x4780},                           // F16 rounds to infinity
      {std::ldexp(1.0f, -14), 0x0400, 0x3880},              // smallest normal F16
      {std::ldexp(1.0f, -24), 0x0001, 0x3380},              // smallest subnormal F16
      {std::ldexp(1.0f, -25), 0x0000, 0x3300},              // tie: rounds to even (zero)
      {std::ldexp(1.5f, -25), 0x0001, 0x3340},              // above the tie
      {std::ldexp(3.0f, -25), 0x0002, 0x33c0},              // tie between 1 and 2 subnormal units: even
      {1.0f + std::ldexp(1.0f, -11), 0x3c00, 0x3f80},       // F16 tie: down to even
      {1.0f + std::ldexp(3.0f, -11), 0x3c02, 0x3f80},       // F16 tie: up to even
      {std::bit_cast<float>(0x3f808000u), 0x3c04, 0x3f80},  // BF16 tie: down to even
      {std::bit_cast<float>(0x3f818000u), 0x3c0c, 0x3f82},  // BF16 tie: up to even
      {std::numeric_limits<float>::max(), 0x7c00, 0x7f80},  // both overflow to infinity
      {-inf, 0xfc00, 0xff80},
      {nan, 0x7e00, 0x7fc0},
  };
  for (const auto& r : rows) {
    CAPTURE(r.value);
    CHECK(bits16(r.value, dtype::F16) == r.f16);
    CHECK(bits16(r.value, dtype::BF16) == r.bf16);
  }
  // A signalling NaN stays NaN; its payload must not collapse to infinity.
  const float snan = std::bit_cast<float>(0x7f800001u);
  CHECK(std::isnan(decode16(bits16(snan, dtype::F16), dtype::F16)));
  CHECK(std::isnan(decode16(bits16(snan, dtype::BF16), dtype::BF16)));
  CHECK(bits16(-nan, dtype::BF16) == 0xffc0);

  // Every F16 and BF16 value survives decode then encode.
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    for (dtype t : {dtype::F16, dtype::BF16}) {
      const float f = decode16(b, t);
      if (std::isnan(f)) continue;
      if (bits16(f, t) != b) {
        CAPTURE(h);
        FAIL("decode then encode changed the bits");
      }
    }
  }
  CHECK(decode16(0x0001, dtype::F16) == std::ldexp(1.0f, -24));
  CHECK(decode16(0x7bff, dtype::F16) == 65504.0f);
  CHECK(decode16(0xfc00, dtype::F16) == -inf);

  const float x = 1.5f;
  CHECK(st::encode_floats(std::span<const float>(&x, 1), dtype::F64) == bytes_t{0, 0, 0, 0, 0, 0, 0xf8, 0x3f});
  CHECK(st::encode_floats(std::span<const float>(&x, 1), dtype::F32) == bytes_t{0, 0, 0xc0, 0x3f});
  CHECK_THROWS_AS(st::encode_floats(std::span<const float>(&x, 1), dtype::I32), std::invalid_argument);
  CHECK_THROWS_AS(st::encode_floats({}, dtype::F8_E5M2), std::invalid_argument);
}

TEST_CASE("metadata round trips, defaults to format pt, and may be left out") {
  temp_dir dir("metadata");
  const std::vector<st::tensor_to_write> ts{floats("w", {2}, {1.0f, 2.0f})};
  st::write_file(dir / "default.safetensors", ts);
  CHECK(st::file(dir / "default.safetensors").header().metadata ==
        std::map<std::string, std::string>{{"format", "pt"}});

  const std::map<std::string, std::string> meta{{"format", "np"}, {"step", "100"}, {"note", "\"quoted\"\n\u00e9"}};
  st::write_file(dir / "custom.safetensors", ts, meta);
  CHECK(st::file(dir / "custom.safetensors").header().metadata == meta);

  st::write_file(dir / "none.safetensors", ts, {});
  const bytes_t raw = read_all(dir / "none.safetensors");
  CHECK(std::string(raw.begin() + 8, raw.end()).find("__metadata__") == std::string::npos);
  CHECK(st::file(dir / "none.safetensors").header().metadata.empty());

  // A file with no tensors is valid too.
  st::write_file(dir / "empty.safetensors", {});
  CHECK(st::file(dir / "empty.safetensors").header().tensors.empty());
}

TEST_CASE("accepts padding, zero-size tensors anywhere and an empty header") {
  auto ok = [](std::string_view header, std::size_t data) { return st::parse(image(header, data), "ok"); };
  CHECK(ok("{}", 0).tensors.empty());
  CHECK(ok("{}      ", 0).data_start == 16);
  CHECK(ok("{\"__metadata__\":{}}", 0).metadata.empty());
  const auto h = ok("{" + entry("z_end", "F32", "[0]", 6, 6) + "," + entry("b", "U8", "[3]", 3, 6) + "," +
                        entry("z_mid", "I64", "[2,0]", 3, 3) + "," + entry("a", "U8", "[3]", 0, 3) + "," +
                        entry("z_start", "BF16", "[0,5]", 0, 0) + "}  ",
                    6);
  std::vector<std::string> order;
  for (const auto& t : h.tensors) order.push_back(t.name);
  CHECK(order == std::vector<std::string>{"z_start", "a", "z_mid", "b", "z_end"});
  CHECK(ok("{" + entry("s", "F64", "[]", 0, 8) + "}", 8).tensors[0].numel() == 1);
}

TEST_CASE("rejects files too short or with a bad header length") {
  rejects(bytes_t{1, 0, 0}, "file shorter than 8 bytes");
  rejects(bytes_t{}, "file shorter than 8 bytes");
  bytes_t huge = image("{}");
  huge[3] = 0x10;  // N = 2 + 2^28 > 100,000,000
  rejects(huge, "exceeds the limit of 100000000 bytes");
  bytes_t all_ones(16, 0xff);
  rejects(all_ones, "exceeds the limit");
  bytes_t past = image("{}");
  past[0] = 3;
  rejects(past, "header length 3 exceeds the 2 bytes after the length field");
}

TEST_CASE("rejects headers that are not UTF-8 JSON objects") {
  rejects("{\"a\xff\":1}", 0, "header is not valid UTF-8 (byte 3");
  rejects("{\"\xc0\xaf\":1}", 0, "not valid UTF-8");          // overlong '/'
  rejects("{\"\xed\xa0\x80\":1}", 0, "not valid UTF-8");      // surrogate encoded directly
  rejects("{\"\xf4\x90\x80\x80\":1}", 0, "not valid UTF-8");  // above U+10FFFF
  rejects("{\"\xe2\x82\":1}", 0, "not valid UTF-8");          // truncated sequence
  rejects("", 0, "header is not a JSON object");
  rejects("[1,2]", 0, "header is not a JSON object");
  rejects(" {}", 0, "header is not a JSON object");
  rejects("\xef\xbb\xbf{}", 0, "header is not a JSON object");  // a byte-order mark
  rejects("{oops}", 0, "header is not valid JSON");
  rejects("{}x", 0, "header is not valid JSON");
  rejects("{} {}", 0, "header is not valid JSON");
  rejects(std::string("{}\0", 3), 0, "header is not valid JSON: NUL byte at byte 2");  // nlohmann stops at NUL
  rejects(std::string("{}\0{\"a\":1}", 10), 0, "NUL byte at byte 2");
  rejects("{\"__metadata__\":{\"k\":\"v\",}}", 0, "header is not valid JSON");
  rejects("{\"\\ud800\":{}}", 0, "header is not valid JSON");  // lone surrogate escape
  rejects("{\"t\":{\"shape\":[[1]]}}", 0, "JSON nesting deeper than 3 levels");
  rejects("{\"t\":{\"shape\":[{}]}}", 0, "JSON nesting deeper than 3 levels");
  rejects("{\"t\":{\"data_offsets\":[[]]}}", 0, "JSON nesting deeper than 3 levels");
  rejects(std::string(100000, '[') + std::string(100000, ']'), 0, "header is not a JSON object");
  rejects("{\"t\":" + std::string(100000, '[') + std::string(100000, ']') + "}", 0, "entry is an array, not an object");
}

TEST_CASE("rejects duplicate keys at every level") {
  const std::string a = entry("a", "U8", "[1]", 0, 1);
  rejects("{" + a + "," + a + "}", 1, "duplicate tensor name 'a'");
  rejects("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate key '__metadata__'");
  rejects("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "duplicate __metadata__ key 'k'");
  rejects("{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
          "tensor 'a': duplicate field 'dtype'");
}

TEST_CASE("rejects malformed tensor entries") {
  rejects("{\"a\":1}", 0, "tensor 'a': entry is an integer, not an object");
  rejects("{\"a\":\"x\"}", 0, "tensor 'a': entry is a string, not an object");
  rejects("{\"a\":null}", 0, "tensor 'a': entry is null, not an object");
  rejects("{\"a\":[]}", 0, "tensor 'a': entry is an array, not an object");
  rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, "tensor 'a': missing field 'data_offsets'");
  rejects("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "tensor 'a': missing field 'dtype'");
  rejects("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, "tensor 'a': missing field 'shape'");
  rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"crc\":0}}", 1,
          "tensor 'a': unexpected field 'crc'");
  rejects("{\"a\":{\"dtype\":8,\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
          "tensor 'a': dtype is an integer, not a string");
  rejects("{\"a\":{\"dtype\":\"u8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "tensor 'a': unknown dtype 'u8'");
  rejects("{\"a\":{\"dtype\":\"C64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, "tensor 'a': unknown dtype 'C64'");
  rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1,
          "tensor 'a': shape is an integer, not an array");
  rejects("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":{}}}", 1,
          "tensor 'a': data_offsets is an object, not an array");
  rejects("{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "empty tensor name");
  rejects("{\"a\\u0001\\\\'\":1}", 0, "tensor 'a\\x01\\x5c\\x27': entry");  // names are escaped in messages
}

TEST_CASE("rejects bad shapes and offsets") {
  auto one = [](const std::string& dtype, const std::string& shape, const std::string& offsets) {
    return "{\"t\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}}";
  };
  rejects(one("U8", "[-1]", "[0,0]"), 0, "tensor 't': shape entry is a negative integer, not a non-negative integer");
  rejects(one("U8", "[1.0]", "[0,1]"), 1, "tensor 't': shape entry is a non-integer or out-of-range number");
  rejects(one("U8", "[1e2]", "[0,100]"), 100, "shape entry is a non-integer");
  rejects(one("U8", "[\"1\"]", "[0,1]"), 1, "shape entry is a string");
  rejects(one("U8", "[true]", "[0,1]"), 1, "shape entry is a boolean");
  rejects(one("U8", "[18446744073709551616]", "[0,0]"), 0, "shape entry is a non-integer or out-of-range number");
  rejects(one("U8", "[9223372036854775808]", "[0,0]"), 0,
          "tensor 't': shape entry 9223372036854775808 overflows int64");
  rejects(one("U8", "[4294967296,4294967296,0]", "[0,0]"), 0,
          "tensor 't': shape [4294967296, 4294967296, 0] overflows");
  rejects(one("F64", "[4611686018427387904]", "[0,0]"), 0, "overflows the byte count");
  rejects(one("U8", "[9223372036854775807,2]", "[0,0]"), 0, "overflows");
  std::string rank64 = "[1", rank65;
  for (int i = 1; i < 64; ++i) rank64 += ",1";
  rank65 = rank64 + ",1]";
  rank64 += "]";
  CHECK(st::parse(image(one("U8", rank64, "[0,1]"), 1), "ok").tensors[0].shape.size() == 64);
  rejects(one("U8", rank65, "[0,1]"), 1, "tensor 't': shape has more than 64 dimensions");
  rejects(one("U8", "[1]", "[0]"), 1, "tensor 't': data_offsets has 1 entries, not 2");
  rejects(one("U8", "[1]", "[0,1,2]"), 1, "tensor 't': data_offsets has more than 2 entries");
  rejects(one("U8", "[1]", "[-1,0]"), 1, "data_offsets entry is a negative integer");
  rejects(one("U8", "[1]", "[0,1.5]"), 1, "data_offsets entry is a non-integer");
  rejects(one("U8", "[0]", "[4,0]"), 4, "tensor 't': data_offsets [4, 0] begin after end");
  rejects(one("F32", "[2]", "[0,4]"), 4, "tensor 't': data_offsets [0, 4] hold 4 bytes, but F32 [2] needs 8");
  rejects(one("BF16", "[]", "[0,4]"), 4, "hold 4 bytes, but BF16 [] needs 2");
  rejects(one("U8", "[0]", "[18446744073709551615,18446744073709551615]"), 0, "gap in the data buffer");
}

TEST_CASE("rejects overlaps, gaps, trailing bytes and truncated data") {
  rejects("{" + entry("a", "U8", "[4]", 0, 4) + "," + entry("b", "U8", "[4]", 2, 6) + "}", 6,
          "tensor 'b' at [2, 6) overlaps tensor 'a', which ends at 4");
  rejects("{" + entry("a", "U8", "[4]", 0, 4) + "," + entry("b", "U8", "[4]", 0, 4) + "}", 4,
          "tensor 'b' at [0, 4) overlaps tensor 'a'");
  rejects("{" + entry("a", "U8", "[4]", 0, 4) + "," + entry("z", "U8", "[0]", 2, 2) + "}", 4,
          "tensor 'z' at [2, 2) overlaps tensor 'a'");
  rejects("{" + entry("a", "U8", "[2]", 0, 2) + "," + entry("b", "U8", "[2]", 3, 5) + "}", 5,
          "gap in the data buffer: bytes [2, 3) belong to no tensor (next is 'b' at [3, 5))");
  rejects("{" + entry("a", "U8", "[2]", 1, 3) + "}", 3, "gap in the data buffer: bytes [0, 1)");
  rejects("{" + entry("a", "U8", "[2]", 0, 2) + "}", 3, "tensors cover 2 bytes of the data buffer, but it holds 3");
  rejects("{}", 1, "tensors cover 0 bytes of the data buffer, but it holds 1 (trailing bytes)");
  rejects("{" + entry("a", "U8", "[4]", 0, 4) + "}", 3, "but it holds 3 (truncated file)");
}

TEST_CASE("rejects metadata that is not a string-to-string map") {
  rejects("{\"__metadata__\":[]}", 0, "__metadata__ is an array, not an object");
  rejects("{\"__metadata__\":\"x\"}", 0, "__metadata__ is a string, not an object");
  rejects("{\"__metadata__\":{\"format\":1}}", 0, "__metadata__ value for key 'format' is an integer, not a string");
  rejects("{\"__metadata__\":{\"format\":null}}", 0, "key 'format' is null, not a string");
  rejects("{\"__metadata__\":{\"format\":{}}}", 0, "key 'format' is an object, not a string");
}

TEST_CASE("file names the path when it is missing, not a file, or malformed") {
  temp_dir dir("file_errors");
  CHECK_THROWS_WITH_AS(st::file(dir / "missing.safetensors"),
                       doctest::Contains("missing.safetensors': cannot open: No such file"), st::format_error);
  CHECK_THROWS_WITH_AS(st::file(dir.path.string()), doctest::Contains("not a regular file"), st::format_error);
  write_all(dir / "empty.safetensors", "");
  CHECK_THROWS_WITH_AS(st::file(dir / "empty.safetensors"),
                       doctest::Contains("empty.safetensors': file shorter than 8 bytes"), st::format_error);
  st::write_file(dir / "cut.safetensors", {floats("w", {4}, {1, 2, 3, 4})});
  fs::resize_file(dir / "cut.safetensors", fs::file_size(dir / "cut.safetensors") - 1);
  CHECK_THROWS_WITH_AS(st::file(dir / "cut.safetensors"), doctest::Contains("cut.safetensors': tensors cover 16"),
                       st::format_error);
}

TEST_CASE("write_file refuses invalid tensors and replaces files atomically") {
  temp_dir dir("write");
  const std::string path = dir / "w.safetensors";
  using ts = std::vector<st::tensor_to_write>;
  auto refuses = [&](const ts& t, const std::string& problem) {
    CAPTURE(problem);
    CHECK_THROWS_WITH_AS(st::write_file(path, t), doctest::Contains(problem.c_str()), std::invalid_argument);
  };
  refuses({{"", st::dtype::U8, {}, {1}}}, "empty tensor name");
  refuses({{"__metadata__", st::dtype::U8, {}, {1}}}, "'__metadata__' is reserved");
  refuses({{"a", st::dtype::U8, {}, {1}}, {"a", st::dtype::U8, {}, {1}}}, "duplicate tensor name 'a'");
  refuses({{"a", st::dtype::F32, {2}, {1, 2, 3}}}, "tensor 'a': F32 [2] needs 8 bytes, data holds 3");
  refuses({{"a", st::dtype::U8, {-1}, {}}}, "tensor 'a': invalid shape [-1]");
  refuses({{"a\xff", st::dtype::U8, {}, {1}}}, "name is not valid UTF-8");
  refuses({{"a", static_cast<st::dtype>(99), {}, {1}}}, "invalid dtype");
  CHECK_FALSE(fs::exists(path));

  st::write_file(path, {floats("old", {1}, {1})});
  st::write_file(path, {floats("new", {2}, {1, 2})});
  st::file f(path);
  CHECK(f.find("old") == nullptr);
  CHECK(f.read_f32("new") == std::vector<float>{1, 2});
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path)) left.push_back(e.path().filename().string());
  CHECK(left == std::vector<std::string>{"w.safetensors"});  // no temporary file left behind
  CHECK_THROWS_AS(st::write_file(dir / "no/such/dir/x.safetensors", {}), st::format_error);
  try {
    st::write_file(dir / "no/such/dir/x.safetensors", {});
  } catch (const st::format_error& e) {
    CHECK(std::string(e.what()).find("levanter::safetensors::write_file: cannot write '") == 0);
    CHECK(std::string(e.what()).find("no/such/dir/x.safetensors'") != std::string::npos);
  }
}

TEST_CASE("hf_dir round trip of a single model.safetensors") {
  temp_dir dir("hf_single");
  const std::vector<st::tensor_to_write> ts{floats("wte", {2, 2}, {1, 2, 3, 4}, st::dtype::BF16),
                                            floats("ln.bias", {3}, {0.5f, -1, 2})};
  CHECK(st::write_hf_dir(dir / "model", ts, 1 << 20) == std::vector<std::string>{"model.safetensors"});
  st::hf_dir d(dir / "model");
  CHECK(d.names() == std::vector<std::string>{"ln.bias", "wte"});
  CHECK(d.shape("wte") == std::vector<std::int64_t>{2, 2});
  CHECK(d.read_f32("wte") == std::vector<float>{1, 2, 3, 4});
  CHECK(d.read_f32("ln.bias") == std::vector<float>{0.5f, -1, 2});
  CHECK(d.find("ln.bias")->type == st::dtype::F32);
  CHECK(d.find("nope") == nullptr);
  CHECK_THROWS_WITH_AS(d.shape("nope"), doctest::Contains("no tensor 'nope'"), st::format_error);
  CHECK_THROWS_WITH_AS(st::hf_dir(dir / "elsewhere"), doctest::Contains("neither model.safetensors nor"),
                       st::format_error);
}

TEST_CASE("hf_dir round trip of shards, and rewriting replaces the old layout") {
  temp_dir dir("hf_sharded");
  const std::vector<st::tensor_to_write> ts{
      floats("a", {6}, {1, 2, 3, 4, 5, 6}),          // 24 bytes
      floats("b", {2}, {7, 8}),                      // 8: fills shard 1 to 32
      floats("c", {10}, std::vector<float>(10, 9)),  // 40: larger than a shard, alone
      floats("d", {}, {10}),                         // 4
      floats("e", {0, 3}, {}),                       // 0
  };
  const auto written = st::write_hf_dir(dir / "m", ts, 32);
  CHECK(written == std::vector<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                            "model-00003-of-00003.safetensors", "model.safetensors.index.json"});
  std::ifstream in(dir / "m/model.safetensors.index.json");
  const auto index = nlohmann::json::parse(in);
  CHECK(index["metadata"]["total_size"] == 76);
  CHECK(index["weight_map"] == nlohmann::json{{"a", "model-00001-of-00003.safetensors"},
                                              {"b", "model-00001-of-00003.safetensors"},
                                              {"c", "model-00002-of-00003.safetensors"},
                                              {"d", "model-00003-of-00003.safetensors"},
                                              {"e", "model-00003-of-00003.safetensors"}});
  st::hf_dir d(dir / "m");
  CHECK(d.names() == std::vector<std::string>{"a", "b", "c", "d", "e"});
  for (const auto& t : ts) {
    CAPTURE(t.name);
    CHECK(d.shape(t.name) == t.shape);
    CHECK(st::encode_floats(d.read_f32(t.name), st::dtype::F32) == t.data);
  }
  st::hf_dir copy = d;  // copies read the same tensors
  CHECK(copy.read_f32("c") == std::vector<float>(10, 9));

  // Fewer shards, then a single file: stale shards and the stale index go.
  st::write_hf_dir(dir / "m", ts, 48);
  CHECK(fs::exists(dir / "m/model-00002-of-00002.safetensors"));
  CHECK_FALSE(fs::exists(dir / "m/model-00001-of-00003.safetensors"));
  CHECK(st::hf_dir(dir / "m").read_f32("d") == std::vector<float>{10});
  st::write_hf_dir(dir / "m", ts, 1000);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir / "m")) left.push_back(e.path().filename().string());
  CHECK(left == std::vector<std::string>{"model.safetensors"});
  CHECK(st::hf_dir(dir / "m").names().size() == 5);
}

TEST_CASE("hf_dir rejects an index that names missing files, wrong shards or paths outside") {
  temp_dir dir("hf_bad");
  st::write_file(dir / "s1.safetensors", {floats("a", {1}, {1}), floats("b", {1}, {2})});
  st::write_file(dir / "s2.safetensors", {floats("c", {1}, {3})});
  st::write_file(dir / "s3.safetensors", {floats("a", {1}, {4})});
  const std::string index = dir / "model.safetensors.index.json";
  auto rejects_index = [&](const std::string& weight_map, const std::string& problem) {
    write_all(index, "{\"metadata\":{\"total_size\":12},\"weight_map\":" + weight_map + "}");
    CAPTURE(weight_map);
    CHECK_THROWS_WITH_AS(st::hf_dir(dir.path.string()), doctest::Contains(problem.c_str()), st::format_error);
  };
  rejects_index(R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s9.safetensors"})", "s9.safetensors': cannot open");
  rejects_index(
      R"({"a":"s1.safetensors","b":"s2.safetensors","c":"s2.safetensors"})",
      "model.safetensors.index.json': weight_map lists 'b' in 's2.safetensors', but it is in 's1.safetensors'");
  rejects_index(R"({"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors","z":"s2.safetensors"})",
                "weight_map lists 'z' in 's2.safetensors', but no shard holds it");
  rejects_index(R"({"a":"s1.safetensors","c":"s2.safetensors"})",
                "'s1.safetensors' holds 'b', which weight_map does not list");
  rejects_index(R"({"a":"s1.safetensors","b":"s1.safetensors","x":"s3.safetensors"})",
                "tensor 'a' is in both 's1.safetensors' and 's3.safetensors'");
  rejects_index(R"({"a":"../s1.safetensors"})", "weight_map['a'] = '../s1.safetensors' is not a file name inside");
  rejects_index(R"({"a":"/etc/passwd"})", "is not a file name inside the directory");
  rejects_index(R"({"a":".."})", "is not a file name inside the directory");
  rejects_index(R"({"a":1})", "weight_map['a'] is not a string");
  rejects_index(R"({"a":"s1.safetensors","a":"s1.safetensors"})", "duplicate key 'a'");
  rejects_index(R"([])", "weight_map is missing or not an object");
  rejects_index(R"({"a":[[[[1]]]]})", "JSON nesting deeper than 4 levels");
  write_all(index, "{\"weight_map\":");
  CHECK_THROWS_WITH_AS(st::hf_dir(dir.path.string()), doctest::Contains("index.json': not valid JSON"),
                       st::format_error);

  write_all(
      index,
      R"({"metadata":{"total_size":12},"weight_map":{"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors"}})");
  st::hf_dir ok(dir.path.string());
  CHECK(ok.names() == std::vector<std::string>{"a", "b", "c"});
  CHECK(ok.read_f32("c") == std::vector<float>{3});
}

TEST_CASE("every file in golden safetensors-bad is rejected by parse and by file") {
  const fs::path bad = fs::path(HALIAX_GOLDEN_DIR) / "safetensors-bad";
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(bad)) {
    if (!e.is_regular_file()) continue;
    ++n;
    const std::string path = e.path().string();
    CAPTURE(path);
    const bytes_t raw = read_all(path);
    CHECK_THROWS_WITH_AS(st::parse(raw, path), doctest::Contains(path.c_str()), st::format_error);
    CHECK_THROWS_AS(st::file{path}, st::format_error);
  }
  CHECK(n >= 12);
}
