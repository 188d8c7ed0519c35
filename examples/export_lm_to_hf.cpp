// export_lm_to_hf: a train_lm checkpoint as a Hugging Face GPT-2 directory (upstream levanter.main.export_lm_to_hf).
//
//   export_lm_to_hf --checkpoint_path checkpoints/RUN --output_dir hf/RUN [--save_dtype bfloat16]
#include <iostream>

#include <levanter/main/hf_convert.hpp>

int main(int argc, char** argv) {
  try {
    auto parsed = levanter::config::parse_command_line<levanter::ConvertLmConfig>(argc, argv, "{}", "<defaults>");
    if (parsed.help) {
      std::cout << levanter::config::help_text<levanter::ConvertLmConfig>("export_lm_to_hf");
      return 0;
    }
    if (parsed.dry_run) {
      std::cout << parsed.resolved_yaml;
      return 0;
    }
    levanter::run_export_lm_to_hf(parsed.config, parsed.sources, std::cout);
    return 0;
  } catch (const levanter::config::config_error& e) {
    std::cerr << "export_lm_to_hf: config error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "export_lm_to_hf: " << e.what() << "\n";
    return 1;
  }
}
