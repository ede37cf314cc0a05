// The GPU optimizer kernels (kernels.hpp): update_math.hpp's update as one
// grid-stride kernel per call; the norm as per-block partial sums of a fixed
// grid, then one block adding them in order: the same bits for the same
// gradients, run after run (no atomics); the check for non-finite values
// as one flag that any warp holding one sets.
#include <algorithm>

#include "ddp/core/error.hpp"          // DDP_CHECK
#include "ddp/core/finite.hpp"         // non_finite_bits
#include "ddp/optim/kernels.hpp"
#include "ddp/runtime/block_sum.cuh"  // block_sum: fixed order
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUDA_CHECK, DDP_CUDA_CHECK_LAUNCH

namespace ddp::optim {

namespace {

constexpr int kThreads = 256;  // a power of two: the block sums halve it
constexpr int kNormBlocks = 512;

// A grid-stride launch's blocks for n elements, at most `cap`.
unsigned grid_for(size_t n, size_t cap = 4096) {
  return unsigned(std::min<size_t>((n + kThreads - 1) / kThreads, cap));
}

// unscale: the host's, or where loss_scale is given 1 / its scale; a
// nonzero *skip leaves everything as it was (Note [loss scale on the
// device]).
__device__ float unscale_of(float unscale, const LossScaleState* loss_scale) {
  return loss_scale ? 1.0f / loss_scale->scale : unscale;
}

// The scalars: by value, or where `at` is given read there (Note [step
// graphs]).
__global__ void step_kernel(size_t n, StepScalars by_value, const StepScalars* at, bool decay, const double* sq_norm,
                            float max_norm, float unscale, const LossScaleState* loss_scale, const unsigned* skip,
                            float* __restrict__ p, const float* __restrict__ g, float* __restrict__ a,
                            float* __restrict__ b) {
  if (skip && *skip) return;
  const StepScalars s = at ? *at : by_value;
  const float gscale = gradient_factor(sq_norm, max_norm, unscale_of(unscale, loss_scale));
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    update_at(i, s, decay, gscale, p, g, a, b);
}

// partial[block] = sum of g[i]^2 over the block's elements (grid stride).
__global__ void sq_partial_kernel(size_t n, const float* __restrict__ g, double* __restrict__ partial) {
  __shared__ double s[kThreads];
  double v = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    v += double(g[i]) * double(g[i]);
  const double total = cuda::block_sum<kThreads>(s, v);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// out[0] = sum of the partials times unscale^2; out[1] += its square root
// (the running sum) unless the step is skipped.
__global__ void sq_final_kernel(const double* __restrict__ partial, int parts, float unscale,
                                const LossScaleState* loss_scale, const unsigned* skip, double* __restrict__ out) {
  __shared__ double s[kThreads];
  double v = 0;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) v += partial[i];
  const double total = cuda::block_sum<kThreads>(s, v);
  if (threadIdx.x == 0) {
    const double u = unscale_of(unscale, loss_scale);
    out[0] = total * (u * u);
    if (!(skip && *skip)) out[1] += sqrt(out[0]);
  }
}

// The scalars arrive as the launch's argument: no host memory to stage or
// keep (a copy from pageable memory may wait for the stream).
__global__ void set_scalars_kernel(StepScalars s, StepScalars* out) { *out = s; }

__global__ void scale_by_kernel(size_t n, const LossScaleState* s, float* __restrict__ x) {
  const float f = s->scale;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] *= f;
}

__global__ void update_scale_kernel(LossScaleState* s, const unsigned* found, double growth, double backoff,
                                    int64_t interval) {
  update_loss_scale(*s, *found != 0, growth, backoff, interval);
}

// *flag |= 1 where g[0, n) holds a NaN or an infinity (the flag cleared before).
__global__ void non_finite_kernel(size_t n, const float* __restrict__ g, unsigned* __restrict__ flag) {
  bool bad = false;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    bad |= non_finite_bits(__float_as_uint(g[i]));
  // Every thread of the warp gets here (blocks of kThreads, a multiple of 32).
  if (__any_sync(0xffffffffu, bad) && threadIdx.x % 32 == 0) atomicOr(flag, 1u);
}

class CudaKernels final : public Kernels {
 public:
  explicit CudaKernels(cudaStream_t stream) : stream_(stream) {
    // Stream-ordered, as the destructor's cudaFreeAsync needs; every use is
    // on this stream.
    DDP_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partial_), kNormBlocks * sizeof(double), stream_));
    DDP_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&out_), 2 * sizeof(double), stream_));
    DDP_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&flag_), sizeof(unsigned), stream_));
    DDP_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&scale_), sizeof(LossScaleState), stream_));
    DDP_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&scalars_), sizeof(StepScalars), stream_));
    set_loss_scale(LossScaleState{});
    DDP_CUDA_CHECK(cudaMemsetAsync(out_, 0, 2 * sizeof(double), stream_));
  }
  ~CudaKernels() override {
    // Freed with the stream's work done: the backend synchronises before it
    // releases its kernels (or leaves them to the process's end on an error).
    cudaFreeAsync(partial_, stream_);
    cudaFreeAsync(out_, stream_);
    cudaFreeAsync(flag_, stream_);
    cudaFreeAsync(scale_, stream_);
    cudaFreeAsync(scalars_, stream_);
  }

  void step(const StepArgs& a) override {
    DDP_CHECK(a.s.kind != Kind::AdamW || (a.a && a.b), "AdamW needs its exp_avg and exp_avg_sq");
    DDP_CHECK(a.s.kind != Kind::Sgd || a.s.mu == 0.0f || a.a, "SGD with momentum needs its buffer");
    if (a.n == 0) return;
    DDP_CHECK(a.p && a.g, "optimizer step: null parameters or gradients");
    step_kernel<<<grid_for(a.n, 8192), kThreads, 0, stream_>>>(a.n, a.s, a.scalars, a.decay, a.sq_norm, a.max_norm,
                                                               a.unscale, a.loss_scale, a.skip, a.p, a.g, a.a, a.b);
    DDP_CUDA_CHECK_LAUNCH(step_kernel);
  }

  const double* sq_norm(const float* g, size_t n, float unscale, const LossScaleState* loss_scale,
                        const unsigned* skip) override {
    sq_partial_kernel<<<kNormBlocks, kThreads, 0, stream_>>>(n, g, partial_);
    DDP_CUDA_CHECK_LAUNCH(sq_partial_kernel);
    sq_final_kernel<<<1, kThreads, 0, stream_>>>(partial_, kNormBlocks, unscale, loss_scale, skip, out_);
    DDP_CUDA_CHECK_LAUNCH(sq_final_kernel);
    return out_;
  }

  double take_norm_sum() override {
    double h = 0;
    DDP_CUDA_CHECK(cudaMemcpyAsync(&h, out_ + 1, sizeof h, cudaMemcpyDeviceToHost, stream_));
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    DDP_CUDA_CHECK(cudaMemsetAsync(out_ + 1, 0, sizeof(double), stream_));
    return h;
  }

  const unsigned* non_finite(const float* g, size_t n) override {
    DDP_CUDA_CHECK(cudaMemsetAsync(flag_, 0, sizeof(unsigned), stream_));
    if (n == 0) return flag_;
    non_finite_kernel<<<grid_for(n), kThreads, 0, stream_>>>(n, g, flag_);
    DDP_CUDA_CHECK_LAUNCH(non_finite_kernel);
    return flag_;
  }

  const LossScaleState* loss_scale() override { return scale_; }
  void set_loss_scale(const LossScaleState& s) override {
    // From pageable memory: returns once s is staged.
    DDP_CUDA_CHECK(cudaMemcpyAsync(scale_, &s, sizeof s, cudaMemcpyHostToDevice, stream_));
  }
  void scale_by_loss_scale(float* x, size_t n) override {
    if (n == 0) return;
    scale_by_kernel<<<grid_for(n), kThreads, 0, stream_>>>(n, scale_, x);
    DDP_CUDA_CHECK_LAUNCH(scale_by_kernel);
  }
  void update_loss_scale(const unsigned* found, const ScalerOptions& o) override {
    update_scale_kernel<<<1, 1, 0, stream_>>>(scale_, found, o.growth_factor, o.backoff_factor, o.growth_interval);
    DDP_CUDA_CHECK_LAUNCH(update_scale_kernel);
  }
  const StepScalars* set_scalars(const StepScalars& s) override {
    set_scalars_kernel<<<1, 1, 0, stream_>>>(s, scalars_);
    DDP_CUDA_CHECK_LAUNCH(set_scalars_kernel);
    return scalars_;
  }

 private:
  cudaStream_t stream_;
  double* partial_ = nullptr;
  double* out_ = nullptr;  // the last squared norm, the running sum of norms
  unsigned* flag_ = nullptr;  // non_finite's
  LossScaleState* scale_ = nullptr;  // Note [loss scale on the device]
  StepScalars* scalars_ = nullptr;   // set_scalars': Note [step graphs]
};

}  // namespace

std::unique_ptr<Kernels> make_cuda_kernels(cudaStream_t stream) { return std::make_unique<CudaKernels>(stream); }

}  // namespace ddp::optim
