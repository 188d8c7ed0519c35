// levanter/distributed/comm.hpp: the local backend and world() (the deterministic collectives are in
// collectives.cpp).
#include <levanter/distributed/comm.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

namespace levanter::distributed {

namespace detail {
// The MPI backend (src/distributed/mpi.cpp); null when the build has no MPI.
std::unique_ptr<communicator> make_mpi_world(int* argc, char*** argv);
void finalize_mpi();
bool mpi_compiled();
}  // namespace detail

namespace {

class local_communicator final : public communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  void barrier() override {}
  void broadcast(void*, std::size_t, int) override {}
  void allgatherv(const void* in, void* out, const std::vector<std::size_t>& counts,
                  const std::vector<std::size_t>& displs) override {
    copy(in, out, counts, displs);
  }
  void gatherv(const void* in, void* out, const std::vector<std::size_t>& counts,
               const std::vector<std::size_t>& displs, int) override {
    copy(in, out, counts, displs);
  }
  void alltoallv(const void* send, const std::vector<std::size_t>& sc, const std::vector<std::size_t>& sd, void* recv,
                 const std::vector<std::size_t>&, const std::vector<std::size_t>& rd) override {
    if (sc.at(0) && static_cast<const char*>(send) + sd.at(0) != static_cast<char*>(recv) + rd.at(0))
      std::memmove(static_cast<char*>(recv) + rd.at(0), static_cast<const char*>(send) + sd.at(0), sc[0]);
  }
  std::unique_ptr<communicator> split(int, int) override { return std::make_unique<local_communicator>(); }
  [[noreturn]] void abort_job(const std::string& why, int code) override {
    std::cerr << why << std::endl;
    std::exit(code);
  }

 private:
  static void copy(const void* in, void* out, const std::vector<std::size_t>& counts,
                   const std::vector<std::size_t>& displs) {
    char* dst = static_cast<char*>(out) + displs.at(0);
    if (counts.at(0) && dst != in) std::memmove(dst, in, counts[0]);
  }
};

std::unique_ptr<communicator>& world_slot() {
  static std::unique_ptr<communicator> w;
  return w;
}

}  // namespace

std::unique_ptr<communicator> make_local_communicator() { return std::make_unique<local_communicator>(); }

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (const char* e = std::getenv(v); e && *e) return true;
  return false;
}

bool have_mpi() { return detail::mpi_compiled(); }

communicator& world() {
  auto& w = world_slot();
  if (!w) w = make_local_communicator();
  return *w;
}

int init_world(int* argc, char*** argv) {
  auto& w = world_slot();
  if (w && w->backend() != "local") return w->size();
  if (launched_by_mpi()) {
    if (!have_mpi())
      throw comm_error("this process was started by mpirun, but this build has no MPI (CMake did not find it): "
                       "install libopenmpi-dev and rebuild, or run without mpirun");
    w = detail::make_mpi_world(argc, argv);
  } else {
    w = make_local_communicator();
  }
  // The cores of the node are shared by its ranks: each rank's pool gets its share unless the user chose.
  if (w->local_size() > 1 && !std::getenv("HALIAX_NUM_THREADS")) {
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    const unsigned n = std::max(1u, hw / static_cast<unsigned>(w->local_size()));
    ::setenv("HALIAX_NUM_THREADS", std::to_string(n).c_str(), 1);
  }
  return w->size();
}

void finalize_world() {
  auto& w = world_slot();
  if (w && w->backend() == "mpi") {
    w->barrier();
    detail::finalize_mpi();
  }
  w.reset();
}

}  // namespace levanter::distributed
