// libFuzzer target for the token cache's ledger reader (levanter::data::open_or_build_cache reading
// <split>/shard_ledger.json, src/data/cache.cpp). Built and run by scripts/fuzz.sh ledger SECONDS.
// fuzz-sources: src/data/cache.cpp src/data/sources.cpp src/data/tokenizer.cpp src/data/unicode_tables.cpp src/io/atomic_file.cpp src/io/json_limits.cpp
// fuzz-libs: -lz -lzstd
// fuzz-flags: -max_len=4096 -dict=tests/fuzz/ledger.dict
//
// Each input is one byte of mode, then the bytes of shard_ledger.json. The harness writes a small cache (3 rows,
// "ab" "cde" "f", one token per byte) and the ledger into a fresh directory and opens it:
//   mode bit 0  clear: with no data files (only a finished cache opens; nothing is built);
//               set:   with the data file the cache came from (docs.jsonl, 3 documents): an unfinished ledger
//                      resumes the build, which must end with exactly the 3 documents' tokens.
//   mode bit 1  set:   the preprocessing metadata the caller passes is the ledger's own (so inputs get past the
//                      metadata check), else a fixed one.
// The contract checked: opening either fails with data_error, or gives a cache whose counts are non-negative, whose
// rows lie inside its tokens, and (with the data file) that holds exactly the documents' tokens. Any other exception
// (nlohmann::json's type_error on a ledger field of the wrong type, say) is a finding, as callers catch data_error.
// With FUZZ_MEMORY_ONLY=1 in the environment only sanitizer reports, crashes and hangs are findings (to look past a
// known contract violation for memory errors).
// The ledgers in ledger-seeds/ are real ones (train_lm's and this harness's cache, built by the real code).
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <levanter/data/cache.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fs = std::filesystem;
namespace ld = levanter::data;

namespace {

const std::vector<std::string> docs = {"ab", "cde", "f"};

const fs::path& root() {
  static const fs::path r = [] {
    std::string t = (fs::temp_directory_path() / "fuzz-ledger-XXXXXX").string();
    if (!::mkdtemp(t.data())) std::abort();
    std::ofstream(fs::path(t) / "docs.jsonl") << "{\"text\": \"ab\"}\n{\"text\": \"cde\"}\n{\"text\": \"f\"}\n";
    std::atexit([] { fs::remove_all(root()); });
    return fs::path(t);
  }();
  return r;
}

void write(const fs::path& p, const void* data, std::size_t n) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!out) std::abort();
}

// The cache the ledger describes: 6 tokens in 3 rows.
void write_cache(const fs::path& dir, const std::uint8_t* ledger, std::size_t n) {
  fs::remove_all(dir);
  fs::create_directories(dir / "input_ids");
  std::vector<std::int32_t> tokens;
  std::vector<std::int64_t> ends;
  for (const auto& d : docs) {
    for (unsigned char c : d) tokens.push_back(c);
    ends.push_back(static_cast<std::int64_t>(tokens.size()));
  }
  write(dir / "input_ids" / "data.bin", tokens.data(), tokens.size() * 4);
  write(dir / "input_ids" / "offsets.bin", ends.data(), ends.size() * 8);
  write(dir / "shard_ledger.json", ledger, n);
}

std::vector<std::int32_t> encode(std::string_view text) { return {text.begin(), text.end()}; }

void check(const ld::token_cache& c, bool built, const nlohmann::json& ledger) {
  const std::int64_t rows = c.committed_docs(), toks = c.committed_tokens();
  if (rows < 0 || toks < 0) __builtin_trap();  // a negative count was accepted
  if (rows > 1000 || toks > 1000) __builtin_trap();  // more than the files hold
  std::int64_t prev = 0;
  std::vector<std::int32_t> all(static_cast<std::size_t>(toks));
  if (toks > 0) c.read_tokens(0, toks, all.data());
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto [b, e] = c.row_range(r);
    if (b != prev || e < b || e > toks) __builtin_trap();  // rows must tile the tokens
    prev = e;
  }
  if (rows > 0 && prev != toks) __builtin_trap();
  if (built) {
    // Resuming a build from the 3-document file must give its tokens: the rows the ledger committed, then the
    // documents after the lines it consumed (committed rows + lines it says were skipped as bad). The ledger
    // passed the cache's checks, so these fields are counts.
    const std::int64_t committed = ledger.value("total_num_rows", std::int64_t{0});
    const std::int64_t consumed = committed + ledger.value("skipped_documents", std::int64_t{0});
    std::vector<std::int32_t> want;
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(docs.size()); ++i)
      if (i < committed || i >= consumed)
        for (unsigned char ch : docs[static_cast<std::size_t>(i)]) want.push_back(ch);
    if (all != want) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t mode = data[0];
  const bool with_file = mode & 1;
  const fs::path dir = root() / "cache";
  write_cache(dir, data + 1, size - 1);

  const auto j = nlohmann::json::parse(data + 1, data + size, nullptr, false);
  // A finished cache is not checked against its data files (by design), so only a resumed build has to match them.
  const bool finished = j.is_object() && j.contains("is_finished") && j["is_finished"] == true;
  nlohmann::json meta = {{"tokenizer", "fuzz"}, {"vocab_size", 256}};
  if (mode & 2) {
    // The ledger's own metadata, less the text_key the cache adds itself.
    if (j.is_object() && j.contains("metadata") && j["metadata"].is_object() &&
        j["metadata"].contains("preprocessor_metadata") && j["metadata"]["preprocessor_metadata"].is_object()) {
      meta = j["metadata"]["preprocessor_metadata"];
      meta.erase("text_key");
    }
  }
  std::vector<std::string> files;
  if (with_file) files.push_back((root() / "docs.jsonl").string());
  ld::cache_options opts;
  opts.num_threads = 1;
  opts.docs_per_chunk = 1;
  opts.fsync = false;
  static const bool memory_only = std::getenv("FUZZ_MEMORY_ONLY") && *std::getenv("FUZZ_MEMORY_ONLY") == '1';
  try {
    auto cache = ld::open_or_build_cache(dir.string(), files, {}, encode, meta, opts);
    cache->total_tokens();  // waits for a resumed build; rethrows its failure
    if (!memory_only) check(*cache, with_file && !finished, j);
  } catch (const ld::data_error&) {
  } catch (const std::exception&) {
    if (!memory_only) throw;
  }
  return 0;
}
