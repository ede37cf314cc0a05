// The GPU twin of sgd_step (optim/sgd.hpp): the same update, in PyTorch's
// order, over the whole flat buffer in ONE kernel launch on stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "ddp/optim/sgd.hpp"  // SgdOptions

namespace ddp::optim {

// p -= lr * update(g); momentum (nullptr without momentum) is the momentum
// buffer, which the first step (first == true) sets to the decayed gradient
// itself, as PyTorch does.
void sgd_step_cuda(const SgdOptions& opt, bool first, size_t n, float* params, const float* grads,
                   float* momentum, cudaStream_t stream);

}  // namespace ddp::optim
