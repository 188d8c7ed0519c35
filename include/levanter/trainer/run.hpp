// levanter/trainer/run.hpp: what a training run is made of besides the model (upstream's Trainer without the
// step): the run id and directory, the trackers, the log, the batch schedule's data offsets, NaN/Inf checks,
// throughput and MFU, and the progress line. Compiled once (src/trainer/run.cpp).
//
// Run directory `<trainer.log_dir>/<run id>/`: `config.yaml` (the resolved config), `metrics.jsonl` (json_logger
// records), `<program>.log` (every line the run prints), and whatever the program adds (run_metadata.json,
// summary.json, profile.txt, logprobs.html).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <haliax/precision.hpp>
#include <levanter/config/types.hpp>
#include <levanter/distributed/comm.hpp>
#include <levanter/io/dir_lock.hpp>
#include <levanter/models/matmul_shape.hpp>
#include <levanter/tracker/tracker.hpp>
#include <levanter/trainer/config.hpp>

namespace levanter {

/// A run stopped by a condition the user asked for (crash_on_nan / crash_on_inf) or by bad inputs.
struct training_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Upstream's run id: `trainer.id`, else $RUN_ID, else 8 random characters of [a-z0-9].
std::string resolve_run_id(const std::optional<std::string>& configured);

/// Global example offset of `step` under a batch-size schedule (upstream BatchSchedule.global_data_offset_by_step).
std::int64_t data_offset_at(const config::IntSchedule& batch_sizes, std::int64_t step);

/// The steps, at most `max_steps`, whose batches `examples` examples fill: the largest s <= max_steps with
/// data_offset_at(s) <= examples (upstream's loader ends a finite dataset there, padding a last partial batch;
/// ours leaves those examples out, so every step keeps its batch shape).
std::int64_t steps_within(const config::IntSchedule& batch_sizes, std::int64_t examples, std::int64_t max_steps);

/// Stops the run when `value` is NaN or infinite and the config says to (upstream crash_on_nan/crash_on_inf).
void check_finite(double value, const char* metric, std::int64_t step, bool crash_on_nan, bool crash_on_inf);

/// The OpenBLAS kernel family in use (e.g. "Haswell", "SkylakeX").
std::string openblas_core();

/// The GEMM rate (FLOP/s) this process reaches through haliax's own GEMM, the one the step runs (every thread of
/// the process, or the device), in matmul precision `p` (bf16: the bfloat16 GEMM where it runs), on the model's
/// products with `m` rows: the denominator of the MFU we report. The shapes' rates are weighted by the FLOPs the
/// step spends in each. On host memory `m` is capped so that one pass over the shapes costs at most 5e10 FLOPs
/// (about a quarter of a second at 200 GFLOP/s); the best of two timed passes after a warm-up is kept. Without
/// shapes, a 1024^3 product.
double measure_gemm_peak(const std::vector<matmul_shape>& shapes, std::int64_t m,
                         haliax::matmul_precision p = haliax::matmul_precision::f32);

/// The memory the arrays can use: the GPU's on a CUDA build, the machine's (MemTotal) otherwise; 0 if unknown.
std::int64_t array_memory_bytes();

/// Throws config::config_error when a model of `parameters` parameters cannot fit: its f32 parameters, gradients and
/// AdamW's two moments (16 bytes a parameter, a lower bound of what training holds), spread over `ranks` processes,
/// exceed array_memory_bytes(). `what` names the model in the message ("model (type llama)").
void check_model_fits(std::int64_t parameters, int ranks, const std::string& what);

/// "1h02m", "3m05s", "42s".
std::string human_duration(double seconds);

/// Throughput bookkeeping over a run (upstream `log_performance_stats`): tokens/s, model FLOP/s and MFU.
/// `throughput/mfu` counts the model's FLOPs (3 x forward); `throughput/hfu` the hardware's, which add the forward
/// passes gradient checkpointing recomputes (upstream's MFU and HFU).
struct throughput_meter {
  double flops_per_token = 0;           ///< training FLOPs per token (forward + backward)
  double hardware_flops_per_token = 0;  ///< the same plus recomputed forwards (0: as flops_per_token)
  double peak_flops = 0;                ///< the job's measured GEMM rate (every rank's added)
  std::int64_t total_tokens = 0;
  double total_seconds = 0;
  /// The `throughput/*` metrics of one step.
  json on_step(std::int64_t tokens, std::int64_t examples, double seconds);
};

/// The progress line printed every few steps: step, loss, learning rate, tokens/s, MFU, ETA.
std::string progress_line(std::int64_t step, std::int64_t total, double loss, double lr, double tokens_per_s,
                          double mfu, double eta_s);

/// A resolved YAML config as JSON, for the trackers' hyperparameters (scalars that read as numbers or booleans
/// become numbers or booleans).
json config_to_json(const std::string& yaml_text);

/// The trackers `trainer.tracker` asks for, writing under `run_dir` (json_logger) or `<logdir>/<run id>`.
std::unique_ptr<tracker> make_tracker(const config::OneOrMany<TrackerChoice>& choices,
                                      const std::filesystem::path& run_dir);

/// A run: its id, its directory, its trackers and its log. Creating one resolves the id, creates
/// `<log_dir>/<id>/`, writes the resolved config there and opens the trackers. Over several ranks, rank 0 chooses
/// the id and tells the others; only rank 0 has the directory, the trackers (the others get a no-op tracker) and
/// prints (`say` does nothing elsewhere).
class run_context {
 public:
  run_context(const TrainerConfig& t, std::string resolved_yaml, std::ostream& out, const std::string& program,
              distributed::communicator& comm = distributed::world());
  run_context(const run_context&) = delete;
  run_context& operator=(const run_context&) = delete;

  const std::string& id() const { return id_; }
  const std::filesystem::path& dir() const { return dir_; }
  const std::string& resolved_yaml() const { return yaml_; }
  const std::string& program() const { return program_; }
  /// Whether the id was chosen by the user (trainer.id or $RUN_ID), so a restart finds this run again.
  bool id_given() const { return id_given_; }
  levanter::tracker& tracker() { return *trk_; }
  /// Whether this process writes the run's files (rank 0).
  bool writer() const { return writer_; }
  /// Prints a line to the program's output and its log file (thread-safe: the checkpointer reports from its own
  /// thread).
  void say(const std::string& line);
  /// `say` with "<program>: " in front, as a callable for subsystems that log.
  std::function<void(const std::string&)> logger();

 private:
  std::string id_, yaml_, program_;
  bool id_given_ = false;
  bool writer_ = true;
  std::filesystem::path dir_;
  io::dir_lock lock_;  ///< one process per run directory
  std::unique_ptr<levanter::tracker> trk_;
  std::ostream& out_;
  std::ofstream log_file_;
  std::mutex mu_;
};

}  // namespace levanter
