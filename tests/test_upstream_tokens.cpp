// The token stream of train_lm's caches against upstream Levanter's (issue "Same YAML, same run as upstream"):
// tests/golden/upstream_train_lm/ holds the config, the data and what upstream's caches hold for them
// (upstream_tokens.json, tests/oracle/gen_upstream_train_lm_golden.py); tests/golden/tokenizers/long_text.json holds
// upstream BatchTokenizer's encodings of long texts (the >10,000-character workaround, applied with the tokenizers
// library by tests/oracle/gen_long_text_golden.py and checked there against upstream's own class).
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <levanter/config/yaml.hpp>
#include <levanter/data/cache.hpp>
#include <levanter/data/detail/tokenizer.hpp>
#include <levanter/data/lm_data.hpp>
#include <levanter/data/tokenizer.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fs = std::filesystem;
namespace ld = levanter::data;

namespace {

const std::string source_dir = LEVANTER_SOURCE_DIR;
const fs::path golden_dir = fs::path(HALIAX_GOLDEN_DIR);

struct temp_dir {
  fs::path path;
  temp_dir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("levanter-upstream-tokens-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() { fs::remove_all(path); }
};

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE_MESSAGE(in, "cannot open " << p);
  return nlohmann::json::parse(in);
}

std::vector<std::int32_t> all_tokens(const ld::token_cache& c) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(c.total_tokens()));
  c.read_tokens(0, static_cast<std::int64_t>(out.size()), out.data());
  return out;
}

// SHA-256 of the ids as int32 little-endian bytes (this host is little-endian, as the cache files are).
std::string sha256_int32le(const std::vector<std::int32_t>& ids) {
  std::string bytes(ids.size() * 4, '\0');
  if (!ids.empty()) std::memcpy(bytes.data(), ids.data(), bytes.size());
  return ld::detail::tok::sha256_hex(bytes);
}

// FNV-1a-64 of the ids as int32 little-endian bytes (tests/oracle/gen_long_text_golden.py).
std::uint64_t fnv_ids(const std::vector<std::int32_t>& ids) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (auto id : ids)
    for (int b = 0; b < 4; ++b) {
      h ^= (static_cast<std::uint32_t>(id) >> (8 * b)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  return h;
}

std::string hex16(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The data section of tests/golden/upstream_train_lm/config.yaml, as train_lm reads it, with the paths (relative to
// the repository root) made absolute and the cache in `cache_dir`.
levanter::LmDataConfig golden_data_config(const fs::path& cache_dir) {
  const auto file = (golden_dir / "upstream_train_lm" / "config.yaml").string();
  levanter::config::source_map sources;
  const auto root = levanter::config::load_yaml_file(file, sources);
  auto d = levanter::config::decode<levanter::LmDataConfig>(root["data"], "data", sources, file);
  for (auto* urls : {&d.train_urls, &d.validation_urls})
    for (auto& u : *urls) u = source_dir + "/" + u;
  d.tokenizer = source_dir + "/" + d.tokenizer;
  d.cache_dir = cache_dir.string();
  return d;
}

void check_split(const ld::token_cache& cache, std::int64_t windows, const nlohmann::json& want,
                 const std::string& split) {
  INFO("split " << split);
  const auto ids = all_tokens(cache);
  CHECK(cache.committed_docs() == want.at("num_documents").get<std::int64_t>());
  CHECK(static_cast<std::int64_t>(ids.size()) == want.at("num_tokens").get<std::int64_t>());
  CHECK(windows == want.at("num_windows").get<std::int64_t>());
  const auto first = want.at("first_ids").get<std::vector<std::int32_t>>();
  REQUIRE(ids.size() >= first.size());
  std::size_t mismatch = 0;
  while (mismatch < first.size() && ids[mismatch] == first[mismatch]) ++mismatch;
  CHECK_MESSAGE(mismatch == first.size(), "first difference at id " << mismatch);
  const auto lengths = want.at("first_doc_lengths").get<std::vector<std::int64_t>>();
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    const auto [b, e] = cache.row_range(static_cast<std::int64_t>(r));
    CHECK_MESSAGE(e - b == lengths[r], "document " << r);
  }
  CHECK(sha256_int32le(ids) == want.at("sha256_int32le").get<std::string>());
}

}  // namespace

TEST_CASE("train_lm's caches of the upstream regression config hold upstream's token stream") {
  const auto golden = read_json(golden_dir / "upstream_train_lm" / "upstream_tokens.json");
  temp_dir tmp;
  const auto d = golden_data_config(tmp.path / "cache");
  // The same path as train_lm: lm_data builds the caches with make_encode_fn / tokenizer_metadata.
  ld::lm_data data(d, {.seq_len = golden.at("train").at("seq_len").get<std::int64_t>(),
                       .batch_size = 8,
                       .data_key = haliax::random::make_key(0),
                       .log = {}});
  const auto& train = data.train_windows(0);
  REQUIRE(train);
  REQUIRE(data.validation_sets().size() == 1);
  const auto& valid = data.validation_sets().front().windows;
  check_split(train->cache(), train->final_size(), golden.at("train"), "train");
  check_split(valid->cache(), valid->final_size(), golden.at("validation"), "validation");

  const auto meta = ld::tokenizer_metadata(data.tok(), true, d.enforce_eos);
  const auto& up = golden.at("train").at("preprocessor_metadata");
  for (const char* key : {"vocab_size", "return_attention_mask", "padding", "append_bos", "append_eos"})
    CHECK_MESSAGE(meta.at(key) == up.at(key), key);
  CHECK(meta.at("bos_eos_as_text") == true);
}

TEST_CASE("GPT-2 style: every document is EOS, encode(space + text + space), EOS") {
  const auto tok = ld::tokenizer::from_file((golden_dir / "tokenizers" / "gpt2_style").string());
  REQUIRE(tok.eos_id() == std::optional<std::int32_t>(0));
  const auto encode = ld::make_encode_fn(tok, true, true);
  for (const std::string text : {"Hello world", "  two leading spaces", "ends with a newline\n", ""}) {
    std::vector<std::int32_t> want{0};
    const auto mid = tok.encode(" " + text + " ");
    want.insert(want.end(), mid.begin(), mid.end());
    want.push_back(0);
    CHECK_MESSAGE(encode(text) == want, text);
  }
  CHECK(encode("Hello world")[1] != tok.encode("Hello world")[0]);  // the first word has its leading-space form
  // enforce_eos false: BOS only.
  const auto bos_only = ld::make_encode_fn(tok, true, false)("Hello");
  CHECK(bos_only.front() == 0);
  CHECK(bos_only.back() != 0);
}

TEST_CASE("upstream's long-text workaround: pieces at white space after 10,000 characters, each with the template") {
  const auto golden = read_json(golden_dir / "tokenizers" / "long_text.json");
  for (const auto& item : golden.at("tokenizers").items()) {
    const std::string name = item.key();  // not a structured binding: clang before 16 cannot capture one
    const auto& info = item.value();
    INFO("tokenizer " << name);
    const auto tok = ld::tokenizer::from_file((golden_dir / "tokenizers" / name).string());
    CHECK(tok.splits_long_texts() == info.at("splits_long_texts").get<bool>());
    CHECK(tok.bos_token() == std::optional<std::string>(info.at("bos_token").get<std::string>()));
    CHECK(tok.eos_token() == std::optional<std::string>(info.at("eos_token").get<std::string>()));
    const auto meta = ld::tokenizer_metadata(tok, true, true);
    CHECK(meta.at("append_bos") == info.at("append_bos"));
    CHECK(meta.at("append_eos") == info.at("append_eos"));
    for (const auto& c : golden.at("cases")) {
      INFO("case " << c.at("name").get<std::string>());
      const auto encode = ld::make_encode_fn(tok, true, true, c.at("workaround_len").get<std::size_t>());
      const auto ids = encode(c.at("text").get<std::string>());
      const auto& want = c.at("ids").at(name);
      if (want.is_array()) {
        CHECK(ids == want.get<std::vector<std::int32_t>>());
        continue;
      }
      CHECK(static_cast<std::int64_t>(ids.size()) == want.at("count").get<std::int64_t>());
      CHECK(hex16(fnv_ids(ids)) == want.at("fnv").get<std::string>());
      const auto head = want.at("head").get<std::vector<std::int32_t>>();
      const auto tail = want.at("tail").get<std::vector<std::int32_t>>();
      REQUIRE(ids.size() >= head.size());
      CHECK(std::vector<std::int32_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(head.size())) == head);
      CHECK(std::vector<std::int32_t>(ids.end() - static_cast<std::ptrdiff_t>(tail.size()), ids.end()) == tail);
    }
  }
  // The default limit is upstream's 10,000 characters.
  const auto sp = ld::tokenizer::from_file((golden_dir / "tokenizers" / "sentencepiece_style").string());
  const std::string text(9000, 'a');
  const std::string long_text = text + " " + text;
  CHECK(ld::make_encode_fn(sp, true, true)(text) == ld::make_encode_fn(sp, true, true, 10000)(text));
  CHECK(ld::make_encode_fn(sp, true, true)(long_text) == ld::make_encode_fn(sp, true, true, 10000)(long_text));
  CHECK(ld::make_encode_fn(sp, true, true)(long_text) != ld::make_encode_fn(sp, true, true, 1000000)(long_text));
}

TEST_CASE("the built-in tokenizers keep their ids, and a cache of the old encoding is refused") {
  const auto byte = ld::tokenizer::byte_level();
  CHECK(ld::make_encode_fn(byte, true, true)("ab") == std::vector<std::int32_t>{'a', 'b', 256});
  CHECK(ld::make_encode_fn(byte, true, false)("ab") == std::vector<std::int32_t>{'a', 'b'});
  CHECK_FALSE(ld::tokenizer_metadata(byte, true, true).contains("bos_eos_as_text"));
  const auto pass = ld::tokenizer::passthrough(10);
  CHECK(ld::make_encode_fn(pass, true, true)("1 2") == std::vector<std::int32_t>{1, 2});
  CHECK_FALSE(ld::tokenizer_metadata(pass, true, true).at("append_eos").get<bool>());

  // A cache built by the code that appended the ids has no bos_eos_as_text in its ledger: it must not be reused.
  temp_dir tmp;
  const auto file = (tmp.path / "docs.jsonl").string();
  std::ofstream(file) << "{\"text\": \"hello world\"}\n{\"text\": \"second\"}\n";
  const auto tok = ld::tokenizer::from_file((golden_dir / "tokenizers" / "gpt2_style").string());
  auto old_meta = ld::tokenizer_metadata(tok, true, true);
  old_meta.erase("bos_eos_as_text");
  const auto dir = (tmp.path / "cache" / "train").string();
  const auto old_encode = [&](std::string_view text) {
    auto ids = tok.encode(text);
    ids.insert(ids.begin(), 0);
    ids.push_back(0);
    return ids;
  };
  ld::open_or_build_cache(dir, {file}, {}, old_encode, old_meta)->total_tokens();
  std::string error;
  try {
    ld::open_or_build_cache(dir, {file}, {}, ld::make_encode_fn(tok, true, true),
                            ld::tokenizer_metadata(tok, true, true));
  } catch (const ld::data_error& e) {
    error = e.what();
  }
  CHECK(error.find("bos_eos_as_text: cached (absent), now true") != std::string::npos);
  CHECK(error.find("delete '" + dir + "' or set data.cache_dir to another directory") != std::string::npos);
}

TEST_CASE("a mixture component's format: {type: text, text_key} is the field its documents are read from") {
  // Each component has its own format upstream (default text, text_key "text"); one whose documents sit under
  // "content" must be read from there, not from data.text_key (before, the component's format was accepted and
  // ignored: the cache build failed on its first document, or read another field).
  temp_dir tmp;
  {
    std::ofstream a(tmp.path / "a.jsonl"), b(tmp.path / "b.jsonl");
    for (int i = 0; i < 20; ++i) {
      a << "{\"text\": \"alpha document " << i << "\", \"content\": \"x\"}\n";
      b << "{\"content\": \"beta document number " << i << "\", \"text\": \"y\"}\n";
    }
  }
  levanter::config::source_map sources;
  const std::string yaml = "{tokenizer: byte, cache_dir: \"" + (tmp.path / "cache").string() + "\", configs: {a: {train_urls: [\"" +
                           (tmp.path / "a.jsonl").string() + "\"]}, b: {train_urls: [\"" + (tmp.path / "b.jsonl").string() +
                           "\"], format: {type: text, text_key: content}}}, train_weights: {a: 0.5, b: 0.5}}";
  const auto d = levanter::config::decode<levanter::LmDataConfig>(levanter::config::load_yaml_string(yaml, "test", sources),
                                                                  "data", sources);
  const auto specs = levanter::data::dataset_specs(d);
  REQUIRE(specs.size() == 2);
  CHECK_FALSE(specs[0].text_key);
  REQUIRE(specs[1].text_key);
  CHECK(*specs[1].text_key == "content");
  ld::lm_data data(d, {.seq_len = 8, .batch_size = 4, .data_key = haliax::random::make_key(0), .log = {}});
  auto text_of = [&](std::size_t i) {
    const auto& w = data.train_windows(i);
    REQUIRE(w);
    std::string s;
    for (auto id : all_tokens(w->cache())) s += static_cast<char>(id);  // byte tokenizer: ids are bytes (EOS aside)
    return s;
  };
  const std::string a = text_of(0), b = text_of(1);
  CHECK(a.find("alpha document 7") != std::string::npos);
  CHECK(b.find("beta document number 7") != std::string::npos);
  CHECK(b.find('y') == std::string::npos);
}
