// 2x2 / stride-2 average pooling on the GPU, NCHW, floor on odd sizes as
// pool_cpu.cpp: the kernels (shared with ConvReluPool) and the AvgPool2d layer.
// One thread per output element forward and per input element backward, so
// every element is written exactly once and nothing needs atomics.
#include "cuda_layers.hpp"
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUDA_CHECK_LAUNCH

namespace ddp::nn {

namespace {

__global__ void avgpool2_forward_kernel(int64_t planes, int h, int w, const float* __restrict__ x, bool relu,
                                        float* __restrict__ y) {
  const int oh = h / 2, ow = w / 2;
  const int64_t n = planes * oh * ow;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int c = int(i % ow);
    const int64_t t = i / ow;
    const int r = int(t % oh);
    const int64_t p = t / oh;
    const float* a = x + (p * h + 2 * r) * int64_t(w) + 2 * c;
    const float* b = a + w;
    float a0 = a[0], a1 = a[1], b0 = b[0], b1 = b[1];
    if (relu) {
      a0 = a0 > 0.0f ? a0 : 0.0f;
      a1 = a1 > 0.0f ? a1 : 0.0f;
      b0 = b0 > 0.0f ? b0 : 0.0f;
      b1 = b1 > 0.0f ? b1 : 0.0f;
    }
    y[i] = 0.25f * ((a0 + a1) + (b0 + b1));  // pool_cpu.cpp's order
  }
}

__global__ void avgpool2_backward_kernel(int64_t planes, int h, int w, const float* __restrict__ dy,
                                         const float* __restrict__ mask, float* __restrict__ dx) {
  const int oh = h / 2, ow = w / 2;
  const int64_t n = planes * h * w;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int col = int(i % w);
    const int64_t t = i / w;
    const int row = int(t % h);
    const int64_t p = t / h;
    float v = 0.0f;
    if (row < 2 * oh && col < 2 * ow && (mask == nullptr || mask[i] > 0.0f))
      v = 0.25f * dy[(p * oh + row / 2) * int64_t(ow) + col / 2];
    dx[i] = v;
  }
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
