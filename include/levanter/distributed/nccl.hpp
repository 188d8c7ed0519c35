// levanter/distributed/nccl.hpp: the NCCL backend of levanter/distributed/comm.hpp (device buffers, one GPU a rank).
//
//   auto& host = levanter::distributed::world();                 // the MPI communicator, already initialised
//   int ndev = 0;
//   cudaGetDeviceCount(&ndev);
//   auto gpu = levanter::distributed::make_nccl_communicator(host, host.local_rank() % ndev);
//   gpu->allgatherv(d_in, d_out, counts, displs);                 // d_in, d_out: device pointers
//
// Semantics are those of `communicator`, on device memory: every pointer passed to a collective is a device pointer
// on `device` (or reachable from it), and every call returns only when its transfers are complete, so buffers are
// free to reuse. The collectives run on a stream of their own; the device work that writes their inputs must be
// finished when they are called (work on the legacy default stream is waited for, as that stream is not
// non-blocking). Construction is collective over `host`: rank 0's ncclUniqueId is broadcast over it, and `host`
// must outlive the NCCL communicator (it gives rank(), size(), local_rank(), local_size(), and ends the job in
// abort_job). Construction and every call make `device` the calling thread's current CUDA device.
//
// The deterministic float collectives of comm.hpp (reduce_scatter_sum, allgather_ranges, ...) stage through host
// memory and so take a host communicator, not this one.
//
// Builds configured without -DLEVANTER_NCCL=ON have the declaration only: make_nccl_communicator throws comm_error.
// LEVANTER_HAVE_NCCL is defined to 1 (for levanter_core and its users) when the backend is built.
#pragma once

#include <levanter/distributed/comm.hpp>
#include <memory>

namespace levanter::distributed {

/// A communicator over the ranks of `host` moving bytes between device buffers with NCCL; `device` is the CUDA
/// device ordinal this rank uses (typically host.local_rank() % device count). Collective over `host`. Throws
/// comm_error when a CUDA or NCCL call fails, or when the build has no NCCL backend.
std::unique_ptr<communicator> make_nccl_communicator(communicator& host, int device);

}  // namespace levanter::distributed
