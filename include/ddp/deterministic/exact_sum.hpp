// ddp::ExactGradientSum: --deterministic's gradient average, the same bits at
// every world size.
//
// Note [fixed-point gradients]: float addition is not associative, so a
// gradient summed over 64 samples on each of 4 ranks and then across them is
// not the float of the same 256 samples summed on one. Under --deterministic
// the global batch is cut into a fixed number of micro-shards (K); each rank
// computes every micro-shard's gradient on its own (the same floats at every
// world size: the same samples, the same kernels, one thread; Note [lanes] in
// nn/device.hpp runs several micro-shards at once), and adds it to
// an int64 accumulator as round(g * 2^e), with e per parameter. Integer
// addition is associative, so the all-reduced sums, and the floats they are
// turned back into once, are the same whatever the ranks and their order.
// The per-element arithmetic is fixed_point.hpp's, the same on the host and
// on a GPU; on a GPU "the same kernels" holds per micro-shard too, since
// every op is called once per micro-shard (one batch size, so one cuDNN
// algorithm, and under --deterministic only deterministic ones).
//
// e must be agreed before the first micro-shard is converted: it comes from
// the previous step's largest |g| over all micro-shards (all-reduced with
// max, which is exact), leaving kHeadroomBits of growth. Every element is kept
// below 2^limit_bits (62 - ceil(log2 K)), so K of them cannot overflow. A
// step whose gradients outgrew that is found from the same all-reduced
// maximum, on every rank alike: its exponents are lowered and the step is
// computed again (a redo; the first step of a run may need one). Exponents are
// run state: a checkpoint keeps them, so a resumed run converts as the
// uninterrupted one would.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/comm/communicator.hpp"  // Communicator
#include "ddp/core/fixed_point.hpp"     // quantize_add, Sink

namespace ddp {

// Growth (in powers of two) of a parameter's largest gradient element from
// one step to the next that needs no redo.
constexpr int kHeadroomBits = 8;

// The largest number of bits an element may use so that `shards` of them
// cannot overflow an int64 sum: 62 - ceil(log2(shards)).
int fixed_point_limit_bits(int shards);

// The exponent for a parameter whose largest |gradient element| was max_abs
// (> 0, finite): the largest element then uses limit_bits - kHeadroomBits
// bits. Clamped to [-kMaxExponent, kMaxExponent].
constexpr int kMaxExponent = 400;
int fixed_point_exponent(double max_abs, int limit_bits);

// acc[i] += round-to-nearest-even(g[i] * 2^exponent): fixed_point.hpp's
// (host code).
#if !defined(__CUDACC__)
using fixed_point::quantize_add;
#endif

// g[i] = acc[i] * 2^-exponent, rounded to float.
void dequantize(const int64_t* acc, size_t n, int exponent, float* g);

// Note [micro-shards] (deterministic/shards.hpp): out[i] = value i of every rank's
// `shards` runs of n values (per_shard, shard-major), added in double in
// global shard order: rank 0's shards first, as the contiguous sampler lays
// the micro-shards out. The same doubles in the same order at any world size,
// hence the same bits (an all-reduce would add them in its own order).
// Collective: every rank passes the same shards and n.
void sum_shards_in_order(comm::Communicator& comm, const double* per_shard, int shards, size_t n, double* out,
                         const std::string& what);

// The fixed-point sum of a step's micro-shards. What it decides (the
// exponents, a redo) is written here once; where the integer sums live and
// how they are added is a device's: HostExactGradientSum below (host memory),
// or the GPU's (make_cuda_exact_sum, device memory, an integer NCCL
// all-reduce).
class ExactGradientSum {
 public:
  enum class Result { Done, Redo, NonFinite };
  virtual ~ExactGradientSum() = default;

  // Before a step's first micro-shard: empties the sums.
  void begin_step() { clear_sums(); }
  // Note [lanes] (deterministic/shards.hpp): up to `lanes` callers may add at once,
  // each with a lane of its own. Lanes other than 0 sum into integers of
  // their own, folded into the step's sums per run of parameters: integer
  // sums, so which lane took which micro-shard changes nothing.
  virtual void set_lanes(int lanes) = 0;
  virtual int lanes() const = 0;
  // One micro-shard's gradients of params [first, first + count) from lane
  // `lane`: g[0] is param first's element 0, the params laid out as in the
  // flat buffer. Lanes may call at once, for the same params.
  virtual void add(int lane, const float* g, size_t first, size_t count) = 0;
  // Note [shard gradients together] (deterministic/shards.hpp): `shards`
  // micro-shards' gradients at once, micro-shard k's at g + k * stride (each
  // laid out as add's g): what as many adds would sum (integers: in any
  // order), here add by add; a GPU's in one launch a parameter.
  virtual void add_shards(int lane, const float* g, size_t stride, int shards, size_t first, size_t count) {
    for (int k = 0; k < shards; ++k) add(lane, g + size_t(k) * stride, first, count);
  }
  // Note [fixed-point epilogue] (nn/cpu/packed_gemm.hpp): in place of add, where
  // lane `lane`'s sums of params [first, first + count) live in host memory,
  // one Sink a param into out (what the caller adds there counts as added);
  // false where they do not (the GPU's).
  virtual bool sinks(int lane, size_t first, size_t count, fixed_point::Sink* out) {
    (void)lane, (void)first, (void)count, (void)out;
    return false;
  }
  // With no lane adding: every lane's sums of params [first, first + count)
  // into the step's.
  virtual void fold(size_t first, size_t count) = 0;
  // Note [overlapped sums]: params [first, first + count) are final on this
  // rank (every micro-shard of theirs added and folded), so their sums may
  // start across the ranks now, while backward computes the other params'.
  // Nothing finish decides can change them: they were converted at exponents
  // agreed before the step, and a step that must be redone drops them.
  // Collective in the order of calls: every rank marks the same runs in the
  // same order (backward's op order).
  void ready(comm::Communicator& comm, size_t first, size_t count);
  // Collective. Done: grads holds the sum of every rank's micro-shards,
  // identical on every rank, and the next step's exponents are set. Redo: a
  // gradient outgrew its exponent on some rank; the exponents are lowered and
  // the step must be computed again. NonFinite: some micro-shard's gradient
  // held a NaN or an infinity; grads is filled with NaN.
  Result finish(comm::Communicator& comm, float* grads);

  // Per parameter, for checkpoints.
  const std::vector<int64_t>& exponents() const { return exponents_; }
  void set_exponents(const std::vector<int64_t>& e);

  // What one rank sends per step: the sums and the maxima.
  int64_t bytes_per_step() const { return int64_t(total_ * sizeof(int64_t) + numels_.size() * sizeof(double)); }

 protected:
  // param_numels in flat order; shards: micro-shards of the global batch,
  // over all ranks together.
  ExactGradientSum(std::vector<size_t> param_numels, int shards);
  // Checks that params [first, first + count) exist; and an add's lane and
  // parameters (lanes: how many there are).
  void check_params(size_t first, size_t count) const;
  void check_add(int lane, int lanes, size_t first, size_t count) const;
  // The device's part: empty the sums (after drop_reduces); its sums in flat
  // order, in its memory (what the communicator all-reduces in place); this
  // rank's largest |g| per parameter since they were emptied (+infinity
  // where one was a NaN or infinite); grads[i] = sum[i] * 2^-exponent; grads
  // all NaN.
  virtual void clear_sums() = 0;
  virtual int64_t* sums() = 0;
  virtual void local_maxima(double* out) = 0;
  virtual void dequantize_into(float* grads) = 0;
  virtual void fill_nan(float* grads) = 0;
  // Note [overlapped sums], the same on every device: start the sums of
  // params [first, first + count) across the ranks; start those no ready()
  // started (in flat order, the same runs on every rank) and wait for all,
  // so that sums() holds every rank's; wait until none is in flight, their
  // results dropped; whether one is in flight (for the destructors: never
  // throws, and a sum whose communicator has failed counts as in flight).
  void start_reduce(comm::Communicator& comm, size_t first, size_t count);
  void reduce_all(comm::Communicator& comm);
  void drop_reduces();
  bool in_flight() const noexcept;

  std::vector<size_t> numels_, offsets_;
  size_t total_ = 0;
  int limit_bits_;
  std::vector<int64_t> exponents_;

 private:
  // Note [overlapped sums]: the sums in flight, in the order started, and
  // which params' sums have started this step.
  std::vector<std::shared_ptr<comm::Work>> inflight_;
  std::vector<char> started_;
};

// The sums in host memory, the gradients read from host memory (the CPU
// device).
class HostExactGradientSum final : public ExactGradientSum {
 public:
  HostExactGradientSum(std::vector<size_t> param_numels, int shards);
  ~HostExactGradientSum() override;
  HostExactGradientSum(const HostExactGradientSum&) = delete;
  HostExactGradientSum& operator=(const HostExactGradientSum&) = delete;
  void set_lanes(int lanes) override;
  int lanes() const override { return int(lane_acc_.size()) + 1; }
  void add(int lane, const float* g, size_t first, size_t count) override;
  bool sinks(int lane, size_t first, size_t count, fixed_point::Sink* out) override;
  void fold(size_t first, size_t count) override;

 private:
  void clear_sums() override;
  int64_t* sums() override { return acc_.data(); }
  void local_maxima(double* out) override;
  void dequantize_into(float* grads) override;
  void fill_nan(float* grads) override;
  std::vector<int64_t> acc_;
  std::vector<double> max_;  // this rank's largest |g| per parameter this step
  // Lanes 1 and up (lane 0 adds into acc_ and max_): each one's sums of the
  // params it was last given, from their first one's offset; its maxima; and
  // whether it has added since the last fold.
  std::vector<std::vector<int64_t>> lane_acc_;
  std::vector<std::vector<double>> lane_max_;
  std::vector<char> lane_added_;
};

#if DDP_HAVE_CUDA
namespace cuda {
class Context;
}
// The sums in the GPU's memory (deterministic/exact_sum_cuda.cu), one lane: each
// micro-shard's gradients are quantized by a kernel on ctx's compute stream
// as they are added (fixed_point.hpp's arithmetic, the host's), the sums
// all-reduced in device memory (an integer NCCL all-reduce on the nccl
// backend, on the communication stream while backward goes on), turned back
// into floats by a kernel. sync(what) waits, bounded, for the compute stream
// before the host reads the maxima (the backend's Backend::sync).
std::unique_ptr<ExactGradientSum> make_cuda_exact_sum(std::vector<size_t> param_numels, int shards,
                                                      cuda::Context& ctx,
                                                      std::function<void(const std::string&)> sync);
#endif

}  // namespace ddp
