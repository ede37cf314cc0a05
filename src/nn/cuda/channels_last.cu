// What a convolution needs around cuDNN to keep activations NHWC (Note
// [channels last], nn/layout.hpp): its weights as KRSC copies, their
// gradient added back into PyTorch's KCRS layout, and the bias added over
// NHWC outputs. One thread an element; every element written once.
#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/nn/kernel_math.hpp"      // krsc_to_kcrs
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUDA_CHECK_LAUNCH

namespace ddp::nn {

namespace {

__global__ void weights_to_krsc_kernel(int64_t n, int c, int rs, Precision p, const float* __restrict__ w,
                                       void* __restrict__ dst) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = w[kernel::krsc_to_kcrs(i, c, rs)];
    if (is_half(p))
      static_cast<uint16_t*>(dst)[i] = to_half_bits(p, v);
    else
      static_cast<float*>(dst)[i] = v;
  }
}

__global__ void add_weights_from_krsc_kernel(int64_t n, int c, int rs, Precision p, const void* __restrict__ src,
                                             float* __restrict__ dw) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v =
        is_half(p) ? half_bits_to_float(p, static_cast<const uint16_t*>(src)[i]) : static_cast<const float*>(src)[i];
    dw[kernel::krsc_to_kcrs(i, c, rs)] += v;
  }
}

__global__ void add_channel_bias_kernel(int64_t n, int c, const float* __restrict__ b, float* __restrict__ y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] += b[i % c];
}

}  // namespace

void weights_to_krsc_cuda(void* dst, const float* w, int k, int c, int rs, Precision p, cudaStream_t stream) {
  const int64_t n = int64_t(k) * c * rs;
  if (n <= 0) return;
  weights_to_krsc_kernel<<<cuda_grid(n), kCudaThreads, 0, stream>>>(n, c, rs, p, w, dst);
  DDP_CUDA_CHECK_LAUNCH(weights_to_krsc_kernel);
}

void add_weights_from_krsc_cuda(float* dw, const void* src, int k, int c, int rs, Precision p, cudaStream_t stream) {
  const int64_t n = int64_t(k) * c * rs;
  if (n <= 0) return;
  add_weights_from_krsc_kernel<<<cuda_grid(n), kCudaThreads, 0, stream>>>(n, c, rs, p, src, dw);
  DDP_CUDA_CHECK_LAUNCH(add_weights_from_krsc_kernel);
}

void add_channel_bias_cuda(float* y, const float* b, int64_t n, int c, cudaStream_t stream) {
  if (n <= 0) return;
  add_channel_bias_kernel<<<cuda_grid(n), kCudaThreads, 0, stream>>>(n, c, b, y);
  DDP_CUDA_CHECK_LAUNCH(add_channel_bias_kernel);
}

}  // namespace ddp::nn
