// levanter/trainer/run.hpp: run ids and directories, trackers, the log, and the step bookkeeping.
#include <levanter/trainer/run.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include <unistd.h>

#include <haliax/core.hpp>
#include <haliax/detail/gemm.hpp>
#include <levanter/config/validate.hpp>
#include <levanter/config/yaml.hpp>
#include <levanter/io/atomic_file.hpp>

#if defined(HALIAX_HAVE_HOST_BLAS)
extern "C" char* openblas_get_corename();
#endif
#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

namespace levanter {

std::string resolve_run_id(const std::optional<std::string>& configured) {
  if (configured && !configured->empty()) return *configured;
  if (const char* env = std::getenv("RUN_ID"); env && *env) {
    // The id names the run's directories, so $RUN_ID obeys the rule trainer.id does.
    const config::source_map none;
    config::validator v{none, {}};
    if (!config::check_path_component(v, "RUN_ID", env, "run id"))
      throw config::config_error("the environment variable " + v.result.errors.front());
    return env;
  }
  static constexpr char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 8; ++i) id.push_back(alphabet[rd() % 36]);
  return id;
}

std::int64_t data_offset_at(const config::IntSchedule& bs, std::int64_t step) {
  std::int64_t off = 0;
  for (std::size_t i = 0; i < bs.steps.size(); ++i) {
    const auto start = bs.steps[i].start;
    if (start >= step) break;
    const auto end = i + 1 < bs.steps.size() ? std::min(bs.steps[i + 1].start, step) : step;
    off += (end - start) * bs.steps[i].value;
  }
  return off;
}

std::int64_t steps_within(const config::IntSchedule& bs, std::int64_t examples, std::int64_t max_steps) {
  std::int64_t lo = 0, hi = std::max<std::int64_t>(max_steps, 0);  // data_offset_at grows with the step
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo + 1) / 2;
    if (data_offset_at(bs, mid) <= examples)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

void check_finite(double value, const char* metric, std::int64_t step, bool crash_on_nan, bool crash_on_inf) {
  if (std::isnan(value) && crash_on_nan)
    throw training_error("step " + std::to_string(step) + ": " + metric +
                         " is NaN (trainer.crash_on_nan is true; lower optimizer.learning_rate or set "
                         "trainer.crash_on_nan: false to continue)");
  if (std::isinf(value) && crash_on_inf)
    throw training_error("step " + std::to_string(step) + ": " + metric +
                         " is infinite (trainer.crash_on_inf is true; lower optimizer.learning_rate or set "
                         "trainer.crash_on_inf: false to continue)");
}

std::string openblas_core() {
#if defined(HALIAX_HAVE_HOST_BLAS)
  const char* c = openblas_get_corename();
  return c ? c : "unknown";
#else
  return "none (no host BLAS in this build)";
#endif
}

namespace {
// Operands for the peak measurement: values in [-0.5, 0.5) from a hash of the index (never constants or zeros,
// which some GEMM units multiply faster than real data).
void fill_operand(float* p, std::int64_t n, std::uint32_t salt) {
  Kokkos::parallel_for(
      "levanter::gemm_peak(fill)", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace, Kokkos::IndexType<std::int64_t>>(0, n),
      KOKKOS_LAMBDA(std::int64_t i) {
        const std::uint32_t h = (static_cast<std::uint32_t>(i) ^ salt) * 2654435761u;
        p[i] = static_cast<float>(h >> 8) * (1.0f / 16777216.0f) - 0.5f;
      });
}
}  // namespace

double measure_gemm_peak(const std::vector<matmul_shape>& shapes_in, std::int64_t m, haliax::matmul_precision p) {
  // In the arrays' memory space (device memory on a GPU build), fenced, so the rate is the device's.
  haliax::detail::ensure_initialized();
  std::vector<matmul_shape> shapes = shapes_in;
  if (shapes.empty() || m <= 0) {
    shapes = {{1024, 1024, 1}};
    m = 1024;
  }
  if constexpr (haliax::detail::host_memory) {
    double per_row = 0;
    for (const auto& s : shapes) per_row += 2.0 * double(s.n) * double(s.k);
    m = std::max<std::int64_t>(64, std::min<std::int64_t>(m, std::int64_t(5e10 / per_row)));
  }
  using view = Kokkos::View<float*, haliax::memory_space>;
  haliax::matmul_precision_scope precision(p);
  double flops = 0, seconds = 0;
  for (const auto& s : shapes) {
    const auto n = s.n, k = s.k;
    view a("levanter::gemm_peak(a)", static_cast<std::size_t>(m * k)),
        b("levanter::gemm_peak(b)", static_cast<std::size_t>(k * n)),
        c("levanter::gemm_peak(c)", static_cast<std::size_t>(m * n));
    fill_operand(a.data(), m * k, 0x5bd1e995u);
    fill_operand(b.data(), k * n, 0x27d4eb2fu);
    double best = 1e300;
    for (int r = 0; r < 3; ++r) {
      Kokkos::fence();
      const auto t0 = std::chrono::steady_clock::now();
      haliax::detail::gemm_batched<float>(false, false, 1, m, n, k, a.data(), b.data(), c.data());
      Kokkos::fence();
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) best = std::min(best, t);  // the first run warms up (buffers, threads, oneDNN's kernels)
    }
    const double f = 2.0 * double(m) * double(n) * double(k);
    flops += s.count * f;
    seconds += s.count * best;
  }
  return flops / seconds;
}

std::int64_t array_memory_bytes() {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (!haliax::detail::host_memory) {
    std::size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) return static_cast<std::int64_t>(total_b);
    return 0;
  }
#endif
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::int64_t>(pages) * page : 0;
}

void check_model_fits(std::int64_t parameters, int ranks, const std::string& what) {
  const std::int64_t have = array_memory_bytes();
  if (have <= 0 || parameters <= 0) return;
  const double need = 16.0 * double(parameters) / double(std::max(ranks, 1));
  if (need <= double(have)) return;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s has %.3g parameters: its f32 parameters, gradients and AdamW moments alone take %.1f GiB%s, but "
                "this %s has %.1f GiB; choose a smaller model (model.hidden_dim, model.num_layers, ...; a model type "
                "without sizes gets upstream's defaults, e.g. 7B for llama)%s",
                what.c_str(), double(parameters), need / double(1 << 30),
                ranks > 1 ? (" per rank over " + std::to_string(ranks) + " ranks").c_str() : "",
                haliax::detail::host_memory ? "machine" : "GPU", double(have) / double(1 << 30),
                ranks > 1 ? " or more ranks" : " or shard it over MPI ranks");
  throw config::config_error(buf);
}

std::string human_duration(double s) {
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

json throughput_meter::on_step(std::int64_t tokens, std::int64_t examples, double seconds) {
  total_tokens += tokens;
  total_seconds += seconds;
  const double tps = double(tokens) / seconds;
  const double fps = tps * flops_per_token;
  const double hfps = tps * (hardware_flops_per_token > 0 ? hardware_flops_per_token : flops_per_token);
  return json{{"throughput/duration", seconds},
              {"throughput/tokens_per_second", tps},
              {"throughput/examples_per_second", double(examples) / seconds},
              {"throughput/gflops_per_second", fps / 1e9},
              {"throughput/mfu", peak_flops > 0 ? fps / peak_flops : 0.0},
              {"throughput/hfu", peak_flops > 0 ? hfps / peak_flops : 0.0},
              {"throughput/total_tokens", total_tokens}};
}

std::string progress_line(std::int64_t step, std::int64_t total, double loss, double lr, double tokens_per_s,
                          double mfu, double eta_s) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "step %lld/%lld  loss %.4f  lr %.3g  %.0f tok/s  MFU %.1f%%  ETA %s", (long long)step,
                (long long)total, loss, lr, tokens_per_s, 100.0 * mfu, human_duration(eta_s).c_str());
  return buf;
}

namespace {
json yaml_to_json(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      json j = json::object();
      for (const auto& kv : n) j[kv.first.as<std::string>()] = yaml_to_json(kv.second);
      return j;
    }
    case YAML::NodeType::Sequence: {
      json j = json::array();
      for (const auto& v : n) j.push_back(yaml_to_json(v));
      return j;
    }
    case YAML::NodeType::Scalar: {
      const auto s = n.Scalar();
      if (n.Tag() != "!") {
        if (s == "true" || s == "false") return s == "true";
        char* end = nullptr;
        const long long i = std::strtoll(s.c_str(), &end, 10);
        if (!s.empty() && *end == 0) return i;
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && *end == 0) return d;
      }
      return s;
    }
    default:
      return nullptr;
  }
}
}  // namespace

json config_to_json(const std::string& yaml_text) { return yaml_to_json(YAML::Load(yaml_text)); }

std::unique_ptr<tracker> make_tracker(const config::OneOrMany<TrackerChoice>& choices,
                                      const std::filesystem::path& run_dir) {
  std::vector<std::unique_ptr<tracker>> ts;
  for (const auto& choice : choices.items) {
    if (const auto* j = choice.get_if<JsonLoggerConfig>())
      ts.push_back(std::make_unique<json_logger_tracker>((run_dir / "metrics.jsonl").string(), j->logger_name));
    else if (choice.get_if<NoopTrackerConfig>())
      ts.push_back(std::make_unique<noop_tracker>());
    else if (const auto* tb = choice.get_if<TensorboardConfig>())
      ts.push_back(std::make_unique<tensorboard_tracker>(
          (std::filesystem::path(tb->logdir.value_or("tblogs")) / run_dir.filename()).string(),
          tb->filename_suffix.value_or(""), tb->write_to_disk));
    else
      throw config::config_error("trainer.tracker: type '" + std::string(choice.type_name()) + "' is not supported");
  }
  if (ts.size() == 1) return std::move(ts.front());
  return std::make_unique<composite_tracker>(std::move(ts));
}

run_context::run_context(const TrainerConfig& t, std::string resolved_yaml, std::ostream& out,
                         const std::string& program, distributed::communicator& comm)
    : yaml_(std::move(resolved_yaml)), program_(program), out_(out) {
  writer_ = comm.rank() == 0;
  // Rank 0 chooses (a random id differs per process); a failure there ends the job before the others use it.
  id_ = distributed::broadcast_string(comm, writer_ ? resolve_run_id(t.id) : std::string());
  id_given_ = (t.id && !t.id->empty()) || (std::getenv("RUN_ID") && *std::getenv("RUN_ID"));
  dir_ = std::filesystem::path(t.log_dir) / id_;
  if (!writer_) {
    trk_ = std::make_unique<noop_tracker>();
    return;
  }
  // A directory that cannot be made because of the path (a file in the way, no permission) is the config's fault
  // (exit 2); a full disk, a quota or a read-only or failing file system is a write failure (exit 5), as for
  // checkpoints.
  auto storage_fault = [](int e) { return e == ENOSPC || e == EDQUOT || e == EIO || e == EROFS || e == EFBIG; };
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    const std::string msg =
        "trainer.log_dir: cannot create the run directory '" + dir_.string() + "' (" + ec.message() + ")";
    if (storage_fault(ec.value())) throw io::io_error(msg);
    throw config::config_error(msg);
  }
  try {
    lock_ = io::dir_lock(dir_);
  } catch (const io::lock_error& e) {
    throw config::config_error("run '" + id_ + "': the run directory " + e.what());
  } catch (const std::exception& e) {
    if (storage_fault(errno)) throw io::io_error(std::string("trainer.log_dir: ") + e.what());
    throw config::config_error(std::string("trainer.log_dir: ") + e.what());
  }
  try {
    io::write_file_atomic(dir_ / "config.yaml", yaml_);
  } catch (const io::io_error& e) {
    throw io::io_error(std::string("trainer.log_dir: ") + e.what());
  }
  trk_ = make_tracker(t.tracker, dir_);
  log_file_.open(dir_ / (program_ + ".log"), std::ios::app);
}

void run_context::say(const std::string& line) {
  if (!writer_) return;
  std::lock_guard lk(mu_);
  out_ << line << std::endl;
  log_file_ << line << std::endl;
}

std::function<void(const std::string&)> run_context::logger() {
  return [this](const std::string& m) { say(program_ + ": " + m); };
}

}  // namespace levanter
