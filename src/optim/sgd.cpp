#include "ddp/optim/sgd.hpp"

#include "ddp/core/error.hpp"
#include "ddp/optim/sgd_math.hpp"  // sgd_scalars: the GPU kernel's floats too

namespace ddp::optim {

Sgd::Sgd(size_t numel, SgdOptions opt) : n_(numel), opt_(opt) {
  DDP_CHECK(opt.lr >= 0, "--lr must be >= 0, got ", opt.lr);
  DDP_CHECK(opt.momentum >= 0, "--momentum must be >= 0, got ", opt.momentum);
  DDP_CHECK(opt.weight_decay >= 0, "--weight-decay must be >= 0, got ", opt.weight_decay);
  DDP_CHECK(!opt.nesterov || (opt.momentum > 0 && opt.dampening == 0),
            "nesterov needs momentum > 0 and zero dampening");
  if (opt.momentum != 0) buf_.assign(n_, 0.0f);
}

void Sgd::step(float* p, const float* g) {
  const SgdScalars s = sgd_scalars(opt_);
  const float lr = s.lr, wd = s.wd, mu = s.mu, damp = s.damp;
  const size_t n = n_;
  if (mu == 0.0f) {
    for (size_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + wd * p[i]);
    return;
  }
  float* b = buf_.data();
  if (!started_) {
    // PyTorch initialises the buffer with the first (decayed) gradient, undamped.
    for (size_t i = 0; i < n; ++i) b[i] = g[i] + wd * p[i];
    started_ = true;
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
