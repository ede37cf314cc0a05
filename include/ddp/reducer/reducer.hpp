// ddp::Reducer: bucketed gradient averaging that overlaps backward.
//
// Note [bucket order]: buckets are contiguous slices of the flat gradient
// buffer, fixed at construction from the parameter sizes in flat (= backward)
// order, identical on every rank. A bucket never splits a parameter. The first
// bucket is capped smaller (min(1 MiB, cap)) so communication starts early.
// Buckets are launched strictly in index order, so every rank issues the same
// sequence of collectives.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/communicator.hpp"  // Communicator, Work
#include "ddp/core/trace.hpp"          // Trace: --trace's spans

namespace ddp {

struct Bucket {
  size_t begin = 0, end = 0;  // element range in the gradient buffer
  size_t first_param = 0, last_param = 0;  // [first, last) indices of the parameters it holds
};

// Buckets over parameters of the given sizes (elements, flat order).
std::vector<Bucket> plan_buckets(const std::vector<size_t>& param_numels, size_t cap_bytes,
                                 size_t first_cap_bytes);

struct ReducerStats {
  double wait_sec = 0;  // time spent in finish() waiting for buckets
  int buckets_launched_early = 0;  // launched before finish() was called
  // Time some bucket was in flight (launch to completion, overlapping
  // buckets counted once), and the part of it before finish() was called:
  // the communication the backward hid.
  double comm_sec = 0, hidden_sec = 0;
};

class Reducer {
 public:
  // overlap = false defers every bucket to finish() (to measure the overlap);
  // wire is what the gradients travel as (--grad-compression).
  Reducer(comm::Communicator& comm, float* grads, const std::vector<size_t>& param_numels,
          double bucket_cap_mb, bool overlap = true, comm::Wire wire = comm::Wire::F32);

  const std::vector<Bucket>& buckets() const { return buckets_; }

  // Call before each backward.
  void begin_backward();
  // Hook for Model::backward: the first n elements of the gradient buffer are
  // final; launches every not-yet-launched bucket that lies inside them.
  void grads_ready(size_t n);
  // Launches what is left, waits for all buckets; gradients are then averaged
  // over ranks. Returns this step's stats.
  ReducerStats finish();

  // no_sync: while false, begin_backward/grads_ready/finish communicate nothing
  // and gradients accumulate locally.
  void set_sync(bool sync) { sync_ = sync; }

  // The parameters' names in flat order, for the names of the buckets'
  // all-reduces ("... (parameters 4..9: fc1.bias .. conv2.weight)"), which
  // timeouts and the watchdog report.
  void set_param_names(std::vector<std::string> names);

  // Each bucket's all-reduce, launch to completion, as a span of the trace
  // (nullptr: none).
  void set_trace(Trace* trace) { trace_ = trace; }

  // All-reduces launched since construction, and their bytes on the wire.
  int64_t launches() const { return launches_; }
  int64_t launched_bytes() const { return launched_bytes_; }
  // Note [step graphs] (train/step_graphs.hpp): a replayed step launched
  // these all-reduces of these bytes, captured from a step of this reducer.
  void replayed(int64_t launches, int64_t bytes) {
    launches_ += launches;
    launched_bytes_ += bytes;
  }

 private:
  void launch(size_t k);
  comm::Communicator& comm_;
  float* grads_;
  std::vector<Bucket> buckets_;
  std::vector<std::shared_ptr<comm::Work>> work_;
  std::vector<std::chrono::steady_clock::time_point> launched_at_;
  Trace* trace_ = nullptr;
  std::vector<std::string> names_;  // one per bucket: what its all-reduce is called
  size_t next_ = 0;
  bool overlap_, sync_ = true;
  comm::Wire wire_;
  int launched_early_ = 0;
  int64_t launches_ = 0, launched_bytes_ = 0;
};

// Copies rank 0's count floats (host memory: parameters, buffers) to every
// rank, in pieces small enough for any MPI count; what names them in errors.
void broadcast_from_rank0(comm::Communicator& comm, float* data, size_t count, const std::string& what);

}  // namespace ddp
