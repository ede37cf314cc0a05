// Average pooling on the GPU, NCHW (the global pool also NHWC: Note [channels
// last], nn/layout.hpp), as nn/cpu/pool.cpp: 2x2 / stride 2 with
// floor on odd sizes (the kernels shared with ConvReluPool) and global.
// One thread per output element forward and per input element backward, so
// every element is written exactly once and nothing needs atomics.
#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/nn/kernel_math.hpp"      // avgpool2_*_at, global_avgpool_*_at
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUDA_CHECK_LAUNCH

namespace ddp::nn {

namespace {

__global__ void avgpool2_forward_kernel(int64_t planes, int h, int w, const float* __restrict__ x, bool relu,
                                        float* __restrict__ y) {
  const int64_t n = planes * (h / 2) * (w / 2);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = kernel::avgpool2_forward_at(i, h, w, x, relu);
}

__global__ void avgpool2_backward_kernel(int64_t planes, int h, int w, const float* __restrict__ dy,
                                         const float* __restrict__ mask, float* __restrict__ dx) {
  const int64_t n = planes * h * w;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dx[i] = kernel::avgpool2_backward_at(i, h, w, dy, mask);
}

// One thread a plane, summing it in order (nn/cpu/pool.cpp's order).
__global__ void global_avgpool_forward_kernel(int64_t planes, int hw, const float* __restrict__ x,
                                              float* __restrict__ y) {
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < planes; p += int64_t(gridDim.x) * blockDim.x)
    y[p] = kernel::global_avgpool_at(p, hw, x);
}

__global__ void global_avgpool_backward_kernel(int64_t n, int hw, const float* __restrict__ dy,
                                               float* __restrict__ dx) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dx[i] = kernel::global_avgpool_grad_at(i, hw, dy);
}

// Note [channels last]: one thread an output (image, channel), neighbouring
// threads on neighbouring channels, so each pixel's read is one contiguous
// row.
__global__ void global_avgpool_nhwc_forward_kernel(int64_t n, int c, int hw, const float* __restrict__ x,
                                                   float* __restrict__ y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = kernel::global_avgpool_nhwc_at(i, c, hw, x);
}

__global__ void global_avgpool_nhwc_backward_kernel(int64_t n, int c, int hw, const float* __restrict__ dy,
                                                    float* __restrict__ dx) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dx[i] = kernel::global_avgpool_grad_nhwc_at(i, c, hw, dy);
}

}  // namespace

void avgpool2_forward_cuda(int64_t planes, int h, int w, const float* x, bool relu, float* y, cudaStream_t stream) {
  const int64_t n = planes * (h / 2) * (w / 2);
  if (n <= 0) return;
  avgpool2_forward_kernel<<<cuda_grid(n), kCudaThreads, 0, stream>>>(planes, h, w, x, relu, y);
  DDP_CUDA_CHECK_LAUNCH(avgpool2_forward_kernel);
}

void avgpool2_backward_cuda(int64_t planes, int h, int w, const float* dy, const float* mask, float* dx,
                            cudaStream_t stream) {
  const int64_t n = planes * h * w;
  if (n <= 0) return;
  avgpool2_backward_kernel<<<cuda_grid(n), kCudaThreads, 0, stream>>>(planes, h, w, dy, mask, dx);
  DDP_CUDA_CHECK_LAUNCH(avgpool2_backward_kernel);
}

void CudaAvgPool::forward(const OpArgs& a) {
  avgpool2_forward_cuda(int64_t(a.batch) * in_.c, in_.h, in_.w, a.x[0], false, a.y, ctx_.compute());
}

void CudaAvgPool::backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) {
  if (dx[0]) avgpool2_backward_cuda(int64_t(a.batch) * in_.c, in_.h, in_.w, dy, nullptr, dx[0], ctx_.compute());
}

void CudaGlobalAvgPool::forward(const OpArgs& a) {
  const int64_t planes = int64_t(a.batch) * in_.c;
  if (planes <= 0) return;
  if (layout_ == Layout::NHWC) {
    global_avgpool_nhwc_forward_kernel<<<cuda_grid(planes), kCudaThreads, 0, ctx_.compute()>>>(
        planes, in_.c, in_.h * in_.w, a.x[0], a.y);
    DDP_CUDA_CHECK_LAUNCH(global_avgpool_nhwc_forward_kernel);
    return;
  }
  global_avgpool_forward_kernel<<<cuda_grid(planes), kCudaThreads, 0, ctx_.compute()>>>(planes, in_.h * in_.w,
                                                                                          a.x[0], a.y);
  DDP_CUDA_CHECK_LAUNCH(global_avgpool_forward_kernel);
}

void CudaGlobalAvgPool::backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) {
  const int64_t n = int64_t(a.batch) * in_.numel();
  if (!dx[0] || n <= 0) return;
  if (layout_ == Layout::NHWC) {
    global_avgpool_nhwc_backward_kernel<<<cuda_grid(n), kCudaThreads, 0, ctx_.compute()>>>(n, in_.c, in_.h * in_.w,
                                                                                            dy, dx[0]);
    DDP_CUDA_CHECK_LAUNCH(global_avgpool_nhwc_backward_kernel);
    return;
  }
  global_avgpool_backward_kernel<<<cuda_grid(n), kCudaThreads, 0, ctx_.compute()>>>(n, in_.h * in_.w, dy, dx[0]);
  DDP_CUDA_CHECK_LAUNCH(global_avgpool_backward_kernel);
}

}  // namespace ddp::nn
