// Generation with a KV cache (levanter/inference/generate.hpp): decoding token by token over the cache gives the
// logits of a full forward pass over the whole sequence, for GPT-2 and every model of the Llama family (sliding
// windows, local layers, soft-capping, QK norms, mixtures of experts) imported from the tiny Hugging Face goldens;
// greedy continuations equal `transformers`' generate() (tests/oracle/gen_generate_golden.py); sampling is
// reproducible and honours temperature, top-k, top-p and stops.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <haliax/haliax.hpp>
#include <levanter/inference/generate.hpp>
#include <levanter/main/sample_lm.hpp>
#include <levanter/models/gpt2_hf.hpp>
#include <levanter/models/llama_hf.hpp>
#include <nlohmann/json.hpp>

#include "llama_configs.hpp"

namespace hax = haliax;
using levanter::Batch;
using levanter::Pos;

namespace {

const std::string golden = HALIAX_GOLDEN_DIR;

using test_llama::base_for;

template <class M>
struct imported {
  M model;
  typename M::config_type cfg;
  std::int64_t vocab = 0;
};

template <class M>
imported<M> import_dir(const std::string& name, const typename M::config_type& base) {
  auto d = levanter::hf::open_dir(golden + "/" + name, "test");
  imported<M> r;
  r.cfg = levanter::hf::config_from_hf<M>(base, d);
  r.vocab = d.vocab_size;
  r.model = M::init(r.cfg, r.vocab, hax::random::make_key(0));
  levanter::hf::load(d, r.model, r.cfg);
  return r;
}

// Prefill `prefill` tokens, then decode the rest one at a time: every position's logits against the full forward
// pass over all `tokens`. Returns the largest difference.
template <class M>
double cache_vs_full(const imported<M>& m, const std::vector<std::int32_t>& tokens, std::int64_t prefill) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  const auto full = levanter::lm_logits(m.model, m.cfg, hax::from_host<std::int32_t>(tokens, 1 * Batch, n * Pos),
                                        hax::zeros<std::int32_t>(1 * Batch, n * Pos))
                        .to_host();
  levanter::kv_cache cache;
  levanter::forward_options o;
  o.cache = &cache;
  double worst = 0;
  for (std::int64_t at = 0; at < n;) {
    const std::int64_t len = at == 0 ? prefill : 1;
    const std::vector<std::int32_t> part(tokens.begin() + at, tokens.begin() + at + len);
    const auto got = levanter::lm_logits(m.model, m.cfg, hax::from_host<std::int32_t>(part, 1 * Batch, len * Pos),
                                         hax::zeros<std::int32_t>(1 * Batch, len * Pos), o)
                         .to_host();
    REQUIRE(cache.length(0) == at + len);
    for (std::int64_t p = 0; p < len; ++p)
      for (std::int64_t v = 0; v < m.vocab; ++v)
        worst = std::max(worst, std::abs(static_cast<double>(got[static_cast<std::size_t>(p * m.vocab + v)]) -
                                         full[static_cast<std::size_t>((at + p) * m.vocab + v)]));
    at += len;
  }
  return worst;
}

std::vector<std::int32_t> sequence(std::int64_t n, std::int64_t vocab) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 11 + 3) % vocab);
  return t;
}

const char* const llama_cases[] = {"llama_mha",     "llama_gqa_tied_linear", "llama_mqa_llama3", "llama_yarn_headdim",
                                   "mistral_sw",    "qwen2_sw",              "qwen3",            "gemma_mqa",
                                   "gemma_gqa",     "gemma2_softcap",        "gemma3_local",     "olmo2_gqa",
                                   "olmo2_tied_llama3", "mixtral_top2",      "mixtral_top1"};

levanter::LlamaConfig llama_base(const std::string& name) {
  return base_for(levanter::hf::open_dir(golden + "/hf_llama/" + name, "test").model_type);
}

}  // namespace

TEST_CASE("kv cache: decoding token by token gives the full forward pass's logits, GPT-2") {
  const auto m = import_dir<levanter::gpt2::LMHeadModel>("hf_gpt2_tiny", levanter::Gpt2Config{});
  const auto t = sequence(m.cfg.seq_len, m.vocab);  // every position the model has
  CHECK(cache_vs_full(m, t, 5) < 2e-5);
  CHECK(cache_vs_full(m, t, 1) < 2e-5);
  // Past the learned positions: a clear error, not a read past the table.
  levanter::kv_cache cache;
  levanter::forward_options o;
  o.cache = &cache;
  const auto n = m.cfg.seq_len;
  (void)m.model.activations(m.cfg, hax::from_host<std::int32_t>(t, 1 * Batch, n * Pos),
                            hax::zeros<std::int32_t>(1 * Batch, n * Pos), o);
  CHECK_THROWS_WITH_AS(m.model.activations(m.cfg, hax::from_host<std::int32_t>(std::vector<std::int32_t>{1}, 1 * Batch,
                                                                               1 * Pos),
                                           hax::zeros<std::int32_t>(1 * Batch, 1 * Pos), o),
                       doctest::Contains("longer than seq_len"), std::invalid_argument);
}

TEST_CASE("kv cache: decoding gives the full forward pass's logits for every Llama-family golden model") {
  for (const char* name : llama_cases) {
    CAPTURE(name);
    const auto m = import_dir<levanter::llama::LMHeadModel>(std::string("hf_llama/") + name, llama_base(name));
    // Longer than every sliding window of the goldens, so decoding runs past it.
    const auto n = std::min<std::int64_t>(m.cfg.seq_len, 20);
    const auto t = sequence(n, m.vocab);
    CHECK(cache_vs_full(m, t, 6) < 2e-5);
  }
}

// Three sequences as one batch over one cache (serve_lm's groups with batch_decode): every row's logits, at the
// prefill and at each decode step, are those of the sequence alone, and after keep_rows drops the middle row
// the others go on unchanged. Bit for bit on these tiny goldens (their products all take OpenBLAS's small-matrix
// path, whatever the rows); larger models' rows can differ in the last bits (docs/generation.md).
template <class M>
void batched_rows_equal_alone(const imported<M>& m, int sequences = 3) {
  const auto f = levanter::make_logits_fn(m.model, m.cfg);
  const std::int64_t P = 5, steps = std::min<std::int64_t>(8, m.cfg.seq_len - P);
  REQUIRE(steps > 3);
  std::vector<std::vector<std::int32_t>> seqs;
  for (int r = 0; r < sequences; ++r) {
    auto t = sequence(P + steps, m.vocab);
    for (auto& x : t) x = static_cast<std::int32_t>((x + 7 * r) % m.vocab);
    seqs.push_back(t);
  }
  std::vector<levanter::kv_cache> alone(static_cast<std::size_t>(sequences));
  levanter::kv_cache batch;
  std::vector<std::int64_t> live;
  for (int r = 0; r < sequences; ++r) live.push_back(r);
  for (std::int64_t at = 0; at < P + steps;) {
    const std::int64_t n = at == 0 ? P : 1;
    std::vector<std::int32_t> ids;
    for (const auto r : live) ids.insert(ids.end(), seqs[r].begin() + at, seqs[r].begin() + at + n);
    const auto got = f(batch, ids, static_cast<std::int64_t>(live.size()));
    const auto V = got.size() / live.size();
    for (std::size_t k = 0; k < live.size(); ++k) {
      const auto r = static_cast<std::size_t>(live[k]);
      const auto want = f(alone[r], std::span<const std::int32_t>(seqs[r].data() + at, static_cast<std::size_t>(n)), 1);
      CAPTURE(at);
      CAPTURE(r);
      CHECK(std::equal(want.begin(), want.end(), got.begin() + static_cast<std::ptrdiff_t>(k * V)));
    }
    at += n;
    if (at == P + 3) {  // the second sequence finishes
      std::vector<std::int64_t> keep;
      for (int r = 0; r < sequences; ++r)
        if (r != 1) keep.push_back(r);
      batch.keep_rows(keep);
      live = keep;
    }
  }
  REQUIRE(batch.rows.size() == static_cast<std::size_t>(sequences - 1));
  for (std::size_t r = 0; r < batch.rows.size(); ++r) CHECK(batch.length(static_cast<std::int64_t>(r)) == P + steps);
}

// Continuous batching (serve_lm): sequences with prompts of different lengths are prefilled apart, then join one
// cache and decode as one batch, each row at its own position; a sequence that joins later, and one that leaves, do
// not change the others. Every row's logits at every step equal the sequence's alone, bit for bit.
template <class M>
void mixed_lengths_equal_alone(const imported<M>& m) {
  const auto f = levanter::make_logits_fn(m.model, m.cfg);
  const std::vector<std::int64_t> prompts = {5, 2, 9, 3};
  const std::int64_t steps = std::min<std::int64_t>(6, m.cfg.seq_len - 9 - 3);  // room for the copy's 2 steps
  REQUIRE(steps >= 4);
  std::vector<std::vector<std::int32_t>> seqs;
  for (std::size_t r = 0; r < prompts.size(); ++r) {
    auto t = sequence(prompts[r] + steps + 2, m.vocab);
    for (auto& x : t) x = static_cast<std::int32_t>((x + 5 * static_cast<std::int32_t>(r) + 1) % m.vocab);
    seqs.push_back(t);
  }
  std::vector<levanter::kv_cache> alone(prompts.size());
  std::vector<std::int64_t> at(prompts.size(), 0);  // positions each sequence has run
  levanter::kv_cache batch;
  std::vector<std::size_t> live;
  auto join = [&](std::size_t r) {  // prefill r on its own cache, check it, and move it into the batch
    levanter::kv_cache own;
    const auto got = f(own, std::span<const std::int32_t>(seqs[r].data(), static_cast<std::size_t>(prompts[r])), 1);
    const auto want = f(alone[r], std::span<const std::int32_t>(seqs[r].data(), static_cast<std::size_t>(prompts[r])), 1);
    CHECK(got == want);
    batch.splice(std::move(own));
    CHECK(own.rows.empty());
    at[r] = prompts[r];
    live.push_back(r);
  };
  join(0);
  join(1);
  join(2);
  for (std::int64_t step = 0; step < steps; ++step) {
    CAPTURE(step);
    if (step == 2) join(3);  // a sequence joins the running batch
    if (step == 3) {         // the sequence of row 1 leaves
      const std::vector<std::int64_t> keep{0, 2, 3};
      batch.keep_rows(keep);
      live = {0, 2, 3};
    }
    std::vector<std::int32_t> ids;
    for (const auto r : live) ids.push_back(seqs[r][static_cast<std::size_t>(at[r])]);
    const auto got = f(batch, ids, static_cast<std::int64_t>(live.size()));
    const auto V = got.size() / live.size();
    for (std::size_t k = 0; k < live.size(); ++k) {
      const auto r = live[k];
      CAPTURE(r);
      CHECK(batch.length(static_cast<std::int64_t>(k)) == at[r] + 1);
      const auto want = f(alone[r], std::span<const std::int32_t>(seqs[r].data() + at[r], 1), 1);
      CHECK(std::equal(want.begin(), want.end(), got.begin() + static_cast<std::ptrdiff_t>(k * V)));
      ++at[r];
    }
  }
  // What append() returns views the cache's buffer with exactly the row's positions: a copy of it is a plain array.
  {
    levanter::kv_cache c = batch;
    auto& row = c.rows.front();
    const auto len = row.length;
    row.appended = 0;
    const auto k1 = hax::zeros<float>(1 * Batch, 1 * levanter::KeyPos, row.k[0].size(levanter::Heads) * levanter::Heads,
                                      row.k[0].size(levanter::HeadSize) * levanter::HeadSize);
    const auto appended = c.append(0, 0, k1, k1);
    const auto& kv = appended.first;
    CHECK(kv.size(levanter::KeyPos) == len + 1);
    CHECK(hax::copy(kv).to_host() == kv.to_host());
    CHECK(static_cast<std::int64_t>(kv.view().extent(0)) == kv.element_count());
  }
  // A copy of a cache owns its keys: decoding the copy leaves the original's next step unchanged.
  levanter::kv_cache copy = batch;
  std::vector<std::int32_t> ids(live.size(), 1);
  const auto from_copy = f(copy, ids, static_cast<std::int64_t>(live.size()));
  std::vector<std::int32_t> other(live.size(), 2);
  (void)f(copy, other, static_cast<std::int64_t>(live.size()));
  CHECK(f(batch, ids, static_cast<std::int64_t>(live.size())) == from_copy);
  // Rows that do not match the input, and a row past the model's positions, are clear errors.
  CHECK_THROWS_WITH_AS(f(batch, std::vector<std::int32_t>{1, 2}, 2), doctest::Contains("sequences"),
                       std::invalid_argument);
}

TEST_CASE("generate: sequences batched over one cache give each sequence's own logits (tiny goldens: bit for bit)") {
  batched_rows_equal_alone(import_dir<levanter::gpt2::LMHeadModel>("hf_gpt2_tiny", levanter::Gpt2Config{}));
  for (const char* name : llama_cases) {
    CAPTURE(name);
    batched_rows_equal_alone(import_dir<levanter::llama::LMHeadModel>(std::string("hf_llama/") + name, llama_base(name)));
  }
}

TEST_CASE("generate: sequences of different lengths decode as one batch, joining and leaving, bit for bit") {
  mixed_lengths_equal_alone(import_dir<levanter::gpt2::LMHeadModel>("hf_gpt2_tiny", levanter::Gpt2Config{}));
  for (const char* name : llama_cases) {
    CAPTURE(name);
    mixed_lengths_equal_alone(import_dir<levanter::llama::LMHeadModel>(std::string("hf_llama/") + name, llama_base(name)));
  }
}

TEST_CASE("generate: sequences batched over one cache give each sequence's own logits at GPT-2 small's width, bit for bit") {
  // 768-wide products: OpenBLAS's small-matrix kernels (SkylakeX, Cooperlake) take a 5-row prefill and not a
  // 45-row one, and round differently; make_logits_fn's independent_rows_scope gives every row the same calls.
  levanter::Gpt2Config c;
  c.hidden_dim = 768;
  c.num_heads = 12;
  c.num_layers = 1;
  c.seq_len = 16;
  imported<levanter::gpt2::LMHeadModel> m;
  m.cfg = c;
  m.vocab = 300;
  m.model = levanter::gpt2::LMHeadModel::init(c, m.vocab, hax::random::make_key(3));
  batched_rows_equal_alone(m, 9);
}

TEST_CASE("generate: greedy continuations equal transformers' generate()") {
  std::ifstream in(golden + "/generate/greedy.json");
  REQUIRE(in.good());
  const auto g = nlohmann::json::parse(in);
  int checked = 0;
  for (const auto& c : g["cases"]) {
    const std::string model = c["model"].get<std::string>();
    CAPTURE(model);
    const auto prompt = c["prompt"].get<std::vector<std::int32_t>>();
    const auto want = c["tokens"].get<std::vector<std::int32_t>>();
    levanter::sampling_options s;
    s.temperature = 0;
    s.max_new_tokens = static_cast<std::int64_t>(want.size());
    levanter::generation out;
    if (model == "hf_gpt2_tiny") {
      const auto m = import_dir<levanter::gpt2::LMHeadModel>(model, levanter::Gpt2Config{});
      out = levanter::generate(m.model, m.cfg, prompt, s);
    } else {
      const auto m = import_dir<levanter::llama::LMHeadModel>(model, llama_base(model.substr(9)));
      out = levanter::generate(m.model, m.cfg, prompt, s);
    }
    CHECK_MESSAGE(out.tokens == want, "got " << nlohmann::json(out.tokens).dump() << ", transformers "
                                                << nlohmann::json(want).dump());
    CHECK(out.finish_reason == "length");
    for (double lp : out.logprobs) CHECK((lp <= 0 && std::isfinite(lp)));
    ++checked;
  }
  CHECK(checked == 26);
}

TEST_CASE("generate: seeded sampling is reproducible, top-k and top-p narrow the choice, stops end it") {
  const auto m = import_dir<levanter::gpt2::LMHeadModel>("hf_gpt2_tiny", levanter::Gpt2Config{});
  const std::vector<std::int32_t> prompt{3, 17, 5};
  levanter::sampling_options s;
  s.max_new_tokens = 10;
  s.temperature = 1.0;
  s.seed = 7;
  const auto a = levanter::generate(m.model, m.cfg, prompt, s);
  const auto b = levanter::generate(m.model, m.cfg, prompt, s);
  CHECK(a.tokens == b.tokens);
  CHECK(a.logprobs == b.logprobs);
  REQUIRE(a.tokens.size() == 10);
  std::map<std::vector<std::int32_t>, int> seen;
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    s.seed = seed;
    ++seen[levanter::generate(m.model, m.cfg, prompt, s).tokens];
  }
  CHECK(seen.size() > 1);  // different seeds, different texts (64 tokens, temperature 1)

  // choose_token on fixed logits: greedy, top-k 1 and a tiny top-p all take the best token, ties to the lower id.
  const std::vector<float> logits{0.5f, 2.0f, 2.0f, -1.0f, -INFINITY};
  levanter::sampling_options t;
  t.temperature = 0;
  CHECK(levanter::choose_token(logits, t, 0).first == 1);
  t.temperature = 1;
  t.top_k = 1;
  for (int i = 0; i < 20; ++i) CHECK(levanter::choose_token(logits, t, i).first == 1);
  t.top_k = 0;
  t.top_p = 0.01;
  for (int i = 0; i < 20; ++i) CHECK(levanter::choose_token(logits, t, i).first == 1);
  t.top_p = 1;
  std::map<std::int32_t, int> counts;
  for (int i = 0; i < 4000; ++i) ++counts[levanter::choose_token(logits, t, i).first];
  CHECK(counts.count(4) == 0);  // a -inf logit is never drawn
  const double z = std::exp(0.5) + 2 * std::exp(2.0) + std::exp(-1.0);
  CHECK(std::abs(counts[1] / 4000.0 - std::exp(2.0) / z) < 0.03);
  CHECK(std::abs(counts[3] / 4000.0 - std::exp(-1.0) / z) < 0.02);
  t.top_k = 2;  // only ids 1 and 2, equally likely
  counts.clear();
  for (int i = 0; i < 2000; ++i) ++counts[levanter::choose_token(logits, t, i).first];
  CHECK(counts.size() == 2);
  CHECK(std::abs(counts[1] / 2000.0 - 0.5) < 0.05);
  CHECK(std::abs(levanter::choose_token(logits, t, 0).second - std::log(0.5)) < 1e-12);
  t.temperature = -1;
  CHECK_THROWS_AS(levanter::choose_token(logits, t, 0), std::invalid_argument);

  // Stops: a stop token ends the generation and is kept; so does a stop sequence.
  s.seed = 7;
  s.stop_tokens = {a.tokens[3]};
  const auto stopped = levanter::generate(m.model, m.cfg, prompt, s);
  const auto first = std::find(a.tokens.begin(), a.tokens.end(), a.tokens[3]) - a.tokens.begin();
  CHECK(stopped.tokens == std::vector<std::int32_t>(a.tokens.begin(), a.tokens.begin() + first + 1));
  CHECK(stopped.finish_reason == "stop");
  s.stop_tokens.clear();
  s.stop_sequences = {{a.tokens[5], a.tokens[6]}};
  const auto seq = levanter::generate(m.model, m.cfg, prompt, s);
  CHECK(seq.finish_reason == "stop");
  CHECK(seq.tokens.size() <= 7);
  CHECK(levanter::ends_generation(seq.tokens, s));
  // The model's positions end a generation ("length"), and an empty prompt is refused.
  s.stop_sequences.clear();
  s.max_new_tokens = 1000;
  const auto longest = levanter::generate(m.model, m.cfg, prompt, s);
  CHECK(static_cast<std::int64_t>(prompt.size() + longest.tokens.size()) == m.cfg.seq_len);
  CHECK(longest.finish_reason == "length");
  CHECK_THROWS_AS(levanter::generate(m.model, m.cfg, std::vector<std::int32_t>{}, s), std::invalid_argument);
}

TEST_CASE("sample_lm: upstream's SampleLmConfig on a Hugging Face directory, greedy as transformers, errors named") {
  std::ifstream in(golden + "/generate/greedy.json");
  const auto g = nlohmann::json::parse(in);
  std::vector<std::vector<std::int32_t>> want;
  std::vector<std::string> prompts;
  for (const auto& c : g["cases"])
    if (c["model"] == "hf_llama/mistral_sw") {
      want.push_back(c["tokens"].get<std::vector<std::int32_t>>());
      std::string p;
      for (auto id : c["prompt"]) p += (p.empty() ? "" : " ") + std::to_string(id.get<int>());
      prompts.push_back(p);
    }
  REQUIRE(want.size() == 2);
  const std::string yaml = "hf_checkpoint: \"" + golden + "/hf_llama/mistral_sw\"\ntokenizer: passthrough\n"
                           "temperature: 0\nstop_sequence: null\nn_rounds: 2\nmax_new_tokens: " +
                           std::to_string(want[1].size()) + "\nprompts: [\"" + prompts[0] + "\", \"" + prompts[1] +
                           "\"]\nengine: {max_pages: 256, max_seqs: 8, page_size: 8}\n";
  const char* argv[] = {"sample_lm"};
  auto parsed = levanter::config::parse_command_line<levanter::SampleLmConfig>(1, argv, yaml, "<test>");
  std::ostringstream out;
  const auto samples = levanter::run_sample_lm(parsed.config, parsed.sources, out);
  REQUIRE(samples.size() == 4);  // 2 rounds x 2 prompts
  want[0].resize(want[1].size());  // (the shorter prompt's golden runs longer)
  for (const auto& s : samples)
    CHECK_MESSAGE(s.gen.tokens == want[static_cast<std::size_t>(s.prompt)],
                  "got " << nlohmann::json(s.gen.tokens).dump() << "\n" << out.str());
  CHECK(out.str().find("Generation 1.0 (round 1") != std::string::npos);
  CHECK(out.str().find("batches of up to 8 (engine.max_seqs)") != std::string::npos);

  // Sampled: the same config twice gives the same text; every continuation's seed is its own.
  parsed.config.temperature = 1.0;
  parsed.config.n_rounds = 1;
  parsed.config.n_generations = 3;
  std::ostringstream o1, o2;
  const auto a = levanter::run_sample_lm(parsed.config, parsed.sources, o1);
  const auto b = levanter::run_sample_lm(parsed.config, parsed.sources, o2);
  REQUIRE(a.size() == 6);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(a[i].gen.tokens == b[i].gen.tokens);
  CHECK((a[0].gen.tokens != a[1].gen.tokens || a[1].gen.tokens != a[2].gen.tokens));
  // One at a time (engine.max_seqs 1) and six at once (max_seqs 8, two prompt lengths): the same continuations, bit for
  // bit (their log-probabilities too), and the stops land where they did.
  parsed.config.engine.yaml = "{max_seqs: 1}";
  std::ostringstream o3;
  const auto alone = levanter::run_sample_lm(parsed.config, parsed.sources, o3);
  REQUIRE(alone.size() == a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(alone[i].gen.tokens == a[i].gen.tokens);
    CHECK(alone[i].gen.logprobs == a[i].gen.logprobs);
    CHECK(alone[i].gen.finish_reason == a[i].gen.finish_reason);
  }
  parsed.config.engine.yaml = "{max_seqs: 0}";
  std::ostringstream o4;
  CHECK_THROWS_WITH_AS(levanter::run_sample_lm(parsed.config, parsed.sources, o4),
                       doctest::Contains("engine.max_seqs must be positive"), levanter::config::config_error);
  parsed.config.engine.yaml = "{max_pages: 256, max_seqs: 8, page_size: 8}";

  auto errors = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "sample_lm");
    std::vector<const char*> av;
    for (const auto& x : args) av.push_back(x.c_str());
    std::ostringstream sink;
    try {
      auto p = levanter::config::parse_command_line<levanter::SampleLmConfig>(static_cast<int>(av.size()), av.data(),
                                                                            yaml, "<test>");
      levanter::run_sample_lm(p.config, p.sources, sink);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(errors({"--checkpoint_path", "somewhere"}).find("both set") != std::string::npos);
  CHECK(errors({"--hf_checkpoint", "meta-llama/Llama-3.2-1B"}).find("meta-llama/Llama-3.2-1B") != std::string::npos);
  CHECK(errors({"--hf_checkpoint", "hf://meta-llama/x"}).find("not a local directory") != std::string::npos);
  CHECK(errors({"--max_new_tokens", "0"}).find("max_new_tokens") != std::string::npos);
  CHECK(errors({"--tokenizer", "byte"}).find("more than the model's vocabulary") != std::string::npos);
  CHECK(errors({"--prompts", "[]"}).find("prompts is empty") != std::string::npos);
}
