// 2x2 / stride-2 average pooling on the GPU, NCHW, floor on odd sizes as
// pool_cpu.cpp: the kernels (shared with ConvReluPool) and the AvgPool2d layer.
// One thread per output element forward and per input element backward, so
// every element is written exactly once and nothing needs atomics.
#include "cuda_layers.hpp"
#include "ddp/nn/kernel_math.hpp"      // avgpool2_*_at
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

void CudaAvgPool2d::forward(const float* x, int batch, float* y) {
  avgpool2_forward_cuda(int64_t(batch) * spec_.in.c, spec_.in.h, spec_.in.w, x, false, y, ctx_.compute());
}

void CudaAvgPool2d::backward(const float* /*x*/, const float* /*y*/, const float* dy, int batch, float* dx) {
  if (dx) avgpool2_backward_cuda(int64_t(batch) * spec_.in.c, spec_.in.h, spec_.in.w, dy, nullptr, dx, ctx_.compute());
}

}  // namespace ddp::nn
