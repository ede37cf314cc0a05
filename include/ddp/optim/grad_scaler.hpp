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

#include <cstdint>

namespace ddp::optim {

struct ScalerOptions {
  double init_scale = 65536.0;  // 2^16, PyTorch's default
  double growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class GradScaler {
 public:
  // Throws ddp::Error for an option out of range (a scale that is not a
  // positive finite float, a growth factor <= 1, a backoff outside (0, 1), an
  // interval < 1).
  explicit GradScaler(const ScalerOptions& o);

  float scale() const { return scale_; }
  int64_t growth_tracker() const { return tracker_; }
  const ScalerOptions& options() const { return opt_; }

  // After a step whose averaged gradients were (not) all finite.
  void update(bool found_inf);

  // A checkpoint's state; throws ddp::Error naming what is out of range.
  void set_state(float scale, int64_t growth_tracker);

 private:
  ScalerOptions opt_;
  float scale_;
  int64_t tracker_ = 0;
};

}  // namespace ddp::optim
