// Linear on the GPU: cuBLAS SGEMMs on the row-major tensors of linear_cpu.cpp.
//
// Note [row-major gemm]: cuBLAS is column-major, and a row-major [r, c]
// matrix is, byte for byte, its column-major transpose [c, r] with leading
// dimension c. So x [batch, in] is x^T (in x batch, ld in), W [out, in] is
// W^T (in x out, ld in), y and dy [batch, out] are y^T, dy^T (out x batch,
// ld out), and each product is written for the transposes:
//   y^T  = W x^T           gemm(T, N, out, batch, in:  W, x)   beta 1 onto the bias
//   dW^T += x^T dy         gemm(N, T, in, out, batch:  x, dy)  beta 1 (accumulate)
//   dx^T = W^T dy^T        gemm(N, N, in, batch, out:  W, dy)  beta 0
#include "cuda_layers.hpp"
#include "ddp/core/error.hpp"          // DDP_CHECK, DDP_FAIL
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUBLAS_CHECK, DDP_CUDA_CHECK_LAUNCH

namespace ddp::nn {

namespace {

// y[r, :] = b (zeros without a bias), for the forward GEMM to add onto, as
// the CPU does.
__global__ void fill_rows_kernel(int batch, int out, const float* __restrict__ b, float* __restrict__ y) {
  const int64_t n = int64_t(batch) * out;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = b ? b[i % out] : 0.0f;
}

// db[o] += dy[r, o] for r in order, the CPU's summation order; one thread a
// feature, so neighbouring threads read neighbouring floats.
__global__ void bias_grad_kernel(int batch, int out, const float* __restrict__ dy, float* __restrict__ db) {
  for (int o = blockIdx.x * blockDim.x + threadIdx.x; o < out; o += gridDim.x * blockDim.x) {
    float acc = db[o];
    for (int r = 0; r < batch; ++r) acc += dy[int64_t(r) * out + o];
    db[o] = acc;
  }
}

}  // namespace

CudaLinear::CudaLinear(const LayerSpec& spec, cuda::Context& ctx)
    : CudaLayer(spec, ctx), in_(int(spec.in.numel())), outf_(spec.out) {}

void CudaLinear::bind(const std::vector<float*>& params, const std::vector<float*>& grads) {
  p_.bind(name(), params, grads);
}

void CudaLinear::forward(const float* x, int batch, float* y) {
  DDP_CHECK(p_.w, "layer ", name(), ": forward before bind");
  if (batch <= 0) return;
  try {
    const int64_t n = int64_t(batch) * outf_;
    fill_rows_kernel<<<cuda_grid(n), kCudaThreads, 0, ctx_.compute()>>>(batch, outf_, p_.b, y);
    DDP_CUDA_CHECK_LAUNCH(fill_rows_kernel);
    const float one = 1.0f;
    DDP_CUBLAS_CHECK(cublasSgemm(ctx_.blas(), CUBLAS_OP_T, CUBLAS_OP_N, outf_, batch, in_, &one, p_.w, in_, x, in_,
                                 &one, y, outf_));
  } catch (const Error& e) {
    DDP_FAIL("layer ", name(), ": forward: ", e.what());
  }
}

void CudaLinear::backward(const float* x, const float* /*y*/, const float* dy, int batch, float* dx) {
  DDP_CHECK(p_.dw, "layer ", name(), ": backward before bind");
  if (batch <= 0) return;
  try {
    if (p_.db) {
      bias_grad_kernel<<<cuda_grid(outf_), kCudaThreads, 0, ctx_.compute()>>>(batch, outf_, dy, p_.db);
      DDP_CUDA_CHECK_LAUNCH(bias_grad_kernel);
    }
    const float one = 1.0f, zero = 0.0f;
    DDP_CUBLAS_CHECK(cublasSgemm(ctx_.blas(), CUBLAS_OP_N, CUBLAS_OP_T, in_, outf_, batch, &one, x, in_, dy, outf_,
                                 &one, p_.dw, in_));
    if (dx)
      DDP_CUBLAS_CHECK(cublasSgemm(ctx_.blas(), CUBLAS_OP_N, CUBLAS_OP_N, in_, batch, outf_, &one, p_.w, in_, dy,
                                   outf_, &zero, dx, in_));
  } catch (const Error& e) {
    DDP_FAIL("layer ", name(), ": backward: ", e.what());
  }
}

}  // namespace ddp::nn
