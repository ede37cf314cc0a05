// DeviceLossScale (device_loss_scale.hpp): Note [loss scale on the device].
#include "device_loss_scale.hpp"

#include "ddp/core/error.hpp"  // DDP_CHECK

namespace ddp::train {

DeviceLossScale::DeviceLossScale(Backend& backend, optim::GradScaler& host, optim::Optimizer& optimizer)
    : backend_(backend), kernels_(backend.optim_kernels()), host_(host), optimizer_(optimizer) {
  push();
}

void DeviceLossScale::push() {
  DDP_CHECK(!in_flight_, "fp16: a loss scale pushed with a step's outcome on its way (catch_up first)");
  unreported_.reset();
  kernels_.set_loss_scale(host_.state());
}

void DeviceLossScale::scale(float* dlogits, size_t n) { kernels_.scale_by_loss_scale(dlogits, n); }

void DeviceLossScale::catch_up() {
  if (!in_flight_) return;
  in_flight_ = false;
  const bool skipped = backend_.flag_on_host("fp16: reading whether the last step was skipped");
  host_.update(skipped);
  if (skipped) optimizer_.unstep();
  unreported_ = skipped;
}

void DeviceLossScale::step(double lr, float* p, const float* g, size_t n, StepHealth& health) {
  const unsigned* found = kernels_.non_finite(g, n);
  // The previous step's outcome, before this step's count is taken.
  before_step(health);
  finish(lr, p, g, found);
}

void DeviceLossScale::before_step(StepHealth& health) {
  catch_up();
  report(health, 1);
}

void DeviceLossScale::issue(double lr, float* p, const float* g, size_t n) {
  finish(lr, p, g, kernels_.non_finite(g, n));
}

void DeviceLossScale::finish(double lr, float* p, const float* g, const unsigned* found) {
  optimizer_.step(lr, p, g, kernels_.loss_scale(), found);
  kernels_.update_loss_scale(found, host_.options());
  backend_.flag_to_host(found);
  in_flight_ = true;
}

StepHealth DeviceLossScale::settle() {
  catch_up();
  StepHealth h;
  report(h, 0);
  return h;
}

void DeviceLossScale::report(StepHealth& h, int steps_ago) {
  if (!unreported_) return;
  h.skipped = *unreported_;
  h.grads_finite = !*unreported_;
  h.steps_ago = steps_ago;
  unreported_.reset();
}

}  // namespace ddp::train
