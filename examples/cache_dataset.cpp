// cache_dataset: tokenizes the train and validation files into the cache `train_lm` reads (upstream
// levanter.main.cache_dataset), with a progress bar on stderr. An interrupted run resumes where it stopped; a
// finished cache is left as it is.
//
//   cache_dataset --train_urls '["data/train-{000..015}.jsonl.zst"]' --validation_urls '["data/valid.jsonl"]'
//                 --cache_dir cache/ --tokenizer tests/golden/tokenizers/gpt2_style --num_threads 2
#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include <levanter/config/cli.hpp>
#include <levanter/data/cache.hpp>
#include <levanter/data/tokenizer.hpp>
#include <nlohmann/json.hpp>

namespace levanter {

/// upstream RayCachedLMDatasetConfig (the data keys of a single-source LM dataset, flat), plus the build options.
struct CacheDatasetConfig {
  std::string tokenizer = "byte";
  std::optional<int64_t> vocab_size;
  std::string cache_dir = "cache/";
  std::vector<std::string> train_urls;
  std::vector<std::string> validation_urls;
  std::optional<std::string> text_key;
  bool enforce_eos = true;
  bool enforce_bos = true;
  int64_t num_threads = 0;
  int64_t docs_per_chunk = 1024;
  std::string bad_documents = "stop";
  config::Opaque cache_options;
  config::Opaque tracker;
  config::Opaque ray;
};

}  // namespace levanter

template <>
struct levanter::config::schema<levanter::CacheDatasetConfig> {
  using T = levanter::CacheDatasetConfig;
  static constexpr auto fields = std::make_tuple(
      field("tokenizer", &T::tokenizer, "'byte' (built in), 'passthrough', or a tokenizer.json file or directory"),
      field("vocab_size", &T::vocab_size, "vocabulary size (passthrough tokenizer)"),
      field("cache_dir", &T::cache_dir, "cache root: splits go to <cache_dir>/train and <cache_dir>/validation"),
      field("train_urls", &T::train_urls, "training files: local paths, globs, {a..b} ranges; .jsonl/.json/.txt[.gz|.zst]"),
      field("validation_urls", &T::validation_urls, "validation files (same forms)"),
      field("text_key", &T::text_key, "JSON field holding the text (default 'text')"),
      field("enforce_eos", &T::enforce_eos, "append EOS to each document when the tokenizer does not"),
      field("enforce_bos", &T::enforce_bos, "prepend BOS to each document when the tokenizer has one and does not"),
      field("num_threads", &T::num_threads, "tokenizing threads (0: one per core); the cache is the same for any count"),
      field("docs_per_chunk", &T::docs_per_chunk, "documents per work unit and commit"),
      field("bad_documents", &T::bad_documents, "malformed line / missing field / invalid UTF-8: stop or skip"),
      field("cache_options", &T::cache_options, "upstream CacheOptions (Ray sharding; accepted, not used)"),
      field("tracker", &T::tracker, "upstream tracker (accepted, not used)"),
      field("ray", &T::ray, "upstream Ray settings (accepted, not used)"));
};

namespace {

std::string human(double v, const char* unit) {
  const char* prefixes[] = {"", "k", "M", "G", "T"};
  int i = 0;
  while (v >= 1000 && i < 4) v /= 1000, ++i;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f %s%s", v, prefixes[i], unit);
  return buf;
}

std::int64_t known_size(const std::vector<std::string>& files) {
  std::int64_t total = 0;
  for (const auto& f : files) {
    std::string comp;
    levanter::data::format_of(f, &comp);
    if (!comp.empty()) return -1;  // compressed: the decompressed size is not known up front
    total += static_cast<std::int64_t>(std::filesystem::file_size(f));
  }
  return total;
}

void build_split(const std::string& split, const std::vector<std::string>& urls, const levanter::CacheDatasetConfig& cfg,
                 const levanter::data::tokenizer& tok) {
  namespace data = levanter::data;
  const std::string dir = (std::filesystem::path(cfg.cache_dir) / split).string();
  if (urls.empty()) {
    std::cerr << "cache_dataset: no " << split << "_urls, skipping " << split << "\n";
    return;
  }
  auto files = data::expand_urls(urls);
  data::source_options src;
  src.text_key = cfg.text_key.value_or("text");
  src.on_bad_document = data::parse_bad_document_policy(cfg.bad_documents);
  data::cache_options opts;
  opts.num_threads = static_cast<int>(cfg.num_threads);
  opts.docs_per_chunk = cfg.docs_per_chunk;
  auto cache = data::open_or_build_cache(dir, files, src, data::make_encode_fn(tok, cfg.enforce_bos, cfg.enforce_eos),
                                         data::tokenizer_metadata(tok, cfg.enforce_bos, cfg.enforce_eos), opts);
  if (cache->finished()) {
    std::cerr << "cache_dataset: " << dir << " is already finished (" << cache->committed_docs() << " documents, "
              << cache->committed_tokens() << " tokens)\n";
    return;
  }
  std::cerr << "cache_dataset: caching " << split << " (" << files.size() << " files) to " << dir << "\n";
  const std::int64_t total = known_size(files);
  const std::int64_t start_bytes = cache->input_bytes();
  const auto t0 = std::chrono::steady_clock::now();
  const bool tty = ::isatty(2);
  auto line = [&](bool final) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::int64_t in = cache->input_bytes();
    const double rate = s > 0 ? static_cast<double>(in - start_bytes) / s : 0.0;
    std::string msg = "  " + split + ": " + std::to_string(cache->committed_docs()) + " docs, " +
                      human(static_cast<double>(cache->committed_tokens()), "tokens") + ", " + human(rate, "B/s");
    if (total > 0) {
      char pct[32];
      std::snprintf(pct, sizeof pct, ", %.1f%%", 100.0 * static_cast<double>(in) / static_cast<double>(total));
      msg += pct;
      if (!final && rate > 0) msg += ", ETA " + std::to_string(static_cast<long>(static_cast<double>(total - in) / rate)) + " s";
    }
    if (cache->skipped_documents()) msg += ", " + std::to_string(cache->skipped_documents()) + " bad documents skipped";
    std::cerr << (tty ? "\r\033[K" : "") << msg << (tty && !final ? "" : "\n") << std::flush;
  };
  // Poll (a failed build rethrows from wait_for_tokens), print every 0.2 s on a terminal, every 5 s in a log.
  const auto every = std::chrono::milliseconds(tty ? 200 : 5000);
  auto last = std::chrono::steady_clock::now();
  while (!cache->finished()) {
    cache->wait_for_tokens(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (std::chrono::steady_clock::now() - last >= every && !cache->finished()) {
      line(false);
      last = std::chrono::steady_clock::now();
    }
  }
  line(true);
  std::cerr << "cache_dataset: finished " << split << " in " << dir << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto parsed = levanter::config::parse_command_line<levanter::CacheDatasetConfig>(argc, argv, "{}", "<defaults>");
    if (parsed.help) {
      std::cout << levanter::config::help_text<levanter::CacheDatasetConfig>("cache_dataset");
      return 0;
    }
    if (parsed.dry_run) {
      std::cout << parsed.resolved_yaml;
      return 0;
    }
    const auto& cfg = parsed.config;
    if (cfg.train_urls.empty() && cfg.validation_urls.empty())
      throw levanter::config::config_error("give train_urls and/or validation_urls, e.g. --train_urls '[\"data/*.jsonl\"]'");
    namespace data = levanter::data;
    const data::tokenizer tok = cfg.tokenizer == "byte"          ? data::tokenizer::byte_level()
                                : cfg.tokenizer == "passthrough" ? data::tokenizer::passthrough(cfg.vocab_size.value_or(0))
                                                                 : data::tokenizer::from_file(cfg.tokenizer);
    build_split("train", cfg.train_urls, cfg, tok);
    build_split("validation", cfg.validation_urls, cfg, tok);
    return 0;
  } catch (const levanter::config::config_error& e) {
    std::cerr << "cache_dataset: config error: " << e.what() << "\n";
    return 2;
  } catch (const levanter::data::data_error& e) {
    std::cerr << "cache_dataset: data error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "cache_dataset: " << e.what() << "\n";
    return 1;
  }
}
