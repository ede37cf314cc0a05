// --deterministic's fixed-point sums on the GPU (make_cuda_exact_sum,
// deterministic/exact_sum.hpp): the integers live in device memory next to the
// gradients, so a micro-shard's gradients never leave the device. Per
// parameter, one kernel adds fixed_point::to_fixed of every element (the
// host's arithmetic) and keeps the largest |g| as an integer maximum of its
// bits (atomicMax: a maximum is the same in any order). At the step's end the
// host reads those maxima (one small copy), and the sums are all-reduced in
// place with Communicator::allreduce_int64_async: ncclInt64 on NCCL, ordered
// after the kernels by the communicator's events. One kernel a parameter
// turns them back into floats on the compute stream, where the optimizer
// reads them.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "ddp/core/error.hpp"            // DDP_CHECK
#include "ddp/deterministic/exact_sum.hpp"
#include "ddp/core/half.hpp"             // bits_float
#include "ddp/core/fixed_point.hpp"       // to_fixed, from_fixed, magnitude_bits
#include "ddp/runtime/cuda_check.hpp"    // DDP_CUDA_CHECK, DDP_CUDA_CHECK_LAUNCH
#include "ddp/runtime/cuda_context.hpp"  // Context: the compute stream, its memory

namespace ddp {

namespace {

constexpr int kThreads = 256;  // a power of two: the block maximum halves it

unsigned grid_for(size_t n) { return unsigned(std::clamp<size_t>((n + kThreads - 1) / kThreads, 1, 4096)); }

// acc[i] += the sum over k < shards of to_fixed(g[k * stride + i]) for the
// values that fit; *max_bits = the largest magnitude_bits of all of them.
// One micro-shard (shards = 1), or several at once (Note [shard gradients
// together]): integers, the same sums in any order.
__global__ void __launch_bounds__(kThreads)
    quantize_add_kernel(const float* __restrict__ g, int64_t n, int64_t stride, int shards, double scale,
                        double limit, int64_t* __restrict__ acc, unsigned* __restrict__ max_bits) {
  __shared__ unsigned s[kThreads];
  unsigned m = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t sum = 0;
    for (int k = 0; k < shards; ++k) {
      const float v = g[k * stride + i];
      m = max(m, unsigned(fixed_point::magnitude_bits(v)));
      int64_t q;
      if (fixed_point::to_fixed(v, scale, limit, &q)) sum += q;
    }
    acc[i] += sum;
  }
  s[threadIdx.x] = m;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) s[threadIdx.x] = max(s[threadIdx.x], s[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0 && s[0] != 0) atomicMax(max_bits, s[0]);
}

__global__ void dequantize_kernel(const int64_t* __restrict__ acc, int64_t n, double inv_scale,
                                  float* __restrict__ g) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    g[i] = fixed_point::from_fixed(acc[i], inv_scale);
}

__global__ void fill_nan_kernel(float* __restrict__ g, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    g[i] = __int_as_float(0x7fc00000);  // a quiet NaN
}

class CudaExactGradientSum final : public ExactGradientSum {
 public:
  CudaExactGradientSum(std::vector<size_t> param_numels, int shards, cuda::Context& ctx,
                       std::function<void(const std::string&)> sync)
      : ExactGradientSum(std::move(param_numels), shards), ctx_(ctx), sync_(std::move(sync)),
        host_bits_(numels_.size()) {
    acc_ = static_cast<int64_t*>(ctx_.alloc(std::max<size_t>(total_, 1) * sizeof(int64_t)));
    max_bits_ = static_cast<unsigned*>(ctx_.alloc(std::max<size_t>(numels_.size(), 1) * sizeof(unsigned)));
    clear_sums();
  }
  ~CudaExactGradientSum() override {
    // An error left sums in flight on the communication stream: their
    // memory stays, as the host's does (HostExactGradientSum), for the
    // little that is left of the job.
    if (in_flight()) return;
    // Stream-ordered: after whatever still reads them (nothing to report
    // from a destructor).
    if (acc_) cudaFreeAsync(acc_, ctx_.compute());
    if (max_bits_) cudaFreeAsync(max_bits_, ctx_.compute());
  }

  // Note [lanes] (deterministic/shards.hpp): a GPU runs its micro-shards one after
  // another on the compute stream.
  void set_lanes(int lanes) override {
    DDP_CHECK(lanes == 1, "--deterministic: a GPU adds its micro-shards on one lane, not ", lanes);
  }
  int lanes() const override { return 1; }

  void add(int lane, const float* g, size_t first, size_t count) override { add_shards(lane, g, 0, 1, first, count); }
  void add_shards(int lane, const float* g, size_t stride, int shards, size_t first, size_t count) override {
    check_add(lane, 1, first, count);
    if (count == 0 || shards <= 0) return;
    const size_t base = offsets_[first];
    const double limit = std::ldexp(1.0, limit_bits_);
    for (size_t p = first; p < first + count; ++p) {
      if (numels_[p] == 0) continue;
      quantize_add_kernel<<<grid_for(numels_[p]), kThreads, 0, ctx_.compute()>>>(
          g + (offsets_[p] - base), int64_t(numels_[p]), int64_t(stride), shards,
          std::ldexp(1.0, int(exponents_[p])), limit, acc_ + offsets_[p], max_bits_ + p);
      DDP_CUDA_CHECK_LAUNCH(quantize_add_kernel);
    }
  }
  void fold(size_t first, size_t count) override { check_params(first, count); }

 private:
  void clear_sums() override {
    drop_reduces();  // nothing may write into acc_ from here on
    DDP_CUDA_CHECK(cudaMemsetAsync(acc_, 0, std::max<size_t>(total_, 1) * sizeof(int64_t), ctx_.compute()));
    DDP_CUDA_CHECK(
        cudaMemsetAsync(max_bits_, 0, std::max<size_t>(numels_.size(), 1) * sizeof(unsigned), ctx_.compute()));
  }

  void local_maxima(double* out) override {
    if (numels_.empty()) return;
    sync_("--deterministic: reading the largest gradient per parameter");  // Note [bounded copies to the host]
    DDP_CUDA_CHECK(cudaMemcpyAsync(host_bits_.data(), max_bits_, numels_.size() * sizeof(unsigned),
                                   cudaMemcpyDeviceToHost, ctx_.compute()));
    for (size_t p = 0; p < numels_.size(); ++p)
      out[p] = host_bits_[p] >= 0x7f800000u ? std::numeric_limits<double>::infinity()
                                            : double(bits_float(host_bits_[p]));
  }

  int64_t* sums() override { return acc_; }

  void dequantize_into(float* grads) override {
    for (size_t p = 0; p < numels_.size(); ++p) {
      if (numels_[p] == 0) continue;
      dequantize_kernel<<<grid_for(numels_[p]), kThreads, 0, ctx_.compute()>>>(
          acc_ + offsets_[p], int64_t(numels_[p]), std::ldexp(1.0, -int(exponents_[p])), grads + offsets_[p]);
      DDP_CUDA_CHECK_LAUNCH(dequantize_kernel);
    }
  }

  void fill_nan(float* grads) override {
    if (total_ == 0) return;
    fill_nan_kernel<<<grid_for(total_), kThreads, 0, ctx_.compute()>>>(grads, int64_t(total_));
    DDP_CUDA_CHECK_LAUNCH(fill_nan_kernel);
  }

  cuda::Context& ctx_;
  std::function<void(const std::string&)> sync_;
  int64_t* acc_ = nullptr;      // device: the step's sums, flat order
  unsigned* max_bits_ = nullptr;  // device: per parameter, magnitude_bits of its largest |g|
  std::vector<unsigned> host_bits_;
};

}  // namespace

std::unique_ptr<ExactGradientSum> make_cuda_exact_sum(std::vector<size_t> param_numels, int shards,
                                                      cuda::Context& ctx,
                                                      std::function<void(const std::string&)> sync) {
  return std::make_unique<CudaExactGradientSum>(std::move(param_numels), shards, ctx, std::move(sync));
}

}  // namespace ddp
