#include "ddp/optim/sgd.hpp"

#include "ddp/core/error.hpp"
#include "ddp/optim/sgd_math.hpp"  // sgd_scalars: the GPU kernel's floats too

namespace ddp::optim {

void sgd_step(const SgdOptions& opt, bool first, size_t n, float* p, const float* g, float* b) {
  DDP_CHECK(opt.lr >= 0 && opt.momentum >= 0 && opt.weight_decay >= 0, "SGD: lr ", opt.lr, ", momentum ",
            opt.momentum, ", weight decay ", opt.weight_decay, ": none may be negative");
  DDP_CHECK(!opt.nesterov || (opt.momentum > 0 && opt.dampening == 0),
            "nesterov needs momentum > 0 and zero dampening");
  DDP_CHECK(opt.momentum == 0 || b, "SGD with momentum needs its buffer");
  const SgdScalars s = sgd_scalars(opt);
  const float lr = s.lr, wd = s.wd, mu = s.mu, damp = s.damp;
  if (mu == 0.0f) {
    for (size_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + wd * p[i]);
    return;
  }
  if (first) {
    for (size_t i = 0; i < n; ++i) b[i] = g[i] + wd * p[i];
  } else {
    for (size_t i = 0; i < n; ++i) b[i] = mu * b[i] + damp * (g[i] + wd * p[i]);
  }
  if (s.nesterov) {
    for (size_t i = 0; i < n; ++i) p[i] -= lr * ((g[i] + wd * p[i]) + mu * b[i]);
  } else {
    for (size_t i = 0; i < n; ++i) p[i] -= lr * b[i];
  }
}

}  // namespace ddp::optim
