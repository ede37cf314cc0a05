// Backends whose all-reduce works on GPU memory: nccl (NCCL on the
// communication stream) and mpi on GPUs (staged through pinned host memory).
//
// Note [device all-reduce order]: allreduce_async(data) on device memory
// orders the collective after all work issued so far on ctx.compute() (an
// event recorded there), and Work::wait() orders ctx.compute() after the
// collective (cudaStreamWaitEvent): the optimizer, issued after the waits,
// reads averaged gradients, and the host never blocks on the GPU for it.
// allreduce_int64_async and allreduce_doubles_async take device memory the
// same way. The blocking collectives (broadcast, barrier, allgather,
// allreduce_doubles) work on HOST memory, through the MPI communicator `host`
// each backend is given (the run's one: make_mpi_communicator).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "ddp/comm/communicator.hpp"
#include "ddp/runtime/cuda_context.hpp"

namespace ddp::comm {

class DeviceCommunicator : public Communicator {
 public:
  // Blocks the host until everything issued so far on `stream` is done,
  // bounded by the timeout. While waiting it watches the collectives for
  // errors; on an error or the timeout it aborts them (ncclCommAbort) and
  // throws ddp::Error naming `what`, the backend and the timeout.
  virtual void synchronize(cudaStream_t stream, const std::string& what) = 0;
  // How long a host wait on this device may last before it fails: the
  // timeout, and under the watchdog its grace too, so that a peer that
  // stopped is named by the watchdog's report rather than by a wait that
  // ran out at the same moment.
  virtual std::chrono::milliseconds wait_limit() const { return timeout(); }
  // Called from another thread (the watchdog's) just before this process
  // ends the job: stops the collectives in flight so that no kernel keeps
  // the GPU waiting (ncclCommAbort on NCCL; nothing for MPI, whose
  // MPI_Abort follows).
  virtual void abort_now() {}

  // Note [step graphs] (train/step_graphs.hpp): while a stream capture is
  // under way on the caller's thread, the collectives issued are recorded in
  // a CUDA graph, not run: the watchdog does not number them (their events
  // cannot be asked whether they fired).
  virtual void capturing(bool /*on*/) {}
  // Throws ddp::Error naming `what` where the backend has seen its
  // collectives fail (NCCL's asynchronous error): for a host that waits on
  // the device while no call of its own would notice (replayed graphs).
  virtual void check_errors(const std::string& /*what*/) {}
  // The work issued on `stream` so far (a replayed graph's collectives) as
  // one operation, done once the stream gets past this point: the watchdog
  // watches it as it watches an all-reduce, under `what` (of `bytes`).
  // nullptr where the backend has none to watch.
  virtual std::shared_ptr<Work> issued_on(cudaStream_t /*stream*/, std::string /*what*/,
                                          const std::string& /*bytes*/) {
    return nullptr;
  }
};

// NCCL: rank 0 calls ncclGetUniqueId and MPI_Bcasts its 128 bytes, then an
// MPI_Barrier, then every rank joins with a non-blocking ncclCommInitRankConfig
// polled against init_timeout (ncclCommAbort and ddp::Error on timeout,
// naming NCCL_SOCKET_IFNAME, firewalls, NCCL_P2P_DISABLE). Averages with
// ncclAvg on ctx.comm(). Collective over world.comm.
std::unique_ptr<DeviceCommunicator> make_nccl_communicator(const World& world, cuda::Context& ctx,
                                                           std::chrono::milliseconds init_timeout,
                                                           std::unique_ptr<Communicator> host);

// MPI on GPU memory: each bucket is copied to pinned host memory, all-reduced
// by the MPI backend (its communication thread), and copied back, on a
// staging thread of its own; several ranks may share one GPU. Collective over
// world.comm.
std::unique_ptr<DeviceCommunicator> make_staged_mpi_communicator(const World& world, cuda::Context& ctx,
                                                                 std::unique_ptr<Communicator> host);

}  // namespace ddp::comm
