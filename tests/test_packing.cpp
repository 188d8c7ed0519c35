// Supervised data and packing (levanter/data/packing.hpp) against tests/golden/packing/supervised.json, written by
// tests/oracle/gen_packing_golden.py with upstream Levanter's own pack_documents, GreedyPrepackedDataset and
// SupervisedDataset (the pinned release): pack ranges, tokens and segment ids equal upstream's; the loss mask is
// upstream's sequence mask moved one position earlier and kept within a row (docs/data.md says why).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <levanter/data/error.hpp>
#include <levanter/data/packing.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train_helpers.hpp"

#ifndef HALIAX_GOLDEN_DIR
#define HALIAX_GOLDEN_DIR "tests/golden"
#endif

namespace {

namespace ld = levanter::data;
namespace fs = std::filesystem;

nlohmann::json load_golden() {
  const std::string path = std::string(HALIAX_GOLDEN_DIR) + "/packing/supervised.json";
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  return nlohmann::json::parse(in);
}

ld::cache_options quiet() {
  ld::cache_options o;
  o.num_threads = 2;
  o.docs_per_chunk = 3;  // several commits, so sources_len is written chunk by chunk
  o.fsync = false;
  return o;
}

// A supervised cache holding exactly `rows` with `sources`: record i is {"prompt": "i", "response": ""} and the
// encode function returns golden row i.
std::shared_ptr<ld::token_cache> golden_cache(const fs::path& dir, const std::vector<std::vector<std::int32_t>>& rows,
                                              const std::vector<std::int32_t>& sources) {
  fs::create_directories(dir);
  {
    std::ofstream out(dir / "rows.jsonl");
    for (std::size_t i = 0; i < rows.size(); ++i) out << "{\"prompt\": \"" << i << "\", \"response\": \"\"}\n";
  }
  ld::source_options src;
  src.fields = {"prompt", "response"};
  ld::encode_fn encode = [&](std::string_view doc) {
    const auto i = std::stoul(nlohmann::json::parse(doc).at(0).get<std::string>());
    std::vector<std::int32_t> row{sources.at(i)};
    row.insert(row.end(), rows.at(i).begin(), rows.at(i).end());
    return row;
  };
  auto c = ld::open_or_build_cache((dir / "cache").string(), {(dir / "rows.jsonl").string()}, src, encode,
                                   {{"tokenizer", "golden"}, {"vocab_size", 300}, {"format", "supervised"}}, quiet());
  c->total_tokens();
  return c;
}

// Every example of `packs` against the golden ones (tokens, segment ids, loss mask); returns the trained positions.
int check_examples(const ld::packed_examples& packs, const nlohmann::json& golden_packs) {
  REQUIRE(packs.size() == static_cast<std::int64_t>(golden_packs.size()));
  const auto L = static_cast<std::size_t>(packs.seq_len());
  std::vector<std::int32_t> tokens(L), seg(L);
  std::vector<std::uint8_t> keep(L);
  int trained = 0;
  for (std::int64_t k = 0; k < packs.size(); ++k) {
    const auto& want = golden_packs[static_cast<std::size_t>(k)];
    packs.example(k, true, tokens.data(), keep.data(), seg.data());
    CHECK(tokens == want["tokens"].get<std::vector<std::int32_t>>());
    CHECK(seg == want["segment_ids"].get<std::vector<std::int32_t>>());
    CHECK(std::vector<int>(keep.begin(), keep.end()) == want["loss_mask"].get<std::vector<int>>());
    trained += static_cast<int>(std::count(keep.begin(), keep.end(), 1));
  }
  return trained;
}

nlohmann::json load_sft_golden() {
  const std::string path = std::string(HALIAX_GOLDEN_DIR) + "/packing/sft.json";
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("pack_documents: the packs of upstream's pack_documents, and its refusals") {
  const auto golden = load_golden();
  int cases = 0, errors = 0;
  for (const auto& e : golden["pack_documents"]) {
    const auto lengths = e["lengths"].get<std::vector<std::int64_t>>();
    std::optional<std::int64_t> max_segments;
    if (!e["max_segments"].is_null()) max_segments = e["max_segments"].get<std::int64_t>();
    const auto max_length = e["max_length"].get<std::int64_t>();
    const bool slice = e["slice_too_long"].get<bool>();
    CAPTURE(e.dump());
    if (e.contains("error")) {
      CHECK_THROWS_AS(ld::pack_documents(lengths, max_length, max_segments, slice), ld::data_error);
      ++errors;
    } else {
      std::vector<ld::doc_range> want;
      for (const auto& r : e["packs"]) want.push_back({r[0].get<std::int64_t>(), r[1].get<std::int64_t>()});
      CHECK(ld::pack_documents(lengths, max_length, max_segments, slice) == want);
    }
    ++cases;
  }
  CHECK(cases >= 60);
  CHECK(errors > 0);  // too-long documents without slicing are refused, as upstream raises
  CHECK_THROWS_WITH_AS(ld::pack_documents(std::vector<std::int64_t>{1}, 8, 0, false),
                       doctest::Contains("max_segments_per_example must be a positive integer"), ld::data_error);
}

TEST_CASE("packed_examples: tokens and segment ids as upstream's SupervisedDataset, the loss mask on the responses") {
  const auto golden = load_golden();
  const auto dir = train_helpers::temp_dir("levanter_test_packing", "golden");
  int compared = 0, sliced = 0, trained = 0;
  std::size_t case_no = 0;
  for (const auto& e : golden["supervised"]) {
    if (e["slice_strategy"] != "right") continue;  // upstream's SupervisedDataset slices from the right
    const auto rows = e["rows"].get<std::vector<std::vector<std::int32_t>>>();
    const auto sources = e["sources_len"].get<std::vector<std::int32_t>>();
    const auto L = e["seq_len"].get<std::int64_t>();
    const auto cache = golden_cache(dir / std::to_string(case_no++), rows, sources);
    const ld::packed_examples packs(cache, L, e["max_segments"].get<std::int64_t>());
    const bool mask_inputs = e["mask_inputs"].get<bool>();
    CAPTURE(case_no);
    CAPTURE(mask_inputs);
    REQUIRE(packs.size() == static_cast<std::int64_t>(e["packs"].size()));
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(L)), seg(tokens.size());
    std::vector<std::uint8_t> keep(tokens.size());
    for (std::int64_t k = 0; k < packs.size(); ++k) {
      const auto& want = e["packs"][static_cast<std::size_t>(k)];
      packs.example(k, mask_inputs, tokens.data(), keep.data(), seg.data());
      CHECK(tokens == want["tokens"].get<std::vector<std::int32_t>>());
      CHECK(seg == want["segment_ids"].get<std::vector<std::int32_t>>());
      // The expected mask: position p is trained when token p + 1 is in the same row and (mask_inputs) is a
      // response token. Upstream's sequence mask says the latter of token p + 1, counting within what was kept;
      // a row sliced from the right keeps its last L tokens, whose index in the whole row is offset by the cut.
      const auto& r = packs.packs()[static_cast<std::size_t>(k)];
      const auto row_len = static_cast<std::int64_t>(rows[static_cast<std::size_t>(r.begin)].size());
      const bool cut = r.end - r.begin == 1 && row_len > L;
      sliced += cut;
      for (std::int64_t p = 0; p < L; ++p) {
        const auto i = static_cast<std::size_t>(p);
        bool expect = p + 1 < L && seg[i] != -1 && seg[i + 1] == seg[i];
        if (expect && mask_inputs) {
          if (cut)
            expect = row_len - L + p + 1 >= sources[static_cast<std::size_t>(seg[i])];
          else
            expect = want["sequence_mask"][i + 1].get<int>() == 1;
        }
        CHECK_MESSAGE(static_cast<bool>(keep[i]) == expect, "pack " << k << " position " << p);
        trained += keep[i];
      }
      ++compared;
    }
  }
  CHECK(compared > 40);
  CHECK(sliced > 0);
  CHECK(trained > 100);
  fs::remove_all(dir);
}

TEST_CASE("supervised rows: the ids of input + separator + output, sources_len the ids of input + separator") {
  const auto tok = ld::tokenizer::byte_level();
  ld::supervised_format f;
  f.separate_with = "\n";
  const auto encode = ld::make_supervised_encode_fn(tok, f);
  const auto row = encode(R"(["What is 2+2?", "4"])");
  const auto source = tok.encode("What is 2+2?\n"), whole = tok.encode("What is 2+2?\n4");
  REQUIRE(row.size() == whole.size() + 1);
  CHECK(row.front() == static_cast<std::int32_t>(source.size()));
  CHECK(std::equal(whole.begin(), whole.end(), row.begin() + 1));

  // The metadata names the fields, so a text cache (or one of other fields) is not reused for them.
  const auto m = ld::supervised_metadata(tok, f);
  CHECK(m["input_field"] == "prompt");
  CHECK(m["output_field"] == "response");
  CHECK(m["separate_with"] == "\n");
  CHECK(m["format"] == "supervised");
}

TEST_CASE("supervised caches: missing fields name file, line and field, and text files and text caches are refused") {
  const auto dir = train_helpers::temp_dir("levanter_test_packing", "errors");
  fs::create_directories(dir);
  {
    std::ofstream(dir / "bad.jsonl") << "{\"prompt\": \"a\", \"response\": \"b\"}\n{\"prompt\": \"c\"}\n";
    std::ofstream(dir / "lines.txt") << "a line\n";
  }
  ld::source_options src;
  src.fields = {"prompt", "response"};
  const auto tok = ld::tokenizer::byte_level();
  const ld::supervised_format f;
  auto open = [&](const std::string& file, const std::string& name) {
    return ld::open_or_build_cache((dir / name).string(), {(dir / file).string()}, src,
                                   ld::make_supervised_encode_fn(tok, f), ld::supervised_metadata(tok, f), quiet());
  };
  CHECK_THROWS_WITH_AS(open("bad.jsonl", "c1")->total_tokens(),
                       doctest::Contains("bad.jsonl:2: no string field 'response'"), ld::data_error);
  CHECK_THROWS_WITH_AS(open("lines.txt", "c2")->total_tokens(), doctest::Contains("supervised and chat data need JSON records"),
                       ld::data_error);
  // Skipping bad records keeps the good one.
  src.on_bad_document = ld::bad_document_policy::skip;
  auto ok = open("bad.jsonl", "c3");
  CHECK(ok->total_tokens() == 2);  // "ab"
  CHECK(ok->skipped_documents() == 1);
  CHECK(ok->sources_lens() == std::vector<std::int32_t>{1});
  // A text cache cannot be packed.
  ld::source_options text;
  auto plain = ld::open_or_build_cache((dir / "text").string(), {(dir / "lines.txt").string()}, text,
                                       ld::make_encode_fn(tok, false, false), ld::tokenizer_metadata(tok, false, false),
                                       quiet());
  CHECK_THROWS_WITH_AS(ld::packed_examples(plain, 8, 64), doctest::Contains("holds text rows"), ld::data_error);
  fs::remove_all(dir);
}

TEST_CASE("sft packing: the examples of upstream sft's permutation, epochs, cuts and prompt-completion packing") {
  const auto golden = load_sft_golden();
  const auto dir = train_helpers::temp_dir("levanter_test_packing", "sft");
  int compared = 0, trained = 0, epochs_seen = 0, cut_seen = 0;
  std::int64_t dropped = 0;
  std::size_t case_no = 0;
  for (const auto& e : golden["prompt_completions"]) {
    const auto rows = e["rows"].get<std::vector<std::vector<std::int32_t>>>();
    const auto sources = e["sources_len"].get<std::vector<std::int32_t>>();
    const auto cache = golden_cache(dir / std::to_string(case_no++), rows, sources);
    ld::prompt_completion_options o;
    o.seq_len = e["seq_len"].get<std::int64_t>();
    o.max_seq_len = e["max_seq_len"].get<std::int64_t>();
    o.epochs = e["epochs"].get<std::int64_t>();
    o.key = haliax::random::make_key(e["key_seed"].get<std::uint64_t>());
    o.pad_id = e["pad"].get<std::int32_t>();
    const ld::packed_examples packs(cache, o);
    CAPTURE(case_no);
    epochs_seen += o.epochs > 1;
    cut_seen += o.max_seq_len < o.seq_len;
    dropped += packs.dropped_rows();
    trained += check_examples(packs, e["packs"]);
    compared += static_cast<int>(packs.size());
  }
  CHECK(compared > 200);
  CHECK(trained > 4000);
  CHECK(epochs_seen > 0);
  CHECK(cut_seen > 0);
  CHECK(dropped > 0);  // some prompts are too long, some responses cut away: upstream leaves those rows out
  fs::remove_all(dir);
}

TEST_CASE("sft rows: the roles sft names, and EOS after the response when the tokenizer does not add it") {
  const auto dir = train_helpers::temp_dir("levanter_test_packing", "sft_rows");
  fs::create_directories(dir);
  std::ofstream(dir / "chat.jsonl")
      << R"({"messages": [{"role": "system", "content": "S"}, {"role": "human", "content": "Hi"}, )"
      << R"({"role": "gpt", "content": "Yo"}, {"role": "human", "content": "later"}]})" << "\n"
      << R"({"messages": [{"role": "human", "content": "only a question"}]})" << "\n";
  const auto tok = ld::tokenizer::byte_level();
  ld::supervised_format f;
  f.messages_field = "messages";
  f.input_role = "human";
  f.output_role = "gpt";
  f.append_eos = true;
  ld::source_options src;
  src.messages_field = "messages";
  src.input_role = "human";
  src.output_role = "gpt";
  auto c = ld::open_or_build_cache((dir / "c").string(), {(dir / "chat.jsonl").string()}, src,
                                   ld::make_supervised_encode_fn(tok, f), ld::supervised_metadata(tok, f), quiet());
  CHECK_THROWS_WITH_AS(c->total_tokens(), doctest::Contains("chat.jsonl:2: no message with role 'gpt'"),
                       ld::data_error);
  src.on_bad_document = ld::bad_document_policy::skip;
  c = ld::open_or_build_cache((dir / "c2").string(), {(dir / "chat.jsonl").string()}, src,
                              ld::make_supervised_encode_fn(tok, f), ld::supervised_metadata(tok, f), quiet());
  REQUIRE(c->total_tokens() == 5);  // "Hi" "Yo" and the byte tokenizer's EOS (id 256), which it never adds itself
  std::vector<std::int32_t> ids(5);
  c->read_tokens(0, 5, ids.data());
  CHECK(ids == std::vector<std::int32_t>{'H', 'i', 'Y', 'o', 256});
  CHECK(c->sources_lens() == std::vector<std::int32_t>{2});
  const auto m = ld::supervised_metadata(tok, f);
  CHECK(m["input_role"] == "human");
  CHECK(m["append_eos"] == true);
  // A cache of this packing holds at least one row; an empty one is refused by name.
  ld::prompt_completion_options o;
  o.seq_len = 8;
  o.max_seq_len = 8;
  const ld::packed_examples packs(c, o);
  REQUIRE(packs.size() == 1);
  std::vector<std::int32_t> tokens(8), seg(8);
  std::vector<std::uint8_t> keep(8);
  packs.example(0, true, tokens.data(), keep.data(), seg.data());
  CHECK(tokens == std::vector<std::int32_t>{'H', 'i', 'Y', 'o', 256, 0, 0, 0});
  CHECK(std::vector<int>(keep.begin(), keep.end()) == std::vector<int>{0, 1, 1, 1, 0, 0, 0, 0});
  fs::remove_all(dir);
}

TEST_CASE("sft_mixture packing: the first examples of upstream sft_mixture's mixture of permuted rows") {
  const auto golden = load_sft_golden();
  const auto dir = train_helpers::temp_dir("levanter_test_packing", "sft_mixture");
  int compared = 0, trained = 0;
  std::size_t case_no = 0;
  for (const auto& e : golden["mixture"]) {
    std::vector<std::shared_ptr<ld::token_cache>> caches;
    std::vector<std::string> names;
    std::vector<std::int64_t> lengths;
    ld::mixture_stage stage;
    for (const auto& d : e["datasets"]) {
      const auto rows = d["rows"].get<std::vector<std::vector<std::int32_t>>>();
      caches.push_back(golden_cache(dir / std::to_string(case_no++), rows,
                                    d["sources_len"].get<std::vector<std::int32_t>>()));
      names.push_back(d["name"].get<std::string>());
      lengths.push_back(static_cast<std::int64_t>(rows.size()));
      stage.weights.emplace_back(names.back(), e["weights"][names.back()].get<double>());
    }
    const auto key = haliax::random::make_key(e["key_seed"].get<std::uint64_t>());
    ld::prompt_completion_options o;
    o.seq_len = e["seq_len"].get<std::int64_t>();
    o.key = key;
    o.pad_id = e["pad"].get<std::int32_t>();
    o.examples = static_cast<std::int64_t>(e["packs"].size());
    o.mixture.emplace(names, std::vector<ld::mixture_stage>{stage}, e["block_size"].get<std::int64_t>(), key, lengths,
                      ld::stop_strategy::restart);
    const ld::packed_examples packs(caches, o);
    CAPTURE(case_no);
    trained += check_examples(packs, e["packs"]);
    compared += static_cast<int>(packs.size());
  }
  CHECK(compared == 240);
  CHECK(trained > 2000);
  fs::remove_all(dir);
}

TEST_CASE("text packing: whole documents, long ones in seq_len pieces, the loss within each document") {
  const auto dir = train_helpers::temp_dir("levanter_test_packing", "text");
  fs::create_directories(dir);
  const std::vector<int> lengths{3, 10, 4, 4, 25, 1, 7};
  {
    std::ofstream out(dir / "docs.jsonl");
    for (std::size_t i = 0; i < lengths.size(); ++i)
      out << "{\"text\": \"" << std::string(static_cast<std::size_t>(lengths[i]), static_cast<char>('a' + i)) << "\"}\n";
  }
  const auto tok = ld::tokenizer::byte_level();
  auto cache = ld::open_or_build_cache((dir / "c").string(), {(dir / "docs.jsonl").string()}, {},
                                       ld::make_encode_fn(tok, false, false), ld::tokenizer_metadata(tok, false, false),
                                       quiet());
  const auto packs = ld::packed_examples::documents(cache, 8, 2);
  // (row, first token, tokens) of each example's pieces
  const std::vector<std::vector<std::array<std::int64_t, 3>>> want = {
      {{1, 0, 8}}, {{0, 0, 3}, {1, 8, 2}}, {{4, 0, 8}}, {{4, 8, 8}}, {{4, 16, 8}}, {{2, 0, 4}, {3, 0, 4}},
      {{4, 24, 1}, {5, 0, 1}}, {{6, 0, 7}}};
  REQUIRE(packs.size() == static_cast<std::int64_t>(want.size()));
  for (std::size_t k = 0; k < want.size(); ++k) {
    const auto got = packs.pieces(static_cast<std::int64_t>(k));
    REQUIRE(got.size() == want[k].size());
    for (std::size_t j = 0; j < got.size(); ++j) {
      CHECK(got[j].row == want[k][j][0]);
      CHECK(got[j].skip == want[k][j][1]);
      CHECK(got[j].n == want[k][j][2]);
      CHECK(got[j].segment == got[j].row);
    }
  }
  std::vector<std::int32_t> tokens(8), seg(8);
  std::vector<std::uint8_t> keep(8);
  packs.example(1, false, tokens.data(), keep.data(), seg.data());
  CHECK(tokens == std::vector<std::int32_t>{'a', 'a', 'a', 'b', 'b', 0, 0, 0});
  CHECK(seg == std::vector<std::int32_t>{0, 0, 0, 1, 1, -1, -1, -1});
  CHECK(std::vector<int>(keep.begin(), keep.end()) == std::vector<int>{1, 1, 0, 1, 0, 0, 0, 0});
  packs.example(2, false, tokens.data(), keep.data(), seg.data());
  CHECK(std::vector<int>(keep.begin(), keep.end()) == std::vector<int>{1, 1, 1, 1, 1, 1, 1, 0});
  fs::remove_all(dir);
}
