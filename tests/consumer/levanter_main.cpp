// Uses the installed levanter: the umbrella header, a config checked by the library, and an LM example built by it.
#include <cstdio>
#include <levanter/levanter.hpp>

int main(int argc, char** argv) {
  haliax::runtime rt(argc, argv);
  levanter::TrainLmConfig cfg;
  cfg.model.get_if<levanter::Gpt2Config>()->activation_function = "tanh";
  const auto v = levanter::validate_train_lm(cfg, {});
  bool refused = false;
  for (const auto& e : v.errors) refused |= e.find("model.activation_function") != std::string::npos;
  // EOS (id 9) ends a document: the next position starts segment 1.
  auto tokens = haliax::from_host<std::int32_t>({1, 9, 2, 3}, 1 * levanter::Batch, 4 * levanter::Pos);
  const auto seg = levanter::lm_example::causal(tokens, 9).segment_ids.to_host();
  std::printf("levanter %s: activation refused %d, segments %d %d %d %d\n", levanter::version, int(refused), seg[0],
              seg[1], seg[2], seg[3]);
  return refused && seg == std::vector<std::int32_t>{0, 0, 1, 1} ? 0 : 1;
}
