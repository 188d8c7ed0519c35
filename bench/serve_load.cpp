// serve_lm under load, on loopback: N clients (default 32) at once each stream a completion of M new tokens (default
// 16) from GPT-2 124M (random weights, f32, the passthrough tokenizer: ids as numbers) served in this process with service.max_seqs = N.
// Reported: tokens/s over the whole run, time to first token and inter-token latency (p50, p99, from each client's
// arrival times of its stream's pieces), and a check that no request was lost or mixed up: each client's text
// equals generate() run alone with its prompt and seed.
//
// With `mixed` 1 the prompts have 2 to 17 tokens (client k: 2 + k % 16), so that sequences of different lengths share
// the decoding batch; otherwise every prompt has four.
//
//   build/bench/serve_load [clients] [max_tokens] [batch_decode: 0 or 1] [mixed: 0 or 1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <cblas.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <haliax/haliax.hpp>
#include <levanter/inference/server.hpp>
#include <levanter/models/gpt2.hpp>

namespace hax = haliax;
using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

namespace {

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(q * double(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  hax::runtime rt;
  const int clients = argc > 1 ? std::atoi(argv[1]) : 32;
  const int max_tokens = argc > 2 ? std::atoi(argv[2]) : 16;
  const bool batched = argc > 3 && std::atoi(argv[3]) != 0;  // server_options::batch_decode
  const bool mixed_lengths = argc > 4 && std::atoi(argv[4]) != 0;
  // GPT-2's 50257 ids, written as numbers (the passthrough tokenizer): every token the random model draws is text.
  const auto tok = levanter::data::tokenizer::passthrough(50257);
  levanter::Gpt2Config cfg;  // GPT-2 small
  const auto model = levanter::gpt2::LMHeadModel::init(cfg, 50257, hax::random::make_key(0));

  levanter::server_options opts;
  opts.model_name = "gpt2";
  opts.service.max_seqs = clients;
  opts.batch_decode = batched;
  opts.threads = clients + 8;
  std::promise<int> port_promise;
  opts.on_listening = [&](int p) { port_promise.set_value(p); };
  std::atomic<bool> stop{false};
  std::ostringstream log;
  std::thread server([&] {
    levanter::serve(opts, tok, levanter::make_logits_fn(model, cfg), cfg.seq_len, log, [&] { return stop.load(); });
  });
  const int port = port_promise.get_future().get();

  struct result {
    std::string prompt, text;
    std::vector<double> arrivals;  // seconds after the request was sent, one per piece with text or tokens
    int status = 0;
    std::string error;  // the client's, when the request failed
  };
  std::vector<result> results(static_cast<std::size_t>(clients));
  std::vector<std::thread> threads;
  const auto t0 = clock_type::now();
  for (int k = 0; k < clients; ++k)
    threads.emplace_back([&, k] {
      auto& r = results[static_cast<std::size_t>(k)];
      r.prompt = std::to_string(464 + k) + " 3290 318 " + std::to_string(1000 + 7 * k);  // four tokens
      if (mixed_lengths) {  // 2 + k % 16 tokens
        r.prompt = std::to_string(464 + k);
        for (int i = 1; i < 2 + k % 16; ++i) r.prompt += " " + std::to_string(1000 + 7 * k + 13 * i);
      }
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(600, 0);
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.set_header("Content-Type", "application/json");
      req.body = json{{"model", "gpt2"}, {"prompt", r.prompt}, {"max_tokens", max_tokens}, {"temperature", 1.0},
                      {"seed", 1000 + k}, {"stream", true}}
                     .dump();
      const auto sent = clock_type::now();
      std::string pending;
      req.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
        const double at = std::chrono::duration<double>(clock_type::now() - sent).count();
        pending.append(data, n);
        std::size_t e;
        while ((e = pending.find("\n\n")) != std::string::npos) {
          const std::string ev = pending.substr(0, e);
          pending.erase(0, e + 2);
          if (ev.rfind("data: {", 0) != 0) continue;
          const auto j = json::parse(ev.substr(6));
          r.text += j["choices"][0]["text"].get<std::string>();
          r.arrivals.push_back(at);
        }
        return true;
      };
      httplib::Response res;
      httplib::Error err = httplib::Error::Success;
      if (!c.send(req, res, err)) r.error = httplib::to_string(err);
      r.status = res.status;
    });
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(clock_type::now() - t0).count();
  stop = true;
  server.join();

  std::vector<double> ttft, gaps;
  std::int64_t tokens = 0;
  int lost = 0, mixed = 0;
  for (int k = 0; k < clients; ++k) {
    const auto& r = results[static_cast<std::size_t>(k)];
    if (r.status != 200 || r.arrivals.empty()) {
      std::printf("  client %d: HTTP %d %s, %zu pieces\n", k, r.status, r.error.c_str(), r.arrivals.size());
      ++lost;
      continue;
    }
    ttft.push_back(r.arrivals.front());
    for (std::size_t i = 1; i < r.arrivals.size(); ++i) gaps.push_back(r.arrivals[i] - r.arrivals[i - 1]);
    levanter::sampling_options s;
    s.max_new_tokens = max_tokens;
    s.temperature = 1.0;
    s.seed = static_cast<std::uint64_t>(1000 + k);
    if (const auto eos = tok.eos_id()) s.stop_tokens = {*eos};
    const auto alone = levanter::generate(model, cfg, tok.encode(r.prompt, false), s);
    tokens += static_cast<std::int64_t>(alone.tokens.size());
    if (tok.decode(alone.tokens, true) != r.text) ++mixed;
  }
  std::printf("serve_load: GPT-2 124M (f32, random weights, passthrough tokenizer), %d clients x %d tokens, streaming, "
              "batch_decode %s, prompts of %s tokens\n", clients, max_tokens, batched ? "on" : "off",
              mixed_lengths ? "2 to 17" : "4");
  std::printf("  OpenBLAS %s, %d threads; haliax %d threads\n", openblas_get_corename(), openblas_get_num_threads(),
              hax::num_threads());
  std::printf("  wall %.2f s, %lld tokens, %.2f tokens/s\n", wall, static_cast<long long>(tokens), double(tokens) / wall);
  std::printf("  time to first token: p50 %.3f s, p99 %.3f s\n", quantile(ttft, 0.5), quantile(ttft, 0.99));
  std::printf("  inter-token latency: p50 %.3f s, p99 %.3f s\n", quantile(gaps, 0.5), quantile(gaps, 0.99));
  std::printf("  lost %d, differing from a request alone %d\n", lost, mixed);
  return lost == 0 && mixed == 0 ? 0 : 1;
}
