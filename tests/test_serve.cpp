// The OpenAI-compatible server (levanter/inference/server.hpp), in process, through cpp-httplib's client: every
// completion and chat answer equals levanter::generate() on the same prompt, seed and stops (whole, streamed, n > 1,
// many clients at once); stop strings cut the text before them; chat prompts are the tokenizer's template rendered
// with the generation prompt; bad requests get OpenAI-style 4xx errors and the server keeps serving, also after a
// client leaves in the middle of a stream. serve_program.sh runs the serve_lm program itself with curl.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <doctest/doctest.h>
#include <levanter/config/yaml.hpp>
#include <levanter/data/jinja.hpp>
#include <levanter/data/tokenizer.hpp>
#include <levanter/inference/server.hpp>
#include <levanter/models/gpt2.hpp>
#include <nlohmann/json.hpp>

#if LEVANTER_HAVE_HTTPLIB
#include <httplib.h>
#endif

namespace hax = haliax;
using json = nlohmann::json;

namespace {

const std::string golden = HALIAX_GOLDEN_DIR;

#if LEVANTER_HAVE_HTTPLIB

constexpr std::uint64_t seed_step = 0x9E3779B97F4A7C15ull;  // choice i of a request draws with seed + i * this

/// A tiny random GPT-2 over the chat test tokenizer (it has a chat template and an EOS), served on a free port.
struct served {
  levanter::data::tokenizer tok = levanter::data::tokenizer::from_file(golden + "/chat_data");
  levanter::Gpt2Config cfg = [] {
    levanter::Gpt2Config c;
    c.seq_len = 64;
    c.hidden_dim = 32;
    c.num_layers = 2;
    c.num_heads = 2;
    return c;
  }();
  levanter::gpt2::LMHeadModel model = levanter::gpt2::LMHeadModel::init(cfg, tok.vocab_size(), hax::random::make_key(3));
  levanter::server_options opts;
  std::atomic<bool> stop{false};
  std::promise<int> port_promise;
  int port = 0;
  std::ostringstream log;
  std::thread thread;

  explicit served(std::int64_t max_body = 4096, bool batch = true,
                  const std::function<void(levanter::server_options&)>& tweak = {}) {
    opts.batch_decode = batch;
    opts.model_name = "tiny";
    opts.max_body_bytes = max_body;
    opts.max_tokens = 40;
    opts.service.max_seqs = 6;
    if (tweak) tweak(opts);
    opts.on_listening = [this](int p) { port_promise.set_value(p); };
    thread = std::thread([this] {
      try {
        levanter::serve(opts, tok, levanter::make_logits_fn(model, cfg), cfg.seq_len, log, [this] { return stop.load(); });
      } catch (...) {
        port_promise.set_exception(std::current_exception());
      }
    });
    port = port_promise.get_future().get();
  }
  /// Stops the server; returns what it printed.
  std::string shutdown() {
    stop = true;
    if (thread.joinable()) thread.join();
    return log.str();
  }
  ~served() { shutdown(); }

  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    return c;
  }

  /// POST `body` to `path`: (status, body).
  std::pair<int, std::string> post(const std::string& path, const std::string& body) const {
    auto c = client();
    auto res = c.Post(path.c_str(), body, "application/json");
    REQUIRE(res);
    return {res->status, res->body};
  }

  json post_ok(const std::string& path, const json& body) const {
    const auto reply = post(path, body.dump());  // not a structured binding: clang before 16 cannot capture one
    const int status = reply.first;
    const std::string& text = reply.second;
    INFO(text);
    REQUIRE(status == 200);
    return json::parse(text);
  }

  /// What generate() makes of `prompt` with the server's stops (EOS) and these options.
  levanter::generation expect(const std::vector<std::int32_t>& prompt, std::int64_t max_tokens, double temperature,
                              std::uint64_t seed) const {
    levanter::sampling_options s;
    s.max_new_tokens = max_tokens;
    s.temperature = temperature;
    s.seed = seed;
    if (const auto eos = tok.eos_id()) s.stop_tokens = {*eos};
    return levanter::generate(model, cfg, prompt, s);
  }

  std::string text_of(const levanter::generation& g) const { return tok.decode(g.tokens, true); }
};

/// The events of a server-sent-event body: each `data:` line's JSON, and whether it ended with [DONE].
std::pair<std::vector<json>, bool> events(const std::string& body) {
  std::vector<json> out;
  bool done = false;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("data: ", 0) != 0) continue;
    const auto payload = line.substr(6);
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    CHECK_FALSE(done);  // nothing after [DONE]
    out.push_back(json::parse(payload));
  }
  return {out, done};
}

#endif

}  // namespace

#if LEVANTER_HAVE_HTTPLIB

TEST_CASE("serve: health, models, and completions equal generate() on the same prompt and seed") {
  served s;
  auto c = s.client();
  auto h = c.Get("/health");
  REQUIRE(h);
  CHECK(h->status == 200);
  CHECK(json::parse(h->body)["status"] == "healthy");
  auto m = c.Get("/v1/models");
  REQUIRE(m);
  CHECK(json::parse(m->body)["data"][0]["id"] == "tiny");

  const std::string prompt = "Hello there, how are";
  const auto ids = s.tok.encode(prompt, false);
  // Greedy.
  auto r = s.post_ok("/v1/completions", {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}});
  const auto greedy = s.expect(ids, 12, 0, 42);
  CHECK(r["object"] == "text_completion");
  CHECK(r["choices"][0]["text"] == s.text_of(greedy));
  CHECK(r["choices"][0]["finish_reason"] == greedy.finish_reason);
  CHECK(r["usage"]["prompt_tokens"] == ids.size());
  CHECK(r["usage"]["completion_tokens"] == greedy.tokens.size());
  CHECK(r["usage"]["total_tokens"] == ids.size() + greedy.tokens.size());
  // Sampled, n = 3, with logprobs: choice i is generate() with seed + i * seed_step.
  r = s.post_ok("/v1/completions", {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 10}, {"temperature", 1.0},
                                    {"seed", 7}, {"n", 3}, {"logprobs", 0}});
  REQUIRE(r["choices"].size() == 3);
  std::vector<std::string> texts;
  for (int i = 0; i < 3; ++i) {
    const auto g = s.expect(ids, 10, 1.0, 7 + seed_step * static_cast<std::uint64_t>(i));
    const auto& ch = r["choices"][i];
    CHECK(ch["index"] == i);
    CHECK(ch["text"] == s.text_of(g));
    texts.push_back(ch["text"]);
    REQUIRE(ch["logprobs"]["token_logprobs"].size() == g.tokens.size());
    for (std::size_t k = 0; k < g.tokens.size(); ++k)
      CHECK(ch["logprobs"]["token_logprobs"][k].get<double>() == doctest::Approx(g.logprobs[k]).epsilon(1e-12));
  }
  CHECK((texts[0] != texts[1] || texts[1] != texts[2]));  // three draws, not one repeated
  // Token-id prompts and lists of prompts: prompt p is choices p * n ... p * n + n - 1.
  r = s.post_ok("/v1/completions", {{"model", "tiny"}, {"prompt", json::array({prompt, json(ids)})}, {"max_tokens", 6},
                                    {"temperature", 0}, {"n", 2}});
  REQUIRE(r["choices"].size() == 4);
  const auto six = s.text_of(s.expect(ids, 6, 0, 0));
  for (int i = 0; i < 4; ++i) CHECK(r["choices"][i]["text"] == six);
}

TEST_CASE("serve: with batch_decode off a forward pass per sequence and token, on (the default) one per token for the n choices") {
  {
    served s(4096, false);
    const auto r = s.post_ok("/v1/completions", {{"model", "tiny"}, {"prompt", "Batch me"}, {"max_tokens", 10},
                                                 {"temperature", 1.0}, {"seed", 3}, {"n", 4}});
    std::int64_t tokens = 0;
    for (const auto& c : r["choices"])
      tokens += static_cast<std::int64_t>(s.expect(s.tok.encode("Batch me", false), 10, 1.0,
                                                   3 + seed_step * c["index"].get<std::uint64_t>()).tokens.size());
    const auto t = std::to_string(tokens);
    CHECK(s.shutdown().find("stopped after " + t + " tokens in " + t + " forward passes") != std::string::npos);
  }
  // Batched (the default): each row's products are computed as they would be alone (haliax::independent_rows_scope),
  // so the texts equal generate()'s (tests/test_generate.cpp checks it at GPT-2 small's width, where OpenBLAS's
  // kernels would otherwise round a row differently beside others).
  auto s = std::make_unique<served>();
  const auto r = s->post_ok("/v1/completions", {{"model", "tiny"}, {"prompt", "Batch me"}, {"max_tokens", 10},
                                                {"temperature", 1.0}, {"seed", 3}, {"n", 4}});
  std::int64_t tokens = 0, longest = 0;
  for (const auto& c : r["choices"]) {
    const auto g = s->expect(s->tok.encode("Batch me", false), 10, 1.0, 3 + seed_step * c["index"].get<std::uint64_t>());
    CHECK(c["text"] == s->text_of(g));
    tokens += static_cast<std::int64_t>(g.tokens.size());
    longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(g.tokens.size()));
  }
  // One pass per position of the longest choice (the prefill chooses the first token), each over every choice
  // still running: the server counts them.
  CHECK(s->shutdown().find("stopped after " + std::to_string(tokens) + " tokens in " + std::to_string(longest) +
                           " forward passes") != std::string::npos);
}

TEST_CASE("serve: stop strings end the text before them, and the stream spells the whole answer") {
  served s;
  const std::string prompt = "Once upon a time";
  const auto ids = s.tok.encode(prompt, false);
  const auto full = s.text_of(s.expect(ids, 30, 1.0, 11));
  REQUIRE(full.size() >= 6);
  // A stop string taken from the middle of the text that generate() makes (two printable ASCII characters).
  std::size_t p = 2;
  auto printable = [&](std::size_t i) { return full[i] >= 0x21 && full[i] <= 0x7e; };
  while (p + 1 < full.size() && !(printable(p) && printable(p + 1))) ++p;
  REQUIRE(p + 1 < full.size());
  const std::string stop = full.substr(p, 2);
  const auto at = full.find(stop);
  auto r = s.post_ok("/v1/completions", {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 30}, {"temperature", 1.0},
                                         {"seed", 11}, {"stop", json::array({stop, "never-seen-zzz"})}});
  CHECK(r["choices"][0]["text"] == full.substr(0, at));
  CHECK(r["choices"][0]["finish_reason"] == "stop");

  // Streamed: the pieces concatenate to the whole answer, the last says why it ended, usage comes last.
  for (const bool with_stop : {false, true}) {
    json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 30}, {"temperature", 1.0}, {"seed", 11},
                 {"n", 2}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
    if (with_stop) body["stop"] = stop;
    const auto whole = s.post_ok("/v1/completions", [&] { json b = body; b.erase("stream"); b.erase("stream_options"); return b; }());
    const auto [status, text] = s.post("/v1/completions", body.dump());
    REQUIRE(status == 200);
    const auto [evs, done] = events(text);
    CHECK(done);
    REQUIRE(!evs.empty());
    std::vector<std::string> got(2);
    std::vector<std::string> finish(2);
    for (std::size_t e = 0; e + 1 < evs.size(); ++e) {
      REQUIRE(evs[e]["choices"].size() == 1);
      const auto& ch = evs[e]["choices"][0];
      const auto i = ch["index"].get<std::size_t>();
      CHECK(finish[i].empty());  // nothing after a choice's last piece
      got[i] += ch["text"].get<std::string>();
      if (!ch["finish_reason"].is_null()) finish[i] = ch["finish_reason"];
    }
    for (int i = 0; i < 2; ++i) {
      CHECK(got[i] == whole["choices"][i]["text"].get<std::string>());
      CHECK(finish[i] == whole["choices"][i]["finish_reason"].get<std::string>());
    }
    CHECK(evs.back()["choices"].empty());
    CHECK(evs.back()["usage"] == whole["usage"]);
  }
}

TEST_CASE("serve: chat renders the tokenizer's template with the generation prompt, whole and streamed") {
  served s;
  const json messages = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                     {{"role", "user"}, {"content", "Hi there"}}});
  // The prompt the server must build: transformers' apply_chat_template(add_generation_prompt=True), tokenized.
  nlohmann::ordered_json ctx = {{"messages", nlohmann::ordered_json::parse(messages.dump())}, {"tools", nullptr},
                                {"documents", nullptr}, {"add_generation_prompt", true}};
  for (const auto& [k, v] : s.tok.template_tokens()) ctx[k] = v;
  const auto rendered = levanter::data::jinja::compiled_template::parse(*s.tok.chat_template()).render(ctx);
  CHECK(rendered.find("Hi there") != std::string::npos);
  const auto ids = s.tok.encode(rendered, false);
  const auto g = s.expect(ids, 9, 0.8, 5);

  auto r = s.post_ok("/v1/chat/completions", {{"model", "tiny"}, {"messages", messages}, {"max_tokens", 9},
                                              {"temperature", 0.8}, {"seed", 5}, {"logprobs", true}});
  CHECK(r["object"] == "chat.completion");
  CHECK(r["usage"]["prompt_tokens"] == ids.size());
  CHECK(r["choices"][0]["message"]["role"] == "assistant");
  CHECK(r["choices"][0]["message"]["content"] == s.text_of(g));
  REQUIRE(r["choices"][0]["logprobs"]["content"].size() == g.tokens.size());
  for (std::size_t k = 0; k < g.tokens.size(); ++k)
    CHECK(r["choices"][0]["logprobs"]["content"][k]["logprob"].get<double>() == doctest::Approx(g.logprobs[k]).epsilon(1e-12));
  // Content given as text parts is the same message.
  const json parts = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                  {{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "Hi "}},
                                                                              {{"type", "text"}, {"text", "there"}}})}}});
  auto r2 = s.post_ok("/v1/chat/completions", {{"model", "tiny"}, {"messages", parts}, {"max_tokens", 9},
                                               {"temperature", 0.8}, {"seed", 5}});
  CHECK(r2["choices"][0]["message"]["content"] == r["choices"][0]["message"]["content"]);
  // Streamed: the first delta names the role, the deltas spell the content.
  const auto [status, text] = s.post("/v1/chat/completions",
                                     json{{"model", "tiny"}, {"messages", messages}, {"max_tokens", 9},
                                          {"temperature", 0.8}, {"seed", 5}, {"stream", true}}.dump());
  REQUIRE(status == 200);
  const auto [evs, done] = events(text);
  CHECK(done);
  REQUIRE(!evs.empty());
  CHECK(evs[0]["object"] == "chat.completion.chunk");
  CHECK(evs[0]["choices"][0]["delta"]["role"] == "assistant");
  std::string content;
  for (const auto& e : evs)
    if (e["choices"][0]["delta"].contains("content")) content += e["choices"][0]["delta"]["content"].get<std::string>();
  CHECK(content == s.text_of(g));
  CHECK(evs.back()["choices"][0]["finish_reason"] == g.finish_reason);
}

TEST_CASE("serve: 32 clients at once each get what a request alone gets") {
  served s;
  const std::vector<std::string> prompts = {"The cat", "A long time ago in a galaxy", "x", "Numbers: 1 2 3"};
  constexpr int clients = 32;  // connecting at once: more than cpp-httplib's own listen backlog of 5
  std::vector<std::string> got(clients);
  std::vector<int> status(clients);
  std::vector<std::thread> ts;
  for (int k = 0; k < clients; ++k)
    ts.emplace_back([&, k] {
      json body = {{"model", "tiny"}, {"prompt", prompts[k % prompts.size()]}, {"max_tokens", 8 + k % 12},
                   {"temperature", 1.0}, {"seed", 100 + k}, {"stream", k % 2 == 1}};
      auto [st, text] = s.post("/v1/completions", body.dump());
      status[k] = st;
      if (k % 2 == 0) {
        got[k] = json::parse(text)["choices"][0]["text"];
      } else {
        for (const auto& e : events(text).first) got[k] += e["choices"][0]["text"].get<std::string>();
      }
    });
  for (auto& t : ts) t.join();
  for (int k = 0; k < clients; ++k) {
    INFO("client " << k);
    CHECK(status[k] == 200);
    const auto ids = s.tok.encode(prompts[k % prompts.size()], false);
    CHECK(got[k] == s.text_of(s.expect(ids, 8 + k % 12, 1.0, static_cast<std::uint64_t>(100 + k))));
  }
}

// service.page_size / max_pages / max_pages_per_seq: each sequence reserves ceil((prompt + max_tokens) / page_size)
// pages when it starts; the running ones never hold more than max_pages, so requests wait for pages (and still get
// what a request alone gets); a request that could never fit is refused at once.
TEST_CASE("serve: cache pages bound the running sequences, requests wait for them, and too large ones are refused") {
  served s(4096, true, [](levanter::server_options& o) {
    o.service.page_size = 4;
    o.service.max_pages = 7;
    o.service.max_pages_per_seq = 6;
  });
  const std::vector<std::string> prompts = {"The cat", "x", "Numbers: 1 2 3"};
  constexpr int clients = 9;
  std::vector<std::string> got(clients);
  std::vector<int> status(clients);
  std::vector<std::thread> ts;
  std::int64_t most_pages = 0;  // of one request
  for (int k = 0; k < clients; ++k) {
    const auto len = static_cast<std::int64_t>(s.tok.encode(prompts[k % prompts.size()], false).size());
    most_pages = std::max(most_pages, (len + 8 + k % 4 + 3) / 4);
    ts.emplace_back([&, k] {
      json body = {{"model", "tiny"}, {"prompt", prompts[k % prompts.size()]}, {"max_tokens", 8 + k % 4},
                   {"temperature", 1.0}, {"seed", 7 + k}, {"stream", k % 2 == 1}};
      auto reply = s.post("/v1/completions", body.dump());
      status[k] = reply.first;
      if (k % 2 == 0) {
        if (reply.first == 200) got[k] = json::parse(reply.second)["choices"][0]["text"];
      } else {
        for (const auto& e : events(reply.second).first) got[k] += e["choices"][0]["text"].get<std::string>();
      }
    });
  }
  for (auto& t : ts) t.join();
  REQUIRE(most_pages >= 3);  // so at most two requests fit in 7 pages at once
  for (int k = 0; k < clients; ++k) {
    INFO("client " << k);
    CHECK(status[k] == 200);
    const auto ids = s.tok.encode(prompts[k % prompts.size()], false);
    CHECK(got[k] == s.text_of(s.expect(ids, 8 + k % 4, 1.0, static_cast<std::uint64_t>(7 + k))));
  }
  // Longer than 6 pages of 4 for one sequence; more than 7 pages for the request (n = 3 x 3 pages).
  auto reply = s.post("/v1/completions", json{{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 30}}.dump());
  CHECK(reply.first == 400);
  CHECK(reply.second.find("service.max_pages_per_seq") != std::string::npos);
  reply = s.post("/v1/completions", json{{"model", "tiny"}, {"prompt", "x"}, {"max_tokens", 9}, {"n", 3}}.dump());
  CHECK(reply.first == 400);
  CHECK(reply.second.find("service.max_pages)") != std::string::npos);
  const std::string log = s.shutdown();
  INFO(log);
  const auto at = log.find(" cache pages at once");
  REQUIRE(at != std::string::npos);
  const auto from = log.rfind(' ', at - 1);
  const int peak = std::stoi(log.substr(from + 1, at - from - 1));
  CHECK(peak <= 7);  // unbounded, 6 sequences of 3 to 6 pages would run at once
  CHECK(peak >= 3);
  CHECK(log.find("cache pages of 4 positions, 7 in all") != std::string::npos);
}

TEST_CASE("serve: bad requests get OpenAI-style errors and the server keeps serving") {
  served s(4096);
  auto error_of = [&](const std::string& path, const std::string& body, int want_status) {
    const auto reply = s.post(path, body);  // not a structured binding: clang before 16 cannot capture one
    const int status = reply.first;
    const std::string& text = reply.second;
    INFO(text);
    CHECK(status == want_status);
    const auto j = json::parse(text);
    CHECK(j["error"]["message"].get<std::string>().size() > 10);
    return j["error"];
  };
  CHECK(error_of("/v1/completions", R"({"model": "tiny", "prompt": )", 400)["message"].get<std::string>().find("not valid JSON") != std::string::npos);
  CHECK(error_of("/v1/completions", "[1, 2]", 400)["message"].get<std::string>().find("JSON object") != std::string::npos);
  CHECK(error_of("/v1/completions", R"({"prompt": "x"})", 400)["param"] == "model");
  CHECK(error_of("/v1/completions", R"({"model": "gpt-4", "prompt": "x"})", 404)["code"] == "model_not_found");
  CHECK(error_of("/v1/completions", R"({"model": "tiny"})", 400)["param"] == "prompt");
  CHECK(error_of("/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 41})", 400)["param"] == "max_tokens");
  CHECK(error_of("/v1/completions", R"({"model": "tiny", "prompt": "x", "max_tokens": 0})", 400)["param"] == "max_tokens");
  // The prompt and max_tokens must fit the model's 64 positions.
  const std::string long_prompt(200, 'a');
  CHECK(error_of("/v1/completions", json{{"model", "tiny"}, {"prompt", long_prompt}}.dump(), 400)["code"] == "context_length_exceeded");
  CHECK(error_of("/v1/completions", R"({"model": "tiny", "prompt": "x", "n": 7})", 400)["param"] == "n");
  CHECK(error_of("/v1/completions", R"({"model": "tiny", "prompt": ["a", "b", "c", "d"], "n": 2})", 400)["param"] == "n");
  CHECK(error_of("/v1/completions", R"({"model": "tiny", "prompt": "x", "temperature": "hot"})", 400)["param"] == "temperature");
  CHECK(error_of("/v1/completions", R"({"model": "tiny", "prompt": "x", "top_p": 0})", 400)["param"] == "top_p");
  CHECK(error_of("/v1/completions", R"({"model": "tiny", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]})", 400)["param"] == "stop");
  CHECK(error_of("/v1/completions", R"({"model": "tiny", "prompt": "x", "stop": 3})", 400)["param"] == "stop");
  CHECK(error_of("/v1/completions", R"({"model": "tiny", "prompt": "x", "logprobs": 3})", 400)["param"] == "logprobs");
  CHECK(error_of("/v1/completions", R"({"model": "tiny", "prompt": [5, -1]})", 400)["param"] == "prompt");
  CHECK(error_of("/v1/completions", R"({"model": "tiny", "prompt": "x", "echo": true})", 400)["param"] == "echo");
  CHECK(error_of("/v1/chat/completions", R"({"model": "tiny", "messages": []})", 400)["param"] == "messages");
  CHECK(error_of("/v1/chat/completions", R"({"model": "tiny", "messages": [{"content": "hi"}]})", 400)["param"] == "messages");
  CHECK(error_of("/v1/chat/completions", R"({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})", 400)["param"] == "top_logprobs");
  // Over the body limit (4096 bytes here): 413 with a message naming the limit.
  const auto big = json{{"model", "tiny"}, {"prompt", std::string(5000, 'a')}}.dump();
  CHECK(error_of("/v1/completions", big, 413)["message"].get<std::string>().find("max_body_bytes") != std::string::npos);
  CHECK(error_of("/v1/nothing", "{}", 404)["message"].get<std::string>().find("/v1/completions") != std::string::npos);

  // A client that leaves in the middle of a stream: its sequences are dropped, the server goes on.
  {
    auto c = s.client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"model", "tiny"}, {"prompt", "abc"}, {"max_tokens", 40}, {"stream", true}}.dump();
    req.set_header("Content-Type", "application/json");
    int chunks = 0;
    req.content_receiver = [&](const char*, std::size_t, std::uint64_t, std::uint64_t) { return ++chunks < 2; };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    c.send(req, res, err);
    CHECK(chunks == 2);
  }
  auto r = s.post_ok("/v1/completions", {{"model", "tiny"}, {"prompt", "abc"}, {"max_tokens", 5}, {"temperature", 0}});
  CHECK(r["choices"][0]["text"] == s.text_of(s.expect(s.tok.encode("abc", false), 5, 0, 0)));
  auto h = s.client().Get("/health");
  REQUIRE(h);
  CHECK(h->status == 200);
}

TEST_CASE("serve: options out of range and a port in use are refused with a message") {
  served s;
  levanter::server_options o;
  o.model_name = "tiny";
  o.port = s.port;  // taken by the running server
  std::ostringstream log;
  auto f = levanter::make_logits_fn(s.model, s.cfg);
  CHECK_THROWS_WITH_AS(levanter::serve(o, s.tok, f, s.cfg.seq_len, log), doctest::Contains("cannot listen"),
                       levanter::config::config_error);
  o.port = 70000;
  CHECK_THROWS_WITH_AS(levanter::serve(o, s.tok, f, s.cfg.seq_len, log), doctest::Contains("port must be"),
                       levanter::config::config_error);
  o.port = 0;
  o.service.max_seqs = 0;
  CHECK_THROWS_WITH_AS(levanter::serve(o, s.tok, f, s.cfg.seq_len, log), doctest::Contains("service.max_seqs"),
                       levanter::config::config_error);
}

#else

TEST_CASE("serve: without cpp-httplib, serve() says what to install") {
  levanter::server_options o;
  std::ostringstream log;
  CHECK_THROWS_WITH_AS(levanter::serve(o, levanter::data::tokenizer::byte_level(), {}, 16, log),
                       doctest::Contains("libcpp-httplib-dev"), levanter::config::config_error);
}

#endif
