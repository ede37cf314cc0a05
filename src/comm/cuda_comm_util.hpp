// What the two GPU backends (nccl_communicator.cu, staged_communicator.cu)
// share: bounded deadlines, quiet cleanup, a pool of CUDA events, and the
// host-memory collectives through an MPI communicator of their own.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/comm/device_communicator.hpp"  // DeviceCommunicator
#include "ddp/runtime/cuda_check.hpp"        // DDP_CUDA_CHECK

namespace ddp::comm::cuda_util {

// A timeout beyond this is "never"; it keeps now() + timeout from overflowing.
inline std::chrono::milliseconds bounded(std::chrono::milliseconds t) {
  return std::clamp(t, std::chrono::milliseconds(0),
                    std::chrono::milliseconds(std::chrono::hours(24 * 365 * 10)));
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

// An all-reduce of nothing: done at once.
class DoneWork final : public Work {
 public:
  void wait() override {}
  bool done() override { return true; }
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

 protected:
  explicit HostCollectives(std::unique_ptr<Communicator> mpi) : host_mpi_(std::move(mpi)) {}
  Communicator& host() {
    host_mpi_->set_timeout(timeout());
    return *host_mpi_;
  }
  std::unique_ptr<Communicator> host_mpi_;  // the caller's thread only
};

}  // namespace ddp::comm::cuda_util
