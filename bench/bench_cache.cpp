// Tokenized cache build end to end: ~100 MB of JSON lines (4 gzip files, generated once in the temporary directory)
// to a finished cache (data, offsets and ledger, fsync at each commit), with the byte-level tokenizer and the GPT-2
// style BPE tokenizer of tests/golden/tokenizers/gpt2_style, at 1 and 2 tokenizing threads.
//
//   read       gunzip + line split only (the reader thread's share)
//   parse      gunzip + line split + JSON parse + UTF-8 check, serial (read_documents)
//   build      open_or_build_cache until finished (arguments: threads, fsync at each commit)
//   sft_rows   single-turn chats (a system, a user and an assistant message each; LEVANTER_BENCH_CHAT_DOCS records,
//              default 20000, plain JSON lines) into an sft cache: JSON parse, the roles' first messages, EOS appended,
//              prompt and prompt + response tokenized (the GPT-2 style BPE), written (argument: threads)
//   sft_pack   that cache's rows permuted and packed as upstream sft packs them into examples of 1024 tokens
//
// tests/oracle/bench_sft_data_py.py runs upstream Levanter's own code for sft_rows and sft_pack on the same file
// (docs/benchmarks.md has both side by side).
//
// Counters: MB_per_s (uncompressed JSON-lines bytes / wall time), Mtokens_per_s. Set LEVANTER_BENCH_DIR to put the
// files on another disk; LEVANTER_BENCH_CACHE_MB changes the corpus size (default 100).
#include <benchmark/benchmark.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <levanter/data/cache.hpp>
#include <levanter/data/packing.hpp>
#include <levanter/data/permutation.hpp>
#include <levanter/data/tokenizer.hpp>
#include <nlohmann/json.hpp>

namespace fs = std::filesystem;
namespace data = levanter::data;

namespace {

fs::path bench_dir() {
  const char* base = std::getenv("LEVANTER_BENCH_DIR");
  return fs::path(base ? base : fs::temp_directory_path().string()) / "levanter_bench_cache";
}

std::int64_t corpus_mb() {
  const char* v = std::getenv("LEVANTER_BENCH_CACHE_MB");
  return v ? std::max<std::int64_t>(1, std::atoll(v)) : 100;
}

// Four .jsonl.gz files of English-like text (a fixed word list, a fixed LCG), made once and reused.
struct corpus {
  std::vector<std::string> files;
  std::int64_t bytes = 0;  // uncompressed JSON-lines bytes
};

const corpus& the_corpus() {
  static corpus c = [] {
    corpus out;
    const fs::path dir = bench_dir() / ("corpus-" + std::to_string(corpus_mb()) + "MB");
    fs::create_directories(dir);
    static const char* words[] = {"the",    "of",     "and",   "to",     "in",      "a",       "is",     "that",
                                  "for",    "it",     "as",    "was",    "with",    "be",      "by",     "on",
                                  "not",    "he",     "this",  "are",    "or",      "his",     "from",   "at",
                                  "which",  "but",    "have",  "an",     "had",     "they",    "you",    "were",
                                  "model",  "token",  "cache", "train",  "levanter", "haliax", "named",  "tensor",
                                  "axis",   "résumé", "naïve", "café",   "über",    "日本語",  "数据",   "2024",
                                  "42",     "3.14",   "—",     "\\\"quoted\\\"", "line\\nbreak", "tab\\t", "GPU", "TPU"};
    const std::size_t nwords = sizeof(words) / sizeof(words[0]);
    const std::int64_t target = corpus_mb() * 1000 * 1000 / 4;
    std::uint64_t x = 12345;
    for (int f = 0; f < 4; ++f) {
      const fs::path p = dir / ("part-" + std::to_string(f) + ".jsonl.gz");
      out.files.push_back(p.string());
      const fs::path size_file = dir / ("part-" + std::to_string(f) + ".size");
      if (fs::exists(p) && fs::exists(size_file)) {
        std::int64_t n = 0;
        std::ifstream(size_file) >> n;
        out.bytes += n;
        continue;
      }
      gzFile gz = gzopen(p.c_str(), "wb6");
      std::int64_t written = 0;
      std::string line;
      while (written < target) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const std::size_t nw = 20 + (x >> 33) % 600;  // documents of ~100 B to ~4 KB
        line = "{\"id\": " + std::to_string(written) + ", \"text\": \"";
        for (std::size_t i = 0; i < nw; ++i) {
          x = x * 6364136223846793005ull + 1442695040888963407ull;
          if (i) line += ((x >> 20) % 17 == 0) ? ". " : " ";
          line += words[(x >> 33) % nwords];
        }
        line += "\"}\n";
        gzwrite(gz, line.data(), static_cast<unsigned>(line.size()));
        written += static_cast<std::int64_t>(line.size());
      }
      gzclose(gz);
      std::ofstream(size_file) << written;
      out.bytes += written;
    }
    return out;
  }();
  return c;
}

const data::tokenizer& bpe() {
  static data::tokenizer t =
      data::tokenizer::from_file((fs::path(__FILE__).parent_path().parent_path() / "tests/golden/tokenizers/gpt2_style").string());
  return t;
}

void set_rate(benchmark::State& st, double bytes, double tokens) {
  st.counters["MB_per_s"] = benchmark::Counter(bytes / 1e6, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["Mtokens_per_s"] = benchmark::Counter(tokens / 1e6, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["MB"] = bytes / 1e6;
}

void BM_read(benchmark::State& st) {
  const auto& c = the_corpus();
  for (auto _ : st) {
    std::int64_t n = 0;
    for (const auto& f : c.files) {
      data::record_reader rd(f);
      data::record r;
      while (rd.next(r)) n += static_cast<std::int64_t>(r.bytes.size());
    }
    benchmark::DoNotOptimize(n);
  }
  set_rate(st, static_cast<double>(c.bytes), 0);
}

void BM_parse(benchmark::State& st) {
  const auto& c = the_corpus();
  for (auto _ : st) {
    std::int64_t n = 0;
    data::read_documents(c.files, {}, [&](std::string_view t) { n += static_cast<std::int64_t>(t.size()); });
    benchmark::DoNotOptimize(n);
  }
  set_rate(st, static_cast<double>(c.bytes), 0);
}

template <bool Bpe>
void BM_build(benchmark::State& st) {
  const auto& c = the_corpus();
  const data::tokenizer tok = Bpe ? bpe() : data::tokenizer::byte_level();
  data::cache_options o;
  o.num_threads = static_cast<int>(st.range(0));
  o.fsync = st.range(1) != 0;
  std::int64_t tokens = 0;
  for (auto _ : st) {
    st.PauseTiming();
    const fs::path dir = bench_dir() / ("cache-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    st.ResumeTiming();
    auto cache = data::open_or_build_cache(dir.string(), c.files, {}, data::make_encode_fn(tok, true, true),
                                           data::tokenizer_metadata(tok, true, true), o);
    tokens = cache->total_tokens();
    st.PauseTiming();
    cache.reset();
    fs::remove_all(dir);
    st.ResumeTiming();
  }
  set_rate(st, static_cast<double>(c.bytes), static_cast<double>(tokens));
  st.counters["tokens"] = static_cast<double>(tokens);
  st.counters["threads"] = static_cast<double>(o.num_threads);
  st.counters["fsync"] = o.fsync ? 1 : 0;
}

// The loader side: one GPT-2-small batch (512 windows of 1024 tokens, in upstream's shuffled order: a linear
// permutation of the windows) read from a finished cache, as train_lm reads every step. Compare batches/s with
// the training step rate: GPT-2-small takes seconds per step on a CPU, so one batch per step is far below this.
void BM_load_batch(benchmark::State& st) {
  const auto& c = the_corpus();
  const fs::path dir = bench_dir() / "cache-load";
  const auto tok = data::tokenizer::byte_level();
  auto cache = data::open_or_build_cache(dir.string(), c.files, {}, data::make_encode_fn(tok, true, true),
                                         data::tokenizer_metadata(tok, true, true), {});
  const std::int64_t L = 1024, B = 512;
  const std::int64_t n = cache->total_tokens() / L;
  const auto order = data::example_order::full(data::permutation_kind::linear, static_cast<std::uint64_t>(n),
                                               haliax::random::make_key(0));
  std::vector<std::int32_t> batch(static_cast<std::size_t>(B * L));
  std::int64_t step = 0;
  for (auto _ : st) {
    for (std::int64_t r = 0; r < B; ++r) {
      const auto w = static_cast<std::int64_t>(order(static_cast<std::uint64_t>((step * B + r) % n)));
      cache->read_tokens(w * L, L, batch.data() + r * L);
    }
    benchmark::DoNotOptimize(batch.data());
    ++step;
  }
  st.counters["batches_per_second"] = benchmark::Counter(static_cast<double>(step), benchmark::Counter::kIsRate);
  st.counters["tokens_per_batch"] = static_cast<double>(B * L);
  st.counters["windows"] = static_cast<double>(n);
}


// Single-turn chat records of English-like text, made once: {"messages": [system, user, assistant]}.
const std::string& the_chat_corpus() {
  static std::string path = [] {
    const char* v = std::getenv("LEVANTER_BENCH_CHAT_DOCS");
    const std::int64_t docs = v ? std::max<std::int64_t>(1, std::atoll(v)) : 20000;
    const fs::path dir = bench_dir();
    fs::create_directories(dir);
    const fs::path p = dir / ("chat-" + std::to_string(docs) + ".jsonl");
    if (fs::exists(p)) return p.string();
    static const char* words[] = {"the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "model", "token",
                                  "answer", "question", "why", "how", "because", "train", "data", "café", "2024"};
    const std::size_t nwords = sizeof(words) / sizeof(words[0]);
    std::uint64_t x = 777;
    auto text = [&](std::size_t lo, std::size_t span) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const std::size_t nw = lo + (x >> 33) % span;
      std::string t;
      for (std::size_t i = 0; i < nw; ++i) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        if (i) t += ' ';
        t += words[(x >> 33) % nwords];
      }
      return t;
    };
    std::ofstream out(p.string() + ".tmp");
    for (std::int64_t i = 0; i < docs; ++i)
      out << nlohmann::json{{"messages", nlohmann::json::array({{{"role", "system"}, {"content", "Be helpful."}},
                                                               {{"role", "user"}, {"content", text(10, 150)}},
                                                               {{"role", "assistant"}, {"content", text(20, 300)}}})}}
                 .dump()
          << "\n";
    out.close();
    fs::rename(p.string() + ".tmp", p);
    return p.string();
  }();
  return path;
}

std::shared_ptr<data::token_cache> build_sft_cache(const fs::path& dir, int threads) {
  data::supervised_format f;
  f.messages_field = "messages";
  f.append_eos = true;
  data::source_options src;
  src.messages_field = "messages";
  data::cache_options o;
  o.num_threads = threads;
  auto cache = data::open_or_build_cache(dir.string(), {the_chat_corpus()}, src,
                                         data::make_supervised_encode_fn(bpe(), f), data::supervised_metadata(bpe(), f), o);
  cache->total_tokens();
  return cache;
}

// A cache of the chat corpus built from scratch by `build(dir, threads)` (threads: the benchmark's argument).
template <class Build>
void rows_bench(benchmark::State& st, const std::string& name, Build build) {
  the_chat_corpus();
  std::int64_t tokens = 0, docs = 0;
  for (auto _ : st) {
    st.PauseTiming();
    const fs::path dir = bench_dir() / (name + "-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    st.ResumeTiming();
    auto cache = build(dir, static_cast<int>(st.range(0)));
    tokens = cache->total_tokens();
    docs = cache->committed_docs();
    st.PauseTiming();
    cache.reset();
    fs::remove_all(dir);
    st.ResumeTiming();
  }
  st.counters["docs_per_s"] = benchmark::Counter(static_cast<double>(docs), benchmark::Counter::kIsIterationInvariantRate);
  st.counters["Mtokens_per_s"] = benchmark::Counter(tokens / 1e6, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["docs"] = static_cast<double>(docs);
  st.counters["threads"] = static_cast<double>(st.range(0));
}

// Every example of `make()` made, as the loader makes them.
template <class Make>
void pack_bench(benchmark::State& st, const data::token_cache& cache, Make make) {
  std::int64_t examples = 0, tokens = 0;
  std::vector<std::int32_t> toks(1024), seg(1024);
  std::vector<std::uint8_t> keep(1024);
  for (auto _ : st) {
    const data::packed_examples packs = make();
    examples = packs.size();
    tokens = 0;
    for (std::int64_t k = 0; k < examples; ++k) {
      packs.example(k, true, toks.data(), keep.data(), seg.data());
      for (const auto& p : packs.pieces(k)) tokens += p.n;
    }
  }
  st.counters["docs_per_s"] = benchmark::Counter(static_cast<double>(cache.committed_docs()),
                                                 benchmark::Counter::kIsIterationInvariantRate);
  st.counters["Mtokens_per_s"] = benchmark::Counter(tokens / 1e6, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["examples"] = static_cast<double>(examples);
}

void BM_sft_rows(benchmark::State& st) { rows_bench(st, "sft", build_sft_cache); }

void BM_sft_pack(benchmark::State& st) {
  const auto cache = build_sft_cache(bench_dir() / "sft-pack", 2);
  data::prompt_completion_options o;
  o.seq_len = 1024;
  o.max_seq_len = 1024;
  o.key = haliax::random::make_key(0);
  pack_bench(st, *cache, [&] { return data::packed_examples(cache, o); });
}

// Multi-turn chat (format: {type: chat}): the same corpus rendered with a Llama 3 style template (the chat_data
// golden tokenizer's own, with {% generation %} masks), tokenized, masked and cached; then packed at 1024.
const data::tokenizer& chat_tok() {
  static data::tokenizer t =
      data::tokenizer::from_file((fs::path(__FILE__).parent_path().parent_path() / "tests/golden/chat_data").string());
  return t;
}

std::shared_ptr<data::token_cache> build_chat_cache(const fs::path& dir, int threads) {
  data::source_options src;
  src.chat = true;
  src.messages_field = "messages";
  data::cache_options o;
  o.num_threads = threads;
  const std::string tmpl = *chat_tok().chat_template();
  auto cache = data::open_or_build_cache(dir.string(), {the_chat_corpus()}, src,
                                         data::make_chat_encode_fn(chat_tok(), tmpl, true),
                                         data::chat_metadata(chat_tok(), tmpl, "messages"), o);
  cache->total_tokens();
  return cache;
}

void BM_chat_rows(benchmark::State& st) { rows_bench(st, "chat", build_chat_cache); }

void BM_chat_pack(benchmark::State& st) {
  const auto cache = build_chat_cache(bench_dir() / "chat-pack", 2);
  pack_bench(st, *cache, [&] { return data::packed_examples::chat(cache, 1024, 64); });
}

}  // namespace

BENCHMARK(BM_load_batch)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_read)->Unit(benchmark::kSecond)->Iterations(1)->UseRealTime();
BENCHMARK(BM_parse)->Unit(benchmark::kSecond)->Iterations(1)->UseRealTime();
BENCHMARK(BM_build<false>)->Name("BM_build/byte")->Args({1, 1})->Args({2, 1})->Args({2, 0})->Unit(benchmark::kSecond)->Iterations(1)->UseRealTime();
BENCHMARK(BM_build<true>)->Name("BM_build/gpt2_style")->Args({1, 1})->Args({2, 1})->Unit(benchmark::kSecond)->Iterations(1)->UseRealTime();
BENCHMARK(BM_sft_rows)->Arg(1)->Arg(2)->Unit(benchmark::kSecond)->Iterations(1)->UseRealTime();
BENCHMARK(BM_sft_pack)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_chat_rows)->Arg(1)->Arg(2)->Unit(benchmark::kSecond)->Iterations(1)->UseRealTime();
BENCHMARK(BM_chat_pack)->Unit(benchmark::kMillisecond)->UseRealTime();

int main(int argc, char** argv) {
  benchmark::AddCustomContext("hardware_concurrency", std::to_string(std::thread::hardware_concurrency()));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
