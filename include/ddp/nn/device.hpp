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
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/core/fixed_point.hpp"  // Sink
#include "ddp/nn/graph.hpp"
#include "ddp/nn/precision.hpp"

namespace ddp::nn {

enum class Mode { Train, Eval };

// Note [micro-shards]: under --deterministic a rank's batch is a run of
// micro-shards of a fixed size, the same at every world size (deterministic/exact_sum.hpp).
// A model with BatchNorm runs its whole batch op by op (Model::forward with a
// shard size): every other op is called once per micro-shard, so its kernels
// see the batch they would see at any world size, and BatchNorm takes the
// whole batch with OpArgs::shard set. Its statistics are then summed shard by
// shard, and the shards' sums added in global shard order over every rank
// (StatsReducer::sum_shards): the same doubles, added in the same order, at
// any world size. Its weight and bias gradients are handed over one shard at
// a time (OpArgs::shard_grads), as every other op's are.
//
// Note [lanes]: a device runs micro-shards on lanes (Device::lanes, the CPU's
// threads): every op but BatchNorm hands its micro-shards to whichever lane
// is free, and on a lane a kernel runs single-threaded with that lane's
// scratch. A shard's arithmetic is then that of one thread alone, whichever
// lane takes it and however many lanes there are: the same bits at one rank
// of many threads as at many ranks of one. Each lane's parameter gradients go
// to a buffer of its own (Model::backward_shards).
//
// Note [shard runs]: a kernel whose samples do not depend on the rest of
// their call's batch may take a lane's micro-shards in one call
// (Kernel::shards_in_one_call): a CPU convolution on the packed GEMM, whose
// every output element is the same float whatever columns sit beside it
// (Note [packed weights] in nn/cpu/packed_gemm.hpp), on the path and tile size its
// micro-shard's size chose. Its weights are then read once a run rather than
// once a micro-shard: ResNet-18's 512-channel layers stream 17 MB of them a
// call. Only the weight and bias gradients, summed per micro-shard, still
// take a call each, but where the kernel converts them into the fixed-point
// sums itself (Note [fixed-point epilogue] in nn/cpu/packed_gemm.hpp). Evaluation's
// last, smaller micro-shard is a call alone.
struct OpArgs {
  int batch = 0;
  Mode mode = Mode::Train;
  std::vector<const float*> x;  // inputs, as Op::inputs
  float* y = nullptr;           // output
  std::vector<float*> p, dp;    // parameters (spec order) and their gradients
  std::vector<float*> buf;      // float buffers (spec order)
  int64_t* counter = nullptr;   // host: num_batches_tracked, or nullptr
  // Note [micro-shards]: 0, or the micro-shard size the batch is made of; then
  // backward hands each shard's parameter gradients over by calling
  // shard_grads() once they alone are in dp (it takes them and zeroes dp).
  int shard = 0;
  std::function<void()> shard_grads;
  // Note [lanes]: -1, or the lane this call runs on, concurrently with the
  // other lanes; then `first` is the index in the whole batch of its first
  // sample (for what a kernel keeps per sample between forward and backward).
  int lane = -1;
  int64_t first = 0;
  // Note [fixed-point epilogue] (nn/cpu/packed_gemm.hpp): empty, or, on a backward
  // call with a run of micro-shards of `shard` samples (and no a.dp), one
  // Sink per parameter: each micro-shard's parameter gradients go there,
  // converted and added by the kernel (Kernel::shard_grads_to_sinks).
  std::vector<fixed_point::Sink> sinks;
};

// Where this call's first sample sits in the whole batch: `first` on a lane,
// 0 off the lanes (the call has the whole batch). What a kernel keeps per
// sample between forward and backward goes there.
inline int64_t first_sample(const OpArgs& a) { return a.lane >= 0 ? a.first : 0; }

// Sums over ranks that an op needs in the middle of forward or backward
// (SyncBatchNorm's per-channel statistics): in place, host memory, blocking,
// collective (every rank calls it in the same order).
class StatsReducer {
 public:
  virtual ~StatsReducer() = default;
  virtual void sum(double* data, size_t n, const std::string& what) = 0;
  // Note [micro-shards]: per_shard holds this rank's `shards` runs of n values
  // (shard-major); out[i] is value i summed over every rank's shards in global
  // shard order (rank 0's first), in double: the same bits at any world size.
  virtual void sum_shards(const double* per_shard, int shards, size_t n, double* out, const std::string& what) = 0;
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

// out[i] = the sum of per_shard[k * n + i] over k = 0 .. shards - 1, in that
// order, in double (Note [micro-shards]).
inline void sum_in_shard_order(const double* per_shard, size_t shards, size_t n, double* out) {
  for (size_t i = 0; i < n; ++i) out[i] = 0.0;
  for (size_t k = 0; k < shards; ++k)
    for (size_t i = 0; i < n; ++i) out[i] += per_shard[k * n + i];
}

// Note [micro-shards]: a BatchNorm call's batch as n runs of `size` images,
// `stride` floats apart (one run, the whole batch, without OpArgs::shard),
// and where each run's `width` sums go: run k's at base + k * width. Throws
// when the shard size does not divide the batch, naming op.
struct ShardRuns {
  int n = 1, size = 0;
  int64_t stride = 0;
  size_t width = 0;
  double* base = nullptr;
  double* sums(int k) const { return base + size_t(k) * width; }
};
ShardRuns shard_runs(const OpArgs& a, int64_t image_floats, size_t width, const std::string& op);

// Note [shard runs]: the calls that cover a batch of micro-shards of `shard`
// samples on `lanes` lanes: the whole micro-shards in one contiguous run a
// lane, as even as they split, then evaluation's last, smaller one alone.
struct ShardRun {
  int64_t first = 0, count = 0;  // in micro-shards
};
std::vector<ShardRun> shard_runs_on_lanes(int batch, int shard, int lanes);

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void forward(const OpArgs& a) = 0;
  // After forward on the same batch (a.y holds its output): adds parameter
  // gradients into a.dp, overwrites dx[i] with d(loss)/d(input i) where dx[i]
  // is not nullptr.
  virtual void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) = 0;
  // Note [lanes]: before lanes run a training forward's micro-shards of a
  // batch of `batch` samples (so that what the kernel keeps per sample is
  // sized before they run at once).
  virtual void begin_lanes(int batch) { (void)batch; }
  // Note [lanes]: before lanes run the micro-shards (of `shard` samples) of
  // a training batch, forward or backward, with the whole batch's
  // arguments, so that what every micro-shard shares (a CPU convolution's
  // transformed kernels) is made once, not once per micro-shard.
  virtual void begin_shards(const OpArgs& whole, int shard, bool backward) {
    (void)whole;
    (void)shard;
    (void)backward;
  }
  // Note [shard runs]: true when, after begin_shards, one call on a lane
  // with a run of whole micro-shards computes every sample's output (and
  // backward's input gradient) bit for bit as calls of one micro-shard each
  // would. Model then gives each lane one run, and asks for the parameter
  // gradients, which are summed per micro-shard, in calls of one micro-shard
  // with no input gradient; the runs' backward calls get nullptr in every
  // a.dp, for no parameter gradient.
  virtual bool shards_in_one_call() const { return false; }
  // Note [fixed-point epilogue] (nn/cpu/packed_gemm.hpp): true when, after
  // begin_shards for backward, a backward call with a run of whole
  // micro-shards (as shards_in_one_call) and OpArgs::sinks set adds each
  // micro-shard's parameter gradients, converted on their own, into the
  // sinks, as calls of one micro-shard each and quantize_add would. Model
  // then asks for no per-micro-shard calls.
  virtual bool shard_grads_to_sinks() const { return false; }
  // Note [mixed precision] (precision.hpp): a convolution's or linear
  // layer's kernel that computes in p itself, making every rounding autocast
  // makes (the GPU's: Note [half kernels]), returns true, and Model then
  // rounds nothing around it; false (the CPU's, and every op's in fp32):
  // Model rounds its operands and results, and the kernel runs in fp32.
  virtual bool set_precision(Precision p) {
    (void)p;
    return false;
  }
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
  // synchronised op reduces its statistics with.
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
  // Note [lanes]: how many micro-shards run at once, and running body(i,
  // lane) for every i in [0, n), each on some lane (no two at once on one).
  virtual int lanes() const { return 1; }
  virtual void for_lanes(int64_t n, const std::function<void(int64_t, int)>& body) {
    for (int64_t i = 0; i < n; ++i) body(i, 0);
  }
};

// The CPU device: kernels on `threads` threads of a pool of its own (OpenBLAS
// single-threaded on each: Note [serial OpenBLAS] in nn/cpu/gemm.hpp).
std::unique_ptr<Device> make_cpu_device(int threads);

}  // namespace ddp::nn
