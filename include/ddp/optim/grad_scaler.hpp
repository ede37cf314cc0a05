// ddp::optim::GradScaler: torch.amp.GradScaler's dynamic loss scale for
// --precision fp16 (Note [mixed precision] in nn/precision.hpp).
//
// The step's d(loss) is multiplied by scale() before backward, so that small
// gradients survive fp16's range; the optimizer divides the averaged
// gradients by it again (Optimizer::step's unscale). A step whose averaged
// gradients hold an infinity or a NaN is skipped: every rank holds the same
// averaged gradients, so every rank skips it. update() then moves the scale
// as PyTorch's _amp_update_scale_ does: a skipped step multiplies it by
// backoff_factor and restarts the count of good steps; growth_interval good
// steps in a row multiply it by growth_factor (unless that is no longer a
// finite float). The state (the scale, the count) is in checkpoints.
#pragma once

#include <cfloat>
#include <cstdint>

#include "ddp/core/host_device.hpp"  // DDP_HOST_DEVICE

namespace ddp::optim {

struct ScalerOptions {
  double init_scale = 65536.0;  // 2^16, PyTorch's default
  double growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

// The scaler's state, in host or device memory (Note [loss scale on the
// device], train/device_loss_scale.hpp).
struct LossScaleState {
  float scale = 65536.0f;
  int64_t tracker = 0;  // good steps since the scale last changed
};

// After a step whose averaged gradients were (not) all finite, as
// at::_amp_update_scale_: the scale is a float, the factors doubles. The
// host's GradScaler and the GPU's kernel both move the scale with it.
DDP_HOST_DEVICE inline void update_loss_scale(LossScaleState& s, bool found_inf, double growth_factor,
                                              double backoff_factor, int64_t growth_interval) {
  if (found_inf) {
    s.scale = static_cast<float>(s.scale * backoff_factor);
    s.tracker = 0;
    return;
  }
  if (++s.tracker < growth_interval) return;
  const float grown = static_cast<float>(s.scale * growth_factor);
  if (grown <= FLT_MAX) s.scale = grown;  // finite (the scale is positive)
  s.tracker = 0;
}

class GradScaler {
 public:
  // Throws ddp::Error for an option out of range (a scale that is not a
  // positive finite float, a growth factor <= 1, a backoff outside (0, 1), an
  // interval < 1).
  explicit GradScaler(const ScalerOptions& o);

  float scale() const { return state_.scale; }
  int64_t growth_tracker() const { return state_.tracker; }
  const LossScaleState& state() const { return state_; }
  const ScalerOptions& options() const { return opt_; }

  // After a step whose averaged gradients were (not) all finite.
  void update(bool found_inf);

  // A checkpoint's state; throws ddp::Error naming what is out of range.
  void set_state(float scale, int64_t growth_tracker);

 private:
  ScalerOptions opt_;
  LossScaleState state_;
};

}  // namespace ddp::optim
