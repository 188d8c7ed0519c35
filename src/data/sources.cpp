// data/sources.hpp: URL expansion, streaming decompression and the records of data files.
#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <levanter/data/sources.hpp>
#include <levanter/io/json_limits.hpp>
#include <nlohmann/json.hpp>
#include <set>

namespace levanter::data {

bad_document_policy parse_bad_document_policy(const std::string& s) {
  if (s == "stop") return bad_document_policy::stop;
  if (s == "skip") return bad_document_policy::skip;
  throw data_error("bad document policy '" + s + "' is not one of: stop, skip");
}

// ---- URL expansion --------------------------------------------------------------------------------------------

namespace detail {
namespace {

bool is_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}
bool is_int(std::string_view s) { return is_digits(!s.empty() && s[0] == '-' ? s.substr(1) : s); }

// Brace expansion is bounded: a pattern may name at most this many files, in at most this many bytes of names
// (`x{1..100000000}` or three nested `{1..1000}` would otherwise exhaust memory before any file is looked at).
inline constexpr std::size_t max_expanded_names = 100'000;
inline constexpr std::size_t max_expanded_bytes = std::size_t{64} << 20;

[[noreturn]] void too_many(const std::string& whole, const std::string& what) {
  throw data_error("data URL '" + whole + "': the brace pattern expands to " + what + " (at most " +
                   std::to_string(max_expanded_names) + " names are allowed); list fewer files, or a glob");
}

// A brace body that is a range `a..b` or `a..b..step` (integers, or single letters), expanded; false if it is not.
bool expand_range(std::string_view body, std::vector<std::string>& out, const std::string& whole) {
  std::vector<std::string_view> parts;
  std::size_t pos = 0;
  while (true) {
    auto dd = body.find("..", pos);
    if (dd == std::string_view::npos) {
      parts.push_back(body.substr(pos));
      break;
    }
    parts.push_back(body.substr(pos, dd - pos));
    pos = dd + 2;
  }
  if (parts.size() < 2 || parts.size() > 3) return false;
  std::int64_t step = 1;
  if (parts.size() == 3) {
    auto s = parts[2];
    if (!s.empty() && s[0] == '-') s.remove_prefix(1);
    if (!is_digits(s)) return false;
    if (s.size() > 18) too_many(whole, "a range with a step of " + std::string(s));
    step = std::stoll(std::string(s));
    if (step == 0) step = 1;
  }
  auto a = parts[0], b = parts[1];
  if (is_int(a) && is_int(b)) {
    auto padded = [](std::string_view s) {
      return s != "0" && s != "-0" && (s.starts_with("0") || s.starts_with("-0"));
    };
    const int width = (padded(a) || padded(b)) ? static_cast<int>(std::max(a.size(), b.size())) : 0;
    // Ends of more than 18 digits cannot make a range of a sensible length (and would overflow).
    if (a.size() > 19 || b.size() > 19) too_many(whole, "the range {" + std::string(body) + "}, whose ends are too large");
    const std::int64_t x = std::stoll(std::string(a)), y = std::stoll(std::string(b));
    const long double count = (x < y ? (long double)y - x : (long double)x - y) / (long double)step + 1;
    if (count > (long double)max_expanded_names)
      too_many(whole, "the range {" + std::string(body) + "} alone: " + std::to_string((long long)count) + " names");
    char buf[64];
    auto emit = [&](std::int64_t v) {
      std::snprintf(buf, sizeof buf, "%0*lld", width, static_cast<long long>(v));
      out.emplace_back(buf);
    };
    if (x < y)
      for (std::int64_t v = x; v <= y; v += step) emit(v);
    else
      for (std::int64_t v = x; v >= y; v -= step) emit(v);
    return true;
  }
  auto letter = [](std::string_view s) { return s.size() == 1 && std::isalpha(static_cast<unsigned char>(s[0])); };
  if (letter(a) && letter(b)) {
    static constexpr std::string_view alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    const auto x = static_cast<std::int64_t>(alphabet.find(a[0])), y = static_cast<std::int64_t>(alphabet.find(b[0]));
    if (x < y)
      for (std::int64_t v = x; v <= y; v += step) out.emplace_back(1, alphabet[static_cast<std::size_t>(v)]);
    else
      for (std::int64_t v = x; v >= y; v -= step) out.emplace_back(1, alphabet[static_cast<std::size_t>(v)]);
    return true;
  }
  return false;
}

std::vector<std::string> brace_pattern(std::string_view p, const std::string& whole);

// A brace body `x,y{z,w}` split at top-level commas (each alternative itself a pattern); false if it has no comma.
bool expand_sequence(std::string_view body, std::vector<std::string>& out, const std::string& whole) {
  // (Each alternative is bounded by brace_pattern; their sum by the product check of the caller's append.)
  std::vector<std::string_view> alts;
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i < body.size(); ++i) {
    if (body[i] == '\\') {
      ++i;
      continue;
    }
    if (body[i] == '{')
      ++depth;
    else if (body[i] == '}')
      --depth;
    else if (body[i] == ',' && depth == 0) {
      alts.push_back(body.substr(start, i - start));
      start = i + 1;
    }
  }
  if (depth != 0 || alts.empty()) return false;
  alts.push_back(body.substr(start));
  for (auto a : alts)
    for (auto& s : brace_pattern(a, whole)) {
      out.push_back(std::move(s));
      if (out.size() > max_expanded_names) too_many(whole, "more than " + std::to_string(max_expanded_names) + " names");
    }
  return true;
}

// The cartesian product of literal pieces and brace groups, left to right (still escaped).
std::vector<std::string> brace_pattern(std::string_view p, const std::string& whole) {
  std::vector<std::string> acc{""};
  auto append_all = [&](const std::vector<std::string>& options) {
    if (options.size() > 0 && acc.size() > max_expanded_names / options.size())
      too_many(whole, std::to_string(acc.size()) + " x " + std::to_string(options.size()) + " names");
    std::size_t bytes = 0;
    for (const auto& a : acc) bytes += a.size() * options.size();
    for (const auto& o : options) bytes += o.size() * acc.size();
    if (bytes > max_expanded_bytes) too_many(whole, "more than " + std::to_string(max_expanded_bytes >> 20) + " MiB of names");
    std::vector<std::string> next;
    next.reserve(acc.size() * options.size());
    for (const auto& a : acc)
      for (const auto& o : options) next.push_back(a + o);
    acc = std::move(next);
  };
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    if (p[i] == '\\') {
      ++i;
      continue;
    }
    if (p[i] == '{') {
      if (depth == 0 && i > start) {
        append_all({std::string(p.substr(start, i - start))});
        start = i;
      }
      ++depth;
    } else if (p[i] == '}') {
      if (--depth < 0) break;
      if (depth == 0) {
        auto body = p.substr(start + 1, i - start - 1);
        std::vector<std::string> options;
        if (!expand_range(body, options, whole) && !expand_sequence(body, options, whole)) {
          // Not a range nor a list: the braces stay literal around the expanded body.
          std::vector<std::string> inner = brace_pattern(body, whole);
          for (auto& s : inner) s = "{" + s + "}";
          options = std::move(inner);
        }
        append_all(options);
        start = i + 1;
      }
    }
  }
  if (depth != 0)
    throw data_error("data URL '" + whole + "': unbalanced braces (escape a literal brace as \\{ or \\})");
  if (start < p.size()) append_all({std::string(p.substr(start))});
  return acc;
}

std::string unescape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) ++i;
    out.push_back(s[i]);
  }
  return out;
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace
}  // namespace detail

std::vector<std::string> brace_expand(const std::string& pattern) {
  auto out = detail::brace_pattern(pattern, pattern);
  for (auto& s : out) s = detail::unescape(s);
  return out;
}

bool is_remote_url(const std::string& url) {
  auto p = url.find("://");
  if (p == std::string::npos) return false;
  return url.compare(0, p, "file") != 0;
}

std::vector<std::string> expand_urls(const std::vector<std::string>& urls) {
  std::vector<std::string> files;
  std::set<std::string> seen;
  for (const auto& url : urls) {
    if (is_remote_url(url))
      throw data_error("data URL '" + url + "': no network access: download it and give a local path");
    const std::string local = url.starts_with("file://") ? url.substr(7) : url;
    for (const auto& cand : brace_expand(local)) {
      std::vector<std::string> matches;
      if (cand.find_first_of("*?[") != std::string::npos) {
        glob_t g{};
        if (::glob(cand.c_str(), GLOB_NOSORT, nullptr, &g) == 0)
          for (std::size_t i = 0; i < g.gl_pathc; ++i)
            if (detail::is_regular_file(g.gl_pathv[i])) matches.emplace_back(g.gl_pathv[i]);
        ::globfree(&g);
        if (matches.empty())
          throw data_error("data pattern '" + cand + "'" + (cand == url ? "" : " (from '" + url + "')") +
                           " matches no file (paths are relative to the working directory)");
        std::sort(matches.begin(), matches.end());
      } else {
        if (!detail::is_regular_file(cand))
          throw data_error("data file '" + cand + "'" + (cand == url ? "" : " (from '" + url + "')") +
                           " not found (paths are relative to the working directory)");
        matches.push_back(cand);
      }
      for (auto& m : matches) {
        if (!seen.insert(m).second)
          throw data_error("data file '" + m + "' is listed twice (by '" + url +
                           "' and an earlier URL); each file may appear once");
        files.push_back(std::move(m));
      }
    }
  }
  return files;
}

std::vector<std::string> shard_names(const std::vector<std::string>& files) {
  std::string prefix;
  if (files.size() == 1) {
    auto slash = files[0].rfind('/');
    prefix = slash == std::string::npos ? "" : files[0].substr(0, slash);
  } else if (!files.empty()) {
    prefix = files[0];
    for (const auto& f : files) {
      std::size_t n = 0;
      while (n < prefix.size() && n < f.size() && prefix[n] == f[n]) ++n;
      prefix.resize(n);
    }
  }
  std::vector<std::string> names;
  for (const auto& f : files) {
    std::string n = f.substr(prefix.size());
    if (n.starts_with("/")) n.erase(0, 1);
    std::replace(n.begin(), n.end(), '.', '_');
    names.push_back(n);
  }
  return names;
}

// ---- streaming decompression ----------------------------------------------------------------------------------

namespace detail {
namespace {

class file_stream : public byte_stream {
 public:
  explicit file_stream(const std::string& path) : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) throw data_error("cannot open data file '" + path + "': " + std::strerror(errno));
  }
  ~file_stream() override { ::close(fd_); }
  file_stream(const file_stream&) = delete;
  file_stream& operator=(const file_stream&) = delete;
  std::size_t read(char* out, std::size_t n) override {
    while (true) {
      auto r = ::read(fd_, out, n);
      if (r >= 0) return static_cast<std::size_t>(r);
      if (errno != EINTR) throw data_error("cannot read data file '" + path_ + "': " + std::strerror(errno));
    }
  }

 private:
  std::string path_;
  int fd_;
};

// gzip (or zlib) members, concatenated members included.
class gzip_stream : public byte_stream {
 public:
  explicit gzip_stream(const std::string& path) : path_(path), file_(path), in_(1 << 16) {
    if (inflateInit2(&z_, 15 + 32) != Z_OK) throw data_error("zlib: cannot initialise for '" + path + "'");
  }
  ~gzip_stream() override { inflateEnd(&z_); }
  gzip_stream(const gzip_stream&) = delete;
  gzip_stream& operator=(const gzip_stream&) = delete;
  std::size_t read(char* out, std::size_t n) override {
    z_.next_out = reinterpret_cast<Bytef*>(out);
    z_.avail_out = static_cast<uInt>(std::min<std::size_t>(n, 1u << 30));
    while (z_.avail_out > 0) {
      if (z_.avail_in == 0 && !eof_) {
        auto got = file_.read(in_.data(), in_.size());
        if (got == 0) eof_ = true;
        z_.next_in = reinterpret_cast<Bytef*>(in_.data());
        z_.avail_in = static_cast<uInt>(got);
      }
      if (z_.avail_in == 0 && eof_) {
        if (in_member_)
          throw data_error("data file '" + path_ + "': truncated gzip stream (re-download or re-compress it)");
        break;
      }
      const auto before = z_.avail_out;
      int rc = inflate(&z_, Z_NO_FLUSH);
      in_member_ = true;
      if (rc == Z_STREAM_END) {
        in_member_ = false;
        inflateReset(&z_);
      } else if (rc == Z_BUF_ERROR && z_.avail_out == before && z_.avail_in == 0) {
        continue;
      } else if (rc != Z_OK) {
        throw data_error("data file '" + path_ + "': corrupt gzip data (" + (z_.msg ? z_.msg : "zlib error") + ")");
      }
    }
    return n - z_.avail_out;
  }

 private:
  std::string path_;
  file_stream file_;
  std::vector<char> in_;
  z_stream z_{};
  bool eof_ = false, in_member_ = false;
};

class zstd_stream : public byte_stream {
 public:
  explicit zstd_stream(const std::string& path) : path_(path), file_(path), in_(ZSTD_DStreamInSize()) {
    ctx_ = ZSTD_createDCtx();
    if (!ctx_) throw data_error("zstd: cannot initialise for '" + path + "'");
  }
  ~zstd_stream() override { ZSTD_freeDCtx(ctx_); }
  zstd_stream(const zstd_stream&) = delete;
  zstd_stream& operator=(const zstd_stream&) = delete;
  std::size_t read(char* out, std::size_t n) override {
    ZSTD_outBuffer ob{out, n, 0};
    while (ob.pos < ob.size) {
      if (ib_.pos == ib_.size && !eof_) {
        auto got = file_.read(in_.data(), in_.size());
        if (got == 0) eof_ = true;
        ib_ = ZSTD_inBuffer{in_.data(), got, 0};
      }
      if (ib_.pos == ib_.size && eof_ && !pending_) {
        if (in_frame_)
          throw data_error("data file '" + path_ + "': truncated zstd stream (re-download or re-compress it)");
        break;
      }
      const auto before = ob.pos;
      std::size_t rc = ZSTD_decompressStream(ctx_, &ob, &ib_);
      if (ZSTD_isError(rc))
        throw data_error("data file '" + path_ + "': corrupt zstd data (" + ZSTD_getErrorName(rc) + ")");
      in_frame_ = rc != 0;
      // Output buffer full with the decoder holding more: it must be called again even without new input.
      pending_ = ob.pos == ob.size && ob.pos > before;
      if (ib_.pos == ib_.size && eof_ && ob.pos == before && !pending_) {
        if (in_frame_)
          throw data_error("data file '" + path_ + "': truncated zstd stream (re-download or re-compress it)");
        break;
      }
    }
    return ob.pos;
  }

 private:
  std::string path_;
  file_stream file_;
  std::vector<char> in_;
  ZSTD_inBuffer ib_{nullptr, 0, 0};
  ZSTD_DCtx* ctx_ = nullptr;
  bool eof_ = false, in_frame_ = false, pending_ = false;
};

}  // namespace
}  // namespace detail

file_format format_of(const std::string& path, std::string* compression) {
  std::string base = path, comp;
  for (const char* c : {".gz", ".zst", ".zstd"})
    if (ends_with(base, c)) {
      comp = c;
      base.resize(base.size() - comp.size());
      break;
    }
  if (compression) *compression = comp;
  if (ends_with(base, ".jsonl") || ends_with(base, ".json")) return file_format::jsonl;
  if (ends_with(base, ".txt")) return file_format::txt;
  std::string hint = ends_with(base, ".parquet") ? " (parquet is not supported here: convert it to .jsonl)" : "";
  throw data_error("data file '" + path + "': unsupported format" + hint +
                   "; use .jsonl, .json (one object per line) or .txt, optionally compressed as .gz or .zst");
}

std::unique_ptr<byte_stream> open_byte_stream(const std::string& path) {
  std::string comp;
  (void)format_of(path, &comp);
  if (comp == ".gz") return std::make_unique<detail::gzip_stream>(path);
  if (comp == ".zst" || comp == ".zstd") return std::make_unique<detail::zstd_stream>(path);
  return std::make_unique<detail::file_stream>(path);
}

// ---- records ------------------------------------------------------------------------------------------------

record_reader::record_reader(const std::string& path)
    : path_(path), format_(format_of(path)), in_(open_byte_stream(path)) {
  buf_.resize(1 << 20);
}

bool record_reader::next(record& r) {
  while (true) {
    r.offset = offset_;
    if (!next_line(r.bytes, r.had_newline)) return false;
    r.line = ++line_;
    if (format_ == file_format::jsonl) {
      const auto first = r.bytes.find_first_not_of(" \t\r");
      if (first == std::string::npos) continue;
      // Upstream reads a `.json` file that starts with '[' as one JSON array (json.load of the whole file).
      if (!seen_record_ && r.bytes[first] == '[')
        throw data_error(path_ + ":" + std::to_string(r.line) +
                         ": a JSON array file is not supported (it cannot be streamed); convert it to JSON lines, "
                         "one object per line (e.g. jq -c '.[]')");
    }
    seen_record_ = true;
    return true;
  }
}

bool record_reader::next_line(std::string& line, bool& had_newline) {
  line.clear();
  had_newline = false;
  bool any = false;
  while (true) {
    if (pos_ == end_) {
      end_ = in_->read(buf_.data(), buf_.size());
      pos_ = 0;
      if (end_ == 0) return any;
    }
    any = true;
    const char* start = buf_.data() + pos_;
    const void* nl = std::memchr(start, '\n', end_ - pos_);
    if (nl) {
      auto n = static_cast<std::size_t>(static_cast<const char*>(nl) - start);
      line.append(start, n);
      pos_ += n + 1;
      offset_ += static_cast<std::int64_t>(n + 1);
      had_newline = true;
      return true;
    }
    line.append(start, end_ - pos_);
    offset_ += static_cast<std::int64_t>(end_ - pos_);
    pos_ = end_;
  }
}

std::size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    // ASCII fast path: 8 bytes at a time.
    while (i + 8 <= n) {
      std::uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
      len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else
      return i;
    if (i + len > n) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    i += len;
  }
  return std::string_view::npos;
}

namespace detail {
namespace {

// Picks field `key` of a top-level JSON object without building the document (the last occurrence wins, as in
// Python's json.loads). found: 0 absent, 1 a string (moved into `out`), 2 another type.
struct text_field_sax {
  const std::string& wanted;
  std::string& out;
  int depth = 0, found = 0;
  bool top_object = false, want = false, failed = false;
  bool value(bool is_string) {
    if (depth == 1 && want) found = is_string ? 1 : 2;
    want = false;
    return true;
  }
  bool null() { return value(false); }
  bool boolean(bool) { return value(false); }
  bool number_integer(std::int64_t) { return value(false); }
  bool number_unsigned(std::uint64_t) { return value(false); }
  bool number_float(double, const std::string&) { return value(false); }
  bool string(std::string& s) {
    if (depth == 1 && want) out = std::move(s);
    return value(true);
  }
  bool binary(std::vector<std::uint8_t>&) { return value(false); }
  bool start_object(std::size_t) {
    if (depth == 0) top_object = true;
    value(false);
    ++depth;
    return true;
  }
  bool end_object() {
    --depth;
    return true;
  }
  bool start_array(std::size_t) {
    value(false);
    ++depth;
    return true;
  }
  bool end_array() {
    --depth;
    return true;
  }
  bool key(std::string& k) {
    want = depth == 1 && k == wanted;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception&) {
    failed = true;
    return false;
  }
};

}  // namespace
}  // namespace detail

std::string decode_record(const std::string& path, file_format fmt, const record& r, const std::string& text_key,
                          std::string& text) {
  const std::string where = path + ":" + std::to_string(r.line);
  if (auto bad = find_invalid_utf8(r.bytes); bad != std::string_view::npos)
    return where + ": invalid UTF-8 at byte " + std::to_string(bad) + " of the line (byte " +
           std::to_string(r.offset + static_cast<std::int64_t>(bad)) + " of the decompressed file)";
  if (fmt == file_format::txt) {
    text = r.bytes;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (r.had_newline) text.push_back('\n');
    return {};
  }
  detail::text_field_sax sax{text_key, text};
  if (!nlohmann::json::sax_parse(r.bytes, &sax, nlohmann::json::input_format_t::json, true) || sax.failed)
    return where + ": malformed JSON line (each line must be one JSON object)";
  if (!sax.top_object) return where + ": the line is JSON but not an object (each line must be one JSON object)";
  if (sax.found != 1)
    return where + ": no string field '" + text_key + "' (set data.text_key to the field holding the text)";
  return {};
}

namespace {

// Upstream SingleTurnChatProcessor: the content of the first message with role "user" and of the first with role
// "assistant" (wherever they are in the list); sft's chat data names the two roles.
// The record parsed into `j`, with a list in its messages field; "" or what is wrong.
std::string read_messages(const std::string& where, const record& r, const std::string& field,
                          nlohmann::ordered_json& j) {
  if (io::json_depth(r.bytes, 64) > 64) return where + ": the record is nested deeper than 64 levels";
  j = nlohmann::ordered_json::parse(r.bytes, nullptr, false);
  if (j.is_discarded()) return where + ": malformed JSON line (each line must be one JSON object)";
  if (!j.is_object()) return where + ": the line is JSON but not an object (each line must be one JSON object)";
  if (!j.contains(field) || !j[field].is_array())
    return where + ": no list of messages in field '" + field + "' (set the format's messages_field)";
  return {};
}

std::string first_turn(const std::string& where, const record& r, const source_options& src, std::string& text) {
  const std::string& field = src.messages_field;
  nlohmann::ordered_json j;
  if (auto err = read_messages(where, r, field, j); !err.empty()) return err;
  nlohmann::json pair = nlohmann::json::array();
  for (const std::string& role : {src.input_role, src.output_role}) {
    const auto& messages = j[field];
    const auto m = std::find_if(messages.begin(), messages.end(), [&](const nlohmann::ordered_json& x) {
      return x.is_object() && x.contains("role") && x["role"] == role;
    });
    if (m == messages.end()) return where + ": no message with role '" + role + "' in '" + field + "'";
    if (!m->contains("content") || !(*m)["content"].is_string())
      return where + ": the first '" + role + "' message of '" + field + "' has no string content";
    pair.push_back((*m)["content"].get<std::string>());
  }
  text = pair.dump();
  return {};
}

// A multi-turn chat record: the list of messages, as JSON (upstream ChatProcessor hands it to the template).
std::string chat_messages(const std::string& where, const record& r, const source_options& src, std::string& text) {
  const std::string& field = src.messages_field;
  nlohmann::ordered_json j;
  if (auto err = read_messages(where, r, field, j); !err.empty()) return err;
  for (std::size_t i = 0; i < j[field].size(); ++i) {
    const auto& m = j[field][i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return where + ": message " + std::to_string(i) + " of '" + field + "' is not an object with a string 'role'";
  }
  text = j[field].dump();
  return {};
}

}  // namespace

std::string decode_document(const std::string& path, file_format fmt, const record& r, const source_options& src,
                            std::string& text) {
  if (!src.pairs() && !src.chat) return decode_record(path, fmt, r, src.text_key, text);
  if (fmt == file_format::txt)
    return path + ": supervised and chat data need JSON records (.jsonl), not lines of text";
  if (!src.messages_field.empty()) {
    const std::string where = path + ":" + std::to_string(r.line);
    if (auto bad = find_invalid_utf8(r.bytes); bad != std::string_view::npos)
      return where + ": invalid UTF-8 at byte " + std::to_string(bad) + " of the line";
    return src.chat ? chat_messages(where, r, src, text) : first_turn(where, r, src, text);
  }
  nlohmann::json values = nlohmann::json::array();
  std::string v;
  for (const auto& field : src.fields) {
    if (auto err = decode_record(path, fmt, r, field, v); !err.empty()) {
      if (err.find("no string field") != std::string::npos)
        return path + ":" + std::to_string(r.line) + ": no string field '" + field +
               "' (set the format's input_field / output_field to the record's fields)";
      return err;
    }
    values.push_back(std::move(v));
  }
  text = values.dump();
  return {};
}

read_stats read_documents(const std::vector<std::string>& files, const source_options& src,
                          const std::function<void(std::string_view)>& f) {
  read_stats st;
  std::string text;
  for (const auto& path : files) {
    record_reader rd(path);
    record r;
    while (rd.next(r)) {
      auto err = decode_document(path, rd.format(), r, src, text);
      if (!err.empty()) {
        if (src.on_bad_document == bad_document_policy::stop)
          throw data_error(err + " (set data.bad_documents: skip to leave such lines out and count them)");
        ++st.skipped;
        continue;
      }
      f(std::string_view(text));
      ++st.documents;
    }
  }
  if (st.documents == 0)
    throw data_error("no documents in the " + std::to_string(files.size()) + " data file(s) given" +
                     (st.skipped ? " (" + std::to_string(st.skipped) + " bad ones skipped)" : std::string()));
  return st;
}

}  // namespace levanter::data
