// sgd_step_cuda (optim/sgd_cuda.hpp): sgd_step as one grid-stride kernel
// over the flat buffer, each element updated by sgd_math.hpp's sgd_update_at.
#include "ddp/optim/sgd_cuda.hpp"

#include <algorithm>

#include "ddp/core/error.hpp"          // DDP_CHECK
#include "ddp/optim/sgd_math.hpp"      // SgdScalars, sgd_update_at
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUDA_CHECK_LAUNCH

namespace ddp::optim {

namespace {

constexpr int kThreads = 256;

__global__ void sgd_kernel(size_t n, SgdScalars s, bool first, float* __restrict__ p, const float* __restrict__ g,
                           float* __restrict__ buf) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    sgd_update_at(i, s, first, p, g, buf);
}

}  // namespace

void sgd_step_cuda(const SgdOptions& opt, bool first, size_t n, float* params, const float* grads, float* momentum,
                   cudaStream_t stream) {
  const SgdScalars s = sgd_scalars(opt);
  DDP_CHECK(!opt.nesterov || (opt.momentum > 0 && opt.dampening == 0),
            "sgd_step_cuda: nesterov needs momentum > 0 and zero dampening");
  DDP_CHECK(s.mu == 0.0f || momentum, "sgd_step_cuda: momentum ", opt.momentum, " without a momentum buffer");
  if (n == 0) return;
  DDP_CHECK(params && grads, "sgd_step_cuda: null params or grads");
  const unsigned grid = unsigned(std::min<size_t>((n + kThreads - 1) / kThreads, 8192));
  sgd_kernel<<<grid, kThreads, 0, stream>>>(n, s, first, params, grads, momentum);
  DDP_CUDA_CHECK_LAUNCH(sgd_kernel);
}

}  // namespace ddp::optim
