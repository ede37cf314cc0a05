// Flatten on the GPU: NCHW is already flat per sample, so both directions are
// device-to-device copies on the compute stream (a separate output buffer,
// because the model gives every layer one).
#include "cuda_layers.hpp"
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUDA_CHECK

namespace ddp::nn {

void CudaFlatten::forward(const float* x, int batch, float* y) {
  const size_t bytes = sizeof(float) * size_t(batch) * size_t(spec_.in.numel());
  if (bytes == 0 || x == y) return;
  DDP_CUDA_CHECK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, ctx_.compute()));
}

void CudaFlatten::backward(const float* /*x*/, const float* /*y*/, const float* dy, int batch, float* dx) {
  const size_t bytes = sizeof(float) * size_t(batch) * size_t(spec_.in.numel());
  if (!dx || bytes == 0 || dx == dy) return;
  DDP_CUDA_CHECK(cudaMemcpyAsync(dx, dy, bytes, cudaMemcpyDeviceToDevice, ctx_.compute()));
}

}  // namespace ddp::nn
