// levanter/data/tokenizer.hpp against hostile and edge-case tokenizer.json files: overlapping added tokens and
// Replace normalizers/decoders compared id for id with the Python `tokenizers` library (golden data:
// tests/golden/tokenizer_hostile/golden.json, written by tests/oracle/gen_tokenizer_hostile_golden.py), and the
// loader's limits: nesting depth, pipeline length, id ranges, sparse ids, output growth, single-character fields.
#include <doctest/doctest.h>

#include <fstream>
#include <levanter/data/tokenizer.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

using levanter::data::data_error;
using levanter::data::tokenizer;

namespace {

const nlohmann::json& golden() {
  static const nlohmann::json j = [] {
    std::ifstream in(std::string(HALIAX_GOLDEN_DIR) + "/tokenizer_hostile/golden.json");
    REQUIRE_MESSAGE(in.good(), "missing tests/golden/tokenizer_hostile/golden.json");
    return nlohmann::json::parse(in);
  }();
  return j;
}

/// A tokenizer.json with the golden's small model (printable ASCII, no merges) and `parts` merged in.
nlohmann::json with_model(nlohmann::json parts) {
  parts["model"] = golden().at("model");
  return parts;
}

/// The message of the data_error that loading `text` throws, or "(no error)".
std::string load_error(const std::string& text) {
  try {
    (void)tokenizer::from_json(text, "hostile.json");
  } catch (const data_error& e) {
    return e.what();
  }
  return "(no error)";
}

void check_has(const std::string& msg, const std::string& part) {
  CAPTURE(msg);
  CHECK(msg.find(part) != std::string::npos);
}

/// A tokenizer.json whose `pipeline` is `depth` Sequences nested around `leaf` (their lists named `key`), written as
/// text: building (copying) so deep a nlohmann::json would take quadratic time.
std::string nested(const char* pipeline, const nlohmann::json& leaf, const char* key, int depth) {
  std::string open, close;
  for (int i = 0; i < depth; ++i) {
    open += "{\"type\": \"Sequence\", \"" + std::string(key) + "\": [";
    close += "]}";
  }
  const std::string mark = "\"nested here\"";
  auto doc = with_model({{pipeline, "nested here"}}).dump();
  return doc.replace(doc.find(mark), mark.size(), open + leaf.dump() + close);
}

}  // namespace

TEST_CASE("overlapping added tokens and Replace edge cases give the Python library's ids and decodes") {
  int bad = 0;
  for (const auto& c : golden().at("cases")) {
    const auto name = c.at("name").get<std::string>();
    CAPTURE(name);
    const auto tok = tokenizer::from_json(with_model(c.at("tokenizer")).dump(), name);
    CHECK(tok.vocab_size() == c.at("vocab_size").get<std::int64_t>());
    const auto& texts = c.at("texts");
    for (std::size_t i = 0; i < texts.size(); ++i) {
      const auto text = texts[i].get<std::string>();
      const auto want = c.at("ids")[i].get<std::vector<std::int32_t>>();
      const auto got = tok.encode(text);
      const bool ok = got == want && tok.decode(want, false) == c.at("decoded")[i].get<std::string>();
      if (!ok && bad++ < 5)
        FAIL_CHECK(name << " differs from Python on " << nlohmann::json(text).dump() << ": got "
                        << nlohmann::json(got).dump() << ", want " << nlohmann::json(want).dump());
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("Replace is one left-to-right pass: a content holding its pattern does not loop") {
  auto replace = [](const std::string& pattern, const std::string& content) {
    return nlohmann::json{{"type", "Replace"}, {"pattern", {{"String", pattern}}}, {"content", content}};
  };
  const auto plain = tokenizer::from_json(with_model({}).dump());  // one id per character
  const auto doubling = tokenizer::from_json(with_model({{"normalizer", replace("a", "aa")}}).dump());
  CHECK(doubling.encode("aba") == plain.encode("aabaa"));
  // the library's empty pattern matches at every character boundary: "ab" -> "XaXbX", "" -> ""
  const auto empty = tokenizer::from_json(with_model({{"normalizer", replace("", "X")}}).dump());
  CHECK(empty.encode("ab") == plain.encode("XaXbX"));
  CHECK(empty.encode("\xC3\xA9") == plain.encode("X\xC3\xA9X"));  // a character, not a byte
  CHECK(empty.encode("").empty());
  // growth is bounded: 40 doublings would make 2^40 bytes of one letter
  const auto grow =
      with_model({{"normalizer", {{"type", "Sequence"}, {"normalizers", std::vector(40, replace("a", "aa"))}}},
                  {"decoder", {{"type", "Sequence"}, {"decoders", std::vector(40, replace("a", "aa"))}}}});
  const auto tok = tokenizer::from_json(grow.dump(), "grow.json");
  try {
    (void)tok.encode("a");
    FAIL("a normalizer growing 2^40-fold was not stopped");
  } catch (const data_error& e) {
    check_has(e.what(), "grow.json");
    check_has(e.what(), "normalizer");
    check_has(e.what(), "64 times");
  }
  const std::vector<std::int32_t> ids{*tok.token_to_id("a")};
  CHECK_THROWS_WITH_AS(tok.decode(ids), doctest::Contains("decoder"), data_error);
  CHECK_THROWS_AS(tok.token_byte_length(ids[0]), data_error);
  // ... also for the normalized contents of added tokens, at load time
  auto added = grow;
  added["decoder"] = nullptr;
  added["added_tokens"] = {{{"id", 98}, {"content", "aaaa"}, {"special", false}, {"normalized", true}}};
  check_has(load_error(added.dump()), "normalizer");
}

TEST_CASE("deeply nested Sequences and JSON are refused with a clear error instead of overflowing the stack") {
  const nlohmann::json split = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Isolated"}};
  const nlohmann::json replace = {{"type", "Replace"}, {"pattern", {{"String", "a"}}}, {"content", "b"}};
  const nlohmann::json fuse = {{"type", "Fuse"}};
  const nlohmann::json bytelevel = {{"type", "ByteLevel"}};
  const std::tuple<const char*, const char*, nlohmann::json> pipelines[] = {
      {"pre_tokenizer", "pretokenizers", split},
      {"normalizer", "normalizers", replace},
      {"decoder", "decoders", fuse},
      {"post_processor", "processors", bytelevel}};
  for (const auto& pkl : pipelines) {
    const char* pipeline = std::get<0>(pkl);  // not a structured binding: clang before 16 cannot capture one
    const char* key = std::get<1>(pkl);
    const auto& leaf = std::get<2>(pkl);
    CAPTURE(std::string(pipeline));
    // 5000 levels are 10000 JSON levels: refused before parsing
    const auto msg = load_error(nested(pipeline, leaf, key, 5000));
    check_has(msg, "hostile.json");
    check_has(msg, "nested deeper than 512");
    // within the JSON limit, the component limit names the pipeline
    check_has(load_error(nested(pipeline, leaf, key, 100)),
              std::string(pipeline) + " has Sequences nested more than 64");
    CHECK_NOTHROW((void)tokenizer::from_json(nested(pipeline, leaf, key, 60)));
  }
  // a flat Sequence recurses in the encoder too: its length is bounded
  const auto flat = nlohmann::json{{"type", "Sequence"}, {"pretokenizers", std::vector(5000, split)}};
  check_has(load_error(with_model({{"pre_tokenizer", flat}}).dump()), "more than 1024 components");
  // deeply nested JSON anywhere (nlohmann::json copies and prints recursively)
  const std::string deep = "{\"model\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  check_has(load_error(deep), "nested deeper than 512 levels");
  const std::string in_string =
      with_model({{"normalizer", {{"type", "Prepend"}, {"prepend", std::string(5000, '[')}}}}).dump();
  CHECK_NOTHROW((void)tokenizer::from_json(in_string));  // brackets inside strings do not count
}

TEST_CASE("ids and numbers read from the file are range-checked, naming the file, the key and the value") {
  auto vocab_with = [](const nlohmann::json& id) {
    return nlohmann::json{
        {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"c", id}}}, {"merges", nlohmann::json::array()}}}};
  };
  for (const auto& bad : {nlohmann::json(2147483648LL), nlohmann::json(-1), nlohmann::json(1.5), nlohmann::json("2"),
                          nlohmann::json(18446744073709551615ULL)}) {
    const auto msg = load_error(vocab_with(bad).dump());
    check_has(msg, "hostile.json");
    check_has(msg, "model.vocab[\"c\"]");
    check_has(msg, bad.dump());
  }
  // fits the type but would need a table of 2^31 entries: refused without allocating it
  for (const auto big : {2147483647LL, 2147483646LL}) {
    const auto msg = load_error(vocab_with(big).dump());
    check_has(msg, "the largest token id is " + std::to_string(big) + " but there are only 3 tokens");
  }
  CHECK(tokenizer::from_json(vocab_with(1000).dump()).token_to_id("c") == 1000);  // a few sparse ids are fine
  auto processor = [](const nlohmann::json& p) { return with_model({{"post_processor", p}}).dump(); };
  check_has(load_error(processor({{"type", "RobertaProcessing"}, {"cls", {"<s>", -3}}, {"sep", {"</s>", 2}}})),
            "post_processor.cls[1] is -3");
  check_has(load_error(processor(nlohmann::json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": -1}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}})"))),
            "post_processor.single[1].Sequence.type_id is -1");
  check_has(load_error(processor(nlohmann::json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [4294967296], "tokens": ["<s>"]}}})"))),
            "post_processor.special_tokens[\"<s>\"].ids[0] is 4294967296");
  check_has(load_error(with_model({{"added_tokens", {{{"id", -2}, {"content", "zz"}}}}}).dump()),
            "added_tokens[0].id is -2");
  check_has(
      load_error(with_model({{"decoder", {{"type", "Strip"}, {"content", " "}, {"start", 1e30}, {"stop", 0}}}}).dump()),
      "decoder.start is 1e+30");
}

TEST_CASE("single-character fields are checked: an empty Metaspace replacement or Strip content would loop") {
  const nlohmann::json meta = {{"type", "Metaspace"}, {"replacement", ""}, {"prepend_scheme", "always"}};
  check_has(load_error(with_model({{"pre_tokenizer", meta}}).dump()), "pre_tokenizer.replacement is \"\"");
  check_has(load_error(with_model({{"decoder", meta}}).dump()), "not a single character");
  const nlohmann::json strip = {{"type", "Strip"}, {"content", ""}, {"start", 2147483647}, {"stop", 0}};
  check_has(load_error(with_model({{"decoder", strip}}).dump()), "decoder.content is \"\"");
  auto two = meta;
  two["replacement"] = "ab";
  check_has(load_error(with_model({{"pre_tokenizer", two}}).dump()), "not a single character");
}

TEST_CASE("from_json loads a tokenizer.json held in memory as from_file loads the file") {
  const std::string path = std::string(HALIAX_GOLDEN_DIR) + "/tokenizers/llama3_style/tokenizer.json";
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto file = tokenizer::from_file(path);
  const auto mem = tokenizer::from_json(text, "llama3 in memory");
  CHECK(mem.name() == "llama3 in memory");
  CHECK(mem.content_hash() == file.content_hash());
  CHECK(mem.vocab_size() == file.vocab_size());
  CHECK(mem.encode("Hello world, it's 2026!") == file.encode("Hello world, it's 2026!"));
  check_has(load_error("{\"model\": "), "hostile.json");
}

TEST_CASE("lstrip and rstrip added tokens on a long run of spaces take linear time") {
  // each " " matches and strips the spaces around it: rescanning the run for every match would be quadratic
  const auto tok = tokenizer::from_json(
      with_model({{"added_tokens", {{{"id", 0}, {"content", " "}, {"lstrip", true}, {"rstrip", true}}}}}).dump());
  const std::string spaces(1 << 20, ' ');
  const auto ids = tok.encode(spaces + "a" + spaces);
  const auto space = *tok.token_to_id(" "), a = *tok.token_to_id("a");
  CHECK(ids == std::vector<std::int32_t>{space, a, space});  // the first " " takes the run, the rest are empty
  const auto rstrip_only =
      tokenizer::from_json(with_model({{"added_tokens", {{{"id", 0}, {"content", " "}, {"rstrip", true}}}}}).dump());
  CHECK(rstrip_only.encode(spaces).size() == spaces.size());  // as the library: one token per space, overlapping
}
