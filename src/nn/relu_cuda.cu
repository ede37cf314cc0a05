// ReLU on the GPU: element-wise kernels over kernel_math.hpp's relu_at and
// relu_grad_at.
#include "cuda_layers.hpp"
#include "ddp/nn/kernel_math.hpp"      // relu_at, relu_grad_at
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUDA_CHECK_LAUNCH

namespace ddp::nn {

namespace {

__global__ void relu_forward_kernel(int64_t n, const float* __restrict__ x, float* __restrict__ y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = kernel::relu_at(x[i]);
}

__global__ void relu_backward_kernel(int64_t n, const float* __restrict__ y, const float* __restrict__ dy,
                                     float* __restrict__ dx) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dx[i] = kernel::relu_grad_at(y[i], dy[i]);
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
