// serve_lm: an OpenAI-compatible server (/v1/completions, /v1/chat/completions, streaming) over a trained model. See
// include/levanter/main/serve_lm.hpp and docs/generation.md.
//
//   serve_lm --checkpoint_path checkpoints/RUN --port 8000
//   curl localhost:8000/v1/completions -d '{"model": "RUN", "prompt": "Once upon", "max_tokens": 32}'
#include <levanter/main/programs.hpp>

int main(int argc, char** argv) { return levanter::serve_lm_main(argc, argv); }
