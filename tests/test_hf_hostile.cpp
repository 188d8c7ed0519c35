// Hostile Hugging Face directories: import_hf_to_lm, run as the program runs (import_hf_to_lm_main), on
// transformers-written directories with one field of config.json changed at a time (removed, null, of another type,
// out of range, past 32 bits, not finite). Each either imports a model that evaluates and takes a training step to
// finite losses, or exits 2 or 5 with a message naming config.json and the field (a tensor when the weights
// disagree): never exit 0 followed by a failure elsewhere. Also: weights holding NaN or inf are refused, naming the
// tensor.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include <haliax/autodiff.hpp>
#include <levanter/levanter.hpp>

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string golden = std::string(HALIAX_GOLDEN_DIR);

struct outcome {
  int code = 0;
  std::string message;
};

/// import_hf_to_lm on `dir` into `out`, as the program (exit code and what it printed on stderr).
outcome import_dir(const fs::path& dir, const fs::path& out) {
  std::ostringstream err, sink;
  auto* saved_err = std::cerr.rdbuf(err.rdbuf());
  auto* saved_out = std::cout.rdbuf(sink.rdbuf());
  const std::string d = dir.string(), o = out.string();
  const char* argv[] = {"import_hf_to_lm", "--hf_checkpoint", d.c_str(), "--output_path", o.c_str()};
  const int code = levanter::import_hf_to_lm_main(5, const_cast<char**>(argv));
  std::cerr.rdbuf(saved_err);
  std::cout.rdbuf(saved_out);
  return {code, err.str()};
}

/// The imported checkpoint's model: its loss on a random batch, then again after one AdamW step; both finite.
std::string evaluate_and_train(const fs::path& ckpt) {
  const auto info = levanter::checkpoint::read_metadata(ckpt).value();
  const auto tc = levanter::checkpoint_train_config(info);
  if (!tc) return "the imported checkpoint has no config.yaml";
  return levanter::with_model(tc->model, [&]<class M>(std::type_identity<M>, const typename M::config_type& mc) {
    auto lm = levanter::load_lm_from_checkpoint<M>(info, mc);
    const std::int64_t vocab = lm.model.vocab_size(), seq = std::min<std::int64_t>(mc.seq_len, 16);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(2 * seq));
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = std::int32_t((i * 7 + 3) % std::size_t(vocab));
    const auto ex = levanter::lm_example::causal(
        haliax::from_host<std::int32_t>(ids, 2 * levanter::Batch, seq * levanter::Pos), -1);
    const double before = levanter::compute_next_token_loss(lm.model, lm.config, ex).item();
    levanter::AdamConfig ac;
    ac.warmup = 0.0;
    levanter::optim::adamw opt(ac, 10);
    auto st = opt.init(lm.model);
    auto [loss, g] = haliax::value_and_grad(
        [&](const M& m) { return levanter::compute_next_token_loss(m, lm.config, ex); })(lm.model);
    opt.update(lm.model, g, st, loss.item());
    const double after = levanter::compute_next_token_loss(lm.model, lm.config, ex).item();
    if (!std::isfinite(before) || !std::isfinite(after))
      return "losses " + std::to_string(before) + " -> " + std::to_string(after) + " are not finite";
    return std::string();
  });
}

/// A copy of `base` (config.json rewritten, the weights linked) in `dir`.
void write_dir(const fs::path& base, const fs::path& dir, const json& config) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(base))
    if (e.path().filename() != "config.json") fs::create_symlink(fs::absolute(e.path()), dir / e.path().filename());
  std::ofstream(dir / "config.json") << config.dump(2);
}

/// import_hf_to_lm on a copy of `base` whose config.json is `text` must exit 5 with a message naming config.json and
/// holding `expect`, and write no checkpoint.
void check_refused(const fs::path& base, const fs::path& work, const std::string& text, const std::string& what,
                   const std::string& expect) {
  write_dir(base, work / "hf", json::object());
  std::ofstream(work / "hf" / "config.json", std::ios::trunc) << text;
  fs::remove_all(work / "ckpt");
  const auto r = import_dir(work / "hf", work / "ckpt");
  CHECK_MESSAGE(r.code == 5, what << ": exit " << r.code << ": " << r.message);
  CHECK_MESSAGE(r.message.find("config.json") != std::string::npos, what << ": " << r.message);
  CHECK_MESSAGE(r.message.find(expect) != std::string::npos, what << ": " << r.message);
  CHECK_FALSE(fs::exists(work / "ckpt" / "metadata.json"));
}

struct tally {
  int imported = 0, refused = 0;
};

/// Every mutation of every field (and of rope_parameters' fields) of `base`'s config.json.
void mutate_all(const std::string& name, const fs::path& base, tally& t) {
  const fs::path work = fs::temp_directory_path() / ("levanter_hf_hostile_" + std::to_string(::getpid()));
  json original;
  std::ifstream(base / "config.json") >> original;
  const std::vector<std::pair<std::string, json>> values = {
      {"null", nullptr},  {"a string", "x"},      {"-1", -1},          {"0", 0},   {"1", 1},
      {"2^32 + 32", 4294967328LL}, {"1e30", 1e30}, {"true", true}, {"[]", json::array()}, {"{}", json::object()}};
  std::vector<std::vector<std::string>> paths;
  for (const auto& [k, v] : original.items()) {
    paths.push_back({k});
    if (v.is_object())
      for (const auto& [k2, v2] : v.items()) paths.push_back({k, k2});
  }
  for (const auto& path : paths) {
    const std::string field = path.size() == 1 ? path[0] : path[0] + "." + path[1];
    for (int m = -1; m < static_cast<int>(values.size()); ++m) {
      json c = original;
      json& parent = path.size() == 1 ? c : c[path[0]];
      if (m < 0)
        parent.erase(path.back());
      else
        parent[path.back()] = values[static_cast<std::size_t>(m)].second;
      const std::string what = name + ": " + field + " = " + (m < 0 ? "(removed)" : values[static_cast<std::size_t>(m)].first);
      write_dir(base, work / "hf", c);
      fs::remove_all(work / "ckpt");
      const auto r = import_dir(work / "hf", work / "ckpt");
      if (r.code == 0) {
        ++t.imported;
        const auto problem = evaluate_and_train(work / "ckpt");
        CHECK_MESSAGE(problem.empty(), what << ": imported, then " << problem);
      } else {
        ++t.refused;
        CHECK_MESSAGE((r.code == 2 || r.code == 5), what << ": exit " << r.code << ": " << r.message);
        const bool names_file = r.message.find("config.json") != std::string::npos;
        // The field itself, a tensor that disagrees with it, or the field it conflicts with under our name
        // (num_attention_heads against num_key_value_heads is "num_heads ... not divisible by num_kv_heads").
        const std::map<std::string, std::string> ours = {
            {"num_attention_heads", "num_heads"}, {"num_hidden_layers", "layers"}, {"n_layer", "layers"},
            {"n_embd", "hidden_dim"}, {"hidden_size", "hidden_dim"}};
        const auto alias = ours.find(path.back());
        const bool names_field = r.message.find(path.back()) != std::string::npos ||
                                 r.message.find("tensor") != std::string::npos ||
                                 (alias != ours.end() && r.message.find(alias->second) != std::string::npos);
        CHECK_MESSAGE((names_file && names_field), what << ": the message does not name config.json and '"
                                                        << path.back() << "': " << r.message);
      }
    }
  }
  fs::remove_all(work);
}

}  // namespace

TEST_CASE("import_hf_to_lm: every field of config.json changed, one at a time: a usable model or exit 2/5 naming it") {
  tally t;
  mutate_all("gpt2", golden + "/hf_gpt2_tiny", t);
  mutate_all("qwen3", golden + "/hf_llama/qwen3", t);
  mutate_all("mistral", golden + "/hf_llama/mistral_sw", t);
  mutate_all("llama3 rope", golden + "/hf_llama/llama_mqa_llama3", t);
  MESSAGE(t.imported << " mutations imported and trained, " << t.refused << " refused");
  CHECK(t.imported > 50);
  CHECK(t.refused > 300);
}

TEST_CASE("import_hf_to_lm: weights holding NaN or inf are refused, naming the tensor") {
  const fs::path work = fs::temp_directory_path() / ("levanter_hf_nan_" + std::to_string(::getpid()));
  const fs::path base = golden + "/hf_llama/qwen3";
  fs::remove_all(work);
  fs::create_directories(work / "hf");
  fs::copy_file(base / "config.json", work / "hf" / "config.json");
  // Rewrite one tensor's first value as NaN, then as +inf, in a copy of the safetensors file.
  std::ifstream in(base / "model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  const auto meta = json::parse(bytes.substr(8, header));
  const std::string name = "model.layers.1.mlp.up_proj.weight";
  REQUIRE(meta.contains(name));
  REQUIRE(meta[name]["dtype"] == "F32");
  const std::size_t at = 8 + header + meta[name]["data_offsets"][0].get<std::size_t>();
  for (float bad : {std::nanf(""), INFINITY}) {
    std::string copy = bytes;
    std::memcpy(copy.data() + at, &bad, 4);
    std::ofstream(work / "hf" / "model.safetensors", std::ios::binary | std::ios::trunc) << copy;
    fs::remove_all(work / "ckpt");
    const auto r = import_dir(work / "hf", work / "ckpt");
    CHECK(r.code == 5);
    CHECK_MESSAGE(r.message.find("tensor '" + name + "' holds") != std::string::npos, r.message);
    CHECK_FALSE(fs::exists(work / "ckpt" / "metadata.json"));
  }
  fs::remove_all(work);
}

TEST_CASE("import_hf_to_lm: a vocab_size past 32 bits or a head_dim of 0 is refused before any allocation") {
  const fs::path work = fs::temp_directory_path() / ("levanter_hf_sizes_" + std::to_string(::getpid()));
  const fs::path base = golden + "/hf_llama/qwen3";
  json c;
  std::ifstream(base / "config.json") >> c;
  for (const auto& [key, value, expect] : std::vector<std::tuple<std::string, json, std::string>>{
           {"vocab_size", 4294967296LL + 64, "'vocab_size' is 4294967360; it must be an integer in [1, 2^22"},
           {"hidden_size", 4294967328LL, "'hidden_size' is 4294967328; it must be an integer in [1, 2^17"},
           {"head_dim", 0, "'head_dim' is 0; it must be an integer in [1, 2^17"},
           {"rms_norm_eps", -1e-6, "rms_norm_eps (our model.layer_norm_epsilon)"}}) {
    json m = c;
    m[key] = value;
    check_refused(base, work, m.dump(2), key, expect);
  }
  fs::remove_all(work);
}

TEST_CASE("import_hf_to_lm: a config.json nested 100000 deep, over 16 MiB or not an object is refused, naming it") {
  const fs::path work = fs::temp_directory_path() / ("levanter_hf_shape_" + std::to_string(::getpid()));
  const fs::path base = golden + "/hf_llama/qwen3";
  for (const auto& [what, text, expect] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"deep", std::string(100000, '['), "nests arrays or objects more than 64 deep"},
           {"large", "{\"vocab_size\": 64, \"pad\": \"" + std::string(17u << 20, 'x') + "\"}", "a config.json is at most"},
           {"a list", "[1, 2]", "is not a JSON object"},
           {"not JSON", "{\"vocab_size\": 64,", "is not valid JSON"}}) {
    check_refused(base, work, text, what, expect);
  }
  fs::remove_all(work);
}

TEST_CASE("import_hf_to_lm: RoPE settings we cannot honour are refused by name, never replaced by plain RoPE") {
  const fs::path work = fs::temp_directory_path() / ("levanter_hf_rope_" + std::to_string(::getpid()));
  const fs::path base = golden + "/hf_llama/llama_mqa_llama3";
  json c;
  std::ifstream(base / "config.json") >> c;
  const json llama3 = c["rope_parameters"];
  auto with = [&](const char* key, const json& v) {
    json m = c;
    m.erase("rope_parameters");
    m[key] = v;
    return m;
  };
  json conflict = c;  // transformers 4's rope_scaling beside transformers 5's rope_parameters, saying another factor
  conflict["rope_scaling"] = llama3;
  conflict["rope_scaling"]["factor"] = 2.0;
  json equal_factors = c;
  equal_factors["rope_parameters"]["high_freq_factor"] = 1.0;
  json yarn_zero = c;
  yarn_zero["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 0.0}, {"rope_theta", 10000.0}};
  for (const auto& [what, config, expect] : std::vector<std::tuple<std::string, json, std::string>>{
           {"rope_type dynamic", with("rope_parameters", {{"rope_type", "dynamic"}, {"factor", 2.0}}),
            "rope_type 'dynamic' is not supported"},
           {"rope_scaling longrope", with("rope_scaling", {{"type", "longrope"}, {"factor", 2.0}}),
            "rope_type 'longrope' is not supported"},
           {"an unknown type", with("rope_parameters", {{"rope_type", "spiral"}}), "rope_type 'spiral' is not supported"},
           {"rope_parameters a list", with("rope_parameters", json::array({1, 2})), "'rope_parameters' is [1,2], not an object"},
           {"rope_scaling a string", with("rope_scaling", "linear"), "'rope_scaling' is \"linear\", not an object"},
           {"rope_scaling disagreeing with rope_parameters", conflict, "rope_scaling's 'factor' (2.0) differs"},
           {"llama3 low_freq_factor == high_freq_factor", equal_factors, "rope_parameters.high_freq_factor (our model.rope.high_freq_factor)"},
           {"yarn factor 0", yarn_zero, "rope_parameters.factor (our model.rope.factor)"}}) {
    check_refused(base, work, config.dump(2), what, expect);
  }
  fs::remove_all(work);
}
