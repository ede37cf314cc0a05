// ReLU on the GPU: element-wise kernels with relu_cpu.cpp's comparisons, so
// a NaN and a zero take the same branch on both devices.
#include "cuda_layers.hpp"
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUDA_CHECK_LAUNCH

namespace ddp::nn {

namespace {

__global__ void relu_forward_kernel(int64_t n, const float* __restrict__ x, float* __restrict__ y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

// From the output: y > 0 exactly where x > 0.
__global__ void relu_backward_kernel(int64_t n, const float* __restrict__ y, const float* __restrict__ dy,
                                     float* __restrict__ dx) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

}  // namespace

void CudaReLU::forward(const float* x, int batch, float* y) {
  const int64_t n = int64_t(batch) * spec_.in.numel();
  if (n <= 0) return;
  relu_forward_kernel<<<cuda_grid(n), kCudaThreads, 0, ctx_.compute()>>>(n, x, y);
  DDP_CUDA_CHECK_LAUNCH(relu_forward_kernel);
}

void CudaReLU::backward(const float* /*x*/, const float* y, const float* dy, int batch, float* dx) {
  const int64_t n = int64_t(batch) * spec_.in.numel();
  if (!dx || n <= 0) return;
  relu_backward_kernel<<<cuda_grid(n), kCudaThreads, 0, ctx_.compute()>>>(n, y, dy, dx);
  DDP_CUDA_CHECK_LAUNCH(relu_backward_kernel);
}

}  // namespace ddp::nn
