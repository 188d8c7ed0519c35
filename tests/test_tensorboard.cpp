// Tests for levanter/tracker/tensorboard.hpp: CRC-32C, TFRecord framing, the protobuf encoding, and records compared byte
// for byte with those of the Python `tensorboard` package (tests/golden/tensorboard/records.txt, written by
// tests/oracle/gen_tensorboard_golden.py with the same inputs as below). With LEVANTER_TB_CHECK_DIR set, the
// event_writer test leaves its logdir there for tests/oracle/check_tensorboard.py.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <levanter/tracker/tensorboard.hpp>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

namespace tb = levanter::tensorboard;
namespace fs = std::filesystem;

namespace {

std::string hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::string bytes_of(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out.push_back(static_cast<char>(v));
  return out;
}

/// name -> hex of the whole record, from the golden file.
std::map<std::string, std::string> golden_records() {
  const std::string path = std::string(HALIAX_GOLDEN_DIR) + "/tensorboard/records.txt";
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "missing " << path << " (run tests/oracle/gen_tensorboard_golden.py)");
  std::map<std::string, std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name, h;
    fields >> name >> h;
    out[name] = h;
  }
  return out;
}

std::uint32_t crc32c_bitwise(std::string_view data) {
  std::uint32_t c = 0xffffffffu;
  for (unsigned char b : data) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
  }
  return ~c;
}

std::uint64_t read_le(std::string_view s, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= std::uint64_t{static_cast<unsigned char>(s[at + i])} << (8 * i);
  return v;
}

/// Splits TFRecord bytes into payloads, checking the length and both masked CRCs; throws on a bad record.
std::vector<std::string> read_records(std::string_view data) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < data.size()) {
    if (data.size() - at < 12) throw std::runtime_error("truncated header at " + std::to_string(at));
    const std::uint64_t len = read_le(data, at, 8);
    if (tb::unmask_crc(static_cast<std::uint32_t>(read_le(data, at + 8, 4))) != tb::crc32c(data.substr(at, 8)))
      throw std::runtime_error("bad length crc at " + std::to_string(at));
    if (data.size() - at - 12 < len + 4) throw std::runtime_error("truncated record at " + std::to_string(at));
    const std::string_view payload = data.substr(at + 12, len);
    if (static_cast<std::uint32_t>(read_le(data, at + 12 + len, 4)) != tb::masked_crc32c(payload))
      throw std::runtime_error("bad data crc at " + std::to_string(at));
    out.emplace_back(payload);
    at += 12 + len + 4;
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// One field of a decoded protobuf message (top level only).
struct pb_field {
  std::uint32_t number;
  std::uint32_t wire;
  std::uint64_t value;    // varint, fixed64, fixed32
  std::string_view bytes;  // length-delimited
};

std::uint64_t get_varint(std::string_view s, std::size_t& at) {
  std::uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    if (at >= s.size() || shift > 63) throw std::runtime_error("bad varint");
    const auto b = static_cast<unsigned char>(s[at++]);
    v |= std::uint64_t{b & 0x7fu} << shift;
    if (!(b & 0x80u)) return v;
  }
}

std::vector<pb_field> decode(std::string_view s) {
  std::vector<pb_field> out;
  std::size_t at = 0;
  while (at < s.size()) {
    const std::uint64_t key = get_varint(s, at);
    pb_field f{static_cast<std::uint32_t>(key >> 3), static_cast<std::uint32_t>(key & 7), 0, {}};
    switch (f.wire) {
      case 0: f.value = get_varint(s, at); break;
      case 1: f.value = read_le(s, at, 8); at += 8; break;
      case 5: f.value = read_le(s, at, 4); at += 4; break;
      case 2: {
        const std::uint64_t n = get_varint(s, at);
        if (n > s.size() - at) throw std::runtime_error("bad length");
        f.bytes = s.substr(at, n);
        at += n;
        break;
      }
      default: throw std::runtime_error("bad wire type");
    }
    if (at > s.size()) throw std::runtime_error("truncated field");
    out.push_back(f);
  }
  return out;
}

const pb_field* find(const std::vector<pb_field>& fields, std::uint32_t number) {
  for (const auto& f : fields)
    if (f.number == number) return &f;
  return nullptr;
}

// The inputs of tests/oracle/gen_tensorboard_golden.py.
const std::vector<double> hist_values = {-3.5, -1e-13, 0.0, 0.0, 1e-12, 0.5, 1.0, 1.0, 1.0, 2.25, 123.456, 1e6, -42.0, 7e-5};
const std::string golden_text = "hello **markdown**\nline 2 \u2014 \u00fcn\u00efc\u00f6d\u00e9";

std::string scalar_record(std::string_view tag, double value, std::int64_t step, double wall_time) {
  return tb::frame_record(tb::encode_event(tb::summary().scalar(tag, value), step, wall_time));
}

}  // namespace

TEST_CASE("crc32c: standard test vectors") {
  CHECK(tb::crc32c("") == 0u);
  CHECK(tb::crc32c("a") == 0xc1d04330u);
  CHECK(tb::crc32c("123456789") == 0xe3069283u);
  // RFC 3720 (iSCSI) B.4
  CHECK(tb::crc32c(std::string(32, '\0')) == 0x8a9136aau);
  CHECK(tb::crc32c(std::string(32, '\xff')) == 0x62a8ab43u);
  std::string up, down;
  for (int i = 0; i < 32; ++i) {
    up.push_back(static_cast<char>(i));
    down.push_back(static_cast<char>(31 - i));
  }
  CHECK(tb::crc32c(up) == 0x46dd794eu);
  CHECK(tb::crc32c(down) == 0x113fdb5cu);
  CHECK(tb::crc32c("The quick brown fox jumps over the lazy dog") == 0x22620404u);
}

TEST_CASE("crc32c: slicing by 8 equals the bitwise definition at every length, offset and split") {
  std::string data;
  std::uint32_t x = 12345;
  for (int i = 0; i < 300; ++i) {
    x = x * 1664525u + 1013904223u;
    data.push_back(static_cast<char>(x >> 24));
  }
  for (std::size_t off = 0; off < 9; ++off)
    for (std::size_t len = 0; off + len <= data.size(); len += (len < 40 ? 1 : 37)) {
      const std::string_view s = std::string_view(data).substr(off, len);
      CHECK(tb::crc32c(s) == crc32c_bitwise(s));
      const std::size_t cut = len / 3;
      CHECK(tb::crc32c_extend(tb::crc32c(s.substr(0, cut)), s.data() + cut, len - cut) == crc32c_bitwise(s));
    }
}

TEST_CASE("masked crc: formula, inverse and a record header written by tensorboard") {
  const std::uint32_t crc = tb::crc32c("123456789");
  CHECK(tb::mask_crc(crc) == static_cast<std::uint32_t>(((crc >> 15) | (crc << 17)) + 0xa282ead8u));
  for (std::uint32_t v : {0u, 1u, 0xe3069283u, 0xffffffffu, 0x80000000u, 0xa282ead8u})
    CHECK(tb::unmask_crc(tb::mask_crc(v)) == v);
  CHECK(tb::mask_crc(0) == 0xa282ead8u);
  // The header of a 32-byte record: length 0x20 and its masked crc, bytes 29 ed a9 50 (from records.txt).
  CHECK(tb::masked_crc32c(bytes_of({0x20, 0, 0, 0, 0, 0, 0, 0})) == 0x50a9ed29u);
  const std::string framed = tb::frame_record("abc");
  CHECK(framed.size() == 3 + 16);
  CHECK(hex(framed.substr(0, 8)) == "0300000000000000");
  CHECK(framed.substr(12, 3) == "abc");
  CHECK(read_records(framed) == std::vector<std::string>{"abc"});
  CHECK(read_records(tb::frame_record("")) == std::vector<std::string>{""});
}

TEST_CASE("protobuf: varint encoding") {
  auto v = [](std::uint64_t x) {
    std::string out;
    tb::pb::put_varint(out, x);
    return hex(out);
  };
  CHECK(v(0) == "00");
  CHECK(v(1) == "01");
  CHECK(v(127) == "7f");
  CHECK(v(128) == "8001");
  CHECK(v(300) == "ac02");
  CHECK(v(16383) == "ff7f");
  CHECK(v(16384) == "808001");
  CHECK(v((std::uint64_t{1} << 40) + 3) == "838080808020");
  CHECK(v(~std::uint64_t{0}) == "ffffffffffffffffff01");
  std::string neg;
  tb::pb::put_int64_field(neg, 2, -1);  // int64 -1: ten bytes of two's complement
  CHECK(hex(neg) == "10ffffffffffffffffff01");
  for (std::uint64_t x : {0ull, 1ull, 127ull, 128ull, 99999ull, 1ull << 35, 1ull << 63, ~0ull}) {
    std::string out;
    tb::pb::put_varint(out, x);
    std::size_t at = 0;
    CHECK(get_varint(out, at) == x);
    CHECK(at == out.size());
  }
}

TEST_CASE("protobuf: keys, fixed-width, length-delimited and packed fields") {
  std::string out;
  tb::pb::put_double_field(out, 1, 1.0);
  CHECK(hex(out) == "09000000000000f03f");
  out.clear();
  tb::pb::put_float_field(out, 2, 1.0f);
  CHECK(hex(out) == "150000803f");
  out.clear();
  tb::pb::put_bytes_field(out, 3, "brain.Event:2");
  CHECK(hex(out) == "1a0d" + hex("brain.Event:2"));
  out.clear();
  tb::pb::put_bytes_field(out, 8, std::string(200, 'x'));  // a two-byte length
  CHECK(hex(out.substr(0, 3)) == "42c801");
  out.clear();
  const std::vector<double> packed = {0.0, 1.0};
  tb::pb::put_packed_doubles_field(out, 7, packed);
  CHECK(hex(out) == "3a100000000000000000000000000000f03f");
  out.clear();
  tb::pb::put_key(out, 16, tb::pb::wire::length_delimited);  // field numbers >= 16 need a two-byte key
  CHECK(hex(out) == "8201");
  // proto3 defaults are left out, -0.0 is not a default
  out.clear();
  tb::pb::put_double_if_set(out, 1, 0.0);
  tb::pb::put_int64_if_set(out, 2, 0);
  tb::pb::put_string_if_set(out, 3, "");
  CHECK(out.empty());
  tb::pb::put_double_if_set(out, 1, -0.0);
  CHECK(hex(out) == "090000000000000080");
}

TEST_CASE("histogram: default bucket limits are TensorFlow's") {
  const auto& limits = tb::default_bucket_limits();
  REQUIRE(limits.size() == 1551);  // 774 of 1e-12 * 1.1^k below 1e20, DBL_MAX, their negatives, 0
  CHECK(limits.front() == -DBL_MAX);
  CHECK(limits.back() == DBL_MAX);
  CHECK(limits[775] == 0.0);
  CHECK(limits[776] == 1e-12);
  CHECK(limits[774] == -1e-12);
  CHECK(limits[1549] < 1e20);
  CHECK(limits[1549] * 1.1 >= 1e20);
  for (std::size_t i = 1; i < limits.size(); ++i) {
    CHECK(limits[i - 1] < limits[i]);
    CHECK(limits[i] == -limits[limits.size() - 1 - i]);
  }
}

TEST_CASE("histogram: counts, min, max, sums and collapsed runs of empty buckets") {
  const std::vector<double> values = {1.0, 1.0, -2.0, 0.0};
  const auto h = tb::make_histogram(std::span<const double>(values));
  CHECK(h.min == -2.0);
  CHECK(h.max == 1.0);
  CHECK(h.num == 4.0);
  CHECK(h.sum == 0.0);
  CHECK(h.sum_squares == 6.0);
  REQUIRE(h.bucket.size() == h.bucket_limit.size());
  double total = 0;
  for (std::size_t i = 0; i < h.bucket.size(); ++i) {
    total += h.bucket[i];
    if (i > 0) CHECK(h.bucket_limit[i - 1] < h.bucket_limit[i]);
    if (i > 0 && h.bucket[i] == 0.0) CHECK(h.bucket[i - 1] != 0.0);  // no two empty buckets in a row
  }
  CHECK(total == 4.0);
  CHECK(h.bucket_limit.back() == DBL_MAX);
  // 1.0 lies in [limit(1.0 - ulp), first limit > 1.0), 0.0 in [0, 1e-12)
  const auto& limits = tb::default_bucket_limits();
  const auto one = static_cast<std::size_t>(std::upper_bound(limits.begin(), limits.end(), 1.0) - limits.begin());
  bool found = false;
  for (std::size_t i = 0; i < h.bucket.size(); ++i)
    if (h.bucket_limit[i] == limits[one]) found = h.bucket[i] == 2.0;
  CHECK(found);
  for (std::size_t i = 0; i < h.bucket.size(); ++i)
    if (h.bucket_limit[i] == 1e-12) CHECK(h.bucket[i] == 1.0);

  const auto empty = tb::make_histogram(std::span<const double>());
  CHECK(empty.num == 0.0);
  CHECK(empty.bucket_limit == std::vector<double>{DBL_MAX});
  CHECK(empty.bucket == std::vector<double>{0.0});

  const std::vector<float> f = {1.0f, 1.0f, -2.0f, 0.0f};
  const auto hf = tb::make_histogram(std::span<const float>(f));
  CHECK(hf.bucket == h.bucket);
  CHECK(hf.bucket_limit == h.bucket_limit);

  const std::vector<double> bad = {1.0, std::nan("")};
  CHECK_THROWS_WITH_AS(tb::make_histogram(std::span<const double>(bad)), "tensorboard: histogram: value #1 is NaN",
                       std::invalid_argument);
}

TEST_CASE("golden: file_version and scalar records are byte-identical to tensorboard's") {
  const auto g = golden_records();
  CHECK(hex(tb::frame_record(tb::encode_file_version_event(1700000000.5))) == g.at("file_version"));
  CHECK(hex(scalar_record("train/loss", 2.718281828, 42, 1700000001.25)) == g.at("scalar"));
  CHECK(hex(scalar_record("train/zero", 0.0, 0, 1700000002.0)) == g.at("scalar_zero"));
  CHECK(hex(scalar_record("train/learning_rate", 3e-4, (std::int64_t{1} << 40) + 3, 1700000003.125)) ==
        g.at("scalar_big_step"));
  CHECK(hex(scalar_record("eval/delta", -1.5e-7, 5, 1700000004.0)) == g.at("scalar_negative"));
}

TEST_CASE("golden: histogram records are byte-identical to tensorboard's") {
  const auto g = golden_records();
  const auto h = tb::make_histogram(std::span<const double>(hist_values));
  CHECK(hex(tb::frame_record(tb::encode_event(tb::summary().histogram("params/weights", h), 100, 1700000005.5))) ==
        g.at("histogram"));
  const auto e = tb::make_histogram(std::span<const double>());
  CHECK(hex(tb::frame_record(tb::encode_event(tb::summary().histogram("params/empty", e), 101, 1700000006.0))) ==
        g.at("histogram_empty"));
}

TEST_CASE("golden: text record is byte-identical to tensorboard's text_pb") {
  const auto g = golden_records();
  CHECK(hex(tb::frame_record(tb::encode_event(tb::summary().text("config/text", golden_text), 7, 1700000007.75))) ==
        g.at("text"));
}

TEST_CASE("record reader: a flipped byte or a truncation is caught") {
  const std::string good = scalar_record("train/loss", 1.0, 1, 2.0);
  CHECK_NOTHROW(read_records(good));
  for (std::size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    CHECK_THROWS(read_records(bad));
  }
  CHECK_THROWS(read_records(std::string_view(good).substr(0, good.size() - 1)));
}

TEST_CASE("event_writer: a logdir of scalars, a histogram and text parses back record by record") {
  const char* env = std::getenv("LEVANTER_TB_CHECK_DIR");
  const bool keep = env != nullptr && *env != '\0';
  const fs::path logdir =
      keep ? fs::path(env) : fs::temp_directory_path() / ("levanter_tb_test_" + std::to_string(::getpid()));
  if (!keep) fs::remove_all(logdir);
  std::string path;
  {
    tb::event_writer w(logdir.string(), ".v2");
    path = w.path();
    for (int step = 0; step < 100; ++step) {
      w.add_scalar("train/loss", 5.0 / (1.0 + 0.1 * step), step);
      w.add_scalar("optim/learning_rate", 1e-3 * (1.0 - step / 100.0), step);
    }
    std::vector<float> weights;
    for (int i = 0; i < 1000; ++i) weights.push_back(static_cast<float>(std::sin(0.37 * i) * std::exp(-0.001 * i)));
    w.add_histogram("params/weights", std::span<const float>(weights), 99);
    w.add_text("run/notes", "# levanter C++\n\n100 steps of **toy** data.", 0);
    w.flush();
  }
  // events.out.tfevents.<10 digits>.<hostname>.<pid>.<counter>.v2
  const std::string name = fs::path(path).filename().string();
  const std::string prefix = "events.out.tfevents.";
  REQUIRE(name.rfind(prefix, 0) == 0);
  const std::string rest = name.substr(prefix.size());
  CHECK(rest.size() > 11);
  CHECK(rest.find_first_not_of("0123456789") == 10);
  CHECK(rest[10] == '.');
  const std::string pid_part = "." + std::to_string(::getpid()) + ".";
  CHECK(rest.find(pid_part) != std::string::npos);
  CHECK(name.substr(name.size() - 3) == ".v2");
  CHECK(fs::path(path).parent_path() == logdir);

  const auto records = read_records(read_file(path));
  REQUIRE(records.size() == 1 + 200 + 2);
  const auto first = decode(records[0]);
  REQUIRE(find(first, 3) != nullptr);
  CHECK(find(first, 3)->bytes == "brain.Event:2");
  CHECK(find(first, 1) != nullptr);  // wall_time
  const double now = tb::now_seconds();
  for (std::size_t i = 1; i <= 200; ++i) {
    const auto ev = decode(records[i]);
    const std::int64_t step = static_cast<std::int64_t>((i - 1) / 2);
    const auto* s = find(ev, 2);
    CHECK((s ? static_cast<std::int64_t>(s->value) : 0) == step);
    const auto* wall = find(ev, 1);
    REQUIRE(wall != nullptr);
    const double t = std::bit_cast<double>(wall->value);
    CHECK(t > now - 3600);
    CHECK(t <= now);
    const auto* summary = find(ev, 5);
    REQUIRE(summary != nullptr);
    const auto values = decode(summary->bytes);
    REQUIRE(values.size() == 1);
    const auto value = decode(values[0].bytes);
    const auto* tag = find(value, 1);
    const auto* simple = find(value, 2);
    REQUIRE(tag != nullptr);
    REQUIRE(simple != nullptr);
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(simple->value));
    if (i % 2 == 1) {
      CHECK(tag->bytes == "train/loss");
      CHECK(x == static_cast<float>(5.0 / (1.0 + 0.1 * step)));
    } else {
      CHECK(tag->bytes == "optim/learning_rate");
    }
  }
  const auto hist_value = decode(decode(find(decode(records[201]), 5)->bytes)[0].bytes);
  CHECK(find(hist_value, 1)->bytes == "params/weights");
  const auto histo = decode(find(hist_value, 5)->bytes);
  CHECK(std::bit_cast<double>(find(histo, 3)->value) == 1000.0);  // num
  const auto text_value = decode(decode(find(decode(records[202]), 5)->bytes)[0].bytes);
  CHECK(find(text_value, 1)->bytes == "run/notes");
  CHECK(find(text_value, 9)->bytes == "\x0a\x06\x0a\x04text");
  if (!keep) fs::remove_all(logdir);
}

TEST_CASE("event_writer: buffers until flush, two writers get two files") {
  const fs::path logdir = fs::temp_directory_path() / ("levanter_tb_buffer_" + std::to_string(::getpid()));
  fs::remove_all(logdir);
  {
    tb::event_writer a(logdir.string());
    tb::event_writer b(logdir.string());
    CHECK(a.path() != b.path());
    CHECK(a.logdir() == logdir.string());
    const auto header = fs::file_size(a.path());
    CHECK(header == tb::frame_record(tb::encode_file_version_event(1.0)).size());
    a.add_scalar("x", 1.0, 1, 10.0);
    CHECK(fs::file_size(a.path()) == header);
    a.flush();
    CHECK(fs::file_size(a.path()) == header + scalar_record("x", 1.0, 1, 10.0).size());
    b.add_scalar("y", 2.0, 2, 20.0);
  }  // b's record is written on destruction
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(logdir)) {
    ++files;
    const auto records = read_records(read_file(e.path().string()));
    CHECK(records.size() == 2);
  }
  CHECK(files == 2);
  fs::remove_all(logdir);
}

TEST_CASE("event_writer: errors name the path or the tag") {
  const fs::path base = fs::temp_directory_path() / ("levanter_tb_errors_" + std::to_string(::getpid()));
  fs::remove_all(base);
  fs::create_directories(base);
  const fs::path file = base / "not_a_dir";
  std::ofstream(file) << "x";
  try {
    tb::event_writer w((file / "logs").string());
    FAIL("expected an exception");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find((file / "logs").string()) != std::string::npos);
  }
  CHECK_THROWS_AS(tb::event_writer(""), std::invalid_argument);

  tb::event_writer w(base.string());
  const std::vector<double> bad = {0.0, 1.0, INFINITY};
  CHECK_THROWS_WITH_AS(w.add_histogram("params/bad", std::span<const double>(bad), 1),
                       "tensorboard: histogram 'params/bad': value #2 is infinite", std::invalid_argument);
  w.close();
  w.close();
  try {
    w.add_scalar("x", 1.0, 1);
    FAIL("expected an exception");
  } catch (const std::runtime_error& e) {
    CHECK(std::string(e.what()).find(w.path()) != std::string::npos);
  }
  CHECK(read_records(read_file(w.path())).size() == 1);
  fs::remove_all(base);
}
