// Linear on the GPU: cuBLAS SGEMMs on the row-major tensors of linear_cpu.cpp,
// shaped by kernel_math.hpp (Note [row-major gemm]), and two small kernels
// for the bias.
#include "cuda_kernels.hpp"
#include "ddp/core/error.hpp"          // DDP_CHECK, DDP_FAIL
#include "ddp/nn/kernel_math.hpp"      // linear_*_gemm, linear_bias_at, linear_bias_grad_at
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUBLAS_CHECK, DDP_CUDA_CHECK_LAUNCH

namespace ddp::nn {

namespace {

// y[r, :] = b (zeros without a bias), for the forward GEMM to add onto, as
// the CPU does.
__global__ void fill_rows_kernel(int batch, int out, const float* __restrict__ b, float* __restrict__ y) {
  const int64_t n = int64_t(batch) * out;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = kernel::linear_bias_at(i, out, b);
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

}  // namespace

void CudaLinear::forward(const OpArgs& a) {
  if (a.batch <= 0) return;
  try {
    const int64_t n = int64_t(a.batch) * out_;
    fill_rows_kernel<<<cuda_grid(n), kCudaThreads, 0, ctx_.compute()>>>(a.batch, out_, a.p[1], a.y);
    DDP_CUDA_CHECK_LAUNCH(fill_rows_kernel);
    kernel::linear_forward_gemm(a.batch, in_, out_, a.x[0], a.p[0], a.y, cublas_gemm(ctx_.blas()));
  } catch (const Error& e) {
    DDP_FAIL("op ", name_, ": forward: ", e.what());
  }
}

void CudaLinear::backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) {
  if (a.batch <= 0) return;
  try {
    bias_grad_kernel<<<cuda_grid(out_), kCudaThreads, 0, ctx_.compute()>>>(a.batch, out_, dy, a.dp[1]);
    DDP_CUDA_CHECK_LAUNCH(bias_grad_kernel);
    kernel::linear_backward_gemm(a.batch, in_, out_, a.x[0], a.p[0], dy, a.dp[0], dx[0], cublas_gemm(ctx_.blas()));
  } catch (const Error& e) {
    DDP_FAIL("op ", name_, ": backward: ", e.what());
  }
}

}  // namespace ddp::nn
