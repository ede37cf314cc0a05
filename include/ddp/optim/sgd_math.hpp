// sgd_step's update of one element, as the GPU's one-launch SGD kernel
// (sgd_cuda.cu) runs it on the device and tests/unit/optim checks it against
// sgd_step on the host (core/host_device.hpp).
#pragma once

#include <cstddef>

#include "ddp/core/host_device.hpp"  // DDP_HOST_DEVICE
#include "ddp/optim/sgd.hpp"         // SgdOptions

namespace ddp::optim {

// The options as float, as sgd_step and the GPU kernel both take them, so
// both devices take the same branches.
struct SgdScalars {
  float lr = 0, wd = 0, mu = 0, damp = 1;  // damp: 1 - dampening
  bool nesterov = false;
};

inline SgdScalars sgd_scalars(const SgdOptions& opt) {
  SgdScalars s;
  s.lr = static_cast<float>(opt.lr);
  s.wd = static_cast<float>(opt.weight_decay);
  s.mu = static_cast<float>(opt.momentum);
  s.damp = 1.0f - static_cast<float>(opt.dampening);
  s.nesterov = opt.nesterov;
  return s;
}

// p[i] -= lr * update(g[i]) in PyTorch's order: weight decay, momentum (buf,
// unread when mu == 0; the first step sets it to the decayed gradient
// itself, undamped), nesterov.
DDP_HOST_DEVICE inline void sgd_update_at(size_t i, const SgdScalars& s, bool first, float* p, const float* g,
                                          float* buf) {
  const float d = g[i] + s.wd * p[i];  // the decayed gradient
  if (s.mu == 0.0f) {
    p[i] -= s.lr * d;
    return;
  }
  const float b = first ? d : s.mu * buf[i] + s.damp * d;
  buf[i] = b;
  p[i] -= s.nesterov ? s.lr * (d + s.mu * b) : s.lr * b;
}

}  // namespace ddp::optim
