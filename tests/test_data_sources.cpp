// Data sources: URL expansion (braces like Python's braceexpand, globs, remote refusal), formats (jsonl, json,
// txt, gz, zst) and the bad-document policies.
#include <doctest/doctest.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <levanter/data/sources.hpp>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace levanter::data;
using strings = std::vector<std::string>;

namespace {

struct temp_dir {
  fs::path path;
  temp_dir() {
    path = fs::temp_directory_path() / ("levanter-sources-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() { fs::remove_all(path); }
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::string file(const std::string& name, const std::string& content) const {
    auto p = path / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << content;
    return p.string();
  }
};

std::string gzip(const std::string& s) {
  z_stream z{};
  deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, s.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(s.data()));
  z.avail_in = static_cast<uInt>(s.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string zstd(const std::string& s) {
  std::string out(ZSTD_compressBound(s.size()), '\0');
  auto n = ZSTD_compress(out.data(), out.size(), s.data(), s.size(), 3);
  REQUIRE(!ZSTD_isError(n));
  out.resize(n);
  return out;
}

strings docs_of(const strings& files, const source_options& src = {}, read_stats* st = nullptr) {
  strings out;
  auto s = read_documents(files, src, [&](std::string_view t) { out.emplace_back(t); });
  if (st) *st = s;
  return out;
}

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const data_error& e) {
    return e.what();
  }
  return "(no data_error)";
}

}  // namespace

TEST_CASE("brace expansion matches Python braceexpand") {
  // Expected values printed by braceexpand 0.1.7 (pip install braceexpand).
  CHECK(brace_expand("a{1..3}b") == strings{"a1b", "a2b", "a3b"});
  CHECK(brace_expand("f{001..003}") == strings{"f001", "f002", "f003"});
  CHECK(brace_expand("f{1..010}").size() == 10);
  CHECK(brace_expand("f{1..010}").front() == "f001");
  CHECK(brace_expand("f{a,b{x,y},c}d") == strings{"fad", "fbxd", "fbyd", "fcd"});
  CHECK(brace_expand("{a}") == strings{"{a}"});
  CHECK(brace_expand("x{}y") == strings{"x{}y"});
  CHECK(brace_expand("{9..7}") == strings{"9", "8", "7"});
  CHECK(brace_expand("{a..c}") == strings{"a", "b", "c"});
  CHECK(brace_expand("{1..5..2}") == strings{"1", "3", "5"});
  CHECK(brace_expand("{,x}") == strings{"", "x"});
  CHECK(brace_expand("{-01..2}") == strings{"-01", "000", "001", "002"});
  CHECK(brace_expand("{a,b}{1,2}") == strings{"a1", "a2", "b1", "b2"});
  CHECK(brace_expand("{{a,b}}") == strings{"{a}", "{b}"});
  CHECK(brace_expand("{a,{b}}") == strings{"a", "{b}"});
  CHECK(brace_expand("shard-{0000..0127}.jsonl").size() == 128);
  CHECK(brace_expand("shard-{0000..0127}.jsonl").back() == "shard-0127.jsonl");
  CHECK(error_of([] { brace_expand("a{b,c"); }).find("unbalanced braces") != std::string::npos);
  CHECK(error_of([] { brace_expand("a}b"); }).find("'a}b'") != std::string::npos);
  // Bounded: a pattern naming more than 100000 files is refused before anything is built (it used to end in
  // std::bad_alloc), whether by one range, nested ranges, or ends too large for a range at all.
  CHECK(error_of([] { brace_expand("x{1..100000000}.jsonl"); }).find("the range {1..100000000} alone: 100000000 names") !=
        std::string::npos);
  const std::string nested = error_of([] { brace_expand("{1..1000}{1..1000}{1..1000}"); });
  CHECK(nested.find("expands to 1000 x 1000 names") != std::string::npos);
  CHECK(error_of([] { brace_expand("a{1..99999999999999999999999}"); }).find("whose ends are too large") !=
        std::string::npos);
  CHECK(error_of([] { brace_expand("{1..1000}{a,b}{1..100}{1..2}"); }).find("at most 100000 names") != std::string::npos);
  CHECK(brace_expand("s{0..99999}").size() == 100000);
}

TEST_CASE("URL lists expand braces in order and globs sorted, and refuse what they cannot read") {
  temp_dir d;
  for (auto n : {"b.jsonl", "a.jsonl", "c.jsonl", "x/1.txt", "x/2.txt"}) d.file(n, "{\"text\": \"t\"}\n");
  const std::string p = d.path.string() + "/";
  CHECK(expand_urls({p + "*.jsonl"}) == strings{p + "a.jsonl", p + "b.jsonl", p + "c.jsonl"});
  CHECK(expand_urls({p + "{c,a}.jsonl"}) == strings{p + "c.jsonl", p + "a.jsonl"});
  CHECK(expand_urls({p + "x/{2,1}.txt", p + "[ab].jsonl"}) == strings{p + "x/2.txt", p + "x/1.txt", p + "a.jsonl", p + "b.jsonl"});
  CHECK(expand_urls({"file://" + p + "a.jsonl"}) == strings{p + "a.jsonl"});
  CHECK(error_of([&] { expand_urls({p + "*.parquet"}); }).find("*.parquet' matches no file") != std::string::npos);
  CHECK(error_of([&] { expand_urls({p + "{a,zz}.jsonl"}); }).find("zz.jsonl' (from") != std::string::npos);
  CHECK(error_of([&] { expand_urls({p + "a.jsonl", p + "*.jsonl"}); }).find("listed twice") != std::string::npos);
  for (std::string url : {"gs://bucket/a.jsonl", "s3://b/x.jsonl.gz", "http://h/x.txt", "https://h/x.txt", "hf://datasets/x"}) {
    auto e = error_of([&] { expand_urls({url}); });
    CHECK(e.find("no network access: download it and give a local path") != std::string::npos);
    CHECK(e.find(url) != std::string::npos);
  }
  CHECK(shard_names({p + "a.jsonl", p + "b.jsonl"}) == strings{"a_jsonl", "b_jsonl"});
  CHECK(shard_names({p + "x/1.txt"}) == strings{"1_txt"});
}

TEST_CASE("jsonl, json, txt, gz and zst inputs give the same documents") {
  temp_dir d;
  // A long document crosses the 1 MiB read buffer and the decompressors' output buffers.
  const std::string big(3 << 20, 'z');
  std::string jsonl = "{\"text\": \"h\\u00e9llo\", \"id\": 1}\n\n{\"text\": \"" + big + "\"}\n{\"text\": \"last\"}";
  const strings expected{"h\xC3\xA9llo", big, "last"};
  CHECK(docs_of({d.file("a.jsonl", jsonl)}) == expected);
  CHECK(docs_of({d.file("a.json", jsonl)}) == expected);
  CHECK(docs_of({d.file("a.jsonl.gz", gzip(jsonl))}) == expected);
  CHECK(docs_of({d.file("a.jsonl.zst", zstd(jsonl))}) == expected);
  // Concatenated gzip members and zstd frames are one stream.
  CHECK(docs_of({d.file("m.jsonl.gz", gzip(jsonl + "\n") + gzip("{\"text\": \"more\"}\n"))}).back() == "more");
  CHECK(docs_of({d.file("m.jsonl.zstd", zstd(jsonl + "\n") + zstd("{\"text\": \"more\"}\n"))}).back() == "more");
  // txt: one document per line, newline kept (the last line has none here), CRLF read as LF.
  CHECK(docs_of({d.file("t.txt", "one\r\ntwo\n\nthree")}) == strings{"one\n", "two\n", "\n", "three"});
  CHECK(docs_of({d.file("t.txt.gz", gzip("one\ntwo\n"))}) == strings{"one\n", "two\n"});
  // Other text keys; unsupported formats, truncated and corrupt streams are errors naming the file.
  source_options k;
  k.text_key = "body";
  CHECK(docs_of({d.file("k.jsonl", "{\"body\": \"b\"}\n")}, k) == strings{"b"});
  // Only the top-level field counts; the last of duplicate keys wins (Python json.loads).
  CHECK(docs_of({d.file("n.jsonl", "{\"meta\": {\"text\": \"no\"}, \"l\": [{\"text\": 1}], \"text\": \"yes\"}\n"
                                   "{\"text\": \"a\", \"text\": \"b\"}\n")}) == strings{"yes", "b"});
  CHECK(error_of([&] { docs_of({d.file("n2.jsonl", "{\"text\": \"a\", \"text\": null}\n")}); }).find("no string field") !=
        std::string::npos);
  CHECK(error_of([&] { docs_of({d.file("arr.json", "[{\"text\": \"a\"},\n {\"text\": \"b\"}]\n")}); })
            .find("arr.json:1: a JSON array file is not supported") != std::string::npos);
  CHECK(error_of([&] { docs_of({d.file("p.parquet", "x")}); }).find("p.parquet': unsupported format") != std::string::npos);
  auto gz = gzip(jsonl);
  CHECK(error_of([&] { docs_of({d.file("cut.jsonl.gz", gz.substr(0, gz.size() / 2))}); }).find("truncated gzip") !=
        std::string::npos);
  auto zs = zstd(jsonl);
  CHECK(error_of([&] { docs_of({d.file("cut.jsonl.zst", zs.substr(0, zs.size() - 10))}); }).find("truncated zstd") !=
        std::string::npos);
  CHECK(error_of([&] { docs_of({d.file("bad.jsonl.zst", "not zstd at all")}); }).find("bad.jsonl.zst': corrupt zstd") !=
        std::string::npos);
  CHECK(error_of([&] { docs_of({(d.path / "missing.jsonl").string()}); }).find("missing.jsonl") != std::string::npos);
}

TEST_CASE("bad documents stop with file and line, or are skipped and counted") {
  temp_dir d;
  auto f = d.file("bad.jsonl",
                  "{\"text\": \"a\"}\n{\"text\": \"b\"\n{\"other\": 1}\n[1]\n{\"text\": \"ok\"}\n{\"text\": \"x\xFFy\"}\n");
  CHECK(error_of([&] { docs_of({f}); }).find(f + ":2: malformed JSON line") != std::string::npos);
  source_options skip;
  skip.on_bad_document = bad_document_policy::skip;
  read_stats st;
  CHECK(docs_of({f}, skip, &st) == strings{"a", "ok"});
  CHECK(st.documents == 2);
  CHECK(st.skipped == 4);
  auto missing = d.file("missing.jsonl", "{\"text\": \"a\"}\n{\"content\": \"b\"}\n");
  CHECK(error_of([&] { docs_of({missing}); }).find(missing + ":2: no string field 'text'") != std::string::npos);
  // Invalid UTF-8: line, byte of the line and byte of the file.
  auto bad = d.file("utf8.jsonl", "{\"text\": \"a\"}\n{\"text\": \"ab\xC3(\"}\n");
  auto e = error_of([&] { docs_of({bad}); });
  CHECK(e.find(bad + ":2: invalid UTF-8 at byte 12 of the line (byte 26 of") != std::string::npos);
  auto txt = d.file("utf8.txt", "fine\n\xED\xA0\x80 surrogate\n");
  CHECK(error_of([&] { docs_of({txt}); }).find(txt + ":2: invalid UTF-8 at byte 0") != std::string::npos);
  CHECK(docs_of({txt}, skip, &st) == strings{"fine\n"});
  CHECK(st.skipped == 1);
  CHECK(find_invalid_utf8("\xC0\x80") == 0);        // overlong
  CHECK(find_invalid_utf8("ok\xF4\x90\x80\x80") == 2);  // above U+10FFFF
  CHECK(find_invalid_utf8("\xF0\x9F\x98\x80 fine") == std::string_view::npos);
  // No documents at all.
  auto empty = d.file("empty.jsonl", "\n\n");
  CHECK(error_of([&] { docs_of({empty}); }).find("no documents") != std::string::npos);
  auto all_bad = d.file("allbad.jsonl", "nope\n");
  CHECK(error_of([&] { docs_of({all_bad}, skip); }).find("1 bad ones skipped") != std::string::npos);
  CHECK(parse_bad_document_policy("skip") == bad_document_policy::skip);
  CHECK(error_of([] { parse_bad_document_policy("ignore"); }).find("'ignore'") != std::string::npos);
}
