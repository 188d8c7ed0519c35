// Tokenisation throughput of levanter::data::tokenizer (Hugging Face tokenizer.json BPE) on English text, in MB/s
// of UTF-8 input, with 1 and 2 threads. tests/oracle/bench_tokenizers_py.py times the Python `tokenizers`
// library (Rust) on the same documents and thread counts; docs/benchmarks.md compares the two.
//
//   BM_encode_batch/threads:N   tokenizer::encode_batch(docs, N): the word caches are warm after the first pass,
//                               as the Rust library's are
//   BM_encode_cold              encode() of every document with a fresh tokenizer (empty word cache) each pass
//
// Environment: LEVANTER_BENCH_TOKENIZER (a tokenizer.json or its directory; default: the committed GPT-2-style
// golden tokenizer), LEVANTER_BENCH_TEXT (JSON lines with a "text" field; default: the fortunes corpus, built
// with scripts/make-fortunes-corpus.sh into the temporary directory when missing).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <levanter/data/tokenizer.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace fs = std::filesystem;
using levanter::data::tokenizer;

namespace {

const fs::path repo_root = fs::path(__FILE__).parent_path().parent_path();

std::string tokenizer_path() {
  const char* env = std::getenv("LEVANTER_BENCH_TOKENIZER");
  return env ? env : (repo_root / "tests/golden/tokenizers/gpt2_style/tokenizer.json").string();
}

std::string text_path() {
  if (const char* env = std::getenv("LEVANTER_BENCH_TEXT")) return env;
  const fs::path dir = fs::temp_directory_path() / "levanter_bench_fortunes";
  const fs::path train = dir / "train.jsonl";
  if (!fs::exists(train)) {
    const std::string cmd =
        "sh '" + (repo_root / "scripts/make-fortunes-corpus.sh").string() + "' '" + dir.string() + "'";
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("bench_tokenizer: '" + cmd + "' failed");
  }
  return train.string();
}

struct corpus {
  std::vector<std::string> docs;
  double bytes = 0;
};

const corpus& docs() {
  static const corpus c = [] {
    corpus r;
    const auto path = text_path();
    std::ifstream in(path);
    if (!in) throw std::runtime_error("bench_tokenizer: cannot open " + path);
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      r.docs.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
      r.bytes += static_cast<double>(r.docs.back().size());
    }
    benchmark::AddCustomContext("tokenizer", tokenizer_path());
    benchmark::AddCustomContext("text", path + " (" + std::to_string(r.docs.size()) + " documents, " +
                                            std::to_string(static_cast<long long>(r.bytes)) + " bytes)");
    return r;
  }();
  return c;
}

const tokenizer& shared_tokenizer() {
  static const tokenizer t = tokenizer::from_file(tokenizer_path());
  return t;
}

void set_rate(benchmark::State& st, const corpus& c, std::size_t tokens) {
  st.counters["MB_per_s"] = benchmark::Counter(c.bytes / 1e6, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["bytes_per_token"] = c.bytes / static_cast<double>(tokens);
}

void BM_encode_batch(benchmark::State& st) {
  const auto& c = docs();
  const auto& tok = shared_tokenizer();
  const int threads = static_cast<int>(st.range(0));
  std::size_t tokens = 0;
  for (const auto& ids : tok.encode_batch(c.docs, threads, false)) tokens += ids.size();  // warm the caches
  for (auto _ : st) {
    auto out = tok.encode_batch(c.docs, threads, false);
    benchmark::DoNotOptimize(out.data());
  }
  set_rate(st, c, tokens);
  st.counters["threads"] = threads;
}
BENCHMARK(BM_encode_batch)->Arg(1)->Arg(2)->ArgName("threads")->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_encode_cold(benchmark::State& st) {
  const auto& c = docs();
  std::size_t tokens = 0;
  for (auto _ : st) {
    st.PauseTiming();
    const auto tok = tokenizer::from_file(tokenizer_path());
    st.ResumeTiming();
    tokens = 0;
    for (const auto& d : c.docs) tokens += tok.encode(d, false).size();
    benchmark::DoNotOptimize(tokens);
  }
  set_rate(st, c, tokens);
}
BENCHMARK(BM_encode_cold)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

HALIAX_BENCHMARK_MAIN();
