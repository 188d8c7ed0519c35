// Checkpoint save and load of GPT-2 small (124M parameters, vocabulary 50257) with its AdamW state (about
// 1.5 GB), against `cp` of the same files on the same disk.
//
//   snapshot   the in-memory copy taken on the training thread (what training waits for)
//   write      HDF5 files + fsync + metadata.json + rename (runs on the background thread in train_lm)
//   load       discover + verify + read into the model and optimizer state
//   cp         `cp -r` of the written checkpoint directory, and `cp -r` followed by `sync`
//
// Counters: MB_per_s (bytes of the HDF5 files / time). Set LEVANTER_BENCH_DIR to put the files on another
// disk (default: the system temporary directory).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include <levanter/checkpoint/train_state.hpp>
#include <levanter/models/gpt2.hpp>

#include "bench_common.hpp"

namespace fs = std::filesystem;
namespace ck = levanter::checkpoint;
using levanter::gpt2::LMHeadModel;

namespace {

struct state {
  levanter::Gpt2Config cfg;
  LMHeadModel model;
  std::unique_ptr<levanter::optim::adamw_optimizer<LMHeadModel>> opt;
  fs::path dir;
  std::uint64_t bytes = 0;
};

std::unique_ptr<state>& shared_ptr() {
  static std::unique_ptr<state> s = [] {
    auto st = std::make_unique<state>();
    st->model = LMHeadModel::init(st->cfg, 50257, haliax::random::make_key(0));
    levanter::AdamConfig oc;
    st->opt = std::make_unique<levanter::optim::adamw_optimizer<LMHeadModel>>(oc, 100, st->model);
    const char* base = std::getenv("LEVANTER_BENCH_DIR");
    st->dir = fs::path(base ? base : fs::temp_directory_path().string()) / ("levanter_bench_checkpoint_" + std::to_string(::getpid()));
    fs::remove_all(st->dir);
    fs::create_directories(st->dir);
    return st;
  }();
  return s;
}
state& shared() { return *shared_ptr(); }

std::vector<ck::named_file> files(const state& s) {
  return ck::train_state_files<LMHeadModel>(s.model, s.opt.get(), 100, haliax::random::make_key(1), 0, "");
}

void set_rate(benchmark::State& bs, double bytes) {
  bs.counters["MB_per_s"] = benchmark::Counter(bytes / 1e6, benchmark::Counter::kIsIterationInvariantRate);
  bs.counters["MB"] = bytes / 1e6;
}

void BM_snapshot(benchmark::State& bs) {
  auto& s = shared();
  std::uint64_t bytes = 0;
  for (auto _ : bs) {
    auto f = files(s);
    bytes = 0;
    for (const auto& x : f) bytes += x.data.bytes();
    benchmark::DoNotOptimize(f.data());
  }
  set_rate(bs, double(bytes));
}

void BM_write(benchmark::State& bs) {
  auto& s = shared();
  auto f = files(s);
  for (auto _ : bs) {
    s.bytes = ck::write_checkpoint(s.dir / "step-100", f, 100, false, std::chrono::system_clock::now());
  }
  set_rate(bs, double(s.bytes));
}

void BM_load(benchmark::State& bs) {
  auto& s = shared();
  if (!fs::exists(s.dir / "step-100" / "metadata.json"))
    s.bytes = ck::write_checkpoint(s.dir / "step-100", files(s), 100, false, std::chrono::system_clock::now());
  for (auto _ : bs) {
    auto found = ck::discover(s.dir);
    auto loaded = ck::load_train_state<LMHeadModel>(found.checkpoints.at(0), s.model, s.opt.get(), false);
    benchmark::DoNotOptimize(loaded.step);
  }
  set_rate(bs, double(s.bytes));
}

void cp_bench(benchmark::State& bs, bool with_sync) {
  auto& s = shared();
  if (!fs::exists(s.dir / "step-100" / "metadata.json"))
    s.bytes = ck::write_checkpoint(s.dir / "step-100", files(s), 100, false, std::chrono::system_clock::now());
  const auto src = (s.dir / "step-100").string(), dst = (s.dir / "copy").string();
  const std::string cmd = "rm -rf '" + dst + "' && cp -r '" + src + "' '" + dst + "'" + (with_sync ? " && sync" : "");
  for (auto _ : bs) {
    bs.PauseTiming();
    fs::remove_all(dst);
    bs.ResumeTiming();
    if (std::system(cmd.c_str()) != 0) bs.SkipWithError("cp failed");
  }
  set_rate(bs, double(s.bytes));
}
void BM_cp(benchmark::State& bs) { cp_bench(bs, false); }
void BM_cp_sync(benchmark::State& bs) { cp_bench(bs, true); }

}  // namespace

BENCHMARK(BM_snapshot)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(BM_write)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(BM_cp)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(BM_cp_sync)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(BM_load)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

int main(int argc, char** argv) {
  haliax::runtime rt;
  bench::add_context();
  benchmark::AddCustomContext("checkpoint_dir", shared().dir.string());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  fs::remove_all(shared().dir);
  shared_ptr().reset();  // its arrays must go before Kokkos is finalised
  return 0;
}
