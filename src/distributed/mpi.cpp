// The MPI backend of levanter/distributed/comm.hpp (host buffers). Compiled with LEVANTER_HAVE_MPI when CMake finds
// MPI; otherwise only the stubs at the end are.
#include <levanter/distributed/comm.hpp>

#include <climits>
#include <cstdlib>
#include <iostream>
#include <memory>

#if LEVANTER_HAVE_MPI
// The C API only (OpenMPI and MPICH otherwise pull in their deprecated C++ bindings and their library).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace levanter::distributed::detail {

#if LEVANTER_HAVE_MPI
namespace {

// MPI counts are ints: buffers are moved in units of 64, 8, 4 or 1 bytes (the largest that divides every count and
// displacement), so one call carries up to 2^31 units.
class byte_units {
 public:
  explicit byte_units(std::initializer_list<const std::vector<std::size_t>*> lists) {
    std::size_t all = 0;
    for (const auto* l : lists)
      for (std::size_t v : *l) all |= v;
    for (std::size_t u : {64u, 8u, 4u})
      if (all % u == 0) {
        unit_ = u;
        break;
      }
    if (unit_ > 1) {
      MPI_Type_contiguous(static_cast<int>(unit_), MPI_BYTE, &type_);
      MPI_Type_commit(&type_);
    }
  }
  ~byte_units() {
    if (unit_ > 1) MPI_Type_free(&type_);
  }
  MPI_Datatype type() const { return unit_ > 1 ? type_ : MPI_BYTE; }
  std::vector<int> ints(const std::vector<std::size_t>& v, const char* what) const {
    std::vector<int> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      const std::size_t u = v[i] / unit_;
      if (u > static_cast<std::size_t>(INT_MAX))
        throw comm_error(std::string("MPI ") + what + ": a buffer of " + std::to_string(v[i]) +
                         " bytes is too large for one MPI call");
      out[i] = static_cast<int>(u);
    }
    return out;
  }

 private:
  std::size_t unit_ = 1;
  MPI_Datatype type_{};
};

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw comm_error(std::string("MPI ") + what + " failed: " + std::string(msg, static_cast<std::size_t>(len)));
}

class mpi_communicator final : public communicator {
 public:
  mpi_communicator() {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    setup();
  }
  explicit mpi_communicator(MPI_Comm c) : comm_(c) { setup(); }
  void setup() {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm node;
    MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_size(node, &local_size_);
    MPI_Comm_free(&node);
  }
  ~mpi_communicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_size() const override { return local_size_; }
  int local_rank() const override { return local_rank_; }
  std::string backend() const override { return "mpi"; }

  void barrier() override { check(MPI_Barrier(comm_), "barrier"); }

  void broadcast(void* data, std::size_t bytes, int root) override {
    const std::vector<std::size_t> c{bytes};
    byte_units u({&c});
    check(MPI_Bcast(data, u.ints(c, "broadcast")[0], u.type(), root, comm_), "broadcast");
    if (rank_ == root) count_sent(bytes * static_cast<std::size_t>(size_ - 1));
  }

  void allgatherv(const void* in, void* out, const std::vector<std::size_t>& counts,
                  const std::vector<std::size_t>& displs) override {
    byte_units u({&counts, &displs});
    const auto c = u.ints(counts, "allgatherv"), d = u.ints(displs, "allgatherv");
    const void* src = in == static_cast<char*>(out) + displs.at(rank_) ? MPI_IN_PLACE : in;
    check(MPI_Allgatherv(src, c[rank_], u.type(), out, c.data(), d.data(), u.type(), comm_), "allgatherv");
    count_sent(counts[rank_] * static_cast<std::size_t>(size_ - 1));
  }

  void gatherv(const void* in, void* out, const std::vector<std::size_t>& counts,
               const std::vector<std::size_t>& displs, int root) override {
    byte_units u({&counts, &displs});
    const auto c = u.ints(counts, "gatherv"), d = u.ints(displs, "gatherv");
    const bool in_place = rank_ == root && in == static_cast<char*>(out) + displs.at(rank_);
    check(MPI_Gatherv(in_place ? MPI_IN_PLACE : in, c[rank_], u.type(), out, c.data(), d.data(), u.type(), root,
                      comm_),
          "gatherv");
    if (rank_ != root) count_sent(counts[rank_]);
  }

  void alltoallv(const void* send, const std::vector<std::size_t>& sc, const std::vector<std::size_t>& sd, void* recv,
                 const std::vector<std::size_t>& rc, const std::vector<std::size_t>& rd) override {
    byte_units u({&sc, &sd, &rc, &rd});
    const auto a = u.ints(sc, "alltoallv"), b = u.ints(sd, "alltoallv"), c = u.ints(rc, "alltoallv"),
               d = u.ints(rd, "alltoallv");
    check(MPI_Alltoallv(send, a.data(), b.data(), u.type(), recv, c.data(), d.data(), u.type(), comm_), "alltoallv");
    std::size_t sent = 0;
    for (int q = 0; q < size_; ++q)
      if (q != rank_) sent += sc[q];
    count_sent(sent);
  }

  std::unique_ptr<communicator> split(int color, int key) override {
    MPI_Comm c{};
    check(MPI_Comm_split(comm_, color, key, &c), "comm_split");
    return std::make_unique<mpi_communicator>(c);
  }

  [[noreturn]] void abort_job(const std::string& why, int code) override {
    std::cerr << why << std::endl;
    std::cerr.flush();
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  MPI_Comm comm_{};
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

bool g_started = false;

}  // namespace

std::unique_ptr<communicator> make_mpi_world(int* argc, char*** argv) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    // Collectives are called from the main thread only (the checkpoint writer thread does no MPI).
    check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "init");
    g_started = true;
  }
  return std::make_unique<mpi_communicator>();
}

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (g_started && !finalized) MPI_Finalize();
}

bool mpi_compiled() { return true; }

#else

std::unique_ptr<communicator> make_mpi_world(int*, char***) {
  throw comm_error("this build has no MPI backend (CMake did not find MPI)");
}
void finalize_mpi() {}
bool mpi_compiled() { return false; }

#endif

}  // namespace levanter::distributed::detail
