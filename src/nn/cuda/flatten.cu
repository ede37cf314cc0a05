// Flatten on the GPU: NCHW is already flat per sample, so both directions are
// device-to-device copies on the compute stream (a separate output buffer,
// because the model gives every op one).
#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUDA_CHECK

namespace ddp::nn {

void CudaFlatten::forward(const OpArgs& a) {
  const size_t bytes = sizeof(float) * size_t(a.batch) * size_t(n_);
  if (bytes == 0 || a.x[0] == a.y) return;
  DDP_CUDA_CHECK(cudaMemcpyAsync(a.y, a.x[0], bytes, cudaMemcpyDeviceToDevice, ctx_.compute()));
}

void CudaFlatten::backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) {
  const size_t bytes = sizeof(float) * size_t(a.batch) * size_t(n_);
  if (!dx[0] || bytes == 0 || dx[0] == dy) return;
  DDP_CUDA_CHECK(cudaMemcpyAsync(dx[0], dy, bytes, cudaMemcpyDeviceToDevice, ctx_.compute()));
}

}  // namespace ddp::nn
