// levanter/distributed/comm.hpp: the processes of one run and the collectives the trainer needs between them.
//
//   auto& w = levanter::distributed::world();       // this process's communicator (size 1 without mpirun)
//   w.rank(), w.size();
//   levanter::distributed::reduce_scatter_sum(w, grads.data(), bounds);   // rank r ends with the sum of its range
//   levanter::distributed::allgather_ranges(w, params.data(), bounds);    // every rank ends with every range
//
// A `communicator` moves bytes (backends: `local` for one process, `mpi` over host buffers, `nccl` over device
// buffers when built with CUDA and NCCL). The float collectives the trainer uses are written on top of it, once,
// so their arithmetic is ours and not the library's: a reduce-scatter adds the ranks' contributions along one fixed
// tree (`tree_order`: halves, split at the middle), so the same run on the same number of ranks gives the same
// bits (MPI_Allreduce makes no such promise), a sum over one rank is the value itself, and with a power-of-two
// rank count the tree over ranks continues the tree the trainer uses over micro-batches, which makes a run's
// gradients independent of how many ranks computed them. Every call is blocking: buffers are free to reuse when it
// returns.
//
// Failure: a rank that throws ends the job (`abort_job`: MPI_Abort with the reason printed first), so no rank is
// left waiting in a collective for a peer that is gone. Every collective must be called by all ranks in the same
// order; the trainer's structure guarantees it (decisions taken on one rank are broadcast first).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace levanter::distributed {

/// A collective failed or the processes are set up wrongly (e.g. launched by mpirun but built without MPI).
struct comm_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Byte-moving primitives over the ranks of one job. Sizes are in bytes; buffers are host memory for `local` and
/// `mpi`, device memory for `nccl`.
class communicator {
 public:
  virtual ~communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "local", "mpi" or "nccl".
  virtual std::string backend() const = 0;
  /// Ranks sharing this node (for sizing thread pools), and this rank's index among them.
  virtual int local_size() const { return 1; }
  virtual int local_rank() const { return 0; }

  virtual void barrier() = 0;
  /// `bytes` at `data` on `root` copied to every rank's `data`.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  /// Rank r's `counts[r]` bytes at `in` land at `out + displs[r]` on every rank.
  virtual void allgatherv(const void* in, void* out, const std::vector<std::size_t>& counts,
                          const std::vector<std::size_t>& displs) = 0;
  /// As allgatherv, but only `root` receives (`out` may be null elsewhere).
  virtual void gatherv(const void* in, void* out, const std::vector<std::size_t>& counts,
                       const std::vector<std::size_t>& displs, int root) = 0;
  /// Rank r sends `send_counts[q]` bytes from `send + send_displs[q]` to rank q, which receives them at
  /// `recv + recv_displs[r]` (counts and displacements as each side sees them).
  virtual void alltoallv(const void* send, const std::vector<std::size_t>& send_counts,
                         const std::vector<std::size_t>& send_displs, void* recv,
                         const std::vector<std::size_t>& recv_counts, const std::vector<std::size_t>& recv_displs) = 0;
  /// Ends every process of the job with `code` after printing `why` (never returns).
  [[noreturn]] virtual void abort_job(const std::string& why, int code) = 0;
  /// The ranks with the same `color` as a communicator of their own, ordered by `key` (collective: every rank
  /// calls it). Tensor parallelism splits the world into data groups and model groups this way.
  virtual std::unique_ptr<communicator> split(int color, int key) = 0;

  /// Bytes this rank has sent to other ranks (its own part of a collective excluded), for the per-step traffic
  /// figure.
  std::uint64_t bytes_sent() const { return bytes_sent_; }

 protected:
  void count_sent(std::uint64_t b) { bytes_sent_ += b; }

 private:
  std::uint64_t bytes_sent_ = 0;
};

/// One process: every collective is a copy.
std::unique_ptr<communicator> make_local_communicator();

/// Whether this process was started by mpirun/srun (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK in the
/// environment).
bool launched_by_mpi();
/// Whether this build has the MPI backend.
bool have_mpi();

/// This process's communicator: MPI when `init_world` found an MPI launch, else the local one.
communicator& world();

/// Starts MPI when this process was launched by mpirun (and the build has MPI), sizes the thread pool to the
/// cores this rank owns (hardware threads / ranks on the node, unless HALIAX_NUM_THREADS is set), and makes
/// `world()` return it. Call once at the start of main. Throws comm_error when launched by mpirun without MPI in
/// the build. Returns the world size.
int init_world(int* argc, char*** argv);
/// Ends MPI (after a barrier) when init_world started it; safe to call more than once.
void finalize_world();

// ---- deterministic float collectives (tree-order sums) ----

/// The order in which `n` terms t[0..n) are added: the sum of [lo, hi) is sum[lo, mid) + sum[mid, hi) with
/// mid = lo + (hi - lo) / 2, down to single terms. Calls add(into, from) for each addition, meaning
/// t[into] = t[into] + t[from] (the left half's sum + the right half's), so that t[0] ends as the sum. For n a
/// power of two this is the balanced pairwise tree; blocks of n / 2^k consecutive terms are always subtrees, which
/// is what makes "k ranks, each summing its block" equal "one process summing everything".
template <class F>
void tree_order(std::int64_t n, F&& add, std::int64_t lo = 0) {
  if (n <= 1) return;
  const std::int64_t half = n / 2;
  tree_order(half, add, lo);
  tree_order(n - half, add, lo + half);
  add(static_cast<int>(lo), static_cast<int>(lo + half));
}

/// Splits [0, n) into `parts` contiguous ranges at the given boundaries' granularity: bounds[0] = 0,
/// bounds[parts] = n, each range as close to n / parts as the `align` grid allows (`align` = 1: exact split).
std::vector<std::int64_t> even_bounds(std::int64_t n, int parts, std::int64_t align = 1);

/// data[0, n) on every rank (n = bounds.back()): afterwards rank r's range [bounds[r], bounds[r+1]) holds the sum
/// over ranks of that range, added in tree_order over the ranks; the rest of `data` is left as it was. Sends
/// (N-1)/N of the buffer.
void reduce_scatter_sum(communicator& c, float* data, const std::vector<std::int64_t>& bounds);
/// Every rank's range [bounds[r], bounds[r+1]) of `data` copied to every rank. Sends 1/N of the buffer to each of
/// N-1 ranks.
void allgather_ranges(communicator& c, float* data, const std::vector<std::int64_t>& bounds);
/// reduce_scatter_sum then allgather_ranges: every rank ends with the same tree-order sum.
void allreduce_sum(communicator& c, float* data, std::int64_t n);
/// Rank r's `mine` (a vector of any length) concatenated in rank order on every rank.
std::vector<double> allgather_doubles(communicator& c, const std::vector<double>& mine);
/// The sum over ranks of `x`, added in tree_order, on every rank.
double allreduce_sum(communicator& c, double x);
/// Rank `root`'s string on every rank.
std::string broadcast_string(communicator& c, const std::string& s, int root = 0);
/// Rank `root`'s flag on every rank.
bool broadcast_flag(communicator& c, bool b, int root = 0);

}  // namespace levanter::distributed
