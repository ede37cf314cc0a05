// ddp::optim::sgd_step: PyTorch's torch.optim.SGD over the flat parameter
// buffer, one pass per step (Note [flat layout] in nn/graph.hpp). Its state,
// the momentum buffer, is the replica's (train/replica.hpp), on the device
// the parameters are on; sgd_step_cuda (sgd_cuda.hpp) is the GPU twin.
#pragma once

#include <cstddef>

namespace ddp::optim {

struct SgdOptions {
  double lr = 0.1;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// p -= lr * update(g) over n floats, in PyTorch's order: weight decay,
// momentum (the first step, first == true, sets the buffer to the decayed
// gradient itself, undamped), nesterov. momentum is the buffer, nullptr when
// opt.momentum is 0. Throws ddp::Error for options PyTorch refuses.
void sgd_step(const SgdOptions& opt, bool first, size_t n, float* p, const float* g, float* momentum);

}  // namespace ddp::optim
