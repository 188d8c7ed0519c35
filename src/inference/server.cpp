// The OpenAI-compatible server (levanter/inference/server.hpp): request parsing and checks, the engine that steps
// every admitted sequence in turn, and the HTTP endpoints (cpp-httplib), whole or streamed.
#include <levanter/inference/server.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <ctime>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <levanter/config/yaml.hpp>
#include <levanter/data/jinja.hpp>

#if LEVANTER_HAVE_HTTPLIB
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <httplib.h>
#endif

namespace levanter {

#if !LEVANTER_HAVE_HTTPLIB

void serve(const server_options&, const data::tokenizer&, logits_fn, std::int64_t, std::ostream&,
           const std::function<bool()>&) {
  throw config::config_error("serve_lm was built without cpp-httplib: install it (Debian: apt-get install "
                             "libcpp-httplib-dev, or scripts/setup-debian.sh) and rebuild");
}

#else

namespace {

using json = nlohmann::json;
// Generated text need not be valid UTF-8 (a byte tokenizer, a token cut mid-character): JSON gets U+FFFD there.
constexpr auto lossy = json::error_handler_t::replace;

/// A request the client got wrong: answered with `status` and OpenAI's error object.
struct request_error : std::runtime_error {
  int status;
  std::string param, code;
  request_error(int s, const std::string& msg, std::string p = {}, std::string c = {})
      : std::runtime_error(msg), status(s), param(std::move(p)), code(std::move(c)) {}
};

json error_body(const std::string& message, const std::string& type, const std::string& param = {},
                const std::string& code = {}) {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return json{{"error", e}};
}

/// One piece of a sequence's output: new text (may be empty), the tokens chosen since the last piece with their
/// log-probabilities, and, on its last piece, why it ended.
struct piece {
  std::size_t choice = 0;
  std::string text;
  std::vector<std::int32_t> tokens;
  std::vector<double> logprobs;
  std::string finish_reason;  ///< empty until the last piece
};

/// Between a request's HTTP thread and the engine: the pieces made so far, and whether the client left.
struct channel {
  std::mutex m;
  std::condition_variable cv;
  std::deque<piece> pieces;
  std::size_t running = 0;  ///< sequences not finished
  std::string error;        ///< the engine failed (or is shutting down)
  std::atomic<bool> cancelled{false};
};

/// A request as the engine takes it: one sequence per (prompt, generation).
struct job {
  struct seq {
    std::vector<std::int32_t> prompt;
    sampling_options options;
  };
  std::vector<seq> seqs;
  std::vector<std::string> stops;
  std::shared_ptr<channel> ch;
};

/// The longest prefix of text[0, end) that ends on a whole UTF-8 character, not before `from`.
std::size_t whole_utf8(const std::string& text, std::size_t end, std::size_t from) {
  std::size_t e = end;
  // Back up to a character start, then check that the character there fits before `end`.
  std::size_t i = e;
  while (i > from && (static_cast<unsigned char>(text[i - 1]) & 0xC0) == 0x80) --i;
  if (i > from) {
    const auto lead = static_cast<unsigned char>(text[i - 1]);
    const std::size_t len = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 1;
    if (i - 1 + len > e) e = i - 1;
  }
  return std::max(e, from);
}

/// Runs the admitted sequences a token per round, and admits queued jobs between rounds. Each sequence is a group of
/// its own, or, with `batch` (continuous batching), sequences admitted in the same round with prompts of the same
/// length form a group for their prefill, and after it join the one decoding group: one batched forward pass per
/// round over one cache whose rows are at different lengths (kv_cache), so the weights are read once for all of
/// them. A finished sequence leaves its group.
///
/// Cache pages: a sequence reserves ceil((prompt + max_tokens) / page_size) pages when it is admitted, and its cache
/// buffers stay within them (kv_cache::sequence::limit); with `max_pages` (0: no bound) a request waits in the queue
/// until its sequences' pages are free, so the keys and values of all running sequences never need more than
/// max_pages x page_size positions. Reserving at admission means a running sequence never runs out of cache.
class engine {
 public:
  engine(const data::tokenizer& tok, logits_fn logits, std::int64_t positions, std::int64_t max_seqs,
         std::int64_t max_queued, bool batch, std::int64_t page_size, std::int64_t max_pages)
      : tok_(tok), logits_(std::move(logits)), positions_(positions), max_seqs_(max_seqs), max_queued_(max_queued),
        page_size_(page_size), max_pages_(max_pages), batch_(batch) {}

  /// Cache pages sequence `s` reserves.
  static std::int64_t pages_of(const job::seq& s, std::int64_t page_size) {
    const auto positions = static_cast<std::int64_t>(s.prompt.size()) + s.options.max_new_tokens;
    return (positions + page_size - 1) / page_size;
  }

  /// Queues `j`; false when the queue is full.
  bool submit(job j) {
    std::lock_guard<std::mutex> lock(m_);
    if (static_cast<std::int64_t>(queue_.size()) >= max_queued_) return false;
    {
      std::lock_guard<std::mutex> l2(j.ch->m);
      j.ch->running = j.seqs.size();
    }
    queue_.push_back(std::move(j));
    cv_.notify_one();
    return true;
  }

  /// Forward passes run and tokens chosen so far (tokens / passes: the mean batch).
  std::pair<std::int64_t, std::int64_t> stats() const { return {passes_, tokens_}; }
  /// The most cache pages reserved at once, and the most sequences run at once.
  std::pair<std::int64_t, std::int64_t> peaks() const { return {peak_pages_, peak_seqs_}; }

  /// Runs until `stop()`; then fails every queued and running request (their threads wake and answer).
  void run(const std::function<bool()>& stop) {
    while (!stop()) {
      admit();
      peak_pages_ = std::max(peak_pages_, pages_in_use());
      peak_seqs_ = std::max(peak_seqs_, running());
      if (groups_.empty()) {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return !queue_.empty(); });
        continue;
      }
      for (auto it = groups_.begin(); it != groups_.end();) {
        if (step(*it))
          it = groups_.erase(it);
        else
          ++it;
      }
      if (batch_) join_decoding();
    }
    std::lock_guard<std::mutex> lock(m_);
    for (auto& g : groups_)
      for (auto& r : g.rows) fail(*r.ch, "the server is shutting down");
    for (auto& j : queue_) fail(*j.ch, "the server is shutting down");
    groups_.clear();
    queue_.clear();
  }

 private:
  struct row {
    decoder d;
    std::shared_ptr<channel> ch;
    std::size_t choice;
    std::shared_ptr<const std::vector<std::string>> stops;
    std::size_t emitted = 0, tokens_sent = 0;
    std::int64_t pages = 0;  ///< cache pages reserved
  };
  struct group {
    kv_cache cache;
    std::vector<row> rows;
  };

  static void fail(channel& ch, const std::string& why) {
    std::lock_guard<std::mutex> lock(ch.m);
    if (ch.error.empty()) ch.error = why;
    ch.cv.notify_all();
  }

  std::int64_t running() const {
    std::int64_t n = 0;
    for (const auto& g : groups_) n += static_cast<std::int64_t>(g.rows.size());
    return n;
  }

  std::int64_t pages_in_use() const {
    std::int64_t n = 0;
    for (const auto& g : groups_)
      for (const auto& r : g.rows) n += r.pages;
    return n;
  }

  void admit() {
    std::vector<row> fresh;
    {
      std::lock_guard<std::mutex> lock(m_);
      // First come, first served: the head waits until its sequences and their cache pages fit, and nothing
      // passes it.
      std::int64_t n = running(), pages = pages_in_use();
      auto job_pages = [&](const job& j) {
        std::int64_t p = 0;
        for (const auto& s : j.seqs) p += pages_of(s, page_size_);
        return p;
      };
      while (!queue_.empty() && n + static_cast<std::int64_t>(queue_.front().seqs.size()) <= max_seqs_ &&
             (max_pages_ == 0 || pages + job_pages(queue_.front()) <= max_pages_)) {
        job j = std::move(queue_.front());
        queue_.pop_front();
        n += static_cast<std::int64_t>(j.seqs.size());
        pages += job_pages(j);
        auto stops = std::make_shared<const std::vector<std::string>>(std::move(j.stops));
        for (std::size_t i = 0; i < j.seqs.size(); ++i) {
          try {
            const auto reserved = pages_of(j.seqs[i], page_size_);
            fresh.push_back(row{decoder({}, positions_, std::move(j.seqs[i].prompt), j.seqs[i].options), j.ch, i,
                                stops, 0, 0, reserved});
          } catch (const std::exception& e) {
            fail(*j.ch, e.what());
          }
        }
      }
    }
    // One group per sequence, or (batch_) per prompt length, in order of arrival.
    std::list<group> formed;
    for (auto& r : fresh) {
      const auto len = r.d.prompt_tokens();
      auto it = std::find_if(formed.begin(), formed.end(),
                             [&](const group& g) { return batch_ && g.rows.front().d.prompt_tokens() == len; });
      if (it == formed.end()) {
        formed.emplace_back();
        it = std::prev(formed.end());
      }
      it->rows.push_back(std::move(r));
    }
    for (auto& g : formed) {  // each sequence's buffers within its pages
      g.cache.rows.resize(g.rows.size());
      for (std::size_t k = 0; k < g.rows.size(); ++k) g.cache.rows[k].limit = g.rows[k].pages * page_size_;
    }
    groups_.splice(groups_.end(), formed);
  }

  /// Moves the rows of every group past its prefill into the first such group, in order: one forward pass per
  /// round decodes them all, whatever their lengths.
  void join_decoding() {
    group* into = nullptr;
    for (auto it = groups_.begin(); it != groups_.end();) {
      if (it->cache.empty()) {
        ++it;
        continue;
      }
      if (!into) {
        into = &*it;
        ++it;
        continue;
      }
      for (auto& r : it->rows) into->rows.push_back(std::move(r));
      into->cache.splice(std::move(it->cache));
      it = groups_.erase(it);
    }
  }

  /// One round of group `g`: drops the rows whose clients left, runs the forward pass, chooses each row's token and
  /// sends its piece; drops the finished rows. Returns whether the group is empty (or failed).
  bool step(group& g) {
    drop_rows(g, [](const row& r) { return r.ch->cancelled.load(); });
    if (g.rows.empty()) return true;
    std::vector<std::int32_t> ids;
    for (const auto& r : g.rows) {
      const auto in = r.d.next_input();
      ids.insert(ids.end(), in.begin(), in.end());
    }
    const auto rows = static_cast<std::int64_t>(g.rows.size());
    ++passes_;
    tokens_ += rows;
    try {
      const auto logits = logits_(g.cache, ids, rows);
      const std::size_t vocab = logits.size() / g.rows.size();
      for (std::size_t k = 0; k < g.rows.size(); ++k) {
        g.rows[k].d.accept(std::span<const float>(logits.data() + k * vocab, vocab));
        send_piece(g.rows[k]);
      }
    } catch (const std::exception& e) {
      for (auto& r : g.rows) fail(*r.ch, std::string("generation failed: ") + e.what());
      return true;
    }
    drop_rows(g, [](const row& r) { return r.d.done(); });
    return g.rows.empty();
  }

  template <class Pred>
  void drop_rows(group& g, Pred gone) {
    std::vector<std::int64_t> keep;
    for (std::size_t k = 0; k < g.rows.size(); ++k)
      if (!gone(g.rows[k])) keep.push_back(static_cast<std::int64_t>(k));
    if (keep.size() == g.rows.size()) return;
    std::vector<row> rows;
    for (const auto k : keep) rows.push_back(std::move(g.rows[static_cast<std::size_t>(k)]));
    g.rows = std::move(rows);
    if (!g.rows.empty() && !g.cache.rows.empty()) g.cache.keep_rows(keep);  // (rows made before the prefill too)
  }

  /// The text and tokens `s` made since its last piece, to its channel; cuts the text at a stop string.
  void send_piece(row& s) {
    const auto& g = s.d.result();
    std::string text = tok_.decode(g.tokens, true);
    std::size_t longest = 0;
    std::size_t cut = std::string::npos;
    for (const auto& stop : *s.stops) {
      longest = std::max(longest, stop.size());
      const auto at = text.find(stop, s.emitted > stop.size() ? s.emitted - stop.size() : 0);
      if (at != std::string::npos) cut = std::min(cut, at);
    }
    if (cut != std::string::npos) {  // a stop string: the text ends before it (OpenAI's `stop`)
      text.resize(std::max(cut, s.emitted));
      s.d.finish("stop");
    }
    std::size_t end = text.size();
    if (!s.d.done()) {
      // Hold back what could still become a stop string or a whole character.
      const std::size_t hold = longest ? longest - 1 : 0;
      end = text.size() > hold ? text.size() - hold : 0;
      static const std::string replacement = "\xEF\xBF\xBD";  // the decoder's U+FFFD for a partial character
      if (end == text.size() && text.size() >= 3 && text.compare(text.size() - 3, 3, replacement) == 0) end -= 3;
      end = whole_utf8(text, end, s.emitted);
    }
    piece p;
    p.choice = s.choice;
    if (end > s.emitted) p.text = text.substr(s.emitted, end - s.emitted);
    s.emitted = std::max(s.emitted, end);
    p.tokens.assign(g.tokens.begin() + static_cast<std::ptrdiff_t>(s.tokens_sent), g.tokens.end());
    p.logprobs.assign(g.logprobs.begin() + static_cast<std::ptrdiff_t>(s.tokens_sent), g.logprobs.end());
    s.tokens_sent = g.tokens.size();
    if (s.d.done()) p.finish_reason = g.finish_reason;
    std::lock_guard<std::mutex> lock(s.ch->m);
    if (s.d.done()) --s.ch->running;
    s.ch->pieces.push_back(std::move(p));
    s.ch->cv.notify_all();
  }

  const data::tokenizer& tok_;
  logits_fn logits_;
  std::int64_t positions_, max_seqs_, max_queued_, page_size_, max_pages_;
  std::int64_t peak_pages_ = 0, peak_seqs_ = 0;
  bool batch_;
  std::int64_t passes_ = 0, tokens_ = 0;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<job> queue_;
  std::list<group> groups_;
};

// ---- requests ------------------------------------------------------------------------------------------------

std::int64_t int_field(const json& body, const char* key, std::int64_t dflt, std::int64_t lo, std::int64_t hi) {
  if (!body.contains(key) || body[key].is_null()) return dflt;
  const auto& v = body[key];
  if (!v.is_number_integer() && !(v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<std::int64_t>(v.get<double>()))))
    throw request_error(400, std::string("'") + key + "' must be an integer", key);
  const auto x = v.is_number_integer() ? v.get<std::int64_t>() : static_cast<std::int64_t>(v.get<double>());
  if (x < lo || x > hi)
    throw request_error(400, std::string("'") + key + "' is " + std::to_string(x) + "; it must be between " +
                                 std::to_string(lo) + " and " + std::to_string(hi), key);
  return x;
}

double number_field(const json& body, const char* key, double dflt, double lo, double hi, bool open_low = false) {
  if (!body.contains(key) || body[key].is_null()) return dflt;
  if (!body[key].is_number()) throw request_error(400, std::string("'") + key + "' must be a number", key);
  const double x = body[key].get<double>();
  if (!(open_low ? x > lo : x >= lo) || !(x <= hi))
    throw request_error(400, std::string("'") + key + "' is " + body[key].dump(-1, ' ', false, lossy) + "; it must be " +
                                 (open_low ? "above " : "at least ") + json(lo).dump(-1, ' ', false, lossy) + " and at most " +
                                 json(hi).dump(-1, ' ', false, lossy), key);
  return x;
}

bool bool_field(const json& body, const char* key) {
  if (!body.contains(key) || body[key].is_null()) return false;
  if (!body[key].is_boolean()) throw request_error(400, std::string("'") + key + "' must be true or false", key);
  return body[key].get<bool>();
}

/// What both endpoints share: the sampling keys, `n`, `stop`, `stream`.
struct common_request {
  std::vector<std::vector<std::int32_t>> prompts;
  std::int64_t n = 1, max_tokens = 16;
  sampling_options base;
  std::vector<std::string> stops;
  bool stream = false, include_usage = false, logprobs = false;
};

class handler {
 public:
  handler(const server_options& o, const data::tokenizer& tok, engine& eng, std::int64_t positions)
      : o_(o), tok_(tok), eng_(eng), positions_(positions) {
    if (const auto& t = tok.chat_template()) {
      try {
        chat_ = std::make_unique<data::jinja::compiled_template>(data::jinja::compiled_template::parse(*t));
      } catch (const std::exception& e) {
        chat_error_ = std::string("the tokenizer's chat template does not parse: ") + e.what();
      }
    } else {
      chat_error_ = "the model's tokenizer has no chat template (tokenizer_config.json chat_template or "
                    "chat_template.jinja); use /v1/completions, or give a tokenizer directory with one";
    }
  }

  void completions(const httplib::Request& req, httplib::Response& res) { answer(req, res, false); }
  void chat(const httplib::Request& req, httplib::Response& res) { answer(req, res, true); }

  void models(httplib::Response& res) const {
    json m = {{"object", "list"},
              {"data", json::array({{{"id", o_.model_name}, {"object", "model"}, {"created", started_},
                                     {"owned_by", "levanter"}}})}};
    res.set_content(m.dump(-1, ' ', false, lossy), "application/json");
  }

 private:
  json parse_body(const httplib::Request& req) const {
    json body;
    try {
      body = json::parse(req.body);
    } catch (const json::exception& e) {
      throw request_error(400, std::string("the request body is not valid JSON: ") + e.what());
    }
    if (!body.is_object()) throw request_error(400, "the request body must be a JSON object");
    if (!body.contains("model") || !body["model"].is_string())
      throw request_error(400, "'model' is required: a string naming the model (GET /v1/models lists it)", "model");
    const auto model = body["model"].get<std::string>();
    if (model != o_.model_name)
      throw request_error(404, "The model '" + model + "' does not exist; this server serves '" + o_.model_name + "'",
                          "model", "model_not_found");
    for (const char* k : {"presence_penalty", "frequency_penalty"})
      if (body.contains(k) && !body[k].is_null() && !(body[k].is_number() && body[k].get<double>() == 0))
        throw request_error(400, std::string("'") + k + "' is not supported (only 0)", k);
    if (body.contains("logit_bias") && !body["logit_bias"].is_null() && !body["logit_bias"].empty())
      throw request_error(400, "'logit_bias' is not supported", "logit_bias");
    return body;
  }

  common_request read_common(const json& body, bool chat) const {
    common_request r;
    r.n = int_field(body, "n", 1, 1, o_.service.max_seqs);
    r.base.temperature = number_field(body, "temperature", o_.temperature, 0, 2);
    r.base.top_p = number_field(body, "top_p", 1.0, 0, 1, true);
    r.base.top_k = int_field(body, "top_k", 0, 0, 1 << 30);
    r.base.seed = static_cast<std::uint64_t>(int_field(body, "seed", o_.seed, INT64_MIN, INT64_MAX));
    if (const auto eos = tok_.eos_id()) r.base.stop_tokens = {*eos};
    if (body.contains("stop") && !body["stop"].is_null()) {
      const auto& s = body["stop"];
      if (s.is_string()) {
        r.stops = {s.get<std::string>()};
      } else if (s.is_array()) {
        for (const auto& x : s) {
          if (!x.is_string()) throw request_error(400, "'stop' must be a string or a list of strings", "stop");
          r.stops.push_back(x.get<std::string>());
        }
      } else {
        throw request_error(400, "'stop' must be a string or a list of strings", "stop");
      }
      if (static_cast<std::int64_t>(r.stops.size()) > o_.service.max_stop_seqs)
        throw request_error(400, "'stop' has " + std::to_string(r.stops.size()) + " strings; at most " +
                                     std::to_string(o_.service.max_stop_seqs) + " (service.max_stop_seqs)", "stop");
      for (const auto& x : r.stops)
        if (x.empty()) throw request_error(400, "'stop' strings must not be empty", "stop");
    }
    r.stream = bool_field(body, "stream");
    if (body.contains("stream_options") && body["stream_options"].is_object())
      r.include_usage = bool_field(body["stream_options"], "include_usage");
    if (chat) {
      r.logprobs = bool_field(body, "logprobs");
      if (int_field(body, "top_logprobs", 0, 0, 20) > 0)
        throw request_error(400, "'top_logprobs' above 0 is not supported: each token's own log-probability is "
                                 "returned with logprobs: true", "top_logprobs");
    } else {
      const auto lp = int_field(body, "logprobs", -1, -1, 5);
      if (lp > 0)
        throw request_error(400, "'logprobs' above 0 (alternatives) is not supported; logprobs: 0 returns each "
                                 "token's own log-probability", "logprobs");
      r.logprobs = lp == 0;
      if (bool_field(body, "echo")) throw request_error(400, "'echo' is not supported", "echo");
      if (body.contains("suffix") && !body["suffix"].is_null())
        throw request_error(400, "'suffix' is not supported", "suffix");
      if (body.contains("best_of") && !body["best_of"].is_null() && int_field(body, "best_of", 1, 1, 128) != r.n)
        throw request_error(400, "'best_of' other than n is not supported", "best_of");
    }
    return r;
  }

  std::vector<std::int32_t> encode_prompt(const std::string& text) const {
    auto ids = tok_.encode(text, false);
    if (ids.empty()) throw request_error(400, "the prompt has no tokens", "prompt");
    return ids;
  }

  std::vector<std::vector<std::int32_t>> completion_prompts(const json& body) const {
    if (!body.contains("prompt")) throw request_error(400, "'prompt' is required", "prompt");
    const auto& p = body["prompt"];
    auto token_list = [&](const json& a) {
      std::vector<std::int32_t> ids;
      for (const auto& t : a) {
        if (!t.is_number_integer() || t.get<std::int64_t>() < 0 || t.get<std::int64_t>() >= tok_.vocab_size())
          throw request_error(400, "'prompt' token ids must be integers below the vocabulary size " +
                                       std::to_string(tok_.vocab_size()), "prompt");
        ids.push_back(t.get<std::int32_t>());
      }
      if (ids.empty()) throw request_error(400, "the prompt has no tokens", "prompt");
      return ids;
    };
    std::vector<std::vector<std::int32_t>> out;
    if (p.is_string()) {
      out.push_back(encode_prompt(p.get<std::string>()));
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      out.push_back(token_list(p));
    } else if (p.is_array() && !p.empty()) {
      for (const auto& x : p) {
        if (x.is_string())
          out.push_back(encode_prompt(x.get<std::string>()));
        else if (x.is_array())
          out.push_back(token_list(x));
        else
          throw request_error(400, "'prompt' must be a string, a list of strings, or token ids", "prompt");
      }
    } else {
      throw request_error(400, "'prompt' must be a string, a list of strings, or token ids", "prompt");
    }
    return out;
  }

  std::vector<std::int32_t> chat_prompt(const json& body) const {
    if (!chat_) throw request_error(400, chat_error_, "messages");
    if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
      throw request_error(400, "'messages' is required: a non-empty list of {role, content}", "messages");
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    for (const auto& m : body["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        throw request_error(400, "each message needs a 'role' string", "messages");
      nlohmann::ordered_json out = {{"role", m["role"]}};
      const auto c = m.contains("content") ? m["content"] : json();
      if (c.is_string() || c.is_null()) {
        out["content"] = c.is_null() ? "" : c.get<std::string>();
      } else if (c.is_array()) {  // content parts: the text ones, joined
        std::string text;
        for (const auto& part : c) {
          if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
            throw request_error(400, "only text content parts ({type: text, text}) are supported", "messages");
          text += part["text"].get<std::string>();
        }
        out["content"] = text;
      } else {
        throw request_error(400, "a message's 'content' must be a string or a list of text parts", "messages");
      }
      for (const char* k : {"name", "tool_calls", "tool_call_id"})
        if (m.contains(k)) out[k] = nlohmann::ordered_json::parse(m[k].dump(-1, ' ', false, lossy));
      msgs.push_back(std::move(out));
    }
    nlohmann::ordered_json ctx = {{"messages", msgs}, {"tools", nullptr}, {"documents", nullptr},
                                  {"add_generation_prompt", true}};
    for (const auto& [k, v] : tok_.template_tokens()) ctx[k] = v;
    std::string text;
    try {
      text = chat_->render(ctx);
    } catch (const std::exception& e) {
      throw request_error(400, std::string("the chat template could not render these messages: ") + e.what(),
                          "messages");
    }
    return encode_prompt(text);
  }

  void answer(const httplib::Request& req, httplib::Response& res, bool chat) {
    try {
      const json body = parse_body(req);
      common_request r = read_common(body, chat);
      if (chat) {
        r.prompts = {chat_prompt(body)};
      } else {
        r.prompts = completion_prompts(body);
      }
      std::int64_t longest = 0;
      for (const auto& p : r.prompts) longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(p.size()));
      if (longest >= positions_)
        throw request_error(400, "This model's maximum context length is " + std::to_string(positions_) +
                                     " tokens; the prompt has " + std::to_string(longest), chat ? "messages" : "prompt",
                            "context_length_exceeded");
      const char* mt = chat && body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
      const std::int64_t dflt = chat ? std::min(o_.max_tokens, positions_ - longest) : o_.default_max_tokens;
      r.max_tokens = int_field(body, mt, dflt, 1, o_.max_tokens);
      if (longest + r.max_tokens > positions_)
        throw request_error(400, "This model's maximum context length is " + std::to_string(positions_) +
                                     " tokens; the prompt (" + std::to_string(longest) + " tokens) plus " + mt + " (" +
                                     std::to_string(r.max_tokens) + ") is more", mt, "context_length_exceeded");
      // Cache pages: each sequence's prompt and new tokens within max_pages_per_seq pages, the request's within
      // max_pages (a request that could never be admitted is refused now, not queued forever).
      const auto& sv = o_.service;
      const std::int64_t per_seq = sv.page_size * sv.max_pages_per_seq;
      if (longest + r.max_tokens > per_seq)
        throw request_error(400, "the prompt (" + std::to_string(longest) + " tokens) plus " + mt + " (" +
                                     std::to_string(r.max_tokens) + ") needs more cache than a sequence may hold: " +
                                     std::to_string(per_seq) + " positions (service.max_pages_per_seq " +
                                     std::to_string(sv.max_pages_per_seq) + " x service.page_size " +
                                     std::to_string(sv.page_size) + ")", mt, "context_length_exceeded");
      if (sv.max_pages) {
        std::int64_t pages = 0;
        for (const auto& p : r.prompts)
          pages += r.n * ((static_cast<std::int64_t>(p.size()) + r.max_tokens + sv.page_size - 1) / sv.page_size);
        if (pages > *sv.max_pages)
          throw request_error(400, "the request needs " + std::to_string(pages) + " cache pages of " +
                                       std::to_string(sv.page_size) + " positions (prompts x n, each prompt plus " +
                                       mt + "); the server has " + std::to_string(*sv.max_pages) +
                                       " (service.max_pages)", mt);
      }
      if (static_cast<std::int64_t>(r.prompts.size()) * r.n > o_.service.max_seqs)
        throw request_error(400, "the request asks for " + std::to_string(r.prompts.size() * r.n) +
                                     " sequences (prompts x n); at most " + std::to_string(o_.service.max_seqs) +
                                     " (service.max_seqs)", "n");
      run(r, chat, res);
    } catch (const request_error& e) {
      res.status = e.status;
      res.set_content(error_body(e.what(), "invalid_request_error", e.param, e.code).dump(-1, ' ', false, lossy),
                      "application/json");
    }
  }

  // ---- responses ----

  struct choice_out {
    std::string text;
    std::vector<std::int32_t> tokens;
    std::vector<double> logprobs;
    std::string finish_reason;
  };

  json logprobs_json(const std::vector<std::int32_t>& ids, const std::vector<double>& lps, bool chat,
                     std::size_t offset0) const {
    if (chat) {
      json content = json::array();
      for (std::size_t i = 0; i < ids.size(); ++i) {
        const std::string t = tok_.decode(std::span<const std::int32_t>(&ids[i], 1), false);
        json bytes = json::array();
        for (const unsigned char c : t) bytes.push_back(static_cast<int>(c));
        content.push_back({{"token", t}, {"logprob", lps[i]}, {"bytes", bytes}, {"top_logprobs", json::array()}});
      }
      return json{{"content", content}};
    }
    json tokens = json::array(), lp = json::array(), offsets = json::array();
    std::size_t off = offset0;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::string t = tok_.decode(std::span<const std::int32_t>(&ids[i], 1), false);
      tokens.push_back(t);
      lp.push_back(lps[i]);
      offsets.push_back(off);
      off += t.size();
    }
    return json{{"tokens", tokens}, {"token_logprobs", lp}, {"top_logprobs", nullptr}, {"text_offset", offsets}};
  }

  void run(const common_request& r, bool chat, httplib::Response& res) {
    auto ch = std::make_shared<channel>();
    job j;
    j.ch = ch;
    j.stops = r.stops;
    std::int64_t prompt_tokens = 0;
    for (std::size_t p = 0; p < r.prompts.size(); ++p) {
      prompt_tokens += static_cast<std::int64_t>(r.prompts[p].size());
      for (std::int64_t i = 0; i < r.n; ++i) {
        sampling_options s = r.base;
        s.max_new_tokens = r.max_tokens;
        // Generation i of a request draws from (seed, i): the same request gives the same choices, whatever runs
        // beside it. Prompt p of a list is choice p * n + i, and draws as choice i of a request with prompt p alone.
        s.seed = r.base.seed + 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(i);
        j.seqs.push_back({r.prompts[p], s});
      }
    }
    const std::size_t nchoices = j.seqs.size();
    if (!eng_.submit(std::move(j)))
      throw request_error(429, "the server is busy: " + std::to_string(o_.max_queued_requests) +
                                   " requests are waiting; retry later", "", "server_busy");
    const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
    const auto created = static_cast<std::int64_t>(std::time(nullptr));
    const std::string object = chat ? "chat.completion" : "text_completion";

    if (!r.stream) {
      std::vector<choice_out> out(nchoices);
      {
        std::unique_lock<std::mutex> lock(ch->m);
        ch->cv.wait(lock, [&] { return ch->running == 0 || !ch->error.empty(); });
        if (!ch->error.empty()) {
          res.status = 500;
          res.set_content(error_body(ch->error, "server_error").dump(-1, ' ', false, lossy), "application/json");
          return;
        }
        for (auto& p : ch->pieces) {
          auto& c = out[p.choice];
          c.text += p.text;
          c.tokens.insert(c.tokens.end(), p.tokens.begin(), p.tokens.end());
          c.logprobs.insert(c.logprobs.end(), p.logprobs.begin(), p.logprobs.end());
          if (!p.finish_reason.empty()) c.finish_reason = p.finish_reason;
        }
      }
      json choices = json::array();
      std::int64_t completion_tokens = 0;
      for (std::size_t i = 0; i < nchoices; ++i) {
        const auto& c = out[i];
        completion_tokens += static_cast<std::int64_t>(c.tokens.size());
        json lp = r.logprobs ? logprobs_json(c.tokens, c.logprobs, chat, 0) : json(nullptr);
        if (chat)
          choices.push_back({{"index", i}, {"message", {{"role", "assistant"}, {"content", c.text}}},
                             {"logprobs", lp}, {"finish_reason", c.finish_reason}});
        else
          choices.push_back({{"index", i}, {"text", c.text}, {"logprobs", lp}, {"finish_reason", c.finish_reason}});
      }
      json body = {{"id", id}, {"object", object}, {"created", created}, {"model", o_.model_name},
                   {"choices", choices},
                   {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
                              {"total_tokens", prompt_tokens + completion_tokens}}}};
      res.set_content(body.dump(-1, ' ', false, lossy), "application/json");
      return;
    }

    // Streaming: one server-sent event per piece, then usage (if asked) and [DONE].
    struct stream_state {
      std::vector<std::size_t> offsets;
      std::vector<bool> started;
      std::int64_t completion_tokens = 0;
      bool finished = false;
    };
    auto st = std::make_shared<stream_state>();
    st->offsets.assign(nchoices, 0);
    st->started.assign(nchoices, false);
    const std::string chunk_object = chat ? "chat.completion.chunk" : "text_completion";
    const bool logprobs = r.logprobs, include_usage = r.include_usage;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, ch, st, id, created, chunk_object, chat, logprobs, include_usage, prompt_tokens](
            std::size_t, httplib::DataSink& sink) {
          if (st->finished) {
            sink.done();
            return true;
          }
          std::deque<piece> got;
          std::string error;
          bool all_done = false;
          {
            std::unique_lock<std::mutex> lock(ch->m);
            ch->cv.wait_for(lock, std::chrono::milliseconds(500),
                            [&] { return !ch->pieces.empty() || !ch->error.empty() || ch->running == 0; });
            got.swap(ch->pieces);
            error = ch->error;
            all_done = ch->running == 0;
          }
          auto send = [&](const json& j) {
            const std::string line = "data: " + j.dump(-1, ' ', false, lossy) + "\n\n";
            return sink.write(line.data(), line.size());
          };
          for (auto& p : got) {
            st->completion_tokens += static_cast<std::int64_t>(p.tokens.size());
            json c = {{"index", p.choice}};
            json lp = logprobs && !p.tokens.empty() ? logprobs_json(p.tokens, p.logprobs, chat, st->offsets[p.choice])
                                                    : json(nullptr);
            if (!chat) {
              for (const auto t : p.tokens)
                st->offsets[p.choice] += tok_.decode(std::span<const std::int32_t>(&t, 1), false).size();
            }
            if (chat) {
              json delta = json::object();
              if (!st->started[p.choice]) delta["role"] = "assistant";
              if (!p.text.empty() || !st->started[p.choice]) delta["content"] = p.text;
              st->started[p.choice] = true;
              if (delta.empty() && p.finish_reason.empty() && !logprobs) continue;
              c["delta"] = delta;
            } else {
              if (p.text.empty() && p.finish_reason.empty() && !logprobs) continue;
              c["text"] = p.text;
            }
            c["logprobs"] = lp;
            c["finish_reason"] = p.finish_reason.empty() ? json(nullptr) : json(p.finish_reason);
            json chunk = {{"id", id}, {"object", chunk_object}, {"created", created}, {"model", o_.model_name},
                          {"choices", json::array({c})}};
            if (include_usage) chunk["usage"] = nullptr;
            if (!send(chunk)) {
              ch->cancelled = true;
              return false;
            }
          }
          if (!error.empty()) {
            send(error_body(error, "server_error"));
            const std::string done = "data: [DONE]\n\n";
            sink.write(done.data(), done.size());
            st->finished = true;
            sink.done();
            return true;
          }
          if (all_done) {
            if (include_usage) {
              json chunk = {{"id", id}, {"object", chunk_object}, {"created", created}, {"model", o_.model_name},
                            {"choices", json::array()},
                            {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", st->completion_tokens},
                                       {"total_tokens", prompt_tokens + st->completion_tokens}}}};
              if (!send(chunk)) return false;
            }
            const std::string done = "data: [DONE]\n\n";
            if (!sink.write(done.data(), done.size())) return false;
            st->finished = true;
            sink.done();
          }
          return true;
        },
        [ch](bool success) {
          if (!success) ch->cancelled = true;
        });
  }

  const server_options& o_;
  const data::tokenizer& tok_;
  engine& eng_;
  std::int64_t positions_;
  std::unique_ptr<data::jinja::compiled_template> chat_;
  std::string chat_error_;
  std::atomic<std::int64_t> next_id_{0};
  std::int64_t started_ = static_cast<std::int64_t>(std::time(nullptr));
};

/// cpp-httplib 0.11 listens with a backlog of 5: a burst of clients connecting at once (32 in bench/serve_load.cpp)
/// overflows it and some connections are reset before a request is read. Linux lets listen() be called again on a
/// listening socket to change its backlog; the library does not expose its socket, so it is found by its port.
void raise_backlog(int port) {
  for (int fd = 0; fd < 4096; ++fd) {
    int accepting = 0;
    socklen_t len = sizeof(accepting);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 || !accepting) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int p = -1;
    if (addr.ss_family == AF_INET) p = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
    if (addr.ss_family == AF_INET6) p = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
    if (p == port) ::listen(fd, SOMAXCONN);
  }
}

std::atomic<bool> g_signalled{false};
extern "C" void on_signal(int) { g_signalled = true; }

}  // namespace

void serve(const server_options& opts, const data::tokenizer& tok, logits_fn logits, std::int64_t positions,
           std::ostream& out, const std::function<bool()>& stop) {
  auto positive = [](std::int64_t v, const char* key) {
    if (v <= 0) throw config::config_error(std::string(key) + " must be positive (is " + std::to_string(v) + ")");
  };
  positive(opts.service.max_seqs, "service.max_seqs");
  positive(opts.max_body_bytes, "max_body_bytes");
  positive(opts.max_tokens, "max_tokens");
  positive(opts.default_max_tokens, "default_max_tokens");
  positive(opts.max_queued_requests, "max_queued_requests");
  positive(opts.threads, "threads");
  if (opts.service.max_stop_seqs < 0) throw config::config_error("service.max_stop_seqs must be at least 0");
  if (opts.port < 0 || opts.port > 65535)
    throw config::config_error("port must be between 0 (any free port) and 65535 (is " + std::to_string(opts.port) + ")");
  if (!(opts.temperature >= 0)) throw config::config_error("temperature must be at least 0 (0 is greedy)");

  positive(opts.service.page_size, "service.page_size");
  positive(opts.service.max_pages_per_seq, "service.max_pages_per_seq");
  if (opts.service.max_pages) positive(*opts.service.max_pages, "service.max_pages");
  engine eng(tok, std::move(logits), positions, opts.service.max_seqs, opts.max_queued_requests, opts.batch_decode,
             opts.service.page_size, opts.service.max_pages.value_or(0));
  handler h(opts, tok, eng, positions);
  httplib::Server svr;
  const auto threads = static_cast<std::size_t>(opts.threads);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(static_cast<std::size_t>(opts.max_body_bytes));
  // SO_REUSEADDR only: cpp-httplib's default also sets SO_REUSEPORT, with which a second server binds a port in use
  // and the two share its connections.
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  svr.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(json{{"status", "healthy"}, {"service", "levanter-inference"}}.dump(-1, ' ', false, lossy), "application/json");
  });
  svr.Get("/v1/models", [&h](const httplib::Request&, httplib::Response& res) { h.models(res); });
  svr.Post("/v1/completions", [&h](const httplib::Request& req, httplib::Response& res) { h.completions(req, res); });
  svr.Post("/v1/chat/completions", [&h](const httplib::Request& req, httplib::Response& res) { h.chat(req, res); });
  const auto max_body = opts.max_body_bytes;
  svr.set_error_handler([max_body](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg;
    if (res.status == 413)
      msg = "the request body is over the server's limit of " + std::to_string(max_body) + " bytes (max_body_bytes)";
    else if (res.status == 404)
      msg = "no endpoint " + req.method + " " + req.path +
            "; this server has GET /health, GET /v1/models, POST /v1/completions and POST /v1/chat/completions";
    else
      msg = "the request could not be served (HTTP " + std::to_string(res.status) + ")";
    res.set_content(error_body(msg, "invalid_request_error").dump(-1, ' ', false, lossy), "application/json");
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = std::string("internal error: ") + e.what();
    } catch (...) {
    }
    res.status = 500;
    res.set_content(error_body(msg, "server_error").dump(-1, ' ', false, lossy), "application/json");
  });

  const std::string host = opts.host == "localhost" ? "127.0.0.1" : opts.host;
  int port = static_cast<int>(opts.port);
  if (port == 0) {
    port = svr.bind_to_any_port(host);
    if (port <= 0) throw config::config_error("host: cannot listen on '" + opts.host + "' (any port)");
  } else if (!svr.bind_to_port(host, port)) {
    throw config::config_error("host/port: cannot listen on " + opts.host + ":" + std::to_string(port) +
                               " (in use, or not an address of this machine); give another port, or port 0");
  }
  raise_backlog(port);
  g_signalled = false;
  auto old_int = std::signal(SIGINT, on_signal);
  auto old_term = std::signal(SIGTERM, on_signal);
  std::thread listener([&svr] { svr.listen_after_bind(); });
  out << "serve_lm: serving '" << opts.model_name << "' (" << positions << " positions, up to "
      << opts.service.max_seqs << " sequences at once" << (opts.batch_decode ? ", batched" : "") << ", cache pages of "
      << opts.service.page_size << " positions"
      << (opts.service.max_pages ? ", " + std::to_string(*opts.service.max_pages) + " in all" : std::string())
      << ")\n";
  out << "serve_lm: listening on http://" << host << ":" << port << std::endl;
  if (opts.on_listening) opts.on_listening(port);
  eng.run([&] { return g_signalled.load() || (stop && stop()); });
  svr.stop();
  listener.join();
  std::signal(SIGINT, old_int);
  std::signal(SIGTERM, old_term);
  const auto [passes, tokens] = eng.stats();
  const auto [peak_pages, peak_seqs] = eng.peaks();
  out << "serve_lm: stopped after " << tokens << " tokens in " << passes << " forward passes; at most " << peak_seqs
      << " sequences and " << peak_pages << " cache pages at once" << std::endl;
}

#endif

}  // namespace levanter
