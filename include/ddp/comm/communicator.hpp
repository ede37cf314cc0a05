// ddp::comm::Communicator: the one interface every collective goes through.
// Backends (one file each): mpi (host memory, MPI), and later nccl (GPU).
// The backend is chosen once at start (make_communicator).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "ddp/runtime/world.hpp"

namespace ddp::comm {

enum class ReduceOp { Sum, Avg };

// What an all-reduce's floats travel as: themselves, or rounded to 16 bits
// (PyTorch DDP's fp16_compress_hook / bf16_compress_hook): half the bytes.
enum class Wire { F32, F16, BF16 };
const char* wire_name(Wire w);  // "none", "fp16", "bf16": --grad-compression's words
size_t wire_bytes(Wire w);      // bytes per value on the wire: 4 or 2
// What errors call an all-reduce of count values: "what (1.5 MiB)", or
// "what (768 KiB as bf16)" when it travels in 16 bits.
std::string allreduce_label(const std::string& what, size_t count, Wire w);

// An operation in flight. wait() returns when it is complete on this rank, and
// throws ddp::Error when it fails or does not complete within the
// communicator's timeout (naming the operation and the timeout).
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool done() = 0;
  // When it completed on this rank, where the backend knows (the MPI
  // backend's communication thread stamps it); else the epoch (zero). Valid
  // after wait() returned.
  virtual std::chrono::steady_clock::time_point finished_at() const { return {}; }
};

// w.done() for callers that must not throw (destructors, the watchdog's
// thread): a done() that throws, its communicator failed (NCCL's), counts as
// not done, since whether the operation still writes its buffer is unknown.
inline bool done_nothrow(Work& w) noexcept {
  try {
    return w.done();
  } catch (...) {
    return false;
  }
}

// An operation complete when issued: what an all-reduce of nothing, over one
// rank, or finished before it returns gives back.
class DoneWork final : public Work {
 public:
  void wait() override {}
  bool done() override { return true; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual const char* backend() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In-place all-reduce of count floats. The buffer must stay valid and
  // untouched until wait() returns. Operations complete in the order issued,
  // and every rank must issue the same sequence.
  virtual std::shared_ptr<Work> allreduce_async(float* data, size_t count, ReduceOp op,
                                                std::string what = "all-reduce") = 0;
  // The same, the values travelling as `wire`: each rank's floats are
  // rounded to 16 bits (divided by the world size first for Avg, as
  // PyTorch's hooks do, so the sum cannot overflow), summed in 16 bits, and
  // written back as floats. Wire::F32 is allreduce_async; a backend
  // without 16-bit all-reduces throws ddp::Error for the others.
  virtual std::shared_ptr<Work> allreduce_compressed_async(float* data, size_t count, ReduceOp op, Wire wire,
                                                           std::string what);

  // Blocking collectives, each bounded by the timeout.
  virtual void broadcast(void* data, size_t bytes, int root, const std::string& what) = 0;
  virtual void barrier(const std::string& what) = 0;
  // Every rank's `bytes` bytes, concatenated in rank order.
  virtual std::vector<char> allgather(const void* mine, size_t bytes, const std::string& what) = 0;
  // Sum or max of small integer/double vectors (metrics, agreement checks).
  virtual void allreduce_doubles(double* data, size_t count, bool max, const std::string& what) = 0;
  // Exact sum of int64 vectors of any length (--deterministic's fixed-point
  // gradients): integer addition is associative, so every rank gets the same
  // sum whatever the reduction order. The caller keeps the sums in range.
  virtual void allreduce_int64(int64_t* data, size_t count, const std::string& what) = 0;
  // The same sum on the memory allreduce_async works on (a GPU backend's:
  // device memory, ordered as its float all-reduces are, Note [device
  // all-reduce order] in device_communicator.hpp). The buffer must stay valid
  // and untouched until wait() returns. This default, for host-memory
  // backends, is allreduce_int64, done when it returns.
  virtual std::shared_ptr<Work> allreduce_int64_async(int64_t* data, size_t count, std::string what);
  // Sum of count doubles on that memory, ordered the same way: SyncBatchNorm's
  // statistics on a GPU, summed without the host waiting for them. The
  // buffer must stay valid and untouched until wait() returns. This
  // default, for host-memory backends, is allreduce_doubles, done when it
  // returns.
  virtual std::shared_ptr<Work> allreduce_doubles_async(double* data, size_t count, std::string what);

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

 protected:
  std::chrono::milliseconds timeout_{std::chrono::seconds(300)};
};

// How the MPI backend waits on a request it has started: MPI_Test back to
// back for spin_us, then sleep between tests, doubling from 1 us up to
// max_sleep_us. Sleeping leaves the core to compute (Open MPI would otherwise
// poll at full speed); the cap bounds the latency it adds. The defaults are
// what measured best on a 2-core box at np 2 (bench_overlap --poll).
struct MpiOptions {
  int spin_us = 20;
  int max_sleep_us = 50;
};

// The MPI backend over world.comm. All-reduces run on a dedicated
// communication thread, so they progress while the caller computes (Open MPI
// has no asynchronous progress of its own); the blocking collectives run on
// the caller's thread. Nothing blocks inside MPI: every wait is bounded by the
// timeout. Construction is collective over world.comm (it duplicates it):
// every rank constructs its communicators in the same order.
std::unique_ptr<Communicator> make_mpi_communicator(const World& world);
std::unique_ptr<Communicator> make_mpi_communicator(const World& world, const MpiOptions& options);

// "1.5 MiB", "300 s", "250 ms": the units error messages use.
std::string format_bytes(size_t bytes);
std::string format_duration(std::chrono::milliseconds t);

}  // namespace ddp::comm
