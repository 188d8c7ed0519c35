// Tests for levanter/data/tokenizer.hpp against the Python `tokenizers` library: id-for-id equality on a generated
// 11 MB corpus (tests/tokenizer_corpus.hpp) for four trained tokenizers (GPT-2, Llama 3 and SentencePiece/Llama 2
// layouts, plus one with lstrip/rstrip/single_word added tokens), hand-picked tricky strings with their full id
// lists, decode round trips, the tokenizer metadata, encode_batch determinism, the two built-ins and the loader's
// error messages. Goldens: tests/golden/tokenizers/, written by tests/oracle/gen_tokenizer_golden.py.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <levanter/data/text.hpp>
#include <levanter/data/tokenizer.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer_corpus.hpp"

namespace lt = levanter::data;
namespace fs = std::filesystem;

namespace {

const std::string golden_dir = std::string(HALIAX_GOLDEN_DIR) + "/tokenizers";
const std::vector<std::string> tokenizer_names = {"gpt2_style",   "llama3_style", "sentencepiece_style",
                                                  "added_tokens", "qwen2_style",  "metaspace_style"};

std::string hex16(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Printable form of a (possibly long) text: C escapes for control bytes, cut at `max` bytes.
std::string snippet(std::string_view s, std::size_t max = 80) {
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c == '"')
      out += "\\\"";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else
      out += static_cast<char>(c);
  }
  out += "\"";
  if (s.size() > max) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

std::string ids_str(const std::vector<std::int32_t>& ids, std::size_t max = 40) {
  std::string out = "[";
  for (std::size_t i = 0; i < ids.size() && i < max; ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  if (ids.size() > max) out += ",... (" + std::to_string(ids.size()) + " ids)";
  return out + "]";
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> docs = [] {
    std::ifstream f(golden_dir + "/corpus.txt");
    std::string line;
    std::size_t n = 0;
    while (std::getline(f, line))
      if (line.rfind("corpus docs=", 0) == 0) n = std::stoul(line.substr(12));
    REQUIRE_MESSAGE(n > 0, "no 'corpus docs=' line in " << golden_dir << "/corpus.txt");
    std::vector<std::string> out(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = tokcorpus::gen_doc(i);
    return out;
  }();
  return docs;
}

struct golden {
  struct doc_rec {
    std::size_t count;
    std::uint64_t hash;
    std::string dec;
  };
  struct nospecial_rec {
    std::size_t doc, count;
    std::uint64_t hash;
    std::string dec;
  };
  std::size_t docs = 0;
  std::uint64_t fnv = 0;
  std::string prefix;
  std::vector<doc_rec> d;
  std::vector<nospecial_rec> n;
};

golden read_golden(const std::string& name) {
  const std::string path = golden_dir + "/" + name + "/encode_golden.txt";
  std::ifstream f(path);
  REQUIRE_MESSAGE(f.good(), "cannot open " << path);
  golden g;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    std::string tag;
    ss >> tag;
    if (tag == "corpus") {
      std::string a, b;
      ss >> a >> b;
      g.docs = std::stoul(a.substr(5));
      g.fnv = std::stoull(b.substr(4), nullptr, 16);
    } else if (tag == "prefix") {
      g.prefix = nlohmann::json::parse(line.substr(7)).get<std::string>();
    } else if (tag == "d") {
      golden::doc_rec r;
      std::string h;
      ss >> r.count >> h >> r.dec;
      r.hash = std::stoull(h, nullptr, 16);
      g.d.push_back(r);
    } else if (tag == "n") {
      golden::nospecial_rec r;
      std::string h;
      ss >> r.doc >> r.count >> h >> r.dec;
      r.hash = std::stoull(h, nullptr, 16);
      g.n.push_back(r);
    }
  }
  REQUIRE_MESSAGE(g.d.size() == g.docs, path << ": " << g.d.size() << " 'd' records for " << g.docs << " documents");
  return g;
}

// Whether `got` matches a decode code of the golden file ('=', '^' or a hex FNV of the expected text).
bool decode_matches(const std::string& code, const std::string& got, const std::string& text,
                    const std::string& prefix) {
  if (code == "=") return got == text;
  if (code == "^") return got == prefix + text;
  return hex16(tokcorpus::fnv1a64(got)) == code;
}

std::string expected_decode(const std::string& code, const std::string& text, const std::string& prefix) {
  if (code == "=") return text;
  if (code == "^") return prefix + text;
  return "<text with FNV " + code + ">";
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  REQUIRE_MESSAGE(f.good(), "cannot open " << path);
  return nlohmann::json::parse(f);
}

// The directory holding tokenizer `name`. A golden tokenizer stored as <name>/patch.json (a base tokenizer with
// top-level keys of its tokenizer.json replaced, as the oracle script does) is written to a temporary directory.
std::string dir_of(const std::string& name) {
  const std::string d = golden_dir + "/" + name;
  if (fs::exists(d + "/tokenizer.json")) return d;
  const auto patch = read_json(d + "/patch.json");
  const std::string base = golden_dir + "/" + patch["base"].get<std::string>();
  auto j = read_json(base + "/tokenizer.json");
  for (const auto& [key, value] : patch["replace"].items()) j[key] = value;
  const fs::path out =
      fs::temp_directory_path() / ("levanter_test_tokenizer_" + std::to_string(::getpid()) + "_" + name);
  fs::create_directories(out);
  std::ofstream(out / "tokenizer.json") << j.dump();
  fs::copy_file(base + "/tokenizer_config.json", out / "tokenizer_config.json", fs::copy_options::overwrite_existing);
  return out.string();
}

lt::tokenizer load(const std::string& name) { return lt::tokenizer::from_file(dir_of(name)); }

// Removes the temporary directories of patched tokenizers when the test program ends.
struct temp_cleanup {
  ~temp_cleanup() {
    std::error_code ec;
    for (const auto& name : tokenizer_names)
      fs::remove_all(
          fs::temp_directory_path(ec) / ("levanter_test_tokenizer_" + std::to_string(::getpid()) + "_" + name), ec);
  }
} cleanup_at_exit;

// The message of the data_error `f` throws, or "" (and a failed check) if it throws nothing or something else.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const lt::data_error& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL_CHECK("threw a non-data_error exception: " << e.what());
    return "";
  }
  FAIL_CHECK("did not throw");
  return "";
}

}  // namespace

TEST_CASE("tokenizer corpus: the C++ generator reproduces the Python documents byte for byte") {
  const std::string path = golden_dir + "/corpus.txt";
  std::ifstream f(path);
  REQUIRE_MESSAGE(f.good(), "cannot open " << path);
  std::string line;
  std::uint64_t want_fnv = 0, want_bytes = 0;
  std::vector<std::pair<std::size_t, std::uint32_t>> per_doc;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    if (line.rfind("corpus ", 0) == 0) {
      std::string tag, docs, bytes, fnv;
      ss >> tag >> docs >> bytes >> fnv;
      want_bytes = std::stoull(bytes.substr(6));
      want_fnv = std::stoull(fnv.substr(4), nullptr, 16);
      continue;
    }
    std::size_t len;
    std::string h;
    ss >> len >> h;
    per_doc.emplace_back(len, static_cast<std::uint32_t>(std::stoul(h, nullptr, 16)));
  }
  const auto& docs = corpus();
  REQUIRE(per_doc.size() == docs.size());
  std::uint64_t total = 0, h = tokcorpus::fnv_offset;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    total += docs[i].size();
    h = tokcorpus::fnv1a64(docs[i], h);
    h = tokcorpus::fnv1a64("\xff", h);
    const auto got32 = static_cast<std::uint32_t>(tokcorpus::fnv1a64(docs[i]) & 0xffffffffu);
    if (docs[i].size() != per_doc[i].first || got32 != per_doc[i].second) {
      if (bad++ == 0)
        FAIL_CHECK("document " << i << " differs from the Python generator: " << docs[i].size() << " bytes (want "
                               << per_doc[i].first << "), starts " << snippet(docs[i]));
    }
  }
  CHECK_MESSAGE(bad == 0, bad << " documents differ");
  CHECK(total == want_bytes);
  CHECK(total > 10'000'000);
  CHECK(hex16(h) == hex16(want_fnv));
}

TEST_CASE("tokenizer golden corpus: encode and decode equal Python tokenizers on every document") {
  const auto& docs = corpus();
  for (const auto& name : tokenizer_names) {
    CAPTURE(name);
    const auto g = read_golden(name);
    REQUIRE(g.docs <= docs.size());
    lt::tokenizer tok = load(name);
    std::size_t bad_ids = 0, bad_dec = 0;
    for (std::size_t i = 0; i < g.docs; ++i) {
      const auto ids = tok.encode(docs[i]);
      const auto& want = g.d[i];
      if (ids.size() != want.count || tokcorpus::fnv_ids(ids) != want.hash) {
        if (bad_ids++ < 3)
          FAIL_CHECK(name << ": document " << i << " " << snippet(docs[i]) << ": got " << ids.size() << " ids (want "
                          << want.count << "), FNV " << hex16(tokcorpus::fnv_ids(ids)) << " (want " << hex16(want.hash)
                          << "); got ids " << ids_str(ids));
        continue;
      }
      const auto text = tok.decode(ids);
      if (!decode_matches(want.dec, text, docs[i], g.prefix)) {
        if (bad_dec++ < 3)
          FAIL_CHECK(name << ": decode of document " << i << ": got " << snippet(text) << ", want "
                          << snippet(expected_decode(want.dec, docs[i], g.prefix)));
      }
    }
    CHECK_MESSAGE(bad_ids == 0, name << ": " << bad_ids << " of " << g.docs << " documents encode differently");
    CHECK_MESSAGE(bad_dec == 0, name << ": " << bad_dec << " of " << g.docs << " documents decode differently");

    std::size_t bad_ns = 0;
    for (const auto& r : g.n) {
      const auto ids = tok.encode(docs[r.doc], false);
      if (ids.size() != r.count || tokcorpus::fnv_ids(ids) != r.hash) {
        if (bad_ns++ < 3)
          FAIL_CHECK(name << ": add_special_tokens=false, document " << r.doc << " " << snippet(docs[r.doc]) << ": got "
                          << ids.size() << " ids (want " << r.count << "); got " << ids_str(ids));
        continue;
      }
      const auto text = tok.decode(ids, true);
      if (!decode_matches(r.dec, text, docs[r.doc], g.prefix) && bad_ns++ < 3)
        FAIL_CHECK(name << ": decode(skip_special_tokens=true) of document " << r.doc << ": got " << snippet(text));
    }
    CHECK_MESSAGE(bad_ns == 0,
                  name << ": " << bad_ns << " of " << g.n.size() << " add_special_tokens=false samples differ");
  }
}

TEST_CASE("tokenizer golden tricky strings: full id lists and decode outputs") {
  const auto tricky = read_json(golden_dir + "/tricky.json");
  for (const auto& name : tokenizer_names) {
    CAPTURE(name);
    lt::tokenizer tok = load(name);
    std::size_t bad = 0;
    for (const auto& rec : tricky) {
      const auto text = rec["text"].get<std::string>();
      const auto& want = rec["expect"][name];
      const auto ids = tok.encode(text);
      const auto want_ids = want["ids"].get<std::vector<std::int32_t>>();
      if (ids != want_ids) {
        ++bad;
        FAIL_CHECK(name << ": encode(" << snippet(text) << ") = " << ids_str(ids) << ", want " << ids_str(want_ids));
        continue;
      }
      const auto ns = tok.encode(text, false);
      const auto want_ns =
          want.contains("ids_nospecial") ? want["ids_nospecial"].get<std::vector<std::int32_t>>() : want_ids;
      if (ns != want_ns) {
        ++bad;
        FAIL_CHECK(name << ": encode(" << snippet(text) << ", add_special_tokens=false) = " << ids_str(ns) << ", want "
                        << ids_str(want_ns));
      }
      const auto dec = tok.decode(ids);
      if (dec != want["decode"].get<std::string>()) {
        ++bad;
        FAIL_CHECK(name << ": decode(encode(" << snippet(text) << ")) = " << snippet(dec) << ", want "
                        << snippet(want["decode"].get<std::string>()));
      }
      const auto dec_skip = tok.decode(ids, true);
      const auto want_skip = want.value("decode_skip", want["decode"].get<std::string>());
      if (dec_skip != want_skip) {
        ++bad;
        FAIL_CHECK(name << ": decode(encode(" << snippet(text) << "), skip_special_tokens=true) = " << snippet(dec_skip)
                        << ", want " << snippet(want_skip));
      }
    }
    CHECK_MESSAGE(bad == 0, name << ": " << bad << " tricky-string mismatches");
  }
}

TEST_CASE("tokenizer golden decode of random id lists: split characters, specials, unknown ids") {
  const auto all = read_json(golden_dir + "/random_decode.json");
  for (const auto& name : tokenizer_names) {
    CAPTURE(name);
    const lt::tokenizer tok = load(name);
    std::size_t bad = 0;
    for (const auto& rec : all[name]) {
      const auto ids = rec["ids"].get<std::vector<std::int32_t>>();
      const auto got = tok.decode(ids);
      const auto got_skip = tok.decode(ids, true);
      if (got != rec["decode"].get<std::string>() && bad++ < 3)
        FAIL_CHECK(name << ": decode(" << ids_str(ids) << ") = " << snippet(got) << ", want "
                        << snippet(rec["decode"].get<std::string>()));
      if (got_skip != rec["decode_skip"].get<std::string>() && bad++ < 3)
        FAIL_CHECK(name << ": decode(" << ids_str(ids) << ", skip_special_tokens=true) = " << snippet(got_skip)
                        << ", want " << snippet(rec["decode_skip"].get<std::string>()));
    }
    CHECK_MESSAGE(bad == 0, name << ": " << bad << " random-id decode mismatches");
  }
}

TEST_CASE("tokenizer metadata: vocab size, bos and eos ids, adds_bos and adds_eos") {
  for (const auto& name : tokenizer_names) {
    CAPTURE(name);
    const auto meta = read_json(golden_dir + "/" + name + "/meta.json");
    const lt::tokenizer tok = load(name);
    CHECK(tok.vocab_size() == meta["vocab_size"].get<std::int64_t>());
    if (meta["bos_id"].is_null())
      CHECK_FALSE(tok.bos_id().has_value());
    else
      CHECK(tok.bos_id() == std::optional<std::int32_t>(meta["bos_id"].get<std::int32_t>()));
    if (meta["eos_id"].is_null())
      CHECK_FALSE(tok.eos_id().has_value());
    else
      CHECK(tok.eos_id() == std::optional<std::int32_t>(meta["eos_id"].get<std::int32_t>()));
    CHECK(tok.adds_bos() == meta["adds_bos"].get<bool>());
    CHECK(tok.adds_eos() == meta["adds_eos"].get<bool>());
    CHECK(tok.encode("hi there") == meta["probe_ids"].get<std::vector<std::int32_t>>());

    // The directory and the file itself load the same tokenizer; the content hash identifies the file.
    const auto by_file = lt::tokenizer::from_file(dir_of(name) + "/tokenizer.json");
    CHECK(by_file.content_hash() == tok.content_hash());
    CHECK(by_file.encode("Hello world, it's me") == tok.encode("Hello world, it's me"));
    CHECK_FALSE(tok.name().empty());
  }
  CHECK(load("gpt2_style").content_hash() != load("llama3_style").content_hash());
  CHECK(load("gpt2_style").content_hash() != load("added_tokens").content_hash());

  const auto gpt2 = load("gpt2_style");
  CHECK(gpt2.token_to_id("<|endoftext|>") == std::optional<std::int32_t>(0));
  CHECK_FALSE(gpt2.token_to_id("definitely not a token").has_value());
  if (const auto the = gpt2.token_to_id("\xc4\xa0the")) {  // "Ġthe"
    CHECK(gpt2.token_text(*the) == " the");
    CHECK(gpt2.token_byte_length(*the) == 4);
  }
  CHECK(gpt2.token_byte_length(0) == 0);  // special
  const auto sp = load("sentencepiece_style");
  CHECK(sp.token_to_id("<0x41>") == std::optional<std::int32_t>(3 + 0x41));
  CHECK(sp.token_byte_length(3 + 0x41) == 1);
  CHECK(sp.token_to_id("<s>") == std::optional<std::int32_t>(1));
  const auto added = load("added_tokens");
  CHECK(added.token_to_id("<tool>") == std::optional<std::int32_t>(1200));
  CHECK(added.token_to_id("[MASK]") == std::optional<std::int32_t>(1203));
}

TEST_CASE("tokenizer encode_batch: 1 and 2 threads give encode's ids") {
  const auto& docs = corpus();
  for (const auto& name : tokenizer_names) {
    CAPTURE(name);
    const lt::tokenizer tok = load(name);
    for (bool special : {true, false}) {
      std::vector<std::string> texts(docs.begin(), docs.begin() + 200);
      texts.push_back("");
      if (special) texts.push_back(docs[1999]);  // 110 KB of whitespace runs
      std::vector<std::vector<std::int32_t>> want;
      for (const auto& t : texts) want.push_back(tok.encode(t, special));
      for (int threads : {1, 2}) {
        CAPTURE(threads);
        CAPTURE(special);
        const auto got = tok.encode_batch(texts, threads, special);
        REQUIRE(got.size() == want.size());
        std::size_t bad = 0;
        for (std::size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
        CHECK(bad == 0);
      }
    }
  }
}

TEST_CASE("tokenizer built-ins: byte_level and passthrough") {
  const auto b = lt::tokenizer::byte_level();
  CHECK(b.vocab_size() == 257);
  CHECK(b.eos_id() == std::optional<std::int32_t>(256));
  const std::string text = "h\xc3\xa9llo\n\x00!";
  const std::string with_nul(text.data(), 9);
  const auto ids = b.encode(with_nul);
  std::vector<std::int32_t> want;
  for (unsigned char c : with_nul) want.push_back(c);
  if (b.adds_eos()) want.push_back(256);
  CHECK_FALSE(b.adds_bos());
  CHECK(ids == want);
  CHECK(b.decode(ids) == with_nul);
  const std::vector<std::int32_t> with_eos = {104, 105, 256};
  CHECK(b.decode(with_eos, true) == "hi");
  // Agrees with the embedded default tokenizer of text.hpp.
  const auto& doc = corpus()[3];
  auto expect = lt::byte_tokenizer{}.encode(doc);
  if (b.adds_eos()) expect.push_back(256);
  CHECK(b.encode(doc) == expect);
  CHECK(b.encode_batch({doc, "ab"}, 2)[0] == expect);

  const auto p = lt::tokenizer::passthrough(100);
  CHECK(p.vocab_size() == 100);
  CHECK(p.encode("1 2 3") == std::vector<std::int32_t>{1, 2, 3});
  CHECK(p.encode("  7\n42\t0 ") == std::vector<std::int32_t>{7, 42, 0});
  CHECK(p.encode("") == std::vector<std::int32_t>{});
  const std::vector<std::int32_t> pid = {5, 17, 99};
  CHECK(p.decode(pid) == "5 17 99");
  CHECK(p.content_hash() != lt::tokenizer::passthrough(101).content_hash());
  CHECK(p.content_hash() != b.content_hash());
  CHECK_THROWS_AS(lt::tokenizer::passthrough(0), lt::data_error);
}

TEST_CASE("tokenizer loader errors name the file and the key") {
  const std::string e = golden_dir + "/errors";
  SUBCASE("missing file") {
    const std::string path = e + "/no_such_dir/tokenizer.json";
    const auto msg = error_of([&] { (void)lt::tokenizer::from_file(path); });
    MESSAGE(msg);
    CHECK_MESSAGE(msg.find("no_such_dir") != std::string::npos, msg);
    const auto msg_dir = error_of([&] { (void)lt::tokenizer::from_file(e); });  // a directory without tokenizer.json
    CHECK_MESSAGE(msg_dir.find("errors") != std::string::npos, msg_dir);
  }
  SUBCASE("malformed JSON") {
    const auto msg = error_of([&] { (void)lt::tokenizer::from_file(e + "/malformed"); });
    MESSAGE(msg);
    CHECK_MESSAGE(msg.find("malformed") != std::string::npos, msg);
  }
  SUBCASE("WordPiece model") {
    const auto msg = error_of([&] { (void)lt::tokenizer::from_file(e + "/wordpiece"); });
    MESSAGE(msg);
    CHECK_MESSAGE(msg.find("wordpiece") != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("WordPiece") != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("model") != std::string::npos, msg);
  }
  SUBCASE("Unigram model") {
    const auto msg = error_of([&] { (void)lt::tokenizer::from_file(e + "/unigram/tokenizer.json"); });
    MESSAGE(msg);
    CHECK_MESSAGE(msg.find("unigram/tokenizer.json") != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("Unigram") != std::string::npos, msg);
  }
  SUBCASE("unsupported normalizer") {
    const auto msg = error_of([&] { (void)lt::tokenizer::from_file(e + "/nfc_normalizer"); });
    MESSAGE(msg);
    CHECK_MESSAGE(msg.find("nfc_normalizer") != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("NFC") != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("normalizer") != std::string::npos, msg);
  }
  SUBCASE("unknown pre-tokenizer type") {
    const auto msg = error_of([&] { (void)lt::tokenizer::from_file(e + "/unknown_pretokenizer"); });
    MESSAGE(msg);
    CHECK_MESSAGE(msg.find("unknown_pretokenizer") != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("MadeUpPreTokenizer") != std::string::npos, msg);
    CHECK_MESSAGE(msg.find("pre_tokenizer") != std::string::npos, msg);
  }
  SUBCASE("a Split regex outside the known family is refused or encoded exactly") {
    const auto expect = read_json(e + "/odd_regex/expect.json");
    std::optional<lt::tokenizer> tok;
    std::string msg;
    try {
      tok = lt::tokenizer::from_file(e + "/odd_regex");
    } catch (const lt::data_error& err) {
      msg = err.what();
    }
    if (tok) {
      for (const auto& rec : expect) {
        const auto text = rec["text"].get<std::string>();
        CHECK_MESSAGE(tok->encode(text) == rec["ids"].get<std::vector<std::int32_t>>(), snippet(text));
      }
    } else {
      MESSAGE(msg);
      CHECK_MESSAGE(msg.find("odd_regex") != std::string::npos, msg);
      CHECK_MESSAGE(msg.find("\\p{Greek}") != std::string::npos, msg);  // names the pattern
    }
  }
}
