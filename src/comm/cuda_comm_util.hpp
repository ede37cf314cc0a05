// What the two GPU backends (nccl_communicator.cu, staged_communicator.cu)
// share: bounded deadlines, bounded waits on a stream, quiet cleanup, a pool
// of CUDA events, and the host-memory collectives through an MPI communicator
// of their own.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/device_communicator.hpp"  // DeviceCommunicator
#include "ddp/runtime/cuda_check.hpp"        // DDP_CUDA_CHECK

namespace ddp::comm::cuda_util {

// A timeout beyond this is "never"; it keeps now() + timeout from overflowing.
inline std::chrono::milliseconds bounded(std::chrono::milliseconds t) {
  return std::clamp(t, std::chrono::milliseconds(0),
                    std::chrono::milliseconds(std::chrono::hours(24 * 365 * 10)));
}

// stream_done without a check.
struct NoCheck {
  void operator()() const {}
};

// Polls `stream` until everything issued on it is done (true), or until
// `deadline` passes first (false), sleeping `pause` between two looks. Before
// each deadline test it calls check(), which may throw (an error state the
// wait must not outlive); a CUDA error other than "not ready" throws.
template <typename Check = NoCheck>
bool stream_done(cudaStream_t stream, std::chrono::steady_clock::time_point deadline,
                 std::chrono::microseconds pause, const Check& check = {}) {
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) DDP_CUDA_CHECK(e);
    check();
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(pause);
  }
}

// Destructors must not throw: their checked calls go through this, which
// drops the error (it would come after the run's result, or hide the error
// being handled).
template <typename F>
void quietly(F&& f) noexcept {
  try {
    f();
  } catch (...) {
  }
}

// Events are made once and reused: an all-reduce needs two per step, and
// creating them each time would be driver calls for nothing. Reuse is safe
// once a Work is gone: cudaStreamWaitEvent captures the event's state at the
// time of the call, so a later cudaEventRecord does not disturb it.
class EventPool {
 public:
  ~EventPool() {
    for (cudaEvent_t e : free_) quietly([&] { DDP_CUDA_CHECK(cudaEventDestroy(e)); });
  }
  cudaEvent_t get() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void put(cudaEvent_t e) {
    if (!e) return;
    std::lock_guard<std::mutex> lk(mu_);
    free_.push_back(e);
  }

 private:
  std::mutex mu_;  // a Work may be released on another thread than the one issuing
  std::vector<cudaEvent_t> free_;
};

// broadcast, barrier, allgather and allreduce_doubles on host memory, by the
// MPI communicator the backend was given, on the caller's thread, under this communicator's timeout (set_timeout is
// not virtual: it is pushed into the MPI communicator at each use).
class HostCollectives : public DeviceCommunicator {
 public:
  void broadcast(void* data, size_t bytes, int root, const std::string& what) override {
    host().broadcast(data, bytes, root, what);
  }
  void barrier(const std::string& what) override { host().barrier(what); }
  std::vector<char> allgather(const void* mine, size_t bytes, const std::string& what) override {
    return host().allgather(mine, bytes, what);
  }
  void allreduce_doubles(double* data, size_t count, bool max, const std::string& what) override {
    host().allreduce_doubles(data, count, max, what);
  }
  void allreduce_int64(int64_t* data, size_t count, const std::string& what) override {
    host().allreduce_int64(data, count, what);
  }

 protected:
  explicit HostCollectives(std::unique_ptr<Communicator> mpi) : host_mpi_(std::move(mpi)) {}
  Communicator& host() {
    host_mpi_->set_timeout(timeout());
    return *host_mpi_;
  }
  std::unique_ptr<Communicator> host_mpi_;  // the caller's thread only
};

}  // namespace ddp::comm::cuda_util
