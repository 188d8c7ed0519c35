// import_hf_to_lm: a local Hugging Face GPT-2 directory as a train_lm checkpoint (upstream
// levanter.main.export_hf_to_lm); start a run from it with initialize_from_checkpoint_path.
//
//   import_hf_to_lm --hf_checkpoint DIR --output_path checkpoints/imported
#include <iostream>

#include <levanter/main/hf_convert.hpp>

int main(int argc, char** argv) {
  try {
    auto parsed = levanter::config::parse_command_line<levanter::ImportHfConfig>(argc, argv, "{}", "<defaults>");
    if (parsed.help) {
      std::cout << levanter::config::help_text<levanter::ImportHfConfig>("import_hf_to_lm");
      return 0;
    }
    if (parsed.dry_run) {
      std::cout << parsed.resolved_yaml;
      return 0;
    }
    levanter::run_import_hf_to_lm(parsed.config, std::cout);
    return 0;
  } catch (const levanter::config::config_error& e) {
    std::cerr << "import_hf_to_lm: config error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "import_hf_to_lm: " << e.what() << "\n";
    return 1;
  }
}
