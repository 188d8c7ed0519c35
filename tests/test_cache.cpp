// The tokenized cache: reading while it builds, resume after a crash (a throwing encoder and a SIGKILLed child),
// bytes independent of the thread count, the reuse check, and errors coming out of the builder.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <levanter/data/cache.hpp>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using namespace levanter::data;

namespace {

struct temp_dir {
  fs::path path;
  temp_dir() {
    static int counter = 0;
    path = fs::temp_directory_path() / ("levanter-cache-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() { fs::remove_all(path); }
  std::string str(const std::string& name) const { return (path / name).string(); }
};

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Three jsonl files of `n` documents each, lengths varying, some non-ASCII text.
std::vector<std::string> make_corpus(const temp_dir& d, int n = 200) {
  std::vector<std::string> files;
  for (int f = 0; f < 3; ++f) {
    auto p = d.str("data/part-" + std::to_string(f) + ".jsonl");
    fs::create_directories(fs::path(p).parent_path());
    std::ofstream out(p);
    for (int i = 0; i < n; ++i) {
      std::string text = "doc " + std::to_string(f) + "/" + std::to_string(i) + " caf\\u00e9 ";
      text += std::string(static_cast<std::size_t>((i * 37 + f * 11) % 90), 'a' + static_cast<char>(i % 26));
      out << "{\"text\": \"" << text << "\"}\n";
    }
    files.push_back(p);
  }
  return files;
}

// The byte-level encoding plus EOS (256), as train_lm's default.
std::vector<std::int32_t> byte_encode(std::string_view s) {
  std::vector<std::int32_t> ids(s.begin(), s.end());
  for (auto& t : ids) t &= 0xFF;
  ids.push_back(256);
  return ids;
}

nlohmann::json byte_meta() {
  return {{"tokenizer", "byte"}, {"vocab_size", 257}, {"append_bos", false}, {"append_eos", true}};
}

// The serial reference: every document's tokens, concatenated, and the row ends.
std::pair<std::vector<std::int32_t>, std::vector<std::int64_t>> reference(const std::vector<std::string>& files) {
  std::vector<std::int32_t> toks;
  std::vector<std::int64_t> ends;
  read_documents(files, {}, [&](std::string_view t) {
    auto ids = byte_encode(t);
    toks.insert(toks.end(), ids.begin(), ids.end());
    ends.push_back(static_cast<std::int64_t>(toks.size()));
  });
  return {toks, ends};
}

std::vector<std::int32_t> all_tokens(const token_cache& c) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(c.total_tokens()));
  c.read_tokens(0, static_cast<std::int64_t>(out.size()), out.data());
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

cache_options small_chunks(int threads, std::int64_t docs = 16) {
  cache_options o;
  o.num_threads = threads;
  o.docs_per_chunk = docs;
  o.fsync = false;
  return o;
}

}  // namespace

TEST_CASE("a built cache holds every document in file order and reopens without rebuilding") {
  temp_dir d;
  auto files = make_corpus(d);
  auto [toks, ends] = reference(files);
  const std::string dir = d.str("cache/train");
  {
    auto c = open_or_build_cache(dir, files, {}, byte_encode, byte_meta(), small_chunks(2));
    CHECK(all_tokens(*c) == toks);
    CHECK(c->finished());
    CHECK(c->committed_docs() == 600);
    CHECK(c->row_range(0) == std::pair<std::int64_t, std::int64_t>{0, ends[0]});
    CHECK(c->row_range(599) == std::pair<std::int64_t, std::int64_t>{ends[598], ends[599]});
    CHECK(c->doc_bytes() == static_cast<std::int64_t>(toks.size()) - 600);
  }
  auto ledger = nlohmann::json::parse(slurp(dir + "/shard_ledger.json"));
  CHECK(ledger["is_finished"] == true);
  CHECK(ledger["total_num_rows"] == 600);
  CHECK(ledger["field_counts"]["input_ids"] == toks.size());
  CHECK(ledger["shard_rows"]["0_jsonl"] == 200);  // upstream shard names drop the common prefix "part-"
  CHECK(ledger["finished_shards"].size() == 3);
  CHECK(ledger["metadata"]["preprocessor_metadata"]["tokenizer"] == "byte");
  CHECK(ledger["metadata"]["preprocessor_metadata"]["text_key"] == "text");
  CHECK(fs::file_size(dir + "/input_ids/data.bin") == toks.size() * 4);
  CHECK(fs::file_size(dir + "/input_ids/offsets.bin") == 600 * 8);
  // Reopening never calls the encoder; with no files a finished cache still opens.
  std::atomic<int> calls{0};
  auto counting = [&](std::string_view s) {
    ++calls;
    return byte_encode(s);
  };
  auto again = open_or_build_cache(dir, files, {}, counting, byte_meta(), small_chunks(2));
  CHECK(again->finished());
  CHECK(all_tokens(*again) == toks);
  CHECK(all_tokens(*open_or_build_cache(dir, {}, {}, counting, byte_meta())) == toks);
  CHECK(calls == 0);
  CHECK_THROWS_AS(again->read_tokens(static_cast<std::int64_t>(toks.size()) - 1, 2, nullptr), std::out_of_range);
}

TEST_CASE("cache bytes are identical for 1 and 2 threads and any chunk size") {
  temp_dir d;
  auto files = make_corpus(d);
  open_or_build_cache(d.str("c1"), files, {}, byte_encode, byte_meta(), small_chunks(1, 1000))->total_tokens();
  open_or_build_cache(d.str("c2"), files, {}, byte_encode, byte_meta(), small_chunks(2, 7))->total_tokens();
  open_or_build_cache(d.str("c3"), files, {}, byte_encode, byte_meta(), small_chunks(3, 1))->total_tokens();
  for (auto f : {"/input_ids/data.bin", "/input_ids/offsets.bin"}) {
    CHECK(slurp(d.str("c1") + f) == slurp(d.str("c2") + f));
    CHECK(slurp(d.str("c1") + f) == slurp(d.str("c3") + f));
  }
}

TEST_CASE("readers see a growing committed prefix of whole rows while the builder runs") {
  temp_dir d;
  auto files = make_corpus(d, 60);
  auto [toks, ends] = reference(files);
  const std::set<std::int64_t> row_ends(ends.begin(), ends.end());
  auto slow = [](std::string_view s) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return byte_encode(s);
  };
  auto c = open_or_build_cache(d.str("cache"), files, {}, slow, byte_meta(), small_chunks(2, 5));
  std::set<std::int64_t> seen;
  std::int64_t have = 0;
  while (!c->finished()) {
    have = c->wait_for_tokens(have + 1);
    const std::int64_t docs = c->committed_docs();
    seen.insert(have);
    CHECK(row_ends.count(have) == 1);  // never a partial row
    CHECK(docs <= static_cast<std::int64_t>(ends.size()));
    std::vector<std::int32_t> got(static_cast<std::size_t>(have));
    c->read_tokens(0, have, got.data());
    CHECK(std::equal(got.begin(), got.end(), toks.begin()));  // equal to the final data
  }
  CHECK(seen.size() >= 5);  // the reader saw the cache grow, not only its final state
  CHECK(all_tokens(*c) == toks);
}

TEST_CASE("a build that fails midway resumes to the same bytes as an uninterrupted build") {
  temp_dir d;
  auto files = make_corpus(d);
  open_or_build_cache(d.str("ref"), files, {}, byte_encode, byte_meta(), small_chunks(2))->total_tokens();
  std::atomic<int> calls{0};
  auto flaky = [&](std::string_view s) {
    if (++calls > 250) throw std::runtime_error("encoder crashed");
    return byte_encode(s);
  };
  const std::string dir = d.str("cache");
  {
    auto c = open_or_build_cache(dir, files, {}, flaky, byte_meta(), small_chunks(2));
    CHECK_THROWS_WITH(c->total_tokens(), "encoder crashed");
    CHECK_THROWS_WITH(c->wait_for_tokens(1 << 30), "encoder crashed");
    CHECK(c->committed_docs() > 0);
    CHECK(c->committed_docs() < 600);
    CHECK_FALSE(c->finished());
  }
  // Garbage past the last commit (writes the crash cut short), longer than the rest of the data, is dropped on
  // reopen.
  {
    std::ofstream(dir + "/input_ids/data.bin", std::ios::app | std::ios::binary) << std::string(1 << 20, 'g');
    std::ofstream(dir + "/input_ids/offsets.bin", std::ios::app | std::ios::binary) << std::string(1 << 20, 'g');
  }
  auto ledger = nlohmann::json::parse(slurp(dir + "/shard_ledger.json"));
  CHECK(ledger["is_finished"] == false);
  std::atomic<int> resumed{0};
  auto counting = [&](std::string_view s) {
    ++resumed;
    return byte_encode(s);
  };
  auto c = open_or_build_cache(dir, files, {}, counting, byte_meta(), small_chunks(1));
  c->total_tokens();
  CHECK(resumed == 600 - ledger["total_num_rows"].get<int>());  // only the uncommitted documents again
  for (auto f : {"/input_ids/data.bin", "/input_ids/offsets.bin"}) CHECK(slurp(d.str("ref") + f) == slurp(dir + f));
}

TEST_CASE("a build with skipped bad lines resumes after the right line") {
  temp_dir d;
  auto path = d.str("mixed.jsonl");
  {
    std::ofstream out(path);
    for (int i = 0; i < 300; ++i)
      out << (i % 7 == 3 ? std::string("{broken\n") : "{\"text\": \"row " + std::to_string(i) + "\"}\n");
  }
  source_options skip;
  skip.on_bad_document = bad_document_policy::skip;
  open_or_build_cache(d.str("ref"), {path}, skip, byte_encode, byte_meta(), small_chunks(2, 10))->total_tokens();
  std::atomic<int> calls{0};
  auto flaky = [&](std::string_view s) {
    if (++calls > 120) throw std::runtime_error("encoder crashed");
    return byte_encode(s);
  };
  const std::string dir = d.str("cache");
  {
    auto c = open_or_build_cache(dir, {path}, skip, flaky, byte_meta(), small_chunks(2, 10));
    CHECK_THROWS(c->total_tokens());
    CHECK(c->skipped_documents() > 0);
  }
  auto c = open_or_build_cache(dir, {path}, skip, byte_encode, byte_meta(), small_chunks(1, 10));
  c->total_tokens();
  CHECK(c->skipped_documents() == 43);
  for (auto f : {"/input_ids/data.bin", "/input_ids/offsets.bin"}) CHECK(slurp(d.str("ref") + f) == slurp(dir + f));
}

TEST_CASE("a SIGKILLed build resumes to the same bytes as an uninterrupted build") {
  temp_dir d;
  auto files = make_corpus(d);
  open_or_build_cache(d.str("ref"), files, {}, byte_encode, byte_meta(), small_chunks(2))->total_tokens();
  const std::string dir = d.str("cache");
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto slow = [](std::string_view s) {
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
      return byte_encode(s);
    };
    cache_options o = small_chunks(2, 8);
    o.fsync = true;
    open_or_build_cache(dir, files, {}, slow, byte_meta(), o)->total_tokens();
    ::_exit(0);
  }
  // Kill it once some, not all, rows are committed.
  std::int64_t rows = 0;
  for (int i = 0; i < 2000 && rows < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    try {
      rows = nlohmann::json::parse(slurp(dir + "/shard_ledger.json")).value("total_num_rows", std::int64_t{0});
    } catch (...) {
    }
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status));
  auto ledger = nlohmann::json::parse(slurp(dir + "/shard_ledger.json"));
  CHECK(ledger["is_finished"] == false);
  CHECK(ledger["total_num_rows"].get<int>() >= 100);
  auto c = open_or_build_cache(dir, files, {}, byte_encode, byte_meta(), small_chunks(2));
  c->total_tokens();
  for (auto f : {"/input_ids/data.bin", "/input_ids/offsets.bin"}) CHECK(slurp(d.str("ref") + f) == slurp(dir + f));
}

TEST_CASE("reopening a cache with other preprocessing settings or other files is an error") {
  temp_dir d;
  auto files = make_corpus(d, 10);
  const std::string dir = d.str("cache/train");
  open_or_build_cache(dir, files, {}, byte_encode, byte_meta(), small_chunks(1))->total_tokens();
  auto meta = byte_meta();
  meta["vocab_size"] = 50257;
  meta["tokenizer"] = "gpt2";
  auto e = error_of([&] { open_or_build_cache(dir, files, {}, byte_encode, meta); });
  CHECK(e.find("vocab_size: cached 257, now 50257") != std::string::npos);
  CHECK(e.find("tokenizer: cached \"byte\", now \"gpt2\"") != std::string::npos);
  CHECK(e.find("delete '" + dir + "' or set data.cache_dir to another directory") != std::string::npos);
  meta = byte_meta();
  meta["tokenizer_hash"] = "0123456789abcdef";
  CHECK(error_of([&] { open_or_build_cache(dir, files, {}, byte_encode, meta); }).find("tokenizer_hash: cached (absent)") !=
        std::string::npos);
  // The same tokenizer content under another name (another path to the same file) is accepted.
  auto hashed = byte_meta();
  hashed["tokenizer_hash"] = "0123456789abcdef";
  open_or_build_cache(d.str("hashed"), files, {}, byte_encode, hashed, small_chunks(1))->total_tokens();
  hashed["tokenizer"] = "/elsewhere/byte";
  CHECK(open_or_build_cache(d.str("hashed"), files, {}, byte_encode, hashed)->finished());
  hashed["tokenizer_hash"] = "fedcba9876543210";
  CHECK(error_of([&] { open_or_build_cache(d.str("hashed"), files, {}, byte_encode, hashed); })
            .find("tokenizer: cached \"byte\", now \"/elsewhere/byte\", tokenizer_hash: cached") != std::string::npos);
  source_options other_key;
  other_key.text_key = "content";
  CHECK(error_of([&] { open_or_build_cache(dir, files, other_key, byte_encode, byte_meta()); })
            .find("text_key: cached \"text\", now \"content\"") != std::string::npos);
  CHECK(error_of([&] { open_or_build_cache(dir, {files[0]}, {}, byte_encode, byte_meta()); })
            .find("built from other data files") != std::string::npos);
  CHECK(error_of([&] { open_or_build_cache(d.str("nothing"), {}, {}, byte_encode, byte_meta()); })
            .find("no data files to build it from") != std::string::npos);
}

TEST_CASE("bad documents and empty data surface from the builder") {
  temp_dir d;
  auto good = d.str("a.jsonl");
  std::ofstream(good) << "{\"text\": \"one\"}\n{\"text\": \"two\"}\n";
  auto bad = d.str("b.jsonl");
  std::ofstream(bad) << "{\"text\": \"three\"}\n{\"text\": 3}\n{\"text\": \"four\"}\n";
  {
    auto c = open_or_build_cache(d.str("stop"), {good, bad}, {}, byte_encode, byte_meta(), small_chunks(2, 1));
    CHECK(error_of([&] { c->total_tokens(); }).find(bad + ":2: no string field 'text'") != std::string::npos);
    CHECK(c->committed_docs() == 3);  // everything before the bad line is committed
  }
  source_options skip;
  skip.on_bad_document = bad_document_policy::skip;
  auto c = open_or_build_cache(d.str("skip"), {good, bad}, skip, byte_encode, byte_meta(), small_chunks(2, 1));
  CHECK(c->total_tokens() == 4 + 4 + 6 + 5);
  CHECK(c->committed_docs() == 4);
  CHECK(c->skipped_documents() == 1);
  auto empty = d.str("e.jsonl");
  std::ofstream(empty) << "\n";
  auto e = open_or_build_cache(d.str("empty"), {empty}, {}, byte_encode, byte_meta(), small_chunks(1));
  CHECK(error_of([&] { e->total_tokens(); }).find("no documents") != std::string::npos);
  auto m = open_or_build_cache(d.str("missing"), {d.str("gone.jsonl")}, {}, byte_encode, byte_meta(), small_chunks(1));
  CHECK(error_of([&] { m->total_tokens(); }).find("gone.jsonl") != std::string::npos);
}

TEST_CASE("token ids outside the vocabulary in a cache are refused when it opens and when it is read") {
  temp_dir d;
  auto files = make_corpus(d, 400);
  const std::string dir = d.str("cache/train");
  std::int64_t total = 0;
  {
    auto c = open_or_build_cache(dir, files, {}, byte_encode, byte_meta(), small_chunks(1));
    total = c->total_tokens();
  }
  const auto ledger = nlohmann::json::parse(slurp(dir + "/shard_ledger.json"));
  CHECK(ledger["min_token_id"] == 32);  // the space
  CHECK(ledger["max_token_id"] == 256);
  const std::string data = dir + "/input_ids/data.bin";
  const std::string pristine = slurp(data);
  auto put = [&](std::int64_t at, std::int32_t id) {
    std::string bytes = pristine;
    std::memcpy(bytes.data() + at * 4, &id, 4);
    std::ofstream(data, std::ios::binary | std::ios::trunc) << bytes;
  };
  // A bad id where opening samples (the first tokens): refused at open, naming the cache, position and id.
  for (const std::int32_t bad : {-1, std::numeric_limits<std::int32_t>::min(), 257, 1 << 30}) {
    put(3, bad);
    const auto e = error_of([&] { open_or_build_cache(dir, {}, {}, byte_encode, byte_meta(), small_chunks(1)); });
    CHECK(e.find("token cache '" + dir + "' is corrupt: token 3 is id " + std::to_string(bad) +
                 ", outside the vocabulary [0, 257)") != std::string::npos);
  }
  // Elsewhere (opening samples 16 Ki tokens at the start, the middle and the end): refused by the read that
  // meets it.
  REQUIRE(total > 60000);
  const std::int64_t at = 20005;
  put(at, 300);
  auto c = open_or_build_cache(dir, {}, {}, byte_encode, byte_meta(), small_chunks(1));
  std::vector<std::int32_t> buf(64);
  CHECK_NOTHROW(c->read_tokens(0, 64, buf.data()));
  CHECK(error_of([&] { c->read_tokens(at - 10, 64, buf.data()); })
            .find("token " + std::to_string(at) + " is id 300") != std::string::npos);
  c.reset();
  // A ledger whose recorded range is outside the vocabulary, and one of the wrong shape.
  std::ofstream(data, std::ios::binary | std::ios::trunc) << pristine;
  auto bad_ledger = ledger;
  bad_ledger["max_token_id"] = 4000;
  std::ofstream(dir + "/shard_ledger.json", std::ios::trunc) << bad_ledger.dump();
  CHECK(error_of([&] { open_or_build_cache(dir, {}, {}, byte_encode, byte_meta(), small_chunks(1)); })
            .find("holds ids from 32 to 4000 per its ledger") != std::string::npos);
  bad_ledger = ledger;
  bad_ledger["field_counts"]["input_ids"] = "many";
  std::ofstream(dir + "/shard_ledger.json", std::ios::trunc) << bad_ledger.dump();
  CHECK(error_of([&] { open_or_build_cache(dir, {}, {}, byte_encode, byte_meta(), small_chunks(1)); })
            .find("is damaged") != std::string::npos);
  bad_ledger = ledger;
  bad_ledger["total_num_rows"] = -5;
  std::ofstream(dir + "/shard_ledger.json", std::ios::trunc) << bad_ledger.dump();
  CHECK(error_of([&] { open_or_build_cache(dir, {}, {}, byte_encode, byte_meta(), small_chunks(1)); })
            .find("is damaged: 'total_num_rows' is not a count (-5)") != std::string::npos);
  // Fields a resumed build relies on: counts that disagree would make it skip or repeat documents.
  auto refused = [&](auto edit, const std::string& why) {
    auto l = ledger;
    edit(l);
    std::ofstream(dir + "/shard_ledger.json", std::ios::trunc) << l.dump();
    CHECK(error_of([&] { open_or_build_cache(dir, {}, {}, byte_encode, byte_meta(), small_chunks(1)); })
              .find("is damaged: " + why) != std::string::npos);
  };
  refused([](auto& l) { l["shard_rows"].erase("0_jsonl"); }, "'shard_rows' add up to 800, 'total_num_rows' says 1200");
  refused([](auto& l) { l["total_num_rows"] = 1e300; }, "'total_num_rows' is not a count (1e+300)");
  refused([](auto& l) { l["max_token_id"] = 0.5; }, "'max_token_id' is not an integer");
  refused([](auto& l) { l["is_finished"] = "yes"; }, "'is_finished' is not a boolean");
  refused([](auto& l) { l["shards"] = 3; }, "'shards' is not a list");
  refused([](auto& l) { l["finished_shards"] = {"1_jsonl"}; }, "'finished_shards' is not a prefix of 'shards'");
  refused([](auto& l) { l["metadata"] = nlohmann::json::array(); }, "'metadata' is not an object of objects");
  // An encoder that returns an id outside the vocabulary fails the build instead of writing it.
  auto broken = [](std::string_view s) {
    auto ids = byte_encode(s);
    ids[0] = 999;
    return ids;
  };
  const auto e = error_of([&] {
    auto c2 = open_or_build_cache(d.str("cache/broken"), files, {}, broken, byte_meta(), small_chunks(1));
    c2->total_tokens();
  });
  CHECK(e.find("is id 999, outside the vocabulary [0, 257)") != std::string::npos);
}
