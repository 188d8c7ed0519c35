// viz_logprobs: the per-token log-probabilities of a model on validation documents as an HTML heatmap
// (upstream levanter.main.viz_logprobs). See include/levanter/main/viz_lm.hpp and docs/viz.md.
//
//   viz_logprobs --checkpoint_path checkpoints/RUN [--path logprobs.html] [--num_docs 32]
//   viz_logprobs --checkpoint_path checkpoints/B --comparison_model_path checkpoints/A
#include <iostream>

#include <levanter/main/viz_lm.hpp>

int main(int argc, char** argv) {
  try {
    auto parsed = levanter::config::parse_command_line<levanter::VizLmConfig>(argc, argv, "{}", "<defaults>");
    if (parsed.help) {
      std::cout << levanter::config::help_text<levanter::VizLmConfig>("viz_logprobs");
      return 0;
    }
    if (parsed.dry_run) {
      std::cout << parsed.resolved_yaml;
      return 0;
    }
    levanter::run_viz_logprobs(parsed.config, parsed.sources, std::cout);
    return 0;
  } catch (const levanter::config::config_error& e) {
    std::cerr << "viz_logprobs: config error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "viz_logprobs: " << e.what() << "\n";
    return 1;
  }
}
