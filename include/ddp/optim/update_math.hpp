// The per-element updates of SGD and AdamW, written once for the CPU loop
// (kernels_cpu.cpp) and the GPU kernel (kernels_cuda.cu), in PyTorch's
// order of operations (torch.optim.SGD, torch.optim.AdamW single-tensor
// path), on the floats PyTorch's kernels see: Python's double scalars are
// rounded to float once (Optimizer::step).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "ddp/core/host_device.hpp"  // DDP_HOST_DEVICE

namespace ddp::optim {

enum class Kind { Sgd, AdamW };

// One step's numbers, as float.
struct StepScalars {
  Kind kind = Kind::Sgd;
  float lr = 0;
  // SGD
  float wd = 0;            // L2 term added to the gradient
  float mu = 0, damp = 1;  // momentum; 1 - dampening
  bool nesterov = false;
  bool first = false;  // the momentum buffer is not set yet: this step sets it
  // AdamW
  float decay_factor = 1;  // 1 - lr * weight_decay (decoupled)
  float beta2 = 0.999f, eps = 1e-8f;
  float one_minus_beta1 = 0.1f, one_minus_beta2 = 0.001f;  // rounded from double, as Python passes them
  float step_size = 0;  // lr / (1 - beta1^t)
  float bc2_sqrt = 1;   // sqrt(1 - beta2^t)
};

// torch.nn.utils.clip_grad_norm_'s factor for gradients of squared L2 norm
// sq: max_norm / (norm + 1e-6), at most 1, in float as PyTorch computes it;
// a NaN norm gives NaN, as torch.clamp keeps it (every gradient then NaN).
DDP_HOST_DEVICE inline float clip_coefficient(float max_norm, double sq) {
  const float norm = static_cast<float>(sqrt(sq));
  const float coef = max_norm / (norm + 1e-6f);
  return coef >= 1.0f ? 1.0f : coef;
}

// What a step multiplies every gradient by: unscale (the inverse of the
// loss scale, 1 without one) times clipping's coefficient where sq, the
// unscaled gradients' squared norm, is given (nullptr: no clipping).
DDP_HOST_DEVICE inline float gradient_factor(const double* sq, float max_norm, float unscale) {
  return (sq ? clip_coefficient(max_norm, *sq) : 1.0f) * unscale;
}

// torch.lerp(a, b, w) as PyTorch computes it (the form depends on w).
DDP_HOST_DEVICE inline float lerp(float a, float b, float w) {
  return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w);
}

// Element i: gscale multiplies the gradient first (clipping: PyTorch's
// in-place grad.mul_); decay says whether the element's parameter group has
// weight decay. a is SGD's momentum buffer (unread when mu == 0) or AdamW's
// exp_avg; b is AdamW's exp_avg_sq.
DDP_HOST_DEVICE inline void update_at(size_t i, const StepScalars& s, bool decay, float gscale, float* p,
                                      const float* g, float* a, float* b) {
  const float gi = gscale == 1.0f ? g[i] : g[i] * gscale;
  if (s.kind == Kind::Sgd) {
    const float d = decay ? gi + s.wd * p[i] : gi;  // the decayed gradient
    if (s.mu == 0.0f) {
      p[i] -= s.lr * d;
      return;
    }
    const float m = s.first ? d : s.mu * a[i] + s.damp * d;
    a[i] = m;
    p[i] -= s.nesterov ? s.lr * (d + s.mu * m) : s.lr * m;
    return;
  }
  const float pi = decay ? p[i] * s.decay_factor : p[i];
  const float m = lerp(a[i], gi, s.one_minus_beta1);
  const float v = b[i] * s.beta2 + s.one_minus_beta2 * gi * gi;
  const float denom = sqrtf(v) / s.bc2_sqrt + s.eps;
  a[i] = m;
  b[i] = v;
  p[i] = pi + (-s.step_size * m) / denom;
}

}  // namespace ddp::optim
