// Unit tests of levanter/data/tokenizer.hpp against the Python `tokenizers` library: the hand-written split-regex
// scanners piece by piece, and pipeline variants (Metaspace schemes, Qwen 2's pattern, unk handling, normalized
// added tokens, Roberta's processor, ...) derived from the committed golden tokenizers by a JSON patch. The golden
// data is tests/golden/tokenizer_unit/golden.json, written by tests/oracle/gen_tokenizer_unit_golden.py.
// (tests/test_tokenizer.cpp checks the committed tokenizers on a large generated corpus.)
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <levanter/data/detail/tokenizer.hpp>
#include <levanter/data/text.hpp>
#include <levanter/data/tokenizer.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using levanter::data::data_error;
using levanter::data::tokenizer;

namespace {

const std::string golden_dir = std::string(HALIAX_GOLDEN_DIR);

const nlohmann::json& golden() {
  static const nlohmann::json j = [] {
    std::ifstream in(golden_dir + "/tokenizer_unit/golden.json");
    REQUIRE_MESSAGE(in.good(), "missing tests/golden/tokenizer_unit/golden.json");
    return nlohmann::json::parse(in);
  }();
  return j;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  return nlohmann::json::parse(in);
}

/// Writes `doc` as tokenizer.json into a fresh temporary directory and returns the file's path.
std::string write_tokenizer(const nlohmann::json& doc, const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("levanter_tokenizer_unit_" + std::to_string(::getpid())) / name;
  fs::create_directories(dir);
  const fs::path file = dir / "tokenizer.json";
  std::ofstream(file) << doc.dump();
  return file.string();
}

std::vector<std::int32_t> ids_of(const nlohmann::json& j) { return j.get<std::vector<std::int32_t>>(); }

std::string base_path(const std::string& base) { return golden_dir + "/tokenizers/" + base + "/tokenizer.json"; }

std::string error_of(const nlohmann::json& doc, const std::string& name) {
  const auto path = write_tokenizer(doc, name);
  try {
    (void)tokenizer::from_file(path);
  } catch (const data_error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("unicode tables classify code points as the library's regex engine does") {
  namespace tk = levanter::data::detail::tok;
  int bad = 0;
  for (const auto& pair : golden().at("classes")) {
    const auto cp = pair[0].get<std::uint32_t>();
    const auto want = pair[1].get<int>();
    const int got = tk::cp_class(static_cast<char32_t>(cp));
    if (got != want && bad++ < 5)
      FAIL_CHECK("U+" << std::hex << cp << std::dec << ": class " << got << ", want " << want);
  }
  CHECK(bad == 0);
}

TEST_CASE("split scanners match the regex engine piece by piece for the GPT-2, Llama 3 and Qwen 2 patterns") {
  namespace tk = levanter::data::detail::tok;
  const auto& g = golden();
  const auto& texts = g.at("split_texts");
  const std::pair<const char*, tk::pattern_kind> kinds[] = {
      {"gpt2", tk::pattern_kind::gpt2}, {"llama3", tk::pattern_kind::llama3}, {"qwen2", tk::pattern_kind::qwen2}};
  for (const auto& nk : kinds) {
    const char* name = nk.first;  // not a structured binding: clang before 16 cannot capture one
    const auto kind = nk.second;
    const auto& expected = g.at("splits").at(name);
    REQUIRE(expected.size() == texts.size());
    int bad = 0;
    for (std::size_t t = 0; t < texts.size(); ++t) {
      const auto s = texts[t].get<std::string>();
      std::vector<std::int64_t> got;
      for (std::size_t i = 0; i < s.size();) {
        const std::size_t j = tk::match_pattern(kind, s.data(), s.size(), i);
        REQUIRE(j > i);
        got.push_back(static_cast<std::int64_t>(j - i));
        i = j;
      }
      const auto want = expected[t].get<std::vector<std::int64_t>>();
      if (got != want && bad++ < 5) FAIL_CHECK(name << " pattern splits " << nlohmann::json(s).dump() << " wrongly");
    }
    CHECK_MESSAGE(bad == 0, name << ": " << bad << " of " << texts.size() << " texts split differently");
  }
}

TEST_CASE("pipeline variants give the Python library's ids and decodes") {
  const auto& g = golden();
  const auto& texts = g.at("texts");
  for (const auto& v : g.at("variants")) {
    const auto name = v.at("name").get<std::string>();
    CAPTURE(name);
    const auto base = base_path(v.at("base").get<std::string>());
    REQUIRE_MESSAGE(tokenizer::from_file(base).content_hash() == v.at("base_sha256").get<std::string>(),
                    base << " changed since golden.json was written: rerun tests/oracle/gen_tokenizer_unit_golden.py");
    const auto doc = read_json(base).patch(v.at("patch"));
    const auto tok = tokenizer::from_file(write_tokenizer(doc, name));
    CHECK(tok.vocab_size() == v.at("vocab_size").get<std::int64_t>());
    const auto& cases = v.at("cases");
    REQUIRE(cases.size() == texts.size());
    int bad = 0;
    for (std::size_t t = 0; t < texts.size(); ++t) {
      const auto text = texts[t].get<std::string>();
      const auto& c = cases[t];
      const auto with = ids_of(c.at("s"));
      const auto without = c.contains("n") ? ids_of(c.at("n")) : with;
      const auto decoded = c.at("d").get<std::string>();
      const auto skipped = c.contains("k") ? c.at("k").get<std::string>() : decoded;
      const bool ok = tok.encode(text, true) == with && tok.encode(text, false) == without &&
                      tok.decode(with, false) == decoded && tok.decode(with, true) == skipped;
      if (!ok && bad++ < 3) FAIL_CHECK(name << " differs from Python on " << nlohmann::json(text).dump());
    }
    CHECK_MESSAGE(bad == 0, name << ": " << bad << " of " << texts.size() << " texts differ");
  }
}

TEST_CASE("encode_batch gives encode's ids for any thread count, also when called again with warm caches") {
  const auto tok = tokenizer::from_file(golden_dir + "/tokenizers/llama3_style");
  std::vector<std::string> texts;
  for (const auto& t : golden().at("split_texts")) texts.push_back(t.get<std::string>());
  std::vector<std::vector<std::int32_t>> want;
  for (const auto& t : texts) want.push_back(tok.encode(t));
  for (int threads : {1, 2, 3, 7, 0})
    for (int round = 0; round < 2; ++round) CHECK(tok.encode_batch(texts, threads) == want);
  CHECK(tok.encode_batch({}, 4).empty());
}

TEST_CASE("special tokens and names come from tokenizer_config.json or well-known tokens") {
  const auto gpt2 = tokenizer::from_file(golden_dir + "/tokenizers/gpt2_style");
  CHECK(gpt2.name() == golden_dir + "/tokenizers/gpt2_style");
  CHECK(gpt2.eos_id() == gpt2.token_to_id("<|endoftext|>"));
  CHECK_FALSE(gpt2.adds_bos());
  CHECK_FALSE(gpt2.adds_eos());
  const auto llama = tokenizer::from_file(golden_dir + "/tokenizers/llama3_style/tokenizer.json");
  REQUIRE(llama.bos_id().has_value());
  CHECK(llama.bos_id() == llama.token_to_id("<|begin_of_text|>"));
  CHECK(llama.eos_id() == llama.token_to_id("<|end_of_text|>"));
  CHECK(llama.adds_bos());
  CHECK(llama.encode("hi").front() == *llama.bos_id());
  const auto sp = tokenizer::from_file(golden_dir + "/tokenizers/sentencepiece_style");
  CHECK(sp.bos_id() == sp.token_to_id("<s>"));
  CHECK(sp.eos_id() == sp.token_to_id("</s>"));
  CHECK(sp.adds_bos());
  CHECK_FALSE(sp.adds_eos());
}

TEST_CASE("tokenizer_config.json's bos_token / eos_token: a token, an AddedToken dict or null, anything else refused") {
  const fs::path dir = fs::temp_directory_path() / ("levanter_tok_cfg_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(golden_dir + "/tokenizers/gpt2_style/tokenizer.json", dir / "tokenizer.json");
  auto with = [&](const std::string& bos, const std::string& eos) {
    std::ofstream(dir / "tokenizer_config.json", std::ios::trunc)
        << "{\"bos_token\": " << bos << ", \"eos_token\": " << eos << "}";
    return tokenizer::from_file(dir.string());
  };
  auto message = [&](const std::string& bos, const std::string& eos) {
    try {
      with(bos, eos);
    } catch (const data_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto eot = tokenizer::from_file(golden_dir + "/tokenizers/gpt2_style").token_to_id("<|endoftext|>");
  REQUIRE(eot.has_value());
  // An AddedToken dict reads as its content; null means none (no guess from well-known names, as transformers).
  const auto d = with("{\"content\": \"<|endoftext|>\", \"special\": true}", "null");
  CHECK(d.bos_id() == eot);
  CHECK_FALSE(d.eos_id().has_value());
  // A token the vocabulary lacks, a number or a dict without content: refused, naming the file and the key.
  const auto unknown = message("\"<|nope|>\"", "\"<|endoftext|>\"");
  CHECK(unknown.find("tokenizer_config.json': 'bos_token' is '<|nope|>', which is not a token") != std::string::npos);
  CHECK(message("\"<|endoftext|>\"", "50256").find("'eos_token' is 50256; give the token as a string") !=
        std::string::npos);
  CHECK(message("{\"special\": true}", "null").find("'bos_token' is {\"special\":true}") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("token_text and token_byte_length show a token as the decoder would") {
  const auto gpt2 = tokenizer::from_file(golden_dir + "/tokenizers/gpt2_style");
  const auto the = gpt2.token_to_id("\xC4\xA0the");  // "Ġthe"
  REQUIRE(the.has_value());
  CHECK(gpt2.token_text(*the) == " the");
  CHECK(gpt2.token_byte_length(*the) == 4);
  CHECK(gpt2.token_byte_length(*gpt2.eos_id()) == 0);
  CHECK(gpt2.token_text(-1).empty());
  const auto sp = tokenizer::from_file(golden_dir + "/tokenizers/sentencepiece_style");
  const auto sp_the = sp.token_to_id("\xE2\x96\x81the");  // "▁the"
  REQUIRE(sp_the.has_value());
  CHECK(sp.token_text(*sp_the) == " the");
  CHECK(sp.token_byte_length(*sp_the) == 4);
  const auto byte_a = sp.token_to_id("<0x41>");
  REQUIRE(byte_a.has_value());
  CHECK(sp.token_text(*byte_a) == "A");
  CHECK(sp.token_byte_length(*byte_a) == 1);
  // the bytes of a text's tokens add up to its length (byte-level model; special tokens stand for no text)
  for (const auto& t : golden().at("texts")) {
    const auto s = t.get<std::string>();
    if (s.find("<|endoftext|>") != std::string::npos) continue;
    std::int64_t n = 0;
    for (auto id : gpt2.encode(s, false)) n += gpt2.token_byte_length(id);
    CHECK(n == static_cast<std::int64_t>(s.size()));
  }
}

TEST_CASE("byte-level GPT-2 decode inverts encode, also for text that is not valid UTF-8 on the way in") {
  const auto tok = tokenizer::from_file(golden_dir + "/tokenizers/gpt2_style");
  for (const auto& t : golden().at("texts")) {
    const auto s = t.get<std::string>();
    CHECK(tok.decode(tok.encode(s)) == s);
  }
  const std::string broken = "ok \xFF\xFE bytes \xE2\x82";
  const auto ids = tok.encode(broken);
  CHECK_FALSE(ids.empty());
  CHECK(tok.decode(ids) == "ok \xEF\xBF\xBD\xEF\xBF\xBD bytes \xEF\xBF\xBD");  // from_utf8_lossy
}

TEST_CASE("the byte-level default and passthrough tokenizers") {
  const auto b = tokenizer::byte_level();
  CHECK(b.name() == "byte");
  CHECK(b.vocab_size() == 257);
  CHECK(b.eos_id() == 256);
  CHECK_FALSE(b.bos_id().has_value());
  CHECK(b.encode("h\xC3\xA9") == std::vector<std::int32_t>{104, 0xC3, 0xA9});
  const std::vector<std::int32_t> ids{104, 0xC3, 0xA9, 256};
  CHECK(b.decode(ids) == "h\xC3\xA9");
  CHECK(b.token_byte_length(256) == 0);
  CHECK(b.token_byte_length(65) == 1);
  levanter::data::byte_tokenizer old;
  CHECK(b.encode("fortune") == old.encode("fortune"));

  const auto p = tokenizer::passthrough(100);
  CHECK(p.name() == "passthrough");
  CHECK(p.vocab_size() == 100);
  CHECK(p.encode(" 1 2\n99\t0 ") == std::vector<std::int32_t>{1, 2, 99, 0});
  const std::vector<std::int32_t> pids{5, 6};
  CHECK(p.decode(pids) == "5 6");
  CHECK_THROWS_AS(p.encode("1 100"), data_error);
  CHECK_THROWS_AS(p.encode("1 x"), data_error);
  CHECK_THROWS_AS(tokenizer::passthrough(0), data_error);
  CHECK(p.content_hash() != tokenizer::passthrough(101).content_hash());
}

TEST_CASE("content_hash is the SHA-256 of the file bytes") {
  namespace tk = levanter::data::detail::tok;
  // FIPS 180-2 test vectors
  CHECK(tk::sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(tk::sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(tk::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const auto path = base_path("gpt2_style");
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(tokenizer::from_file(path).content_hash() == tk::sha256_hex(bytes));
}

TEST_CASE("unsupported tokenizer.json features are refused naming the file, key and value") {
  const auto base = read_json(base_path("gpt2_style"));
  auto with = [&](const std::string& pointer, const nlohmann::json& value) {
    auto d = base;
    d[nlohmann::json::json_pointer(pointer)] = value;
    return d;
  };
  auto has = [](const std::string& msg, const std::string& part) {
    CAPTURE(msg);
    CHECK(msg.find(part) != std::string::npos);
  };
  has(error_of(with("/model/type", "Unigram"), "unigram"), "Unigram");
  has(error_of(with("/model/type", "WordPiece"), "wordpiece"), "WordPiece");
  has(error_of(with("/model/type", "WordPiece"), "wordpiece2"), "tokenizer.json");
  has(error_of(with("/model/dropout", 0.1), "dropout"), "model.dropout");
  has(error_of(with("/model/continuing_subword_prefix", "##"), "prefix"), "continuing_subword_prefix");
  has(error_of(with("/normalizer", {{"type", "NFKD"}}), "nfkd"), "NFKD");
  has(error_of(with("/decoder", {{"type", "WordPiece"}}), "decoder"), "decoder.type");
  has(error_of(with("/truncation", {{"max_length", 8}}), "truncation"), "truncation");
  has(error_of(with("/pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}}),
               "regex"),
      "\\w+");
  has(error_of(with("/pre_tokenizer", nlohmann::json::parse(R"({"type": "Sequence", "pretokenizers": [
                      {"type": "ByteLevel"}, {"type": "Split", "pattern": {"String": " "}}]})")),
               "after_bytelevel"),
      "after ByteLevel");
  has(error_of(with("/pre_tokenizer", {{"type", "Whitespace"}}), "whitespace"), "Whitespace");
  CHECK_THROWS_AS(tokenizer::from_file("/nonexistent/tokenizer.json"), data_error);
  fs::remove_all(fs::temp_directory_path() / ("levanter_tokenizer_unit_" + std::to_string(::getpid())));
}

TEST_CASE("the word cache finds what it stored and empties itself when full") {
  namespace tk = levanter::data::detail::tok;
  tk::word_cache c;
  std::uint32_t n = 0;
  CHECK(c.find("x", 1, n) == nullptr);
  const std::size_t total = tk::word_cache::capacity + 1000;
  for (std::size_t i = 0; i < total; ++i) {
    const std::string w = "w" + std::to_string(i);
    const std::int32_t ids[3] = {static_cast<std::int32_t>(i), 7, static_cast<std::int32_t>(w.size())};
    c.insert(w, std::hash<std::string_view>{}(w), ids, 1 + i % 3);
  }
  CHECK(c.size() == 1000);  // emptied once at capacity
  for (std::size_t i = total - 1000; i < total; ++i) {
    const std::string w = "w" + std::to_string(i);
    const std::int32_t* got = c.find(w, std::hash<std::string_view>{}(w), n);
    REQUIRE(got != nullptr);
    CHECK(n == 1 + i % 3);
    CHECK(got[0] == static_cast<std::int32_t>(i));
  }
  const std::string old = "w5";
  CHECK(c.find(old, std::hash<std::string_view>{}(old), n) == nullptr);
}
