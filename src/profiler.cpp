// profiler.hpp: the per-op time breakdown, fed by Kokkos' profiling callbacks.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <haliax/detail/device_guard.hpp>
#include <haliax/detail/profile.hpp>
#include <levanter/profiler.hpp>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <tuple>

namespace levanter {

namespace {

using steady_clock = std::chrono::steady_clock;

struct frame {
  std::string name;
  steady_clock::time_point start;
  double child = 0;
  double flops = 0;
};
struct shared_state {
  std::mutex mu;
  std::atomic<bool> active{false};
  std::atomic<std::thread::id> owner{};
  std::vector<frame> stack;  // the owner thread's open kernels and regions
  std::map<std::string, profile_entry> table;
};
shared_state& state() {
  static shared_state s;
  return s;
}
bool mine() { return state().active && std::this_thread::get_id() == state().owner; }

void open_entry(const char* name) {
  if (!mine()) return;
  state().stack.push_back({name ? name : "?", steady_clock::now(), 0, 0});
}
void close_entry() {
  if (!mine()) return;
  auto& s = state();
  if (s.stack.empty()) return;
  frame f = std::move(s.stack.back());
  s.stack.pop_back();
  const double incl = std::chrono::duration<double>(steady_clock::now() - f.start).count();
  if (!s.stack.empty()) s.stack.back().child += incl;
  std::string phase = "other";
  for (const auto& p : s.stack)
    if (p.name == "forward" || p.name == "backward") phase = p.name;
  if (f.name == "forward" || f.name == "backward") phase = f.name;
  std::string op = f.name, axes;
  if (op.rfind("dot ", 0) == 0) {
    axes = op.substr(4);
    op = "dot";
  }
  std::lock_guard lk(s.mu);
  auto& e = s.table[phase + '\x1f' + op + '\x1f' + axes];
  e.phase = phase;
  e.op = op;
  e.axes = axes;
  e.calls += 1;
  e.total_seconds += incl;
  e.self_seconds += incl - f.child;
  e.flops += f.flops;
}
// The device guard (haliax/detail/device_guard.hpp) listens to the same kernel events; while the profiler holds
// them it forwards to the guard.
void begin_kernel(const char* name, std::uint32_t, std::uint64_t* id) {
  *id = 0;
  haliax::detail::device_guard::enter();
  open_entry(name);
}
void end_kernel(std::uint64_t) {
  close_entry();
  haliax::detail::device_guard::leave();
}
void push_region(const char* name) { open_entry(name); }
void pop_region() { close_entry(); }
void add_flops(double f) {
  if (!mine() || state().stack.empty()) return;
  state().stack.back().flops += f;
}

std::string fixed(double v, int digits) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(digits);
  o << v;
  return o.str();
}
std::string pad(const std::string& s, std::size_t w, bool right = false) {
  if (s.size() >= w) return s + " ";
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

}  // namespace

void profiler::start() {
  auto& s = state();
  std::lock_guard lk(s.mu);
  s.owner = std::this_thread::get_id();
  s.stack.clear();
  s.active = true;
  namespace E = Kokkos::Tools::Experimental;
  E::set_begin_parallel_for_callback(&begin_kernel);
  E::set_end_parallel_for_callback(&end_kernel);
  E::set_begin_parallel_reduce_callback(&begin_kernel);
  E::set_end_parallel_reduce_callback(&end_kernel);
  E::set_begin_parallel_scan_callback(&begin_kernel);
  E::set_end_parallel_scan_callback(&end_kernel);
  E::set_push_region_callback(&push_region);
  E::set_pop_region_callback(&pop_region);
  haliax::detail::profile::flops_hook().store(&add_flops);
}

void profiler::stop() {
  haliax::detail::profile::remove_kernel_callbacks();
  haliax::detail::profile::flops_hook().store(nullptr);
  auto& s = state();
  std::lock_guard lk(s.mu);
  s.active = false;
}

bool profiler::running() const { return state().active; }

std::vector<profile_entry> profiler::entries() const {
  auto& s = state();
  std::lock_guard lk(s.mu);
  std::vector<profile_entry> out;
  for (const auto& [k, e] : s.table) out.push_back(e);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.self_seconds != b.self_seconds ? a.self_seconds > b.self_seconds
                                            : std::tie(a.phase, a.op, a.axes) < std::tie(b.phase, b.op, b.axes);
  });
  return out;
}

void profiler::reset() {
  auto& s = state();
  std::lock_guard lk(s.mu);
  s.table.clear();
}

void profiler::write(const std::filesystem::path& dir, std::int64_t first_step, std::int64_t steps,
                     double seconds) const {
  const auto rows = entries();
  double self_sum = 0;
  for (const auto& r : rows) self_sum += r.self_seconds;
  nlohmann::json j = {{"first_step", first_step},
                      {"steps", steps},
                      {"wall_seconds", seconds},
                      {"attributed_seconds", self_sum},
                      {"ops", nlohmann::json::array()}};
  std::ostringstream t;
  t << "# per-op time of steps " << first_step << ".." << first_step + steps - 1 << " (" << steps << " steps, "
    << fixed(seconds, 3) << " s wall, " << fixed(seconds > 0 ? 100.0 * self_sum / seconds : 0.0, 1)
    << "% attributed); sorted by self time\n";
  t << pad("phase", 9) << pad("op", 34) << pad("calls", 9, true) << pad("self s", 11, true) << pad("self %", 8, true)
    << pad("total s", 11, true) << pad("GFLOP/s", 10, true) << "  axes\n";
  for (const auto& r : rows) {
    const double gf = r.flops > 0 && r.total_seconds > 0 ? r.flops / r.total_seconds / 1e9 : 0.0;
    t << pad(r.phase, 9) << pad(r.op, 34) << pad(std::to_string(r.calls), 9, true)
      << pad(fixed(r.self_seconds, 4), 11, true)
      << pad(fixed(seconds > 0 ? 100.0 * r.self_seconds / seconds : 0.0, 1), 8, true)
      << pad(fixed(r.total_seconds, 4), 11, true) << pad(gf > 0 ? fixed(gf, 1) : "-", 10, true) << "  " << r.axes
      << "\n";
    j["ops"].push_back({{"phase", r.phase},
                        {"op", r.op},
                        {"axes", r.axes},
                        {"calls", r.calls},
                        {"self_seconds", r.self_seconds},
                        {"total_seconds", r.total_seconds},
                        {"flops", r.flops},
                        {"gflops_per_second", gf}});
  }
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "profile.txt") << t.str();
  std::ofstream(dir / "profile.json") << j.dump(2) << "\n";
}

}  // namespace levanter
