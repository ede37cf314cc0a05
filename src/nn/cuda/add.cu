// The residual add on the GPU (and the ReLU after it): element-wise kernels
// over kernel_math.hpp's add_at and add_grad_at.
#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/nn/kernel_math.hpp"      // add_at, add_grad_at
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUDA_CHECK_LAUNCH

namespace ddp::nn {

namespace {

__global__ void add_forward_kernel(int64_t n, const float* __restrict__ a, const float* __restrict__ b, bool relu,
                                   float* __restrict__ y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = kernel::add_at(a[i], b[i], relu);
}

// da and db get the same gradient; either may be nullptr.
__global__ void add_backward_kernel(int64_t n, const float* __restrict__ y, bool relu, const float* __restrict__ dy,
                                    float* __restrict__ da, float* __restrict__ db) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = kernel::add_grad_at(y[i], dy[i], relu);
    if (da) da[i] = g;
    if (db) db[i] = g;
  }
}

}  // namespace

void CudaAdd::forward(const OpArgs& a) {
  const int64_t n = int64_t(a.batch) * n_;
  if (n <= 0) return;
  add_forward_kernel<<<cuda_grid(n), kCudaThreads, 0, ctx_.compute()>>>(n, a.x[0], a.x[1], relu_, a.y);
  DDP_CUDA_CHECK_LAUNCH(add_forward_kernel);
}

void CudaAdd::backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) {
  const int64_t n = int64_t(a.batch) * n_;
  if (n <= 0 || (!dx[0] && !dx[1])) return;
  add_backward_kernel<<<cuda_grid(n), kCudaThreads, 0, ctx_.compute()>>>(n, a.y, relu_, dy, dx[0], dx[1]);
  DDP_CUDA_CHECK_LAUNCH(add_backward_kernel);
}

}  // namespace ddp::nn
