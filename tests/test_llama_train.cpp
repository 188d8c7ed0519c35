// The Llama family through train_lm's library entry point (levanter/main/train_lm.hpp): for each type (llama with
// GQA, mistral with a sliding window shorter than the sequence, qwen with biases and windows from layer 1, qwen3
// with QK norm, gemma with MQA, gemma2 with soft-capping and local layers, gemma3 with local layers and their own
// RoPE base, olmo2 with post-norm layers, mixtral with top-2 of 4 experts and both auxiliary losses) a tiny model trains 20 steps with a falling loss, a run stopped after step 13 and resumed from its
// step-10 checkpoint equals the uninterrupted one bitwise (losses, parameters, optimizer state), the resolved
// config keeps its type, and the Hugging Face export it writes starts a new run (initialize_from_hf).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <levanter/main/train_lm.hpp>
#include <nlohmann/json.hpp>

#include "train_helpers.hpp"

namespace fs = std::filesystem;

namespace {

using train_helpers::file_bytes;
using train_helpers::loss_log;
fs::path temp_dir(const std::string& name) { return train_helpers::temp_dir("levanter_test_llama_train", name); }
void write_corpus(const fs::path& path, int docs, int seed) { train_helpers::write_corpus(path, docs, seed, 777u); }

levanter::TrainLmConfig tiny_config(const fs::path& dir, const std::string& model) {
  const std::string yaml =
      "data:\n  train_urls: [\"" + (dir / "train.jsonl").string() + "\"]\n" + "  validation_urls: [\"" +
      (dir / "valid.jsonl").string() + "\"]\n" + "  tokenizer: byte\n  cache_dir: \"" + (dir / "cache").string() +
      "\"\n" + "model: " + model + "\n" +
      "trainer:\n  num_train_steps: 20\n  train_batch_size: 4\n  steps_per_eval: 10\n"
      "  max_eval_batches: 2\n  id: test\n  log_dir: \"" +
      (dir / "logs").string() + "\"\n" + "  checkpointer: {base_path: \"" + (dir / "checkpoints").string() +
      "\", keep: [{every: 10}]}\n"
      "optimizer: {learning_rate: 3e-3, warmup: 2}\n";
  const char* argv[] = {"train_lm"};
  auto parsed = levanter::config::parse_command_line<levanter::TrainLmConfig>(1, argv, yaml, "<test>");
  const auto v = levanter::validate_train_lm(parsed.config, parsed.sources);
  REQUIRE_MESSAGE(v.errors.empty(), (v.errors.empty() ? "" : v.errors.front()));
  return parsed.config;
}

using M = levanter::llama::LMHeadModel;
using hook = levanter::hook<M>;

levanter::train_result run(const levanter::TrainLmConfig& cfg, const std::vector<hook>& hooks = {}) {
  std::ostringstream sink;
  return levanter::with_model(cfg.model, [&]<class Model>(std::type_identity<Model>, const auto& mc) {
    if constexpr (std::is_same_v<Model, M>)
      return levanter::run_train_lm<M>(cfg, mc, levanter::config::to_yaml_string(cfg), sink, hooks);
    else
      return levanter::train_result{};
  });
}

struct stop_here : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

TEST_CASE("llama family: 20 steps train, resume bitwise, keep their type, and restart from their HF export") {
  const std::pair<const char*, const char*> models[] = {
      {"llama",
       "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, num_heads: 4, "
       "num_kv_heads: 2, rope: {type: llama3, original_max_position_embeddings: 16}}"},
      {"mistral",
       "{type: mistral, seq_len: 32, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, num_heads: 4, "
       "num_kv_heads: 1, sliding_window: 8}"},
      {"qwen",
       "{type: qwen, seq_len: 32, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, num_heads: 4, "
       "num_kv_heads: 2, use_sliding_window: true, sliding_window: 8, max_window_layers: 1, "
       "tie_word_embeddings: true}"},
      {"qwen3",
       "{type: qwen3, seq_len: 32, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, num_heads: 4, "
       "num_kv_heads: 2, head_dim: 16, rope: {type: yarn, factor: 2, original_max_position_embeddings: 16}}"},
      {"gemma",
       "{type: gemma, seq_len: 32, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, num_heads: 4, "
       "num_kv_heads: 1, head_dim: 16}"},
      {"gemma2",
       "{type: gemma2, seq_len: 32, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, num_heads: 4, "
       "num_kv_heads: 2, head_dim: 8, query_pre_attn_scalar: 12, attn_logit_softcapping: 5.0, "
       "final_logit_softcapping: 10.0, sliding_window: 8}"},
      {"gemma3",
       "{type: gemma3, seq_len: 32, hidden_dim: 32, intermediate_dim: 48, num_layers: 3, num_heads: 4, "
       "num_kv_heads: 2, head_dim: 8, sliding_window: 8, sliding_window_pattern: 3, rope_local_base_freq: 100.0}"},
      {"olmo2",
       "{type: olmo2, seq_len: 32, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, num_heads: 4, "
       "num_kv_heads: 2}"},
      {"mixtral",
       "{type: mixtral, seq_len: 32, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, num_heads: 4, "
       "num_kv_heads: 2, n_routed_experts: 4, num_experts_per_tok: 2}"},
  };
  for (const auto& [type, model] : models) {
    const std::string type_name = type;
    CAPTURE(type_name);
    auto dir = temp_dir(type);
    write_corpus(dir / "train.jsonl", 100, 3);
    write_corpus(dir / "valid.jsonl", 10, 4);
    auto cfg = tiny_config(dir, model);
    CHECK(cfg.model.type_name() == type);
    cfg.trainer.id = "whole";
    cfg.hf_save_path = (dir / "hf").string();
    auto whole = run(cfg);
    CHECK(whole.start_step == 0);
    CHECK(whole.final_loss < whole.first_loss - 0.5);
    cfg.hf_save_path.reset();

    cfg.trainer.id = "split";
    CHECK_THROWS_AS(run(cfg, {hook{1,
                                   [](const levanter::step_info<M>& s) {
                                     if (s.next_step == 13) throw stop_here("killed");
                                   },
                                   false}}),
                    stop_here);
    auto resumed = run(cfg);
    CHECK(resumed.start_step == 10);
    CHECK(resumed.final_loss == whole.final_loss);
    const auto a = loss_log(dir / "logs" / "whole" / "metrics.jsonl");
    CHECK(a.size() == 20);
    CHECK(a == loss_log(dir / "logs" / "split" / "metrics.jsonl"));
    for (const char* f : {"model.h5", "opt_state.h5", "training_state.h5"})
      CHECK_MESSAGE(file_bytes(dir / "checkpoints" / "whole" / "step-20" / f) ==
                        file_bytes(dir / "checkpoints" / "split" / "step-20" / f),
                    f);
    // the resolved config in the run's checkpoint keeps the model type
    const auto saved = file_bytes(dir / "checkpoints" / "whole" / "step-20" / "config.yaml");
    CHECK(saved.find("type: " + std::string(type)) != std::string::npos);

    // a new run from the Hugging Face export, the architecture taken from its config.json
    std::vector<fs::path> exports;
    for (const auto& e : fs::directory_iterator(dir / "hf" / "whole")) exports.push_back(e.path());
    REQUIRE(!exports.empty());
    std::sort(exports.begin(), exports.end());
    auto next = tiny_config(dir, model);
    next.trainer.id = "from_hf";
    next.trainer.num_train_steps = 4;
    next.initialize_from_hf = exports.back().string();
    next.use_hf_model_config = true;
    auto second = run(next);
    CHECK(second.parameters == whole.parameters);
    CHECK(second.first_loss < whole.first_loss - 0.5 * (whole.first_loss - whole.final_loss));
    fs::remove_all(dir);
  }
}
