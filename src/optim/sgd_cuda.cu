// sgd_step_cuda (optim/sgd_cuda.hpp): Sgd::step as one grid-stride kernel
// over the flat buffer, with sgd.cpp's float arithmetic in sgd.cpp's order.
#include "ddp/optim/sgd_cuda.hpp"

#include <algorithm>

#include "ddp/core/error.hpp"          // DDP_CHECK
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUDA_CHECK_LAUNCH

namespace ddp::optim {

namespace {

constexpr int kThreads = 256;

__global__ void sgd_kernel(size_t n, float lr, float wd, float mu, float damp, bool first, bool nesterov,
                           float* __restrict__ p, const float* __restrict__ g, float* __restrict__ buf) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float d = g[i] + wd * p[i];  // the decayed gradient
    if (mu == 0.0f) {
      p[i] -= lr * d;
      continue;
    }
    // PyTorch's first step sets the buffer to d itself, undamped.
    const float b = first ? d : mu * buf[i] + damp * d;
    buf[i] = b;
    p[i] -= nesterov ? lr * (d + mu * b) : lr * b;
  }
}

}  // namespace

void sgd_step_cuda(const SgdOptions& opt, bool first, size_t n, float* params, const float* grads, float* momentum,
                   cudaStream_t stream) {
  // The same float conversions as Sgd::step, so the same branch is taken.
  const float lr = static_cast<float>(opt.lr);
  const float wd = static_cast<float>(opt.weight_decay);
  const float mu = static_cast<float>(opt.momentum);
  const float damp = 1.0f - static_cast<float>(opt.dampening);
  DDP_CHECK(!opt.nesterov || (opt.momentum > 0 && opt.dampening == 0),
            "sgd_step_cuda: nesterov needs momentum > 0 and zero dampening");
  DDP_CHECK(mu == 0.0f || momentum, "sgd_step_cuda: momentum ", opt.momentum, " without a momentum buffer");
  if (n == 0) return;
  DDP_CHECK(params && grads, "sgd_step_cuda: null params or grads");
  const unsigned grid = unsigned(std::min<size_t>((n + kThreads - 1) / kThreads, 8192));
  sgd_kernel<<<grid, kThreads, 0, stream>>>(n, lr, wd, mu, damp, first, opt.nesterov, params, grads, momentum);
  DDP_CUDA_CHECK_LAUNCH(sgd_kernel);
}

}  // namespace ddp::optim
