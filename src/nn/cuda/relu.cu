// ReLU on the GPU: element-wise kernels over kernel_math.hpp's relu_at and
// relu_grad_at.
#include "ddp/nn/cuda/kernels.hpp"
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

void CudaRelu::forward(const OpArgs& a) {
  const int64_t n = int64_t(a.batch) * n_;
  if (n <= 0) return;
  relu_forward_kernel<<<cuda_grid(n), kCudaThreads, 0, ctx_.compute()>>>(n, a.x[0], a.y);
  DDP_CUDA_CHECK_LAUNCH(relu_forward_kernel);
}

void CudaRelu::backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) {
  const int64_t n = int64_t(a.batch) * n_;
  if (!dx[0] || n <= 0) return;
  relu_backward_kernel<<<cuda_grid(n), kCudaThreads, 0, ctx_.compute()>>>(n, a.y, dy, dx[0]);
  DDP_CUDA_CHECK_LAUNCH(relu_backward_kernel);
}

}  // namespace ddp::nn
