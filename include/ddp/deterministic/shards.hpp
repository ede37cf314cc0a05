// What --deterministic asks of a device beyond the plain Kernel: running a
// batch's micro-shards on lanes, and BatchNorm's sums micro-shard by
// micro-shard. The executor that uses it is ShardedModel
// (deterministic/sharded_model.hpp); each device's kernels for it are
// deterministic/cpu_kernels.cpp and cuda_kernels.cu, built on nn/cpu's and
// nn/cuda's.
//
// Note [micro-shards]: under --deterministic a rank's batch is a run of
// micro-shards of a fixed size, the same at every world size
// (deterministic/exact_sum.hpp). A model runs its whole batch op by op
// (ShardedModel::forward_shards): every op but BatchNorm is called once per
// micro-shard, so its kernels see the batch they would see at any world
// size, and BatchNorm takes the whole batch (ShardedBatchKernel). Its
// statistics are then summed shard by shard, and the shards' sums added in
// global shard order over every rank (ShardStats::sum_shards): the same
// doubles, added in the same order, at any world size. Its weight and bias
// gradients are handed over one shard at a time, as every other op's are.
//
// Note [lanes]: a device runs micro-shards on lanes (Lanes, the CPU's
// threads): every op but BatchNorm hands its micro-shards to whichever lane
// is free, and on a lane a kernel runs single-threaded with that lane's
// scratch (LaneKernel). A shard's arithmetic is then that of one thread
// alone, whichever lane takes it and however many lanes there are: the same
// bits at one rank of many threads as at many ranks of one. Each lane's
// parameter gradients go to a buffer of its own
// (ShardedModel::backward_shards).
//
// Note [shard runs]: a kernel whose samples do not depend on the rest of
// their call's batch may take a lane's micro-shards in one call
// (LaneKernel::shards_in_one_call): a CPU convolution on the packed GEMM,
// whose every output element is the same float whatever columns sit beside
// it (Note [packed weights] in nn/cpu/packed_gemm.hpp), on the path and tile
// size its micro-shard's size chose. Its weights are then read once a run
// rather than once a micro-shard: ResNet-18's 512-channel layers stream 17 MB
// of them a call. Only the weight and bias gradients, summed per
// micro-shard, still take a call each, but where the kernel converts them
// into the fixed-point sums itself (Note [fixed-point epilogue] in
// nn/cpu/packed_gemm.hpp). Evaluation's last, smaller micro-shard is a call
// alone.
//
// Note [shard gradients together]: on a device without lanes (a GPU: its
// micro-shards follow one another on one stream) that asks for it
// (ShardsTogether), an op's micro-shards write their parameter gradients
// into buffers of their own, one after another, and the fixed-point sums
// take them all at once (ShardGradients::take_shards,
// ExactGradientSum::add_shards: one launch a parameter rather than one a
// parameter and micro-shard, and one zeroing rather than 16). Integer sums:
// the same integers in any order. A kernel that can (ShardBias: the GPU's
// convolution in fp32 and TF32) first sums every micro-shard's bias
// gradient in one pass, each the bits its own call would add, and the
// micro-shards' calls then leave the bias out.
//
// Note [shard streams]: those micro-shards' calls each write a buffer of
// their own from the op's inputs and output gradient alone, so on a device
// with several streams (ShardStreams: the GPU's side streams, Note [side
// streams] in runtime/cuda_context.hpp) they may run at once, where one
// after another each leaves most of a GPU idle (a weight gradient over 16
// samples). Each call is the call it was (the same kernel and plan, chosen
// by the micro-shard's size, and scratch of its stream's own): the same
// bits, however they overlap. Only a kernel that says its calls share no
// memory of their own (ConcurrentShards) is spread, and not in an op's first
// backward, so that whatever the kernel chooses and sizes at a first call
// (cuDNN's plans, timed with --cudnn-benchmark) is done on the compute
// stream alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ddp/core/fixed_point.hpp"  // Sink
#include "ddp/nn/device.hpp"         // Kernel, OpArgs

namespace ddp::deterministic {

// Where a call runs (Note [lanes]): its lane, and the index in the whole
// batch of its first sample (for what a kernel keeps per sample between
// forward and backward).
struct Lane {
  int index = 0;
  int64_t first = 0;
};

// A device's lanes (the CPU's: its threads). A device that has none runs
// micro-shards one after another (a GPU: on its compute stream).
class Lanes {
 public:
  virtual ~Lanes() = default;
  virtual int lanes() const = 0;
  // body(i, lane) for every i in [0, n), each on some lane (no two at once on one).
  virtual void for_lanes(int64_t n, const std::function<void(int64_t, int)>& body) = 0;
};

// Note [shard gradients together]: a device without lanes that says whether
// its micro-shards' gradients go over together (the GPU's: with
// --gpu-kernels proven).
class ShardsTogether {
 public:
  virtual ~ShardsTogether() = default;
  virtual bool shard_gradients_together() const = 0;
};

// Note [shard streams]: a device without lanes that runs calls at once on
// several streams of its own.
class ShardStreams {
 public:
  virtual ~ShardStreams() = default;
  // body(i) for every i in [0, n), spread over the streams: each sees what
  // was issued before, and what is issued afterwards sees them all.
  virtual void on_streams(int64_t n, const std::function<void(int64_t)>& body) = 0;
};

// Note [shard streams]: a kernel whose micro-shard backward calls (with
// their bias gradients where `bias`) may run at once on a ShardStreams
// device: they share no memory of the kernel's own.
class ConcurrentShards {
 public:
  virtual ~ConcurrentShards() = default;
  virtual bool concurrent_shard_calls(bool bias) const = 0;
};

// Note [shard gradients together]: a kernel that adds the bias gradients
// (its last parameter's) of `shards` micro-shards of `shard` samples at once:
// a's batch, dy its output gradient, micro-shard k's added at bias + k *
// stride, each the bits the micro-shard's own backward call would add; true
// where it did (the micro-shards' own calls then get no bias gradient),
// false where it cannot (nothing done).
class ShardBias {
 public:
  virtual ~ShardBias() = default;
  virtual bool bias_grads_of_shards(const nn::OpArgs& a, const float* dy, int shard, int shards, float* bias,
                                    size_t stride) = 0;
};

// A kernel that runs micro-shards on lanes. A kernel that is not one is
// called as a plain Kernel on each micro-shard (one that uses no threads or
// scratch of its own, or a GPU's, whose micro-shards follow one another).
class LaneKernel {
 public:
  virtual ~LaneKernel() = default;
  // Before lanes run a training forward's micro-shards of a batch of
  // `batch` samples (so that what the kernel keeps per sample is sized
  // before they run at once).
  virtual void begin_lanes(int batch) { (void)batch; }
  // Before lanes run the micro-shards (of `shard` samples) of a training
  // batch, forward or backward, with the whole batch's arguments, so that
  // what every micro-shard shares (a CPU convolution's transformed kernels)
  // is made once, not once per micro-shard.
  virtual void begin_shards(const nn::OpArgs& whole, int shard, bool backward) {
    (void)whole, (void)shard, (void)backward;
  }
  // Note [shard runs]: true when, after begin_shards, one call on a lane
  // with a run of whole micro-shards computes every sample's output (and
  // backward's input gradient) bit for bit as calls of one micro-shard each
  // would. The executor then gives each lane one run, and asks for the
  // parameter gradients, which are summed per micro-shard, in calls of one
  // micro-shard with no input gradient; the runs' backward calls get nullptr
  // in every a.dp, for no parameter gradient.
  virtual bool shards_in_one_call() const { return false; }
  // Note [fixed-point epilogue] (nn/cpu/packed_gemm.hpp): true when, after
  // begin_shards for backward, backward_to_sinks adds each micro-shard's
  // parameter gradients, converted on their own, into the sinks, as calls
  // of one micro-shard each and quantize_add would. The executor then asks
  // for no per-micro-shard calls.
  virtual bool grads_to_sinks() const { return false; }
  // forward and backward of a's samples on `lane`, single-threaded.
  virtual void forward(const nn::OpArgs& a, const Lane& lane) = 0;
  virtual void backward(const nn::OpArgs& a, const float* dy, const std::vector<float*>& dx, const Lane& lane) = 0;
  // Where grads_to_sinks: backward of a run of whole micro-shards of `shard`
  // samples whose parameter gradients go into sinks (one a parameter).
  virtual void backward_to_sinks(const nn::OpArgs& a, const float* dy, const std::vector<float*>& dx,
                                 const Lane& lane, int shard, const std::vector<fixed_point::Sink>& sinks);
};

// Note [micro-shards]: what BatchNorm adds its micro-shards' sums over ranks
// with. per_shard holds this rank's `shards` runs of n values (shard-major);
// out[i] is value i summed over every rank's shards in global shard order
// (rank 0's first), in double: the same bits at any world size. Collective.
class ShardStats {
 public:
  virtual ~ShardStats() = default;
  virtual void sum_shards(const double* per_shard, int shards, size_t n, double* out, const std::string& what) = 0;
};

// Note [micro-shards]: BatchNorm on the whole batch, its sums taken
// micro-shard by micro-shard (of `shard` samples) and added in shard order:
// over every rank through the ShardStats its device was given, else this
// rank's alone. backward_shards calls take() once each micro-shard's weight
// and bias gradients alone are in a.dp (take takes them and zeroes a.dp);
// or, where `together` is given (Note [shard gradients together]), may call
// it once instead with every micro-shard's gradients: micro-shard k's at
// g + k * stride (the weight's then the bias's, as in a.dp).
class ShardedBatchKernel {
 public:
  using TakeShards = std::function<void(const float* g, size_t stride, int shards)>;
  virtual ~ShardedBatchKernel() = default;
  virtual void forward_shards(const nn::OpArgs& a, int shard) = 0;
  virtual void backward_shards(const nn::OpArgs& a, const float* dy, const std::vector<float*>& dx, int shard,
                               const std::function<void()>& take, const TakeShards* together = nullptr) = 0;
};

// The micro-shards of `shard` samples a BatchNorm call's batch of `batch`
// splits into; throws naming op where shard does not divide it.
int shards_of(int batch, int shard, const std::string& op);

// out[i] = the sum of per_shard[k * n + i] over k = 0 .. shards - 1, in that
// order, in double (Note [micro-shards]).
void sum_in_shard_order(const double* per_shard, size_t shards, size_t n, double* out);

// Note [shard runs]: the calls that cover a batch of micro-shards of `shard`
// samples on `lanes` lanes: the whole micro-shards in one contiguous run a
// lane, as even as they split, then evaluation's last, smaller one alone.
struct ShardRun {
  int64_t first = 0, count = 0;  // in micro-shards
};
std::vector<ShardRun> shard_runs_on_lanes(int batch, int shard, int lanes);

}  // namespace ddp::deterministic
