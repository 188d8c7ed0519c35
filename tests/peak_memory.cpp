// Peak memory of forward + backward through a stack of transformer blocks, with and without gradient
// checkpointing. Each policy runs in a forked child so that its peak resident set size (ru_maxrss from wait4)
// is its own. Prints both figures and their ratio; exits 1 if the checkpointed peak is above `--max-ratio` of
// the plain one.
//
//   peak_memory                                   # GPT-2-small-shaped stack: 12 layers, 768 wide, 8 x 512 tokens
//   peak_memory --layers 12 --embed 256 --heads 4 --batch 8 --pos 256 --max-ratio 0.35   # the CI-sized check
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "toy_transformer.hpp"

using namespace toy;

namespace {
struct options {
  std::int64_t layers = 12, embed = 768, heads = 12, mlp = 0, batch = 8, pos = 512;
  double max_ratio = 0.35;
};

/// Runs one forward + backward with the given policy; returns the loss (so the work cannot be skipped).
float run(const options& o, nn::checkpoint_policy policy) {
  haliax::runtime rt;
  config c;
  c.embed = o.embed;
  c.heads = o.heads;
  c.layers = o.layers;
  c.mlp = o.mlp > 0 ? o.mlp : 4 * o.embed;
  using stack_t = nn::Stacked<Layers, block>;
  auto blocks = stack_t::init(c.layers * Layers, hax::random::make_key(0),
                              [&](hax::random::key k) { return block<>::init(k, c); });
  auto x = hax::random::normal(hax::random::make_key(1), o.batch * Batch, o.pos * Pos, c.embed * Embed);
  auto loss_fn = [&](const stack_t& s) {
    auto y = s.fold(
        x, [](const block<>& b, const hidden_t<float>& h, std::int64_t) { return b(h, true); }, policy);
    return hax::mean(hax::square(y));
  };
  auto [loss, g] = hax::value_and_grad(loss_fn)(blocks);
  return loss.item() + 0.0f * g.stacked.ln_1.weight->to_host()[0];
}

long child_peak_kb(const options& o, nn::checkpoint_policy policy) {
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    std::perror("peak_memory: fork");
    std::exit(2);
  }
  if (pid == 0) {
    float loss = run(o, policy);
    std::printf("  loss %.6f\n", static_cast<double>(loss));
    std::fflush(stdout);
    std::_Exit(0);
  }
  int status = 0;
  rusage ru{};
  if (wait4(pid, &status, 0, &ru) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "peak_memory: the child run failed (status %d)\n", status);
    std::exit(2);
  }
  return ru.ru_maxrss;
}
}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    auto next = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "peak_memory: %s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    std::string a = argv[i];
    if (a == "--layers") o.layers = std::atoll(next("--layers"));
    else if (a == "--embed") o.embed = std::atoll(next("--embed"));
    else if (a == "--heads") o.heads = std::atoll(next("--heads"));
    else if (a == "--mlp") o.mlp = std::atoll(next("--mlp"));
    else if (a == "--batch") o.batch = std::atoll(next("--batch"));
    else if (a == "--pos") o.pos = std::atoll(next("--pos"));
    else if (a == "--max-ratio") o.max_ratio = std::atof(next("--max-ratio"));
    else {
      std::fprintf(stderr,
                   "peak_memory: unknown argument '%s' (options: --layers --embed --heads --mlp --batch --pos "
                   "--max-ratio)\n",
                   argv[i]);
      return 2;
    }
  }
  std::printf("stack: %lld layers, embed %lld, heads %lld, batch %lld x %lld positions\n",
              static_cast<long long>(o.layers), static_cast<long long>(o.embed), static_cast<long long>(o.heads),
              static_cast<long long>(o.batch), static_cast<long long>(o.pos));
  std::printf("policy none:\n");
  const long plain = child_peak_kb(o, nn::checkpoint_policy::none);
  std::printf("  peak RSS %.1f MiB\n", plain / 1024.0);
  std::printf("policy per_layer:\n");
  const long ckpt = child_peak_kb(o, nn::checkpoint_policy::per_layer);
  std::printf("  peak RSS %.1f MiB\n", ckpt / 1024.0);
  std::printf("policy nested:\n");
  const long nested = child_peak_kb(o, nn::checkpoint_policy::nested);
  std::printf("  peak RSS %.1f MiB\n", nested / 1024.0);
  const double ratio = static_cast<double>(ckpt) / static_cast<double>(plain);
  std::printf("per_layer / none = %.3f (limit %.2f); nested / none = %.3f\n", ratio, o.max_ratio,
              static_cast<double>(nested) / static_cast<double>(plain));
  return ratio <= o.max_ratio ? 0 : 1;
}
