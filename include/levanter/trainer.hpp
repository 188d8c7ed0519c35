// levanter/trainer.hpp: the pieces of upstream's Trainer that do not depend on the model: run ids and run
// directories, the step schedule of batch sizes, hooks every N steps, NaN/Inf checks, throughput and MFU, the
// progress line, and the machine's measured GEMM peak that MFU is reported against.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <haliax/detail/gemm.hpp>
#include <levanter/config/types.hpp>
#include <levanter/tracker.hpp>

extern "C" char* openblas_get_corename();

namespace levanter {

/// A run stopped by a condition the user asked for (crash_on_nan / crash_on_inf) or by bad inputs.
struct training_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Upstream's run id: `trainer.id`, else $RUN_ID, else 8 random characters of [a-z0-9].
inline std::string resolve_run_id(const std::optional<std::string>& configured) {
  if (configured && !configured->empty()) return *configured;
  if (const char* env = std::getenv("RUN_ID"); env && *env) return env;
  static constexpr char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 8; ++i) id.push_back(alphabet[rd() % 36]);
  return id;
}

/// Global example offset of `step` under a batch-size schedule (upstream BatchSchedule.global_data_offset_by_step).
inline std::int64_t data_offset_at(const config::IntSchedule& bs, std::int64_t step) {
  std::int64_t off = 0;
  for (std::size_t i = 0; i < bs.steps.size(); ++i) {
    const auto start = bs.steps[i].start;
    if (start >= step) break;
    const auto end = i + 1 < bs.steps.size() ? std::min(bs.steps[i + 1].start, step) : step;
    off += (end - start) * bs.steps[i].value;
  }
  return off;
}

/// What a hook sees after each step (upstream StepInfo).
struct step_info {
  std::int64_t step = 0;  // the step just completed (1-based count of updates applied)
  std::int64_t num_train_steps = 0;
  double loss = 0;
  double learning_rate = 0;
  double step_seconds = 0;
  std::int64_t tokens = 0;
};

/// A hook run every `every` steps (and, when `at_end`, after the last step).
struct hook {
  std::int64_t every = 1;
  std::function<void(const step_info&)> fn;
  bool at_end = false;
};

/// Stops the run when the loss is NaN or infinite and the config says to (upstream crash_on_nan/crash_on_inf).
inline void check_finite(double value, const char* metric, std::int64_t step, bool crash_on_nan, bool crash_on_inf) {
  if (std::isnan(value) && crash_on_nan)
    throw training_error("step " + std::to_string(step) + ": " + metric +
                         " is NaN (trainer.crash_on_nan is true; lower optimizer.learning_rate or set "
                         "trainer.crash_on_nan: false to continue)");
  if (std::isinf(value) && crash_on_inf)
    throw training_error("step " + std::to_string(step) + ": " + metric +
                         " is infinite (trainer.crash_on_inf is true; lower optimizer.learning_rate or set "
                         "trainer.crash_on_inf: false to continue)");
}

/// The OpenBLAS kernel family in use (e.g. "Haswell", "SkylakeX").
inline std::string openblas_core() {
  const char* c = openblas_get_corename();
  return c ? c : "unknown";
}

/// The GEMM rate this process reaches through haliax's deterministic tiled GEMM on a square-ish f32 problem
/// (FLOP/s): the denominator of the MFU we report. Takes about a quarter of a second.
inline double measure_gemm_peak(std::int64_t n = 1024, int reps = 3) {
  std::vector<float> a(static_cast<std::size_t>(n * n), 0.5f), b(a.size(), 0.25f), c(a.size());
  double best = 0;
  for (int r = 0; r < reps + 1; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    haliax::detail::host_gemm_batched(false, false, 1, n, n, n, a.data(), b.data(), c.data());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::max(best, 2.0 * double(n) * double(n) * double(n) / s);
  }
  return best;
}

inline std::string human_duration(double s) {
  if (!(s >= 0) || !std::isfinite(s)) return "?";
  const auto t = static_cast<std::int64_t>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(t / 3600), (long long)(t % 3600 / 60));
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%llds", (long long)t);
  return buf;
}

/// Throughput bookkeeping over a run (upstream `log_performance_stats`): tokens/s, model FLOP/s and MFU.
struct throughput_meter {
  double flops_per_token = 0;  // training FLOPs per token (forward + backward)
  double peak_flops = 0;       // the machine's measured GEMM rate
  std::int64_t total_tokens = 0;
  double total_seconds = 0;

  json on_step(std::int64_t tokens, std::int64_t examples, double seconds) {
    total_tokens += tokens;
    total_seconds += seconds;
    const double tps = double(tokens) / seconds;
    const double fps = tps * flops_per_token;
    return json{{"throughput/duration", seconds},
                {"throughput/tokens_per_second", tps},
                {"throughput/examples_per_second", double(examples) / seconds},
                {"throughput/gflops_per_second", fps / 1e9},
                {"throughput/mfu", peak_flops > 0 ? fps / peak_flops : 0.0},
                {"throughput/total_tokens", total_tokens}};
  }
};

/// The progress line printed every few steps: step, loss, learning rate, tokens/s, MFU, ETA.
inline std::string progress_line(std::int64_t step, std::int64_t total, double loss, double lr, double tokens_per_s,
                                 double mfu, double eta_s) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %lld/%lld  loss %.4f  lr %.3g  %.0f tok/s  MFU %.1f%%  ETA %s", (long long)step,
                (long long)total, loss, lr, tokens_per_s, 100.0 * mfu, human_duration(eta_s).c_str());
  return buf;
}

/// Writes `text` to `path` atomically (temp file + rename), so a crash never leaves a half-written file.
inline void write_file_atomic(const std::filesystem::path& path, const std::string& text) {
  const auto tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error("cannot write '" + tmp + "'");
    out << text;
    out.flush();
    if (!out) throw std::runtime_error("writing '" + tmp + "' failed (disk full?)");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace levanter
