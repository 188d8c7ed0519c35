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
#include <levanter/data/jinja.hpp>
#include <levanter/data/packing.hpp>
#include <map>
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

namespace {

nlohmann::json load_chat_golden() {
  const std::string path = std::string(HALIAX_GOLDEN_DIR) + "/chat_data/golden.json";
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  return nlohmann::json::parse(in);
}

std::string chat_dir() { return std::string(HALIAX_GOLDEN_DIR) + "/chat_data"; }

// The message that `f` throws (data_error), or "" when it does not throw.
template <class F>
std::string data_error_of(F&& f) {
  try {
    f();
  } catch (const ld::data_error& e) {
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("chat rows: ids and assistant masks equal transformers' apply_chat_template, template from the config") {
  const auto golden = load_chat_golden();
  const auto tok = ld::tokenizer::from_file(chat_dir());
  // The tokenizer's own template (tokenizer_config.json) and the special tokens transformers passes to it.
  REQUIRE(tok.chat_template().has_value());
  CHECK(*tok.chat_template() == golden["templates"]["llama3_gen"].get<std::string>());
  const auto& tt = tok.template_tokens();
  REQUIRE(tt.size() == 2);
  CHECK(tt[0] == std::pair<std::string, std::string>{"bos_token", "<|begin_of_text|>"});
  CHECK(tt[1] == std::pair<std::string, std::string>{"eos_token", "<|end_of_text|>"});
  CHECK(ld::chat_template_for(tok, ld::chat_format{}, std::nullopt) == *tok.chat_template());

  int cases = 0, partial_edges = 0;
  for (const auto& c : golden["cases"]) {
    const std::string tname = c["template"].get<std::string>();
    CAPTURE(tname);
    CAPTURE(c["conversation"].get<int>());
    const auto enc = ld::make_chat_encode_fn(tok, golden["templates"][tname].get<std::string>(), true);
    const auto& conv = golden["conversations"][c["conversation"].get<std::size_t>()];
    const auto row = enc(conv.dump());
    const auto ids = c["input_ids"].get<std::vector<std::int32_t>>();
    const auto masks = c["assistant_masks"].get<std::vector<std::int32_t>>();
    REQUIRE(row.size() == 1 + 2 * ids.size());
    CHECK(row[0] == static_cast<std::int32_t>(ids.size()));
    CHECK(std::vector<std::int32_t>(row.begin() + 1, row.begin() + 1 + static_cast<std::ptrdiff_t>(ids.size())) == ids);
    CHECK(std::vector<std::int32_t>(row.begin() + 1 + static_cast<std::ptrdiff_t>(ids.size()), row.end()) == masks);
    // (token offsets: the rendered text's bytes are spelled by the ids)
    const auto ends = tok.token_ends(ids, c["text"].get<std::string>());
    CHECK(ends.back() == static_cast<std::int64_t>(c["text"].get<std::string>().size()));
    if (tname == "space_gen") ++partial_edges;
    ++cases;
  }
  CHECK(cases == 24);
  CHECK(partial_edges == 6);
}

// SentencePiece-style tokenizers rewrite the text before the model sees it (Llama 2 and Mistral: a normalizer that
// prepends "▁" to every piece between special tokens and turns spaces into "▁"; newer conversions: a Metaspace
// pre-tokenizer): the masks follow each token back to the characters it came from, as transformers' offsets do.
TEST_CASE("chat rows under SentencePiece-style tokenizers: ids and masks equal transformers' (normalizer, Metaspace)") {
  const std::string dir = std::string(HALIAX_GOLDEN_DIR) + "/chat_data_sp";
  std::ifstream in(dir + "/golden.json");
  REQUIRE(in.good());
  const auto golden = nlohmann::json::parse(in);
  std::map<std::string, int> cases;
  for (const auto& c : golden["cases"]) {
    const std::string variant = c["tokenizer"].get<std::string>(), tname = c["template"].get<std::string>();
    CAPTURE(variant);
    CAPTURE(tname);
    CAPTURE(c["conversation"].get<int>());
    const auto tok = ld::tokenizer::from_file(dir + "/" + variant);
    const auto enc = ld::make_chat_encode_fn(tok, golden["templates"][tname].get<std::string>(), true);
    const auto row = enc(golden["conversations"][c["conversation"].get<std::size_t>()].dump());
    const auto ids = c["input_ids"].get<std::vector<std::int32_t>>();
    const auto masks = c["assistant_masks"].get<std::vector<std::int32_t>>();
    REQUIRE(row.size() == 1 + 2 * ids.size());
    CHECK(std::vector<std::int32_t>(row.begin() + 1, row.begin() + 1 + static_cast<std::ptrdiff_t>(ids.size())) == ids);
    CHECK(std::vector<std::int32_t>(row.begin() + 1 + static_cast<std::ptrdiff_t>(ids.size()), row.end()) == masks);
    const std::string text = c["text"].get<std::string>();
    CHECK(tok.token_ends(ids, text).back() == static_cast<std::int64_t>(text.size()));
    ++cases[variant];
  }
  CHECK(cases["normalizer"] == 18);
  CHECK(cases["metaspace"] == 18);
}

TEST_CASE("chat caches: rows packed whole, long ones cut to their first seq_len tokens, trained on the assistant") {
  const auto golden = load_chat_golden();
  const auto dir = train_helpers::temp_dir("levanter_test_packing", "chat");
  fs::create_directories(dir);
  const auto tok = ld::tokenizer::from_file(chat_dir());
  const std::string tmpl = golden["templates"]["chatml_gen"].get<std::string>();
  {
    std::ofstream out(dir / "chats.jsonl");
    for (const auto& conv : golden["conversations"]) out << nlohmann::json{{"messages", conv}, {"id", 1}}.dump() << "\n";
  }
  ld::source_options src;
  src.chat = true;
  src.messages_field = "messages";
  auto cache = ld::open_or_build_cache((dir / "c").string(), {(dir / "chats.jsonl").string()}, src,
                                       ld::make_chat_encode_fn(tok, tmpl, true), ld::chat_metadata(tok, tmpl, "messages"),
                                       quiet());
  REQUIRE(cache->total_tokens() > 0);
  REQUIRE(cache->has_assistant_masks());
  std::vector<std::vector<std::int32_t>> ids, masks;
  for (const auto& c : golden["cases"])
    if (c["template"] == "chatml_gen") {
      ids.push_back(c["input_ids"].get<std::vector<std::int32_t>>());
      masks.push_back(c["assistant_masks"].get<std::vector<std::int32_t>>());
    }
  REQUIRE(cache->committed_docs() == static_cast<std::int64_t>(ids.size()));
  for (std::size_t r = 0; r < ids.size(); ++r) {  // the cache holds the golden rows
    const auto [b, e] = cache->row_range(static_cast<std::int64_t>(r));
    std::vector<std::int32_t> t(static_cast<std::size_t>(e - b));
    std::vector<std::uint8_t> m(t.size());
    cache->read_tokens(b, e - b, t.data());
    cache->read_masks(b, e - b, m.data());
    CHECK(t == ids[r]);
    CHECK(std::vector<std::int32_t>(m.begin(), m.end()) == masks[r]);
  }

  // Greedy packs of whole rows (upstream GreedyPrepackedDataset, slice "left"), checked position by position.
  const std::int64_t L = 96;
  for (const std::int64_t max_segments : {std::int64_t{64}, std::int64_t{1}}) {
    CAPTURE(max_segments);
    const auto packs = ld::packed_examples::chat(cache, L, max_segments);
    std::vector<std::int64_t> lengths;
    for (const auto& r : ids) lengths.push_back(static_cast<std::int64_t>(r.size()));
    const auto ranges = ld::pack_documents(lengths, L, max_segments, true);
    REQUIRE(packs.size() == static_cast<std::int64_t>(ranges.size()));
    std::vector<std::int32_t> tokens(L), seg(L);
    std::vector<std::uint8_t> keep(L), all(L);
    int trained = 0, cut = 0;
    for (std::int64_t k = 0; k < packs.size(); ++k) {
      packs.example(k, true, tokens.data(), keep.data(), seg.data());
      packs.example(k, false, tokens.data(), all.data(), seg.data());
      std::int64_t at = 0;
      for (auto row = ranges[static_cast<std::size_t>(k)].begin; row < ranges[static_cast<std::size_t>(k)].end; ++row) {
        const auto& want = ids[static_cast<std::size_t>(row)];
        const auto& m = masks[static_cast<std::size_t>(row)];
        const auto n = std::min<std::int64_t>(static_cast<std::int64_t>(want.size()), L);
        if (n < static_cast<std::int64_t>(want.size())) ++cut;
        for (std::int64_t j = 0; j < n; ++j, ++at) {
          const auto i = static_cast<std::size_t>(at), jj = static_cast<std::size_t>(j);
          CHECK(tokens[i] == want[jj]);
          CHECK(seg[i] == row);
          CHECK(static_cast<int>(keep[i]) == static_cast<int>(j + 1 < n && m[jj + 1] == 1));
          CHECK(static_cast<int>(all[i]) == static_cast<int>(j + 1 < n));
          trained += keep[i];
        }
      }
      for (; at < L; ++at) {
        const auto i = static_cast<std::size_t>(at);
        CHECK(tokens[i] == 0);
        CHECK(seg[i] == -1);
        CHECK(keep[i] == 0);
      }
    }
    CHECK(cut == std::count_if(ids.begin(), ids.end(), [&](const auto& r) { return std::ssize(r) > L; }));
    CHECK(cut > 0);
    CHECK(trained > 100);
  }
  CHECK(data_error_of([&] { ld::packed_examples(cache, L, 64); }).find("text rows") != std::string::npos);

  // Upstream Levanter's own MultiturnChatDataset over the same rows (golden): the same examples, bit for bit.
  for (const auto& up : golden["upstream_packs"]) {
    const auto seq = up["seq_len"].get<std::int64_t>();
    CAPTURE(up["max_segments"].get<std::int64_t>());
    const auto packs = ld::packed_examples::chat(cache, seq, up["max_segments"].get<std::int64_t>());
    REQUIRE(packs.size() == static_cast<std::int64_t>(up["examples"].size()));
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(seq)), seg(tokens.size());
    std::vector<std::uint8_t> keep(tokens.size());
    for (std::int64_t k = 0; k < packs.size(); ++k) {
      const auto& want = up["examples"][static_cast<std::size_t>(k)];
      packs.example(k, true, tokens.data(), keep.data(), seg.data());
      CHECK(tokens == want["tokens"].get<std::vector<std::int32_t>>());
      CHECK(seg == want["segment_ids"].get<std::vector<std::int32_t>>());
      CHECK(std::vector<int>(keep.begin(), keep.end()) == want["loss_mask"].get<std::vector<int>>());
    }
  }

  // Another template is another cache: refused, naming the key, not silently read.
  cache.reset();
  CHECK(data_error_of([&] {
          ld::open_or_build_cache((dir / "c").string(), {(dir / "chats.jsonl").string()}, src,
                                  ld::make_chat_encode_fn(tok, tmpl + " ", true),
                                  ld::chat_metadata(tok, tmpl + " ", "messages"), quiet());
        }).find("chat_template") != std::string::npos);
  // A damaged mask file is refused, never read as masks: a byte not 0 or 1, or a file shorter than the tokens.
  const auto masks_file = dir / "c" / "assistant_masks" / "data.bin";
  const auto size = fs::file_size(masks_file);
  {
    std::fstream f(masks_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3);
    f.put(7);
  }
  auto reopen = [&] {
    return ld::open_or_build_cache((dir / "c").string(), {(dir / "chats.jsonl").string()}, src,
                                   ld::make_chat_encode_fn(tok, tmpl, true), ld::chat_metadata(tok, tmpl, "messages"),
                                   quiet());
  };
  auto damaged = reopen();
  std::vector<std::uint8_t> m(8);
  CHECK(data_error_of([&] { damaged->read_masks(0, 8, m.data()); }).find("is damaged") != std::string::npos);
  damaged.reset();
  fs::resize_file(masks_file, size - 1);
  CHECK(data_error_of([&] { reopen(); }).find("is damaged") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("chat data errors: no template, no generation block, no assistant text, a tokenizer that cannot spell") {
  const auto golden = load_chat_golden();
  const auto byte = ld::tokenizer::byte_level();
  ld::chat_format f;
  // No template anywhere.
  auto msg = data_error_of([&] { ld::chat_template_for(byte, f, std::nullopt); });
  CHECK(msg.find("has no chat template") != std::string::npos);
  CHECK(msg.find("format.chat_template") != std::string::npos);
  // A template without {% generation %} trains nothing under mask_user_turns (upstream refuses it too) ...
  const std::string plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}";
  f.chat_template = plain;
  CHECK(data_error_of([&] { ld::chat_template_for(byte, f, std::nullopt); }).find("{% generation %}") !=
        std::string::npos);
  f.mask_user_turns = false;  // ... and is fine without it
  CHECK(ld::chat_template_for(byte, f, std::nullopt) == plain);
  f.chat_template.reset();
  CHECK(ld::chat_template_for(byte, f, std::string("data {% generation %}x{% endgeneration %}")) ==
        "data {% generation %}x{% endgeneration %}");
  f.mask_user_turns = true;
  CHECK(ld::chat_template_for(byte, f, std::string("{%- generation -%}x{% endgeneration %}")).size() > 0);

  // The byte tokenizer spells any text; a record whose template renders no assistant text is refused.
  const std::string tmpl = golden["templates"]["space_gen"].get<std::string>();
  const auto enc = ld::make_chat_encode_fn(byte, tmpl, true);
  const auto row = enc(R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])");
  const std::string text = "User: hi\nAssistant: yo";  // (trim_blocks takes the newline after endgeneration)
  REQUIRE(row.size() == 1 + 2 * text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    CHECK(row[1 + i] == static_cast<unsigned char>(text[i]));
    CHECK(row[1 + text.size() + i] == (i >= 19 && i < 22 ? 1 : 0));  // " yo"
  }
  msg = data_error_of([&] { enc(R"([{"role": "user", "content": "only a question"}])"); });
  CHECK(msg.find("no assistant text") != std::string::npos);
  CHECK(msg.find("only a question") != std::string::npos);
  CHECK(ld::make_chat_encode_fn(byte, tmpl, false)(R"([{"role": "user", "content": "q"}])").size() == 1 + 2 * 8);
  // A template error names its line.
  CHECK_THROWS_WITH_AS(ld::make_chat_encode_fn(byte, "line one\n{{ messages | frobnicate }}", false),
                       doctest::Contains("line 2"), levanter::data::jinja::template_error);
  msg = data_error_of([&] { ld::make_chat_encode_fn(byte, "{{ raise_exception('bad roles') }}", false)("[]"); });
  CHECK(msg.find("bad roles") != std::string::npos);
  // Ids that are not the text's encoding cannot be placed in it: said, naming the token, not guessed.
  const auto sp = ld::tokenizer::from_file(std::string(HALIAX_GOLDEN_DIR) + "/tokenizers/sentencepiece_style");
  auto ids = sp.encode("Hello there", false);
  CHECK(sp.token_ends(ids, "Hello there").back() == 11);
  msg = data_error_of([&] { sp.token_ends(ids, "Hello where"); });
  CHECK(msg.find("does not spell the text") != std::string::npos);
  ids.push_back(ids.back());
  msg = data_error_of([&] { sp.token_ends(ids, "Hello there"); });
  CHECK(msg.find("token " + std::to_string(ids.size() - 1)) != std::string::npos);

  // Records: messages must be a list of objects with a role; a bad line names file and line.
  const auto dir = train_helpers::temp_dir("levanter_test_packing", "chat_errors");
  fs::create_directories(dir);
  std::ofstream(dir / "bad.jsonl") << R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})"
                                   << "\n"
                                   << R"({"messages": [{"content": "no role"}]})" << "\n";
  ld::source_options src;
  src.chat = true;
  src.messages_field = "messages";
  auto cache = ld::open_or_build_cache((dir / "c").string(), {(dir / "bad.jsonl").string()}, src, enc,
                                       ld::chat_metadata(byte, tmpl, "messages"), quiet());
  msg = data_error_of([&] { cache->total_tokens(); });
  CHECK(msg.find("bad.jsonl:2") != std::string::npos);
  CHECK(msg.find("'role'") != std::string::npos);
  fs::remove_all(dir);
}
