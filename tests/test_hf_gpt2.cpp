// GPT-2 to and from Hugging Face (levanter/compat/hf_gpt2.hpp). The golden directories under
// tests/golden/hf_gpt2_tiny*/ were written by `transformers` (tests/oracle/gen_hf_gpt2_golden.py): a random tiny
// GPT2LMHeadModel saved with save_pretrained (transformer.-prefixed names), sharded, and in the hub/upstream
// layout without the prefix; hf_gpt2_tiny_logits.h5 holds its logits on fixed tokens.
//
// With LEVANTER_HF_EXPORT_CHECK_DIR set, the export test also leaves an export of a model of ours plus our logits
// (levanter_logits.h5) there, for tests/oracle/check_hf_export.py to load in `transformers`.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <levanter/checkpoint/h5.hpp>
#include <levanter/models/gpt2_hf.hpp>

#include "h5_golden.hpp"

namespace fs = std::filesystem;
namespace hax = haliax;
using levanter::Gpt2Config;
using levanter::gpt2::LMHeadModel;

namespace {

const std::string golden = std::string(HALIAX_GOLDEN_DIR);

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("levanter_test_hf_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

struct golden_logits {
  std::vector<std::int32_t> tokens;
  std::vector<float> logits;
  std::int64_t batch = 0, seq = 0, vocab = 0;
};

golden_logits read_golden() {
  h5golden::file f(golden + "/hf_gpt2_tiny_logits.h5");
  golden_logits g;
  std::vector<std::int64_t> dims;
  g.tokens = f.ints("tokens", &dims);
  g.batch = dims[0];
  g.seq = dims[1];
  g.logits = f.floats("logits", &dims);
  g.vocab = dims[2];
  return g;
}

/// Our logits on `tokens` as one document per row (no segment masking, as transformers computes them).
std::vector<float> logits_of(const LMHeadModel& m, const Gpt2Config& c, const std::vector<std::int32_t>& tokens,
                             std::int64_t batch, std::int64_t seq) {
  hax::no_grad_guard ng;
  auto t = hax::from_host<std::int32_t>(tokens, batch * levanter::Batch, seq * levanter::Pos);
  auto seg = hax::zeros<std::int32_t>(batch * levanter::Batch, seq * levanter::Pos);
  levanter::forward_options o;
  o.inference = true;
  return m.logits(c, t, seg, o).to_host();
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

std::vector<std::vector<float>> values(const LMHeadModel& m) {
  std::vector<std::vector<float>> out;
  hax::tree::for_each_leaf(m, [&](const std::string&, const auto& leaf) { out.push_back(leaf.to_host()); });
  return out;
}

/// Imports a golden directory: config from config.json, weights from the safetensors.
std::pair<LMHeadModel, Gpt2Config> import_dir(const std::string& dir) {
  auto d = levanter::hf::open_dir(dir, "test");
  Gpt2Config c = levanter::hf::config_from_hf<LMHeadModel>(Gpt2Config{}, d);
  c.gradient_checkpointing = false;
  auto m = LMHeadModel::init(c, d.vocab_size, hax::random::make_key(0));
  levanter::hf::load(d, m, c);
  return {m, c};
}

}  // namespace

TEST_CASE("hf gpt2: importing a transformers checkpoint reproduces its logits (all three layouts)") {
  const auto g = read_golden();
  for (const char* variant : {"hf_gpt2_tiny", "hf_gpt2_tiny_sharded", "hf_gpt2_tiny_noprefix"}) {
    CAPTURE(variant);
    auto [m, c] = import_dir(golden + "/" + variant);
    CHECK(c.seq_len == 16);
    CHECK(c.hidden_dim == 32);
    CHECK(c.num_layers == 2);
    CHECK(c.num_heads == 4);
    CHECK(m.vocab_size() == g.vocab);
    const auto ours = logits_of(m, c, g.tokens, g.batch, g.seq);
    double scale = 0;
    for (float x : g.logits) scale = std::max(scale, double(std::fabs(x)));
    CHECK(scale > 0.5);  // the golden is not trivially small
    CHECK(max_abs_diff(ours, g.logits) <= 1e-5 * std::max(1.0, scale));
  }
}

TEST_CASE("hf gpt2: export then import gives the same model, sharded or not, and config.json round trips") {
  auto dir = temp_dir("roundtrip");
  Gpt2Config c;
  c.seq_len = 16;
  c.hidden_dim = 32;
  c.num_layers = 3;
  c.num_heads = 4;
  c.gradient_checkpointing = false;
  const auto m = LMHeadModel::init(c, 257, hax::random::make_key(3));
  auto files = levanter::hf::save(m, c, 257, (dir / "single").string(), {std::nullopt, 256});
  CHECK(fs::exists(dir / "single" / "model.safetensors"));
  CHECK(fs::exists(dir / "single" / "config.json"));
  auto cfg = nlohmann::json::parse(std::ifstream(dir / "single" / "config.json"));
  CHECK(cfg["model_type"] == "gpt2");
  CHECK(cfg["architectures"][0] == "GPT2LMHeadModel");
  CHECK(cfg["n_layer"] == 3);
  CHECK(cfg["vocab_size"] == 257);
  CHECK(cfg["eos_token_id"] == 256);
  CHECK(cfg["bos_token_id"].is_null());  // the tokenizer's ids, as given: this one has no BOS
  // Upstream's names: no transformer. prefix, h.N., wte/wpe, no lm_head.
  levanter::safetensors::hf_dir st((dir / "single").string());
  CHECK(st.find("h.2.attn.c_attn.weight") != nullptr);
  CHECK(st.shape("h.2.attn.c_attn.weight") == std::vector<std::int64_t>{32, 96});
  CHECK(st.shape("h.0.mlp.c_proj.weight") == std::vector<std::int64_t>{128, 32});
  CHECK(st.shape("wte.weight") == std::vector<std::int64_t>{257, 32});
  CHECK(st.find("lm_head.weight") == nullptr);
  CHECK(st.names().size() == 2 + 12 * 3 + 2);

  auto [back, c2] = import_dir((dir / "single").string());
  CHECK(c2.num_layers == 3);
  CHECK(values(back) == values(m));

  // Sharded: several files and an index; the same weights come back.
  files = levanter::hf::save(m, c, 257, (dir / "sharded").string(), {}, levanter::safetensors::dtype::F32, 20000);
  CHECK(fs::exists(dir / "sharded" / "model.safetensors.index.json"));
  CHECK(files.size() > 3);
  auto [back2, c3] = import_dir((dir / "sharded").string());
  CHECK(values(back2) == values(m));

  // bfloat16: about 3 significant digits survive.
  levanter::hf::save(m, c, 257, (dir / "bf16").string(), {}, levanter::safetensors::dtype::BF16);
  auto cfg16 = nlohmann::json::parse(std::ifstream(dir / "bf16" / "config.json"));
  CHECK(cfg16["torch_dtype"] == "bfloat16");
  auto [back3, c4] = import_dir((dir / "bf16").string());
  const auto a = values(m), b = values(back3);
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    for (std::size_t j = 0; j < a[i].size(); ++j)
      if (a[i][j] != 0) worst = std::max(worst, std::fabs(double(a[i][j]) - b[i][j]) / std::fabs(double(a[i][j])));
  CHECK(worst > 0);        // it was rounded
  CHECK(worst <= 1.0 / 256);  // to 8 significant bits

  // For the transformers oracle (tests/oracle/check_hf_export.py): an export of ours with our logits.
  if (const char* out = std::getenv("LEVANTER_HF_EXPORT_CHECK_DIR")) {
    const fs::path o(out);
    fs::remove_all(o);
    // Scaled up so the logits are far from zero (a fresh init gives logits of about 0.01).
    const auto big = hax::tree::map(m, [](const std::string&, const auto& x) { return x * 10.0f; });
    levanter::hf::save(big, c, 257, o.string(), {256, 256}, levanter::safetensors::dtype::F32, 60000);
    std::vector<std::int32_t> tokens;
    for (int i = 0; i < 2 * 16; ++i) tokens.push_back((i * 37 + 11) % 257);
    const auto logits = logits_of(big, c, tokens, 2, 16);
    levanter::checkpoint::snapshot s;
    s.add("tokens", hax::from_host<std::int32_t>(tokens, 2 * levanter::Batch, 16 * levanter::Pos));
    s.add("logits", hax::from_host<float>(logits, 2 * levanter::Batch, 16 * levanter::Pos, 257 * levanter::Vocab));
    s.write((o / "levanter_logits.h5").string());
    MESSAGE("wrote an export for check_hf_export.py to " << o.string());
  }
  fs::remove_all(dir);
}

TEST_CASE("hf gpt2: a model without biases exports zero biases and imports back") {
  auto dir = temp_dir("nobias");
  Gpt2Config c;
  c.seq_len = 8;
  c.hidden_dim = 16;
  c.num_layers = 1;
  c.num_heads = 2;
  c.use_bias = false;
  const auto m = LMHeadModel::init(c, 50, hax::random::make_key(4));
  levanter::hf::save(m, c, 50, dir.string(), {});
  levanter::safetensors::hf_dir st(dir.string());
  const auto b = st.read_f32("h.0.attn.c_attn.bias");
  CHECK(b == std::vector<float>(48, 0.0f));
  auto d = levanter::hf::open_dir(dir.string(), "test");
  auto m2 = LMHeadModel::init(c, 50, hax::random::make_key(9));
  levanter::hf::load(d, m2, c);  // zero biases are accepted for a bias-free model
  CHECK(values(m2) == values(m));
  fs::remove_all(dir);
}

TEST_CASE("hf gpt2: unusable checkpoints are refused with the reason") {
  auto dir = temp_dir("errors");
  using levanter::hf::error;
  CHECK_THROWS_WITH_AS(levanter::hf::open_dir("openai-community/gpt2", "initialize_from_hf"),
                       doctest::Contains("not a local directory"), error);
  fs::create_directories(dir / "empty");
  CHECK_THROWS_AS(levanter::hf::open_dir((dir / "empty").string(), "x"), std::exception);

  // Another architecture.
  fs::copy(golden + "/hf_gpt2_tiny", dir / "llama");
  {
    auto j = nlohmann::json::parse(std::ifstream(dir / "llama" / "config.json"));
    j["model_type"] = "llama";
    std::ofstream(dir / "llama" / "config.json") << j.dump();
  }
  CHECK_THROWS_WITH_AS(import_dir((dir / "llama").string()),
                       doctest::Contains("has model_type 'llama', but the model is a gpt2"), error);

  // config.json that does not match the weights.
  fs::copy(golden + "/hf_gpt2_tiny", dir / "wrong");
  {
    auto j = nlohmann::json::parse(std::ifstream(dir / "wrong" / "config.json"));
    j["n_embd"] = 64;
    std::ofstream(dir / "wrong" / "config.json") << j.dump();
  }
  CHECK_THROWS_WITH_AS(import_dir((dir / "wrong").string()), doctest::Contains("does config.json match the weights?"), error);

  // A model config that differs from the checkpoint's architecture.
  auto d = levanter::hf::open_dir(golden + "/hf_gpt2_tiny", "initialize_from_hf");
  Gpt2Config c;
  c.seq_len = 16;
  c.hidden_dim = 32;
  c.num_layers = 4;
  c.num_heads = 4;
  CHECK_THROWS_WITH_AS(levanter::hf::check_matches<LMHeadModel>(c, d, "initialize_from_hf"),
                       doctest::Contains("n_layer 2 but the model config says 4"), error);
  c.num_layers = 2;
  CHECK_NOTHROW(levanter::hf::check_matches<LMHeadModel>(c, d, "initialize_from_hf"));
  CHECK_THROWS_WITH_AS(levanter::hf::dtype_from_config(std::string("int8")), doctest::Contains("unknown dtype 'int8'"), error);
  fs::remove_all(dir);
}

TEST_CASE("hf gpt2: a tensor of the right size but the wrong shape is refused, naming both shapes") {
  const auto dir = fs::temp_directory_path() / ("levanter_hf_shape_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Gpt2Config c;
  c.seq_len = 8;
  c.hidden_dim = 16;
  c.num_layers = 1;
  c.num_heads = 2;
  const auto m = LMHeadModel::init(c, 50, hax::random::make_key(4));
  levanter::hf::save(m, c, 50, dir.string(), {});
  levanter::safetensors::hf_dir st(dir.string());
  // Each case rewrites one tensor with the same elements under another shape: transposed, flattened, an extra
  // dimension.
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> cases = {
      {"wte.weight", {16, 50}}, {"wte.weight", {800}}, {"h.0.attn.c_attn.weight", {48, 16}},
      {"h.0.mlp.c_fc.weight", {1, 16, 64}}, {"ln_f.weight", {16, 1}}};
  for (const auto& [bad, shape] : cases) {
    std::vector<levanter::safetensors::tensor_to_write> ts;
    for (const auto& name : st.names()) {
      const auto v = st.read_f32(name);
      ts.push_back({name, levanter::safetensors::dtype::F32, name == bad ? shape : st.shape(name),
                    levanter::safetensors::encode_floats(v, levanter::safetensors::dtype::F32)});
    }
    const auto bad_dir = dir / "bad";
    levanter::safetensors::write_hf_dir(bad_dir.string(), ts, std::uint64_t{1} << 40);
    fs::copy_file(dir / "config.json", bad_dir / "config.json", fs::copy_options::overwrite_existing);
    auto d = levanter::hf::open_dir(bad_dir.string(), "test");
    auto m2 = LMHeadModel::init(c, 50, hax::random::make_key(9));
    std::string want = "tensor '" + bad + "' has shape [";
    for (std::size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
    CHECK_THROWS_WITH_AS(levanter::hf::load(d, m2, c), doctest::Contains((want + "], the model expects [").c_str()),
                         levanter::hf::error);
  }
  fs::remove_all(dir);
}
