// Linear on the GPU: cuBLAS SGEMMs on the row-major tensors of nn/cpu/linear.cpp,
// shaped by kernel_math.hpp (Note [row-major gemm]), and two small kernels
// for the bias; in tf32 the same SGEMMs on TF32 tensor cores (Note [tf32]
// in nn/precision.hpp); in bf16 or fp16, cublasGemmEx on 16-bit copies of
// the operands with fp32 results (Note [half kernels], nn/cuda/half.cu).
#include <cuda_runtime_api.h>  // cudaMemsetAsync

#include <optional>

#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/core/error.hpp"          // DDP_CHECK, DDP_FAIL
#include "ddp/nn/kernel_math.hpp"      // linear_*_gemm, linear_bias_at, linear_bias_grad_at
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUBLAS_CHECK, DDP_CUDA_CHECK, DDP_CUDA_CHECK_LAUNCH

namespace ddp::nn {

namespace {

// y[r, :] = b (zeros without a bias), for the forward GEMM to add onto, as
// the CPU does; rounded to p, as a 16-bit bias is.
__global__ void fill_rows_kernel(int batch, int out, Precision p, const float* __restrict__ b,
                                 float* __restrict__ y) {
  const int64_t n = int64_t(batch) * out;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = round_to(p, kernel::linear_bias_at(i, out, b));
}

// One thread a feature, so neighbouring threads read neighbouring floats.
__global__ void bias_grad_kernel(int batch, int out, const float* __restrict__ dy, float* __restrict__ db) {
  for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < out; o += gridDim.x * blockDim.x)
    db[o] = kernel::linear_bias_grad_at(o, batch, out, dy, db[o]);
}

// kernel_math.hpp's gemm callback as cublasSgemm on the layer's handle.
auto cublas_gemm(cublasHandle_t blas) {
  return [blas](bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                float beta, float* c, int ldc) {
    const float one = 1.0f;
    DDP_CUBLAS_CHECK(cublasSgemm(blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                                 &one, a, lda, b, ldb, &beta, c, ldc));
  };
}

// The handle's math mode while a layer's GEMMs run: the context pins it to
// CUBLAS_PEDANTIC_MATH for fp32 (Note [fma math] in nn/cuda/cudnn_conv.cu),
// which may keep cublasGemmEx off tensor cores. The default mode puts 16-bit
// operands with fp32 accumulation on them (and has no TF32 for 16-bit
// inputs); CUBLAS_TF32_TENSOR_OP_MATH puts fp32 SGEMMs on TF32 tensor cores.
class MathMode {
 public:
  MathMode(cublasHandle_t blas, cublasMath_t mode) : blas_(blas) {
    DDP_CUBLAS_CHECK(cublasGetMathMode(blas_, &before_));
    DDP_CUBLAS_CHECK(cublasSetMathMode(blas_, mode));
  }
  ~MathMode() { cublasSetMathMode(blas_, before_); }
  MathMode(const MathMode&) = delete;
  MathMode& operator=(const MathMode&) = delete;

 private:
  cublasHandle_t blas_;
  cublasMath_t before_{};
};

// The gemm callback as cublasGemmEx on 16-bit operands of p's format, fp32
// results and accumulation.
auto cublas_gemm_half(cublasHandle_t blas, Precision p) {
  const cudaDataType_t type = p == Precision::BF16 ? CUDA_R_16BF : CUDA_R_16F;
  return [blas, type](bool ta, bool tb, int m, int n, int k, const uint16_t* a, int lda, const uint16_t* b, int ldb,
                      float beta, float* c, int ldc) {
    const float one = 1.0f;
    DDP_CUBLAS_CHECK(cublasGemmEx(blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                                  &one, a, type, lda, b, type, ldb, &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
  };
}

}  // namespace

void CudaLinear::forward(const OpArgs& a) {
  if (a.batch <= 0) return;
  try {
    const int64_t n = int64_t(a.batch) * out_;
    fill_rows_kernel<<<cuda_grid(n), kCudaThreads, 0, ctx_.compute()>>>(a.batch, out_, precision_, a.p[1], a.y);
    DDP_CUDA_CHECK_LAUNCH(fill_rows_kernel);
    if (is_half(precision_)) return forward_half(a);
    std::optional<MathMode> tf32;
    if (precision_ == Precision::TF32) tf32.emplace(ctx_.blas(), CUBLAS_TF32_TENSOR_OP_MATH);
    kernel::linear_forward_gemm(a.batch, in_, out_, a.x[0], a.p[0], a.y, cublas_gemm(ctx_.blas()));
  } catch (const Error& e) {
    DDP_FAIL("op ", name_, ": forward: ", e.what());
  }
}

void CudaLinear::backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) {
  if (a.batch <= 0) return;
  try {
    if (is_half(precision_)) return backward_half(a, dy, dx[0]);
    if (a.dp[1]) {  // none in a run of micro-shards' call (Note [checked runs])
      bias_grad_kernel<<<cuda_grid(out_), kCudaThreads, 0, ctx_.compute()>>>(a.batch, out_, dy, a.dp[1]);
      DDP_CUDA_CHECK_LAUNCH(bias_grad_kernel);
    }
    std::optional<MathMode> tf32;
    if (precision_ == Precision::TF32) tf32.emplace(ctx_.blas(), CUBLAS_TF32_TENSOR_OP_MATH);
    kernel::linear_backward_gemm(a.batch, in_, out_, a.x[0], a.p[0], dy, a.dp[0], dx[0], cublas_gemm(ctx_.blas()));
  } catch (const Error& e) {
    DDP_FAIL("op ", name_, ": backward: ", e.what());
  }
}

// Note [half kernels]: y = round(round(b) + x W^T), the product of 16-bit
// copies accumulated in fp32 onto the rounded bias fill_rows_kernel wrote.
void CudaLinear::forward_half(const OpArgs& a) {
  const int64_t nx = int64_t(a.batch) * in_, nw = int64_t(out_) * in_, ny = int64_t(a.batch) * out_;
  ctx_.staging(staging_bytes(backward_pieces(a.batch)));  // backward's, now (staging_pieces)
  const std::vector<void*> at = staging_pieces(ctx_, {size_t(nx) * 2, size_t(nw) * 2});
  auto* xh = static_cast<uint16_t*>(at[0]);
  auto* wh = static_cast<uint16_t*>(at[1]);
  to_half_cuda(xh, a.x[0], nx, precision_, ctx_.compute());
  to_half_cuda(wh, a.p[0], nw, precision_, ctx_.compute());
  {
    MathMode math(ctx_.blas(), CUBLAS_DEFAULT_MATH);
    kernel::linear_forward_gemm(a.batch, in_, out_, xh, wh, a.y, cublas_gemm_half(ctx_.blas(), precision_));
  }
  round_cuda(a.y, a.y, ny, precision_, ctx_.compute());
}

// d(y), x, w in 16 bits; the fp32 weight gradient.
std::vector<size_t> CudaLinear::backward_pieces(int batch) const {
  const size_t nx = size_t(batch) * size_t(in_), nw = size_t(out_) * size_t(in_), ny = size_t(batch) * size_t(out_);
  return {ny * 2, nx * 2, nw * 2, nw * sizeof(float)};
}

// d(output) as a 16-bit copy; the bias gradient its rounded column sums; the
// weight gradient into fp32 scratch, rounded as it is added; d(input)
// rounded in place. Each only where asked for (a run of micro-shards' call
// takes no parameter gradients: Note [checked runs]).
void CudaLinear::backward_half(const OpArgs& a, const float* dy, float* dx) {
  const int64_t nx = int64_t(a.batch) * in_, nw = int64_t(out_) * in_, ny = int64_t(a.batch) * out_;
  const std::vector<void*> at = staging_pieces(ctx_, backward_pieces(a.batch));
  auto* dyh = static_cast<uint16_t*>(at[0]);
  auto* xh = static_cast<uint16_t*>(at[1]);
  auto* wh = static_cast<uint16_t*>(at[2]);
  auto* dw = static_cast<float*>(at[3]);
  cudaStream_t s = ctx_.compute();
  to_half_cuda(dyh, dy, ny, precision_, s);
  if (a.dp[1]) channel_grad_from_half_cuda(a.dp[1], dyh, a.batch, out_, 1, precision_, s);
  const bool weights = a.dp[0] != nullptr;
  if (weights) to_half_cuda(xh, a.x[0], nx, precision_, s);
  if (dx) to_half_cuda(wh, a.p[0], nw, precision_, s);
  if (weights) DDP_CUDA_CHECK(cudaMemsetAsync(dw, 0, size_t(nw) * sizeof(float), s));
  {
    MathMode math(ctx_.blas(), CUBLAS_DEFAULT_MATH);
    kernel::linear_backward_gemm(a.batch, in_, out_, xh, wh, dyh, weights ? dw : nullptr, dx,
                                 cublas_gemm_half(ctx_.blas(), precision_));
  }
  if (weights) add_rounded_cuda(a.dp[0], dw, nw, precision_, s);
  if (dx) round_cuda(dx, dx, nx, precision_, s);
}

}  // namespace ddp::nn
