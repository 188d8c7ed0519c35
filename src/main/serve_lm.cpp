// serve_lm (levanter/main/serve_lm.hpp): the model source, the served name, and the dispatch on the model type.
#include <levanter/main/serve_lm.hpp>

#include <filesystem>
#include <iostream>

namespace levanter {

namespace detail {

server_options serve_options(const ServeLmConfig& cfg, const std::string& model_name) {
  server_options o;
  o.service = cfg.service;
  o.temperature = cfg.temperature;
  o.seed = cfg.seed;
  o.host = cfg.host;
  o.port = cfg.port;
  if (cfg.model_name) {
    o.model_name = *cfg.model_name;
  } else {  // the checkpoint's run directory or the Hugging Face directory's name
    std::filesystem::path p(model_name);
    if (p.filename().empty()) p = p.parent_path();
    if (p.filename().string().rfind("step-", 0) == 0) p = p.parent_path();
    o.model_name = p.filename().string();
  }
  if (o.model_name.empty()) throw config::config_error("model_name must not be empty");
  o.max_body_bytes = cfg.max_body_bytes;
  o.max_tokens = cfg.max_tokens;
  o.default_max_tokens = cfg.default_max_tokens;
  o.max_queued_requests = cfg.max_queued_requests;
  o.threads = cfg.threads;
  o.batch_decode = cfg.batch_decode;
  return o;
}

}  // namespace detail

void run_serve_lm(const ServeLmConfig& cfg, const config::source_map& sources, std::ostream& out) {
  const detail::model_source src =
      detail::resolve_model_source(cfg.checkpoint_path, cfg.hf_checkpoint, cfg.model, cfg.tokenizer, sources,
                                   [&](const std::string& m) { out << "serve_lm: " << m << "\n"; });
  with_model(src.model, [&]<class M>(std::type_identity<M>, const auto&) { run_serve_lm_with<M>(src, cfg, out); });
}

int serve_lm_main(int argc, char** argv) {
  return run_program("serve_lm", [&] {
    auto parsed = config::parse_command_line<ServeLmConfig>(argc, argv, "{}", "<defaults>");
    if (parsed.help) {
      std::cout << config::help_text<ServeLmConfig>("serve_lm");
      return 0;
    }
    if (parsed.dry_run) {
      std::cout << parsed.resolved_yaml;
      return 0;
    }
    run_serve_lm(parsed.config, parsed.sources, std::cout);
    return 0;
  });
}

}  // namespace levanter
