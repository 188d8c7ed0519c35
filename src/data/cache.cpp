// data/cache.hpp: the tokenized data cache: ledger, commit protocol and background build.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <levanter/data/cache.hpp>
#include <levanter/data/detail/tokenizer.hpp>
#include <levanter/io/atomic_file.hpp>
#include <levanter/io/json_limits.hpp>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

namespace levanter::data {

// ---- upstream's BatchTokenizer (levanter/data/text.py) ---------------------------------------------------------

namespace {

struct bos_eos_plan {
  bool bos = false, eos = false;
};

// BatchTokenizer.__init__: a token the tokenizer lacks is not enforced; the others are added when the probe
// encode("hi there") (template applied) does not already start with BOS / end with EOS.
bos_eos_plan plan_of(const tokenizer& tok, bool enforce_bos, bool enforce_eos) {
  enforce_bos = enforce_bos && tok.bos_id().has_value();
  enforce_eos = enforce_eos && tok.eos_id().has_value();
  if (!enforce_bos && !enforce_eos) return {};
  const auto probe = tok.encode("hi there");
  return {enforce_bos && (probe.empty() || probe.front() != *tok.bos_id()),
          enforce_eos && (probe.empty() || probe.back() != *tok.eos_id())};
}

// BatchTokenizer._break_for_long_sequences for one document: while it is longer than `max_chars` characters (code
// points), it is cut at the first white space (Unicode White_Space, what the `regex` module's \s matches) at or after
// character `max_chars`, or at its end when there is none, which leaves an empty last piece, as upstream does.
std::vector<std::string_view> split_long_text(std::string_view d, std::size_t max_chars) {
  std::size_t chars = 0, len = 0;
  for (std::size_t i = 0; i < d.size(); i += len, ++chars) detail::tok::next_cp(d.data(), d.size(), i, len);
  std::vector<std::string_view> pieces;
  while (chars > max_chars) {
    std::size_t i = 0, k = 0;
    for (; k < max_chars; ++k, i += len) detail::tok::next_cp(d.data(), d.size(), i, len);
    std::size_t split = d.size(), split_chars = chars;
    for (; i < d.size(); ++k, i += len)
      if (detail::tok::cp_class(detail::tok::next_cp(d.data(), d.size(), i, len)) == detail::tok::cls_space) {
        split = i;
        split_chars = k;
        break;
      }
    pieces.push_back(d.substr(0, split));
    d.remove_prefix(split);
    chars -= split_chars;
  }
  pieces.push_back(d);
  return pieces;
}

}  // namespace

nlohmann::json tokenizer_metadata(const tokenizer& tok, bool enforce_bos, bool enforce_eos) {
  const auto plan = plan_of(tok, enforce_bos, enforce_eos);
  nlohmann::json m = {{"tokenizer", tok.name()},
                      {"tokenizer_hash", tok.content_hash()},
                      {"vocab_size", tok.vocab_size()},
                      {"return_attention_mask", false},
                      {"padding", false},
                      {"append_bos", plan.bos},
                      {"append_eos", plan.eos}};
  // Caches built before BOS/EOS were added as text (with their ids appended instead) lack this key and are refused.
  if (!tok.is_builtin()) m["bos_eos_as_text"] = true;
  return m;
}

encode_fn make_encode_fn(tokenizer tok, bool enforce_bos, bool enforce_eos, std::size_t long_text_chars) {
  const auto plan = plan_of(tok, enforce_bos, enforce_eos);
  if (tok.is_builtin()) {  // ours, no upstream equivalent: the ids themselves (the byte-level EOS has no text)
    return [tok = std::move(tok), plan](std::string_view text) {
      auto ids = tok.encode(text);
      if (plan.bos) ids.insert(ids.begin(), *tok.bos_id());
      if (plan.eos) ids.push_back(*tok.eos_id());
      return ids;
    };
  }
  const std::string prefix = plan.bos ? *tok.bos_token() + " " : std::string();
  const std::string suffix = plan.eos ? " " + *tok.eos_token() : std::string();
  const std::size_t split = tok.splits_long_texts() ? long_text_chars : 0;
  return [tok = std::move(tok), prefix, suffix, split](std::string_view text) {
    std::string d;
    d.reserve(prefix.size() + text.size() + suffix.size());
    d.append(prefix).append(text).append(suffix);
    if (split == 0) return tok.encode(d);
    std::vector<std::int32_t> ids;
    for (const auto piece : split_long_text(d, split)) {
      const auto p = tok.encode(piece);
      ids.insert(ids.end(), p.begin(), p.end());
    }
    return ids;
  };
}

namespace detail {
namespace {
void write_all(int fd, const void* p, std::size_t n, std::int64_t at, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    auto w = ::pwrite(fd, c, n, at);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw data_error("cache: cannot write '" + path + "': " + std::strerror(errno) + " (disk full?)");
    }
    c += w;
    n -= static_cast<std::size_t>(w);
    at += w;
  }
}

void read_all(int fd, void* p, std::size_t n, std::int64_t at, const std::string& path) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    auto r = ::pread(fd, c, n, at);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw data_error("cache: cannot read '" + path + "' (" + (r < 0 ? std::strerror(errno) : "short file") + ")");
    c += r;
    n -= static_cast<std::size_t>(r);
    at += r;
  }
}

std::int64_t file_size(int fd) {
  struct stat st {};
  ::fstat(fd, &st);
  return static_cast<std::int64_t>(st.st_size);
}

// Writes `j` to `path` atomically (io::write_file_atomic; with `sync`, the file and its directory are fsynced).
void commit_json(const std::string& path, const nlohmann::json& j, bool sync) {
  try {
    io::write_file_atomic(path, j.dump(1), {.sync = sync});
  } catch (const io::io_error& e) {
    throw data_error(std::string("cache: ") + e.what());
  }
}

// The first token of `ids` outside [0, vocab) (any negative one when vocab <= 0), or -1.
std::int64_t first_bad_id(const std::int32_t* ids, std::int64_t n, std::int64_t vocab) {
  const auto hi = static_cast<std::uint32_t>(vocab > 0 && vocab <= INT32_MAX ? vocab : std::int64_t{INT32_MAX} + 1);
  std::uint32_t bad = 0;  // branch-free scan; the rare hit is located afterwards
  for (std::int64_t i = 0; i < n; ++i) bad |= static_cast<std::uint32_t>(static_cast<std::uint32_t>(ids[i]) >= hi);
  if (!bad) return -1;
  for (std::int64_t i = 0; i < n; ++i)
    if (static_cast<std::uint32_t>(ids[i]) >= hi) return i;
  return -1;
}

std::string short_json(const nlohmann::json* j) { return j ? j->dump() : std::string("(absent)"); }

}  // namespace
}  // namespace detail

// Another builder holds the cache's lock (other_process: not this process's own open cache).
struct cache_busy : data_error {
  cache_busy(const std::string& m, bool other) : data_error(m), other_process(other) {}
  bool other_process;
};

// The whole cache: files, ledger and the build's threads. A member of token_cache so that destroying it (also when
// opening fails) stops and joins the threads before the files close.
struct token_cache::state {
  state(std::string dir, std::vector<std::string> files, source_options src, encode_fn encode, cache_options opts)
      : dir_(std::move(dir)), files_(std::move(files)), src_(std::move(src)), encode_(std::move(encode)), opts_(opts) {}
  state(const state&) = delete;
  state& operator=(const state&) = delete;
  ~state() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    space_cv_.notify_all();
    done_cv_.notify_all();
    for (auto& t : threads_) t.join();
    close_files();
  }

  std::int64_t committed_tokens() const { return tokens_.load(std::memory_order_acquire); }
  std::int64_t committed_docs() const { return docs_.load(std::memory_order_acquire); }
  std::int64_t skipped_documents() const {
    std::lock_guard lk(mu_);
    return skipped_;
  }
  bool finished() const { return finished_.load(std::memory_order_acquire); }

  void open(nlohmann::json metadata) {
    has_sources_ = src_.pairs();
    has_masks_ = src_.chat;
    if (!has_sources_ && !has_masks_) metadata["text_key"] = src_.text_key;  // supervised metadata names its fields itself
    names_ = shard_names(files_);
    std::filesystem::create_directories(dir_ + "/input_ids");
    const std::string ledger_path = dir_ + "/shard_ledger.json";
    bool have_ledger = std::filesystem::exists(ledger_path);
    if (have_ledger) {
      try {
        std::ifstream in(ledger_path, std::ios::binary);
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (!in && !in.eof()) throw std::runtime_error("cannot read it");
        if (io::json_depth(text, 64) > 64) throw std::runtime_error("nested deeper than 64 levels");
        ledger_ = nlohmann::json::parse(text);
        validate_ledger();
      } catch (const data_error&) {
        throw;
      } catch (const std::exception& e) {
        throw data_error("cache ledger '" + ledger_path + "' is unreadable (" + e.what() + "); delete '" + dir_ +
                         "' to rebuild the cache");
      }
      nlohmann::json cached = nlohmann::json::object();
      if (ledger_.contains("metadata") && ledger_["metadata"].contains("preprocessor_metadata"))
        cached = ledger_["metadata"]["preprocessor_metadata"];
      check_metadata(cached, metadata);
      if (!ledger_.value("is_finished", false) || !files_.empty()) check_shards();
    } else if (files_.empty()) {
      throw data_error("no cache at '" + dir_ +
                       "' and no data files to build it from (give train_urls/validation_urls)");
    }

    if (metadata.contains("vocab_size") && metadata["vocab_size"].is_number_integer())
      vocab_ = metadata["vocab_size"].get<std::int64_t>();
    // A ledger of the wrong shape (hand-edited, damaged) fails with the fix, not with a JSON type error.
    try {
      const bool done = have_ledger && ledger_.value("is_finished", false);
      open_files(done, have_ledger, metadata);
    } catch (const nlohmann::json::exception& e) {
      throw data_error("cache ledger '" + ledger_path + "' is damaged (" + e.what() + "); delete '" + dir_ +
                       "' to rebuild the cache");
    }
  }

  /// The ledger's fields have the types and relations the build writes; anything else is a damaged ledger (a
  /// hand edit, a bad copy) and refused before any field is used: a count it got wrong would make a resumed build
  /// skip or repeat documents.
  void validate_ledger() const {
    const std::string where = "cache ledger '" + dir_ + "/shard_ledger.json' is damaged: ";
    auto bad = [&](const std::string& what) {
      return data_error(where + what + "; delete '" + dir_ + "' to rebuild the cache");
    };
    if (!ledger_.is_object()) throw bad("it is not a JSON object");
    auto count = [&](const nlohmann::json& obj, const std::string& key, bool required) -> std::int64_t {
      if (!obj.contains(key)) {
        if (required) throw bad("'" + key + "' is missing");
        return 0;
      }
      const auto v = io::json_int(obj[key]);
      if (!v || *v < 0) throw bad("'" + key + "' is not a count (" + obj[key].dump() + ")");
      return *v;
    };
    auto strings = [&](const std::string& key) {
      std::vector<std::string> out;
      if (!ledger_.contains(key)) return out;
      if (!ledger_[key].is_array()) throw bad("'" + key + "' is not a list");
      for (const auto& v : ledger_[key]) {
        if (!v.is_string()) throw bad("'" + key + "' holds a " + std::string(v.type_name()));
        out.push_back(v.get<std::string>());
      }
      return out;
    };
    const std::int64_t rows = count(ledger_, "total_num_rows", true);
    if (!ledger_.contains("field_counts") || !ledger_["field_counts"].is_object()) throw bad("'field_counts' is missing");
    count(ledger_["field_counts"], "input_ids", true);
    for (const char* k : {"text_bytes", "input_bytes", "skipped_documents"}) count(ledger_, k, false);
    for (const char* k : {"min_token_id", "max_token_id"})
      if (ledger_.contains(k) && !io::json_int(ledger_[k])) throw bad(std::string("'") + k + "' is not an integer");
    if (ledger_.contains("is_finished") && !ledger_["is_finished"].is_boolean()) throw bad("'is_finished' is not a boolean");
    if (ledger_.contains("metadata") &&
        (!ledger_["metadata"].is_object() ||
         (ledger_["metadata"].contains("preprocessor_metadata") &&
          !ledger_["metadata"]["preprocessor_metadata"].is_object())))
      throw bad("'metadata' is not an object of objects");
    const auto shards = strings("shards"), finished = strings("finished_shards");
    // Chunks commit in file order: the finished shards are the first ones, in order; rows come only from them and
    // the one after them; a finished cache has finished every shard.
    if (finished.size() > shards.size() || !std::equal(finished.begin(), finished.end(), shards.begin()))
      throw bad("'finished_shards' is not a prefix of 'shards'");
    if (ledger_.value("is_finished", false) && finished.size() != shards.size())
      throw bad("it is finished but not every shard is");
    std::int64_t sum = 0, skipped = 0;
    for (const char* k : {"shard_rows", "shard_skipped"}) {
      if (!ledger_.contains(k)) continue;
      if (!ledger_[k].is_object()) throw bad(std::string("'") + k + "' is not an object");
      for (const auto& [name, v] : ledger_[k].items()) {
        const auto pos = std::find(shards.begin(), shards.end(), name) - shards.begin();
        if (pos == static_cast<std::ptrdiff_t>(shards.size())) throw bad(std::string("'") + k + "' names an unknown shard '" + name + "'");
        const auto n = count(ledger_[k], name, true);
        if (n > 0 && static_cast<std::size_t>(pos) > finished.size())
          throw bad("shard '" + name + "' has rows before the shards ahead of it are finished");
        (std::string_view(k) == "shard_rows" ? sum : skipped) += n;
      }
    }
    if (ledger_.contains("shard_skipped") && skipped != count(ledger_, "skipped_documents", false))
      throw bad("'shard_skipped' add up to " + std::to_string(skipped) + ", 'skipped_documents' says " +
                std::to_string(count(ledger_, "skipped_documents", false)));
    if (ledger_.contains("shard_rows") && sum != rows)
      throw bad("'shard_rows' add up to " + std::to_string(sum) + ", 'total_num_rows' says " + std::to_string(rows));
  }

  /// Throws data_error when one of `n` tokens read from position `at` is outside the vocabulary.
  void check_ids(const std::int32_t* ids, std::int64_t n, std::int64_t at) const {
    const auto i = detail::first_bad_id(ids, n, vocab_);
    if (i < 0) return;
    throw data_error("token cache '" + dir_ + "' is corrupt: token " + std::to_string(at + i) + " is id " +
                     std::to_string(ids[i]) + ", outside the vocabulary [0, " +
                     (vocab_ > 0 ? std::to_string(vocab_) : std::string("2^31")) +
                     ") of its tokenizer; delete '" + dir_ + "' to rebuild it");
  }

  /// Opening an existing cache: the id range its ledger records, and the tokens of a few spread-out windows.
  void check_committed_ids(std::int64_t toks) const {
    if (ledger_.contains("min_token_id") && ledger_.contains("max_token_id")) {
      const auto lo = ledger_["min_token_id"].get<std::int64_t>(), hi = ledger_["max_token_id"].get<std::int64_t>();
      if (lo < 0 || (vocab_ > 0 && hi >= vocab_))
        throw data_error("token cache '" + dir_ + "' holds ids from " + std::to_string(lo) + " to " +
                         std::to_string(hi) + " per its ledger, outside the vocabulary [0, " +
                         std::to_string(vocab_) + ") of its tokenizer; delete '" + dir_ + "' to rebuild it");
    }
    constexpr std::int64_t window = 1 << 14;
    std::vector<std::int32_t> buf(window);
    for (const std::int64_t start : {std::int64_t{0}, toks / 2, toks - window}) {
      const std::int64_t a = std::clamp<std::int64_t>(start, 0, toks), n = std::min(window, toks - a);
      if (n <= 0) continue;
      detail::read_all(data_fd_, buf.data(), static_cast<std::size_t>(n) * 4, a * 4, data_path());
      check_ids(buf.data(), n, a);
    }
  }

  void close_files() {
    for (int* fd : {&data_fd_, &offsets_fd_, &lock_fd_, &sources_fd_, &masks_fd_})
      if (*fd >= 0) ::close(*fd), *fd = -1;
  }

  void open_files(bool done, bool have_ledger, const nlohmann::json& metadata) {
    const std::string ledger_path = dir_ + "/shard_ledger.json";
    if (!done) {
      lock_fd_ = ::open((dir_ + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (lock_fd_ < 0) throw data_error("cache '" + dir_ + "': cannot create its lock file (" + std::strerror(errno) + ")");
      if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
        char buf[64] = {};
        const auto n = ::pread(lock_fd_, buf, sizeof buf - 1, 0);
        const bool ours = n > 0 && std::string(buf, static_cast<std::size_t>(n)) == std::to_string(::getpid()) + "\n";
        throw cache_busy("cache '" + dir_ + "' is being built by " +
                             (ours ? std::string("another open cache object of this process")
                                   : std::string("another process")) +
                             "; wait for it or use another cache_dir",
                         !ours);
      }
      // The builder's pid, so that this process can tell its own lock from another's.
      const std::string me = std::to_string(::getpid()) + "\n";
      if (::ftruncate(lock_fd_, 0) != 0 || ::pwrite(lock_fd_, me.data(), me.size(), 0) < 0) {
        // only informative
      }
    }
    data_fd_ = ::open(data_path().c_str(), (done ? O_RDONLY : O_RDWR | O_CREAT) | O_CLOEXEC, 0644);
    offsets_fd_ = ::open(offsets_path().c_str(), (done ? O_RDONLY : O_RDWR | O_CREAT) | O_CLOEXEC, 0644);
    if (has_sources_) {
      std::filesystem::create_directories(dir_ + "/sources_len");
      sources_fd_ = ::open(sources_path().c_str(), (done ? O_RDONLY : O_RDWR | O_CREAT) | O_CLOEXEC, 0644);
    }
    if (has_masks_) {
      std::filesystem::create_directories(dir_ + "/assistant_masks");
      masks_fd_ = ::open(masks_path().c_str(), (done ? O_RDONLY : O_RDWR | O_CREAT) | O_CLOEXEC, 0644);
    }
    if (data_fd_ < 0 || offsets_fd_ < 0 || (has_sources_ && sources_fd_ < 0) || (has_masks_ && masks_fd_ < 0))
      throw data_error("cache '" + dir_ + "': cannot open its token files (" + std::strerror(errno) +
                       "); delete the directory to rebuild");

    if (!have_ledger) {
      ledger_ = {{"total_num_rows", 0},
                 {"shard_rows", nlohmann::json::object()},
                 {"is_finished", false},
                 {"finished_shards", nlohmann::json::array()},
                 {"field_counts", {{"input_ids", 0}}},
                 {"metadata", {{"preprocessor_metadata", metadata}}},
                 {"format", "levanter-cpp-token-cache-1"},
                 {"shards", names_},
                 {"shard_skipped", nlohmann::json::object()},
                 {"text_bytes", 0},
                 {"input_bytes", 0},
                 {"skipped_documents", 0}};
      for (const auto& n : names_) ledger_["shard_rows"][n] = 0, ledger_["shard_skipped"][n] = 0;
    }
    const std::int64_t rows = ledger_.value("total_num_rows", std::int64_t{0});
    const std::int64_t toks = ledger_["field_counts"].value("input_ids", std::int64_t{0});
    if (rows < 0 || toks < 0 || rows > (INT64_MAX >> 4) || toks > (INT64_MAX >> 4))
      throw data_error("cache ledger of '" + dir_ + "' is damaged: it counts " + std::to_string(rows) + " rows and " +
                       std::to_string(toks) + " tokens; delete '" + dir_ + "' to rebuild the cache");
    if (detail::file_size(offsets_fd_) < rows * 8 || detail::file_size(data_fd_) < toks * 4 ||
        (has_sources_ && detail::file_size(sources_fd_) < rows * 4) ||
        (has_masks_ && detail::file_size(masks_fd_) < toks))
      throw data_error("cache '" + dir_ +
                       "' is damaged: its files are shorter than its ledger says; delete it to rebuild");
    if (rows > 0) {
      std::int64_t last = 0;
      detail::read_all(offsets_fd_, &last, 8, (rows - 1) * 8, offsets_path());
      if (last != toks)
        throw data_error("cache '" + dir_ + "' is damaged: offsets and ledger disagree; delete it to rebuild");
    } else if (toks != 0) {
      // Tokens but no row to hold them (a fuzz finding): the rows would not tile the tokens.
      throw data_error("cache '" + dir_ + "' is damaged: its ledger counts " + std::to_string(toks) +
                       " tokens but no rows; delete it to rebuild");
    }
    check_committed_ids(toks);
    text_bytes_ = ledger_.value("text_bytes", std::int64_t{0});
    skipped_ = ledger_.value("skipped_documents", std::int64_t{0});
    input_bytes_ = ledger_.value("input_bytes", std::int64_t{0});
    docs_.store(rows, std::memory_order_release);
    tokens_.store(toks, std::memory_order_release);
    if (done) {
      finished_.store(true, std::memory_order_release);
      return;
    }
    // Bytes past the last commit come from a build that was killed: drop them.
    if (::ftruncate(data_fd_, toks * 4) != 0 || ::ftruncate(offsets_fd_, rows * 8) != 0 ||
        (has_sources_ && ::ftruncate(sources_fd_, rows * 4) != 0) || (has_masks_ && ::ftruncate(masks_fd_, toks) != 0))
      throw data_error("cache '" + dir_ + "': cannot truncate its uncommitted tail: " + std::strerror(errno));
    if (!have_ledger) detail::commit_json(ledger_path, ledger_, opts_.fsync);
    // What the reader thread needs from the ledger, copied now: the committer owns the ledger from here on.
    const auto done_shards = ledger_["finished_shards"].get<std::vector<std::string>>();
    for (const auto& n : names_) {
      resume_done_.push_back(std::find(done_shards.begin(), done_shards.end(), n) != done_shards.end());
      resume_skip_.push_back(ledger_["shard_rows"].value(n, std::int64_t{0}) +
                             ledger_["shard_skipped"].value(n, std::int64_t{0}));
    }
    start_build();
  }

  struct chunk {
    std::size_t shard = 0;
    bool last_in_shard = false;
    std::vector<record> records;
    std::vector<std::int32_t> tokens;
    std::vector<std::int64_t> ends;  // row ends relative to the chunk
    std::vector<std::int32_t> sources;  // supervised rows: each row's sources_len
    std::vector<std::uint8_t> masks;     // chat rows: each token's assistant mask
    std::int64_t text_bytes = 0, skipped = 0, input_bytes = 0;
    std::exception_ptr error;
    bool done = false;
  };

  std::string data_path() const { return dir_ + "/input_ids/data.bin"; }
  std::string offsets_path() const { return dir_ + "/input_ids/offsets.bin"; }
  std::string sources_path() const { return dir_ + "/sources_len/data.bin"; }
  std::string masks_path() const { return dir_ + "/assistant_masks/data.bin"; }

  void check_metadata(const nlohmann::json& cached, const nlohmann::json& now) const {
    std::string diffs;
    // The same tokenizer file under another path (relative vs absolute, moved) is the same tokenizer.
    const bool same_tokenizer = cached.contains("tokenizer_hash") && now.contains("tokenizer_hash") &&
                                cached["tokenizer_hash"] == now["tokenizer_hash"];
    auto visit = [&](const std::string& k) {
      if (k == "tokenizer" && same_tokenizer) return;
      const nlohmann::json* a = cached.contains(k) ? &cached[k] : nullptr;
      const nlohmann::json* b = now.contains(k) ? &now[k] : nullptr;
      if (a && b && *a == *b) return;
      if (!diffs.empty()) diffs += ", ";
      diffs += k + ": cached " + detail::short_json(a) + ", now " + detail::short_json(b);
    };
    for (auto it = cached.begin(); it != cached.end(); ++it) visit(it.key());
    for (auto it = now.begin(); it != now.end(); ++it)
      if (!cached.contains(it.key())) visit(it.key());
    if (!diffs.empty())
      throw data_error("cache '" + dir_ + "' was built with other preprocessing settings (" + diffs + "); delete '" +
                       dir_ + "' or set data.cache_dir to another directory");
  }

  void check_shards() const {
    const auto cached = ledger_.value("shards", std::vector<std::string>{});
    if (cached == names_) return;
    std::string a = cached.empty() ? "(none)" : cached.front() + (cached.size() > 1 ? ", ..." : "");
    std::string b = names_.empty() ? "(none)" : names_.front() + (names_.size() > 1 ? ", ..." : "");
    throw data_error("cache '" + dir_ + "' was built from other data files (" + std::to_string(cached.size()) +
                     " shards: " + a + "; now " + std::to_string(names_.size()) + ": " + b + "); delete '" + dir_ +
                     "' or set data.cache_dir to another directory");
  }

  void start_build() {
    const int workers =
        opts_.num_threads > 0 ? opts_.num_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    max_in_flight_ = static_cast<std::size_t>(2 * workers + 2);
    threads_.emplace_back([this] { guarded([this] { produce(); }); });
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { work(); });
    threads_.emplace_back([this] { guarded([this] { commit_loop(); }); });
  }

  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (...) {
      fail(std::current_exception());
    }
  }

  void fail(std::exception_ptr e) {
    {
      std::lock_guard lk(mu_);
      if (!error_) error_ = e;
      stop_ = true;
    }
    work_cv_.notify_all();
    space_cv_.notify_all();
    done_cv_.notify_all();
    commit_cv_.notify_all();
  }

  // Reads records in file order into chunks (one reader: file order is commit order).
  void produce() {
    auto push = [&](std::shared_ptr<chunk> c) {
      std::unique_lock lk(mu_);
      space_cv_.wait(lk, [&] { return stop_ || pending_.size() < max_in_flight_; });
      if (stop_) return false;
      pending_.push_back(c);
      if (c->done)
        done_cv_.notify_all();
      else {
        work_.push_back(c);
        work_cv_.notify_one();
      }
      return true;
    };
    for (std::size_t s = 0; s < files_.size(); ++s) {
      if (resume_done_[s]) continue;
      auto c = std::make_shared<chunk>();
      c->shard = s;
      std::int64_t bytes_left = 0;
      try {
        record_reader rd(files_[s]);
        std::int64_t skip = resume_skip_[s];
        record r;
        std::int64_t bytes = 0;
        while (rd.next(r)) {
          if (skip > 0) {
            --skip;
            continue;
          }
          bytes += static_cast<std::int64_t>(r.bytes.size()) + 1;
          c->records.push_back(std::move(r));
          r = record{};
          if (static_cast<std::int64_t>(c->records.size()) >= opts_.docs_per_chunk || bytes >= opts_.bytes_per_chunk) {
            c->input_bytes = bytes;
            if (!push(c)) return;
            c = std::make_shared<chunk>();
            c->shard = s;
            bytes = 0;
          }
        }
        bytes_left = bytes;
        if (skip > 0)
          throw data_error("cache '" + dir_ + "': data file '" + files_[s] +
                           "' has fewer documents than the cache already holds from it (was it changed?); delete the "
                           "cache to rebuild");
      } catch (...) {
        c->records.clear();
        c->error = std::current_exception();
        c->done = true;
        push(c);
        return;
      }
      c->last_in_shard = true;
      c->input_bytes = bytes_left;
      if (!push(c)) return;
    }
    std::lock_guard lk(mu_);
    producer_done_ = true;
    done_cv_.notify_all();
  }

  void work() {
    std::string text;
    while (true) {
      std::shared_ptr<chunk> c;
      {
        std::unique_lock lk(mu_);
        work_cv_.wait(lk, [&] { return stop_ || !work_.empty(); });
        if (stop_) return;
        c = work_.front();
        work_.pop_front();
      }
      try {
        const std::string& path = files_[c->shard];
        const file_format fmt = format_of(path);
        for (const auto& r : c->records) {
          auto err = decode_document(path, fmt, r, src_, text);
          if (!err.empty()) {
            if (src_.on_bad_document == bad_document_policy::stop)
              throw data_error(err + " (set data.bad_documents: skip to leave such lines out and count them)");
            ++c->skipped;
            continue;
          }
          auto ids = encode_(text);
          auto from = ids.begin();
          if (has_sources_) {  // [sources_len, ids...]: the first value is stored apart from the tokens
            if (ids.empty() || ids.front() < 0)
              throw data_error("cache '" + dir_ + "': the supervised encode function returned no sources_len");
            c->sources.push_back(ids.front());
            ++from;
          }
          auto to = ids.end();
          if (has_masks_) {  // [n, ids (n), masks (n)]: the masks are stored apart from the tokens
            const std::int64_t n = ids.empty() ? -1 : ids.front();
            if (n < 0 || static_cast<std::int64_t>(ids.size()) != 1 + 2 * n)
              throw data_error("cache '" + dir_ + "': the chat encode function returned a malformed row");
            ++from;
            to = from + n;
            for (auto m = to; m != ids.end(); ++m) {
              if (*m != 0 && *m != 1)
                throw data_error("cache '" + dir_ + "': the chat encode function returned a mask value not 0 or 1");
              c->masks.push_back(static_cast<std::uint8_t>(*m));
            }
          }
          c->tokens.insert(c->tokens.end(), from, to);
          c->ends.push_back(static_cast<std::int64_t>(c->tokens.size()));
          c->text_bytes += static_cast<std::int64_t>(text.size());
        }
      } catch (...) {
        c->error = std::current_exception();
      }
      c->records = {};
      {
        std::lock_guard lk(mu_);
        c->done = true;
      }
      done_cv_.notify_all();
    }
  }

  // Commits chunks strictly in order: data (synced), then offsets (synced), then the ledger, then the counts.
  void commit_loop() {
    const std::string ledger_path = dir_ + "/shard_ledger.json";
    while (true) {
      std::shared_ptr<chunk> c;
      {
        std::unique_lock lk(mu_);
        done_cv_.wait(lk, [&] {
          return stop_ || (!pending_.empty() && pending_.front()->done) || (pending_.empty() && producer_done_);
        });
        if (stop_) return;
        if (pending_.empty()) break;
        c = pending_.front();
        pending_.pop_front();
      }
      space_cv_.notify_one();
      if (c->error) std::rethrow_exception(c->error);
      const std::int64_t rows = committed_docs(), toks = committed_tokens();
      const auto n = static_cast<std::int64_t>(c->ends.size());
      const auto ntok = static_cast<std::int64_t>(c->tokens.size());
      if (ntok > 0) {
        check_ids(c->tokens.data(), ntok, toks);  // an encode function's bug must not become a corrupt cache
        const auto [lo, hi] = std::minmax_element(c->tokens.begin(), c->tokens.end());
        ledger_["min_token_id"] = std::min<std::int64_t>(*lo, ledger_.value("min_token_id", std::int64_t{*lo}));
        ledger_["max_token_id"] = std::max<std::int64_t>(*hi, ledger_.value("max_token_id", std::int64_t{*hi}));
      }
      if (n > 0) {
        detail::write_all(data_fd_, c->tokens.data(), c->tokens.size() * 4, toks * 4, data_path());
        if (opts_.fsync) ::fdatasync(data_fd_);
        for (auto& e : c->ends) e += toks;
        detail::write_all(offsets_fd_, c->ends.data(), c->ends.size() * 8, rows * 8, offsets_path());
        if (opts_.fsync) ::fdatasync(offsets_fd_);
        if (has_sources_) {
          detail::write_all(sources_fd_, c->sources.data(), c->sources.size() * 4, rows * 4, sources_path());
          if (opts_.fsync) ::fdatasync(sources_fd_);
        }
        if (has_masks_) {
          detail::write_all(masks_fd_, c->masks.data(), c->masks.size(), toks, masks_path());
          if (opts_.fsync) ::fdatasync(masks_fd_);
        }
      }
      const std::string& name = names_[c->shard];
      ledger_["total_num_rows"] = rows + n;
      ledger_["field_counts"]["input_ids"] = toks + ntok;
      ledger_["shard_rows"][name] = ledger_["shard_rows"].value(name, std::int64_t{0}) + n;
      ledger_["shard_skipped"][name] = ledger_["shard_skipped"].value(name, std::int64_t{0}) + c->skipped;
      if (c->last_in_shard) ledger_["finished_shards"].push_back(name);
      {
        std::lock_guard lk(mu_);
        text_bytes_ += c->text_bytes;
        skipped_ += c->skipped;
        input_bytes_ += c->input_bytes;
        ledger_["input_bytes"] = input_bytes_;
        ledger_["text_bytes"] = text_bytes_;
        ledger_["skipped_documents"] = skipped_;
      }
      if (n > 0 || c->skipped > 0 || c->last_in_shard) detail::commit_json(ledger_path, ledger_, opts_.fsync);
      {
        std::lock_guard lk(mu_);
        tokens_.store(toks + ntok, std::memory_order_release);
        docs_.store(rows + n, std::memory_order_release);
      }
      commit_cv_.notify_all();
    }
    if (committed_docs() == 0) {
      std::int64_t sk = skipped_documents();
      throw data_error("no documents in the " + std::to_string(files_.size()) + " data file(s) of cache '" + dir_ +
                       "'" + (sk ? " (" + std::to_string(sk) + " bad ones skipped)" : std::string()) +
                       "; check the files and data.text_key");
    }
    ledger_["is_finished"] = true;
    detail::commit_json(ledger_path, ledger_, opts_.fsync);
    {
      std::lock_guard lk(mu_);
      finished_.store(true, std::memory_order_release);
    }
    // Finished: nothing more is written, so processes waiting to read the cache may open it now.
    if (lock_fd_ >= 0) ::flock(lock_fd_, LOCK_UN);
    commit_cv_.notify_all();
  }

  std::string dir_;
  std::vector<std::string> files_, names_;
  source_options src_;
  encode_fn encode_;
  cache_options opts_;
  nlohmann::json ledger_;  // owned by the committer thread once the build runs
  std::int64_t vocab_ = 0;  // the tokenizer's vocabulary size from the metadata; 0 when unknown
  int data_fd_ = -1, offsets_fd_ = -1, lock_fd_ = -1;
  int sources_fd_ = -1;       // supervised rows: int32 sources_len per row
  bool has_sources_ = false;  // source_options::pairs(): rows of supervised records
  int masks_fd_ = -1;         // chat rows: one byte (0 or 1) per token, the assistant mask
  bool has_masks_ = false;    // source_options::chat: rows of multi-turn chat records
  std::vector<bool> resume_done_;
  std::vector<std::int64_t> resume_skip_;

  mutable std::mutex mu_;
  mutable std::condition_variable commit_cv_;
  std::condition_variable work_cv_, space_cv_, done_cv_;
  std::deque<std::shared_ptr<chunk>> pending_, work_;
  std::size_t max_in_flight_ = 4;
  bool stop_ = false, producer_done_ = false;
  std::exception_ptr error_;
  std::int64_t text_bytes_ = 0, skipped_ = 0, input_bytes_ = 0;
  std::atomic<std::int64_t> tokens_{0}, docs_{0};
  std::atomic<bool> finished_{false};
  std::vector<std::thread> threads_;
};

token_cache::token_cache(std::string dir, std::vector<std::string> files, source_options src, encode_fn encode,
                         const nlohmann::json& metadata, cache_options opts)
    : s_(std::make_unique<state>(std::move(dir), std::move(files), std::move(src), std::move(encode), opts)) {
  s_->open(metadata);
}

token_cache::~token_cache() = default;

std::int64_t token_cache::committed_tokens() const { return s_->committed_tokens(); }
std::int64_t token_cache::committed_docs() const { return s_->committed_docs(); }
std::int64_t token_cache::doc_bytes() const {
  std::lock_guard lk(s_->mu_);
  return s_->text_bytes_;
}
std::int64_t token_cache::input_bytes() const {
  std::lock_guard lk(s_->mu_);
  return s_->input_bytes_;
}
std::int64_t token_cache::skipped_documents() const { return s_->skipped_documents(); }
bool token_cache::finished() const { return s_->finished(); }
const std::string& token_cache::dir() const { return s_->dir_; }

std::int64_t token_cache::wait_for_tokens(std::int64_t n) const {
  auto& s = *s_;
  std::unique_lock lk(s.mu_);
  s.commit_cv_.wait(lk, [&] { return s.committed_tokens() >= n || s.finished() || s.error_ || s.stop_; });
  if (s.error_) std::rethrow_exception(s.error_);
  return s.committed_tokens();
}

std::int64_t token_cache::total_tokens() const {
  auto& s = *s_;
  std::unique_lock lk(s.mu_);
  s.commit_cv_.wait(lk, [&] { return s.finished() || s.error_ || s.stop_; });
  if (s.error_) std::rethrow_exception(s.error_);
  return s.committed_tokens();
}

void token_cache::read_tokens(std::int64_t start, std::int64_t count, std::int32_t* out) const {
  const auto have = committed_tokens();
  if (start < 0 || count < 0 || start + count > have)
    throw std::out_of_range("token_cache::read_tokens: [" + std::to_string(start) + ", " +
                            std::to_string(start + count) + ") is beyond the " + std::to_string(have) +
                            " committed tokens of '" + s_->dir_ + "'");
  detail::read_all(s_->data_fd_, out, static_cast<std::size_t>(count) * 4, start * 4, s_->data_path());
  s_->check_ids(out, count, start);
}

std::pair<std::int64_t, std::int64_t> token_cache::row_range(std::int64_t row) const {
  if (row < 0 || row >= committed_docs())
    throw std::out_of_range("token_cache::row_range: row " + std::to_string(row) + " is not committed in '" + s_->dir_ +
                            "'");
  std::int64_t ends[2] = {0, 0};
  if (row == 0)
    detail::read_all(s_->offsets_fd_, &ends[1], 8, 0, s_->offsets_path());
  else
    detail::read_all(s_->offsets_fd_, ends, 16, (row - 1) * 8, s_->offsets_path());
  return {ends[0], ends[1]};
}

bool token_cache::has_sources_len() const { return s_->has_sources_; }
bool token_cache::has_assistant_masks() const { return s_->has_masks_; }

void token_cache::read_masks(std::int64_t start, std::int64_t count, std::uint8_t* out) const {
  if (!s_->has_masks_) throw data_error("cache '" + s_->dir_ + "' holds no chat rows, so no assistant masks");
  if (start < 0 || count < 0 || start + count > committed_tokens())
    throw std::out_of_range("token_cache::read_masks: tokens [" + std::to_string(start) + ", " +
                            std::to_string(start + count) + ") are not committed in '" + s_->dir_ + "'");
  if (count == 0) return;
  detail::read_all(s_->masks_fd_, out, static_cast<std::size_t>(count), start, s_->masks_path());
  for (std::int64_t i = 0; i < count; ++i)
    if (out[i] > 1)
      throw data_error("cache '" + s_->dir_ + "' is damaged: an assistant mask is not 0 or 1; delete it to rebuild");
}

std::vector<std::int64_t> token_cache::row_ends() const {
  std::vector<std::int64_t> ends(static_cast<std::size_t>(committed_docs()));
  if (!ends.empty()) detail::read_all(s_->offsets_fd_, ends.data(), ends.size() * 8, 0, s_->offsets_path());
  for (std::size_t i = 0; i < ends.size(); ++i)
    if (ends[i] < (i ? ends[i - 1] : 0) || ends[i] > committed_tokens())
      throw data_error("cache '" + s_->dir_ + "' is damaged: its row offsets are not in order; delete it to rebuild");
  return ends;
}

std::vector<std::int32_t> token_cache::sources_lens() const {
  if (!s_->has_sources_) throw data_error("cache '" + s_->dir_ + "' holds text rows, not supervised ones");
  std::vector<std::int32_t> out(static_cast<std::size_t>(committed_docs()));
  if (!out.empty()) detail::read_all(s_->sources_fd_, out.data(), out.size() * 4, 0, s_->sources_path());
  for (auto v : out)
    if (v < 0)
      throw data_error("cache '" + s_->dir_ + "' is damaged: a negative sources_len; delete it to rebuild");
  return out;
}

std::shared_ptr<token_cache> open_or_build_cache(const std::string& split_dir, const std::vector<std::string>& files,
                                                 const source_options& src, encode_fn encode,
                                                 const nlohmann::json& preprocessor_metadata,
                                                 const cache_options& opts) {
  for (bool said = false;;) {
    try {
      return std::make_shared<token_cache>(split_dir, files, src, encode, preprocessor_metadata, opts);
    } catch (const cache_busy& busy) {
      if (!busy.other_process || !opts.wait_for_builder) throw data_error(busy.what());
      // One builder per cache: wait until the other process finishes (or dies: the kernel releases its lock),
      // then open again, finding the cache finished (or resumable).
      if (!said && opts.log) opts.log("cache " + split_dir + " is being built by another process; waiting for it");
      said = true;
      const int fd = ::open((split_dir + "/.lock").c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) continue;
      while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
      }
      ::flock(fd, LOCK_UN);
      ::close(fd);
    }
  }
}

}  // namespace levanter::data
