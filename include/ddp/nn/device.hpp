// ddp::nn::Device: what a device supplies to run a Graph (nn/graph.hpp):
// memory, and for each op a Kernel. The executor that runs a graph, Model
// (nn/model.hpp), is written once for every device.
//
// The CPU device is the reference: its kernels are the free functions of
// nn/cpu/ops.hpp (src/nn/cpu/*.cpp); the GPU device's kernels sit beside
// them (src/nn/cuda/*.cu) and must agree with them.
//
// Note [gradient accumulation]: a kernel's backward ADDS parameter gradients
// into dp (beta = 1 in GEMM terms), as PyTorch does; the replica zeroes the
// flat gradient buffer once per optimizer step, which makes gradient
// accumulation (no_sync) free. Input gradients (dx) are OVERWRITTEN; where a
// value feeds several ops the executor adds their contributions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddp/nn/graph.hpp"
#include "ddp/nn/precision.hpp"

namespace ddp::nn {

enum class Mode { Train, Eval };

struct OpArgs {
  int batch = 0;
  Mode mode = Mode::Train;
  std::vector<const float*> x;  // inputs, as Op::inputs
  float* y = nullptr;           // output
  std::vector<float*> p, dp;    // parameters (spec order) and their gradients
  std::vector<float*> buf;      // float buffers (spec order)
  int64_t* counter = nullptr;   // host: num_batches_tracked, or nullptr
};

// Sums over ranks that an op needs in the middle of forward or backward
// (SyncBatchNorm's per-channel statistics): in place, collective (every rank
// calls them in the same order).
class StatsReducer {
 public:
  virtual ~StatsReducer() = default;
  // Host memory, blocking.
  virtual void sum(double* data, size_t n, const std::string& what) = 0;
  // The device's memory, ordered on the device after the work issued before
  // it and before the work issued after it, the host not waiting (a GPU's:
  // the device communicator's, Note [device all-reduce order] in
  // comm/device_communicator.hpp).
  virtual void sum_on_device(double* data, size_t n, const std::string& what) = 0;
  virtual int ranks() const = 0;
  // Waits until the device has done what was issued (a GPU op about to copy
  // its sums to the host), bounded as the run's collectives are: the device
  // may be waiting on a collective a dead peer never joins.
  //
  // Note [bounded copies to the host]: a cudaMemcpyAsync into pageable host
  // memory returns only once the copy is done, and the copy runs after all
  // the stream holds: issued first, it would wait there without a bound. So
  // the bounded wait goes first, and the copy then returns done.
  virtual void sync_device(const std::string& what) = 0;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void forward(const OpArgs& a) = 0;
  // After forward on the same batch (a.y holds its output): adds parameter
  // gradients into a.dp, overwrites dx[i] with d(loss)/d(input i) where dx[i]
  // is not nullptr.
  virtual void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) = 0;
  // Note [mixed precision] (precision.hpp): a convolution's or linear
  // layer's kernel that computes in p itself, making every rounding autocast
  // makes (the GPU's: Note [half kernels]), returns true, and Model then
  // rounds nothing around it; false (the CPU's, and every op's in fp32):
  // Model rounds its operands and results, and the kernel runs in fp32.
  virtual bool set_precision(Precision p) {
    (void)p;
    return false;
  }
  // Note [claimed runs] (nn/model.hpp): the ops this kernel runs as one,
  // its own and the ones after it (1: its own only).
  virtual size_t ops() const { return 1; }
};

// Floats on a device, zero-filled when made.
class Array {
 public:
  virtual ~Array() = default;
  virtual float* data() = 0;
  virtual size_t size() const = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda:0"
  // The kernels of op `op` of g; stats (may be nullptr) is what a
  // synchronised op reduces its statistics with. A kernel may claim the ops
  // after `op` too (Kernel::ops, Note [claimed runs]); the CPU's never do.
  virtual std::unique_ptr<Kernel> kernel(const Graph& g, size_t op, StatsReducer* stats) = 0;
  virtual std::unique_ptr<Array> alloc(size_t n) = 0;
  virtual void fill(float* p, size_t n, float value) = 0;
  virtual void add(float* dst, const float* src, size_t n) = 0;  // dst += src
  virtual void scale(float* p, size_t n, float s) = 0;             // p *= s
  // dst[i] = round_to(prec, src[i]) (Note [mixed precision]); dst may be src.
  virtual void round(float* dst, const float* src, size_t n, Precision prec) = 0;
  // Copies between host and device memory; both return when the copy is done.
  virtual void to_host(float* host, const float* dev, size_t n) = 0;
  virtual void from_host(float* dev, const float* host, size_t n) = 0;
  // Blocks until everything issued so far is done.
  virtual void sync() = 0;
};

// The CPU device: kernels on `threads` threads of a pool of its own (OpenBLAS
// single-threaded on each: Note [serial OpenBLAS] in nn/cpu/gemm.hpp).
std::unique_ptr<Device> make_cpu_device(int threads);

}  // namespace ddp::nn
