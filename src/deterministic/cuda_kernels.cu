// The GPU's kernels for --deterministic (deterministic/devices.hpp): one
// lane, so only the kernels that keep something per sample between forward
// and backward (the fused LeNet layer) or take sums over the batch
// (BatchNorm) differ from nn/cuda's; every other op is called micro-shard by
// micro-shard as it is, or with --gpu-kernels proven in checked runs (Note
// [checked runs] in deterministic/checked_runs.hpp).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/scoped.hpp"  // Scoped            // DDP_CHECK
#include "ddp/deterministic/checked_runs.hpp"
#include "ddp/deterministic/devices.hpp"
#include "ddp/deterministic/shards.hpp"
#include "ddp/nn/cuda/device.hpp"        // CudaDevice
#include "ddp/nn/cuda/kernels.hpp"       // CudaBatchNorm, CudaConvReluPool
#include "ddp/runtime/cuda_check.hpp"    // DDP_CUDA_CHECK, DDP_CUDA_CHECK_LAUNCH
#include "sharded_batch.hpp"

namespace ddp::deterministic {

using nn::Op;
using nn::OpArgs;

namespace {

// out[i] = the sum of per_shard[k * width + i] over k in shard order, from
// 0.0: sum_in_shard_order's order.
__global__ void bn_sum_shards_kernel(int shards, int width, const double* __restrict__ per_shard,
                                     double* __restrict__ out) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) {
    double s = 0.0;
    for (int k = 0; k < shards; ++k) s += per_shard[int64_t(k) * width + i];
    out[i] = s;
  }
}

// differ = 1 where the n words at a and b are not all the same bits.
__global__ void differ_kernel(int64_t n, const uint32_t* __restrict__ a, const uint32_t* __restrict__ b,
                              int* __restrict__ differ) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    if (a[i] != b[i]) {
      *differ = 1;
      return;
    }
}

// Note [checked runs]: once per batch size, mode, direction and op, so the
// host waits here. The compute stream then holds only this rank's kernels
// (no collective of --deterministic's is waited for on it), so the wait is
// bounded.
bool same_bits_cuda(cuda::Context& ctx, const float* a, const float* b, size_t n) {
  if (n == 0) return true;
  cuda::DeviceBuffer flag(ctx, 1);  // one float's room for an int
  auto* differ = reinterpret_cast<int*>(flag.data());
  DDP_CUDA_CHECK(cudaMemsetAsync(differ, 0, sizeof(int), ctx.compute()));
  differ_kernel<<<nn::cuda_grid(int64_t(n)), nn::kCudaThreads, 0, ctx.compute()>>>(
      int64_t(n), reinterpret_cast<const uint32_t*>(a), reinterpret_cast<const uint32_t*>(b), differ);
  DDP_CUDA_CHECK_LAUNCH(differ_kernel);
  int host = 0;
  DDP_CUDA_CHECK(cudaMemcpyAsync(&host, differ, sizeof(int), cudaMemcpyDeviceToHost, ctx.compute()));
  ctx.sync();
  return host == 0;
}

// The whole batch's conv outputs are sized before its micro-shards run,
// each at its first image's place.
class LaneConvReluPoolCuda final : public nn::CudaConvReluPool, public LaneKernel {
 public:
  using CudaConvReluPool::CudaConvReluPool;
  using CudaConvReluPool::backward;
  using CudaConvReluPool::forward;
  void begin_lanes(int batch) override { reserve(batch); }
  void forward(const OpArgs& a, const Lane& lane) override { forward_at(a, lane.first); }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx, const Lane& lane) override {
    backward_at(a, lane.first, dy, dx);
  }
};

// Note [shard gradients together]: the convolution, its micro-shards' bias
// gradients summed in one pass where it can; Note [shard streams]: its
// micro-shards' calls at once where they share nothing.
class ShardConvCuda final : public nn::Kernel, public ShardBias, public ConcurrentShards {
 public:
  ShardConvCuda(const Op& op, cuda::Context& ctx, nn::Layout layout) : conv_(op, ctx, layout) {}
  void forward(const OpArgs& a) override { conv_.forward(a); }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override {
    conv_.backward(a, dy, dx);
  }
  bool set_precision(nn::Precision p) override { return conv_.set_precision(p); }
  bool bias_grads_of_shards(const OpArgs& a, const float* dy, int shard, int shards, float* bias,
                            size_t stride) override {
    DDP_CHECK(a.batch == shard * shards, "a batch of ", a.batch, " is not ", shards, " micro-shards of ", shard);
    return conv_.bias_grads_of_parts(shard, shards, dy, bias, stride);
  }
  bool concurrent_shard_calls(bool bias) const override { return conv_.concurrent_calls(bias); }

 private:
  nn::CudaConv conv_;
};

// Every sum taken micro-shard by micro-shard into a buffer of its own, and
// the shards' sums added in shard order: on the device, or over every rank
// through the host (ShardStats).
class ShardBatchNormCuda final : public ShardedBatch<nn::CudaBatchNorm> {
 public:
  ShardBatchNormCuda(const Op& op, cuda::Context& ctx, nn::StatsReducer* stats, nn::Layout layout)
      : ShardedBatch(op, ctx, stats, layout), shard_stats_(shard_stats(stats, op.name)) {}
  ~ShardBatchNormCuda() override {
    if (per_shard_) cudaFreeAsync(per_shard_, ctx_.compute());
  }

 private:
  // Note [shards in one launch]: with the split sums (--gpu-kernels proven
  // or NHWC) every micro-shard's sums come from one launch, each block
  // summing its micro-shard as a launch of that micro-shard alone would (the
  // same cut: the same bits); backward then hands over each micro-shard's
  // weight and bias gradients, in turn or (Note [shard gradients together])
  // all at once.
  void channel_sums(const OpArgs& a, size_t width, const RunSum& sum, const AfterSum* after,
                    const std::string& what) override {
    if (shard_ == 0) return CudaBatchNorm::channel_sums(a, width, sum, after, what);
    const int n = shards_of(a.batch, shard_, op_.name);
    double* per = shard_sums(n, width);
    const bool together = split() && ctx_.next(NextKernel::ShardSums);
    if (together) sum(0, shard_, n, per);
    if (after && together && together_) {
      // Note [shard gradients together]: every micro-shard's gradients at
      // once, taken at once.
      grads_.reserve(ctx_, size_t(n) * width);
      param_grads_of_shards(n, per, grads_.data());
      (*together_)(grads_.data(), width, n);
    } else {
      for (int k = 0; k < n; ++k) {
        if (!together) sum(int64_t(k) * shard_, shard_, 1, per + size_t(k) * width);
        if (!after) continue;
        (*after)(per + size_t(k) * width);
        (*take_)();
      }
    }
    reduce_shards(n, width, what);
  }
  // Where shard k of `shards` puts its `width` sums (per_shard_, grown to fit).
  double* shard_sums(int shards, size_t width) {
    const size_t n = size_t(shards) * width;
    if (per_shard_size_ < n) {
      if (per_shard_) ctx_.free(per_shard_);  // stream-ordered: after what read it
      per_shard_ = static_cast<double*>(ctx_.alloc(sizeof(double) * n));
      per_shard_size_ = n;
    }
    return per_shard_;
  }
  // The shards' sums into sums_ in global shard order (over every rank when
  // synchronised; with --gpu-kernels proven one rank's are every rank's,
  // added on the device in sum_in_shard_order's order: the same doubles).
  void reduce_shards(int shards, size_t width, const std::string& what) {
    if (!shard_stats_ || (ctx_.next(NextKernel::OneRank) && stats_->ranks() == 1)) {
      bn_sum_shards_kernel<<<nn::cuda_grid(int64_t(width)), nn::kCudaThreads, 0, ctx_.compute()>>>(
          shards, int(width), per_shard_, sums_);
      DDP_CUDA_CHECK_LAUNCH(bn_sum_shards_kernel);
      return;
    }
    const size_t n = size_t(shards) * width;
    if (host_.size() < n) host_.resize(n);
    host_out_.resize(width);
    // Note [bounded copies to the host]: the bounded wait first; the copy into
    // pageable memory then returns done.
    stats_->sync_device(op_.name + ": " + what);
    DDP_CUDA_CHECK(
        cudaMemcpyAsync(host_.data(), per_shard_, sizeof(double) * n, cudaMemcpyDeviceToHost, ctx_.compute()));
    shard_stats_->sum_shards(host_.data(), shards, width, host_out_.data(), op_.name + ": " + what);
    DDP_CUDA_CHECK(
        cudaMemcpyAsync(sums_, host_out_.data(), sizeof(double) * width, cudaMemcpyHostToDevice, ctx_.compute()));
  }
  ShardStats* shard_stats_;
  cuda::DeviceBuffer grads_;     // Note [shard gradients together]: each micro-shard's weight and bias gradients
  double* per_shard_ = nullptr;  // device: each micro-shard's sums
  size_t per_shard_size_ = 0;
  std::vector<double> host_, host_out_;  // the sums on their way through the host
};

class CudaShardDevice final : public nn::CudaDevice, public ShardsTogether, public ShardStreams {
 public:
  // No claimed runs: the micro-shards' kernels are op by op.
  explicit CudaShardDevice(cuda::Context& ctx) : CudaDevice(ctx, nn::CudaDeviceOptions{std::nullopt, false}) {}
  bool shard_gradients_together() const override { return ctx_.next(NextKernel::ShardsTogether); }
  // Note [shard streams] (asked for only where shard_gradients_together).
  void on_streams(int64_t n, const std::function<void(int64_t)>& body) override {
    if (ctx_.next(NextKernel::ShardStreams)) return ctx_.on_side_streams(n, body);
    for (int64_t i = 0; i < n; ++i) body(i);
  }
  std::unique_ptr<nn::Kernel> kernel(const nn::Graph& g, size_t i, nn::StatsReducer* stats) override {
    const Op& op = g.ops[i];
    if (op.kind == nn::OpKind::ConvReluPool) return std::make_unique<LaneConvReluPoolCuda>(op, ctx_);
    if (op.kind == nn::OpKind::BatchNorm2d) return std::make_unique<ShardBatchNormCuda>(op, ctx_, stats, layout(g));
    // A convolution that sums its micro-shards' bias gradients in one pass
    // and may take side streams (shards-together, shard-streams) whether or
    // not its calls are checked runs: each piece on its own, so that
    // leaving one out (gpu-check.sh's halving) leaves the others running.
    std::unique_ptr<nn::Kernel> plain = op.kind == nn::OpKind::Conv2d && ctx_.next(NextKernel::ShardsTogether)
                                            ? std::make_unique<ShardConvCuda>(op, ctx_, layout(g))
                                            : CudaDevice::kernel(g, i, stats);
    if (!ctx_.next(NextKernel::CheckedRuns) || !checkable_in_runs(op.kind)) return plain;
    CheckedRuns::Env env;
    env.device = this;
    env.same_bits = [this](const float* a, const float* b, size_t n) { return same_bits_cuda(ctx_, a, b, n); };
    env.say_once = [this](const std::string& key, const std::string& what) { ctx_.warn_once(key, what); };
    // A failed one call (out of memory, say) leaves its error as the last;
    // the micro-shards' calls that follow must not report it as theirs. A
    // sticky error stays, and they do fail.
    env.after_failure = [] { (void)cudaGetLastError(); };
    return std::make_unique<CheckedRuns>(g, i, std::move(plain), std::move(env));
  }
};

}  // namespace

std::unique_ptr<nn::Device> make_cuda_device(cuda::Context& ctx) { return std::make_unique<CudaShardDevice>(ctx); }

}  // namespace ddp::deterministic
