// The GPU's 16-bit kernels' conversions (Note [half kernels]): operands into
// bf16 or fp16, results back to fp32 with their roundings, and the pieces
// of the context's staging memory the converted copies live in.
//
// Note [half kernels]: on a GPU, --precision bf16|fp16 runs convolutions and
// linear layers in the 16-bit format itself, where autocast runs them:
// cuDNN's convolutions on 16-bit tensors and cuBLAS's cublasGemmEx on
// 16-bit matrices, both accumulating in fp32 on tensor cores. Such a kernel
// says so (Kernel::set_precision returns true) and then makes every rounding
// of Note [mixed precision] (nn/precision.hpp) itself, so Model rounds
// nothing around it:
//   - its input and weight become 16-bit copies (the rounding) in the
//     context's staging memory, made per call, so nothing 16-bit is kept
//     between forward and backward;
//   - forward's 16-bit output comes back as fp32 with the bias, rounded,
//     added and the sum rounded again (a 16-bit conv followed by a 16-bit
//     bias add, as in PyTorch); a linear layer's fp32 GEMM output onto its
//     rounded bias is rounded once;
//   - backward takes d(output) as a 16-bit copy; d(input) and the weight
//     gradient come out in 16 bits (a GEMM's fp32 result rounded), and the
//     weight and bias gradients are added to the fp32 gradient buffer.
// The CPU kernels compute the same thing in fp32 on operands Model has
// rounded (the product of two 16-bit values is exact in fp32), so the two
// devices differ by the order of their fp32 sums and by where a sum is
// rounded, not by what is rounded. One place rounds more on the GPU, as
// autocast would: LeNet's fused conv-relu-pool pools (and takes its relu
// mask from) the rounded conv + bias, and its convolution's backward takes
// d(conv output), a quarter of the rounded d(output), in 16 bits; the CPU
// pools fp32 conv + bias and passes that quarter on in fp32 (they differ
// where fp16 loses a quarter's bits below its normal range). Every
// conversion is precision.hpp's, which the host tests check bit by bit: the
// hardware's own round-to-nearest-even.
#include <vector>

#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/nn/precision.hpp"          // to_half_bits, half_bits_to_float, round_to
#include "ddp/runtime/block_sum.cuh"     // block_sum: a channel's gradient, in a fixed order
#include "ddp/runtime/cuda_check.hpp"    // DDP_CUDA_CHECK, DDP_CUDA_CHECK_LAUNCH

namespace ddp::nn {

namespace {

#define DDP_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// dst may be src, so neither is __restrict__.
__global__ void round_kernel(int64_t n, Precision p, float* dst, const float* src) {
  DDP_GRID_STRIDE(i, n) dst[i] = round_to(p, src[i]);
}

__global__ void to_half_kernel(int64_t n, Precision p, uint16_t* __restrict__ dst, const float* __restrict__ src) {
  DDP_GRID_STRIDE(i, n) dst[i] = to_half_bits(p, src[i]);
}

__global__ void from_half_kernel(int64_t n, Precision p, bool add, float* __restrict__ dst,
                                 const uint16_t* __restrict__ src) {
  DDP_GRID_STRIDE(i, n) dst[i] = add ? dst[i] + half_bits_to_float(p, src[i]) : half_bits_to_float(p, src[i]);
}

__global__ void add_rounded_kernel(int64_t n, Precision p, float* __restrict__ dst, const float* __restrict__ src) {
  DDP_GRID_STRIDE(i, n) dst[i] += round_to(p, src[i]);
}

__global__ void planes_from_half_kernel(int64_t n, int channels, int64_t pixels, Precision p,
                                        const uint16_t* __restrict__ yh, const float* __restrict__ b,
                                        float* __restrict__ y) {
  DDP_GRID_STRIDE(i, n) y[i] = plane_from_half_at(i, channels, pixels, p, yh, b);
}

// One block a channel: its values over every image and pixel, summed in
// double in an order fixed by the block size, the sum rounded once.
constexpr int kSumThreads = 256;
__global__ void channel_grad_kernel(int64_t images, int channels, int64_t pixels, Precision p,
                                    const uint16_t* __restrict__ dyh, float* __restrict__ db) {
  __shared__ double s[kSumThreads];
  for (int c = blockIdx.x; c < channels; c += gridDim.x) {
    double v = 0;
    for (int64_t j = threadIdx.x; j < images * pixels; j += kSumThreads) {
      const int64_t image = j / pixels, pixel = j % pixels;
      v += half_bits_to_float(p, dyh[(image * channels + c) * pixels + pixel]);
    }
    const double sum = cuda::block_sum<kSumThreads>(s, v);
    if (threadIdx.x == 0) db[c] += round_to(p, float(sum));
    __syncthreads();  // s is reused by the next channel
  }
}

#undef DDP_GRID_STRIDE

}  // namespace

void round_cuda(float* dst, const float* src, int64_t n, Precision p, cudaStream_t stream) {
  if (n <= 0) return;
  if (!is_half(p)) {  // a copy, as the CPU device's
    if (dst != src)
      DDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  round_kernel<<<cuda_grid(n), kCudaThreads, 0, stream>>>(n, p, dst, src);
  DDP_CUDA_CHECK_LAUNCH(round_kernel);
}

void to_half_cuda(uint16_t* dst, const float* src, int64_t n, Precision p, cudaStream_t stream) {
  if (n <= 0) return;
  to_half_kernel<<<cuda_grid(n), kCudaThreads, 0, stream>>>(n, p, dst, src);
  DDP_CUDA_CHECK_LAUNCH(to_half_kernel);
}

void from_half_cuda(float* dst, const uint16_t* src, int64_t n, Precision p, bool add, cudaStream_t stream) {
  if (n <= 0) return;
  from_half_kernel<<<cuda_grid(n), kCudaThreads, 0, stream>>>(n, p, add, dst, src);
  DDP_CUDA_CHECK_LAUNCH(from_half_kernel);
}

void add_rounded_cuda(float* dst, const float* src, int64_t n, Precision p, cudaStream_t stream) {
  if (n <= 0) return;
  add_rounded_kernel<<<cuda_grid(n), kCudaThreads, 0, stream>>>(n, p, dst, src);
  DDP_CUDA_CHECK_LAUNCH(add_rounded_kernel);
}

void planes_from_half_cuda(float* y, const uint16_t* yh, const float* b, int64_t images, int channels,
                           int64_t pixels, Precision p, cudaStream_t stream) {
  const int64_t n = images * channels * pixels;
  if (n <= 0) return;
  planes_from_half_kernel<<<cuda_grid(n), kCudaThreads, 0, stream>>>(n, channels, pixels, p, yh, b, y);
  DDP_CUDA_CHECK_LAUNCH(planes_from_half_kernel);
}

void channel_grad_from_half_cuda(float* db, const uint16_t* dyh, int64_t images, int channels, int64_t pixels,
                                 Precision p, cudaStream_t stream) {
  if (channels <= 0 || images * pixels <= 0) return;
  channel_grad_kernel<<<unsigned(std::min(channels, 8192)), kSumThreads, 0, stream>>>(images, channels, pixels, p,
                                                                                       dyh, db);
  DDP_CUDA_CHECK_LAUNCH(channel_grad_kernel);
}

namespace {

constexpr size_t kAlign = 256;  // what cuDNN and cuBLAS like their operands aligned to
size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

size_t staging_bytes(const std::vector<size_t>& bytes) {
  size_t total = 0;
  for (size_t b : bytes) total += aligned(b);
  return total;
}

std::vector<void*> staging_pieces(cuda::Context& ctx, const std::vector<size_t>& bytes) {
  auto* base = static_cast<char*>(ctx.staging(staging_bytes(bytes)));
  std::vector<void*> pieces;
  size_t at = 0;
  for (size_t b : bytes) {
    pieces.push_back(base + at);
    at += aligned(b);
  }
  return pieces;
}

}  // namespace ddp::nn
