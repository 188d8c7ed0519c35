// The NCCL backend of levanter/distributed/comm.hpp (device buffers), declared in levanter/distributed/nccl.hpp.
// Compiled with LEVANTER_HAVE_NCCL when the build is configured with -DLEVANTER_NCCL=ON (cmake/LevanterNccl.cmake);
// otherwise only the stub at the end is.
#include <levanter/distributed/nccl.hpp>

#if LEVANTER_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <iostream>
#include <string>
#include <string_view>
#include <thread>
#endif

namespace levanter::distributed {

#if LEVANTER_HAVE_NCCL
namespace {

// "<library> <operation>[ <part>]": the message names the collective and, within it, the call that failed.
std::string failure(const char* library, std::string_view what, std::string_view part, const char* reason) {
  std::string msg = std::string(library).append(" ").append(what);
  if (!part.empty()) msg.append(" ").append(part);
  return msg.append(" failed: ").append(reason);
}

void check_cuda(cudaError_t rc, std::string_view what, std::string_view part = {}) {
  if (rc != cudaSuccess) throw comm_error(failure("CUDA", what, part, cudaGetErrorString(rc)));
}

void check_nccl(ncclResult_t rc, std::string_view what, std::string_view part = {}) {
  if (rc == ncclSuccess) return;
  std::string msg = failure("NCCL", what, part, ncclGetErrorString(rc));
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  // The last-error text says what went wrong (which peer, which transport); the code only says what kind.
  if (const char* last = ncclGetLastError(nullptr); last && *last) msg.append(" (").append(last).append(")");
#endif
  throw comm_error(msg);
}

class nccl_communicator final : public communicator {
 public:
  nccl_communicator(communicator& host, int device)
      : host_(host), device_(device), rank_(host.rank()), size_(host.size()) {
    // Rank 0 makes the id and broadcasts it with its status, so that a failure there is reported on every rank
    // instead of leaving the others in ncclCommInitRank with a garbage id.
    struct {
      ncclUniqueId id;
      std::int32_t rc;
    } boot{};
    if (rank_ == 0) boot.rc = ncclGetUniqueId(&boot.id);
    host_.broadcast(&boot, sizeof boot, 0);
    if (boot.rc != ncclSuccess)
      throw comm_error(std::string("NCCL get unique id failed on rank 0: ") +
                       ncclGetErrorString(static_cast<ncclResult_t>(boot.rc)));
    try {
      check_cuda(cudaSetDevice(device_), "set device", std::to_string(device_));
      // A blocking stream (not cudaStreamNonBlocking): it waits for work queued earlier on the legacy default
      // stream, so a caller whose kernels run there needs no synchronisation before a collective.
      check_cuda(cudaStreamCreate(&stream_), "stream create");
      check_cuda(cudaMalloc(&barrier_buf_, 1), "malloc", "(barrier buffer)");
      check_cuda(cudaMemsetAsync(barrier_buf_, 0, 1, stream_), "memset", "(barrier buffer)");
      check_cuda(cudaStreamSynchronize(stream_), "stream synchronize");
      check_nccl(ncclCommInitRank(&comm_, size_, boot.id, rank_), "init rank");
    } catch (...) {
      broken_ = true;  // a communicator left by a failed init is aborted, not destroyed
      release();
      throw;
    }
  }
  ~nccl_communicator() override { release(); }
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_size() const override { return host_.local_size(); }
  int local_rank() const override { return host_.local_rank(); }
  std::string backend() const override { return "nccl"; }

  // A 1-byte max-reduction: no rank's copy completes before every rank has contributed. The buffer holds 0 and the
  // max of zeros leaves it so.
  void barrier() override {
    use_device();
    check_nccl(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclUint8, ncclMax, comm_, stream_), "barrier");
    wait("barrier");
  }

  void broadcast(void* data, std::size_t bytes, int root) override {
    use_device();
    check_nccl(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_), "broadcast");
    wait("broadcast");
    if (rank_ == root) count_sent(bytes * static_cast<std::size_t>(size_ - 1));
  }

  void allgatherv(const void* in, void* out, const std::vector<std::size_t>& counts,
                  const std::vector<std::size_t>& displs) override {
    check_lengths("allgatherv", {&counts, &displs});
    use_device();
    const std::size_t mine = counts[rank_];
    copy_own(in, static_cast<char*>(out) + displs[rank_], mine, "allgatherv");
    group("allgatherv", [&] {
      for (int q = 0; q < size_; ++q) {
        if (q == rank_) continue;
        send(in, mine, q, "allgatherv");
        recv(static_cast<char*>(out) + displs[q], counts[q], q, "allgatherv");
      }
    });
    wait("allgatherv");
    count_sent(mine * static_cast<std::size_t>(size_ - 1));
  }

  void gatherv(const void* in, void* out, const std::vector<std::size_t>& counts,
               const std::vector<std::size_t>& displs, int root) override {
    check_lengths("gatherv", {&counts, &displs});
    use_device();
    if (rank_ == root) {
      copy_own(in, static_cast<char*>(out) + displs[rank_], counts[rank_], "gatherv");
      group("gatherv", [&] {
        for (int q = 0; q < size_; ++q)
          if (q != rank_) recv(static_cast<char*>(out) + displs[q], counts[q], q, "gatherv");
      });
    } else {
      group("gatherv", [&] { send(in, counts[rank_], root, "gatherv"); });
    }
    wait("gatherv");
    if (rank_ != root) count_sent(counts[rank_]);
  }

  // The send and receive buffers must not overlap (apart from this rank's own part, which may be in place): NCCL
  // runs the sends and receives of one group concurrently.
  void alltoallv(const void* send_buf, const std::vector<std::size_t>& sc, const std::vector<std::size_t>& sd,
                 void* recv_buf, const std::vector<std::size_t>& rc, const std::vector<std::size_t>& rd) override {
    check_lengths("alltoallv", {&sc, &sd, &rc, &rd});
    use_device();
    const char* src = static_cast<const char*>(send_buf);
    char* dst = static_cast<char*>(recv_buf);
    copy_own(src + sd[rank_], dst + rd[rank_], sc[rank_], "alltoallv");
    std::size_t sent = 0;
    group("alltoallv", [&] {
      for (int q = 0; q < size_; ++q) {
        if (q == rank_) continue;
        send(src + sd[q], sc[q], q, "alltoallv");
        recv(dst + rd[q], rc[q], q, "alltoallv");
        sent += sc[q];
      }
    });
    wait("alltoallv");
    count_sent(sent);
  }

  std::unique_ptr<communicator> split(int, int) override {
    throw comm_error("the NCCL communicator cannot be split yet (tensor parallelism runs over MPI)");
  }

  [[noreturn]] void abort_job(const std::string& why, int code) override {
    // Printed before ncclCommAbort, which can itself block on a wedged device; host.abort_job prints it again.
    std::cerr << why << std::endl;
    std::cerr.flush();
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    host_.abort_job(why, code);
    std::_Exit(code);  // not reached: host.abort_job does not return (GCC does not see [[noreturn]] on a virtual call)
  }

 private:
  // The collectives may be called from a thread whose current device is another one (or none yet).
  void use_device() {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != device_)
      check_cuda(cudaSetDevice(device_), "set device", std::to_string(device_));
  }

  void check_lengths(const char* what, std::initializer_list<const std::vector<std::size_t>*> lists) const {
    for (const auto* l : lists)
      if (l->size() != static_cast<std::size_t>(size_))
        throw comm_error(std::string("NCCL ") + what + ": " + std::to_string(l->size()) +
                         " counts or displacements for " + std::to_string(size_) + " ranks");
  }

  // This rank's own part of a collective: a device-to-device copy, or nothing when it is already in place.
  void copy_own(const void* from, void* to, std::size_t bytes, const char* what) {
    if (bytes && from != to)
      check_cuda(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream_), what, "copy");
  }

  // Point-to-point calls between ncclGroupStart and ncclGroupEnd are issued together, so the order of the loop does
  // not deadlock. A failure inside the group still ends it, so NCCL is not left with a group open.
  template <class F>
  void group(const char* what, F&& issue) {
    check_nccl(ncclGroupStart(), what, "group start");
    try {
      issue();
    } catch (...) {
      ncclGroupEnd();
      throw;
    }
    check_nccl(ncclGroupEnd(), what, "group end");
  }
  // A zero count on one side is a zero count on the other (counts are consistent across ranks), so both skip it.
  void send(const void* buf, std::size_t bytes, int peer, const char* what) {
    if (bytes) check_nccl(ncclSend(buf, bytes, ncclUint8, peer, comm_, stream_), what, "send");
  }
  void recv(void* buf, std::size_t bytes, int peer, const char* what) {
    if (bytes) check_nccl(ncclRecv(buf, bytes, ncclUint8, peer, comm_, stream_), what, "recv");
  }

  // Returns when everything queued on stream_ is done (the interface is blocking). Polls instead of
  // cudaStreamSynchronize so that an error NCCL detects asynchronously (a peer's network failure) is reported
  // through ncclCommGetAsyncError instead of leaving this rank waiting forever on a kernel that cannot finish.
  void wait(const char* what) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t rc = cudaStreamQuery(stream_);
      if (rc == cudaSuccess) return;
      if (rc != cudaErrorNotReady) {
        broken_ = true;  // a device fault: the queued NCCL kernels will not finish either
        check_cuda(rc, what);
      }
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &async), what, "(async error query)");
      if (async != ncclSuccess) {
        broken_ = true;
        check_nccl(async, what, "(asynchronous error)");
      }
      // Short collectives finish within microseconds: yield at first, then poll every few tens of microseconds
      // so that a long one does not take a core from the host thread pool.
      if (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(1))
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // Also undoes a partly finished constructor. A communicator that saw an error is aborted rather than destroyed:
  // ncclCommDestroy would wait for operations that can no longer complete.
  void release() noexcept {
    cudaSetDevice(device_);
    if (comm_ && broken_)
      ncclCommAbort(comm_);
    else if (comm_)
      ncclCommDestroy(comm_);
    if (barrier_buf_) cudaFree(barrier_buf_);
    if (stream_) cudaStreamDestroy(stream_);
    comm_ = nullptr;
    barrier_buf_ = nullptr;
    stream_ = nullptr;
  }

  communicator& host_;
  int device_;
  int rank_, size_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* barrier_buf_ = nullptr;
  bool broken_ = false;
};

}  // namespace

std::unique_ptr<communicator> make_nccl_communicator(communicator& host, int device) {
  return std::make_unique<nccl_communicator>(host, device);
}

#else

std::unique_ptr<communicator> make_nccl_communicator(communicator&, int) {
  throw comm_error(
      "this build has no NCCL backend (configure with -DLEVANTER_NCCL=ON, which needs the CUDA toolkit "
      "and NCCL)");
}

#endif

}  // namespace levanter::distributed
