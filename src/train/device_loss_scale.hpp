// DeviceLossScale: --precision fp16's loss scaler deciding on the device, so
// that the host never waits for a step (a GPU's with --gpu-kernels proven).
//
// Note [loss scale on the device]: GradScaler.step reads found_inf on the
// host every step (PyTorch's too), and the host then waits for the device:
// on a GPU the next step's launches start from an idle device, which a small
// model's step (LeNet's, launch-bound) pays in full. Here what a step needs
// before the host could know found_inf is decided on the device:
// - the scale lives in the device's memory (optim::Kernels::loss_scale):
//   d(loss) is multiplied by it there, the optimizer divides by it there, and
//   after each step update_loss_scale moves it there by GradScaler's rule;
// - the optimizer's kernels read the step's found_inf (Kernels::non_finite's
//   flag) and leave every parameter and buffer as it was where it is set.
// The host reads the flag one step late: step k's is copied to the host as
// step k ends and read in step k+1 before its optimizer step is issued, when
// the device is long past it. So the host's count of steps taken (AdamW's
// bias corrections, SGD's first momentum) is exact for every step issued (a
// step found skipped is taken back, Optimizer::unstep, before the next is
// issued), its GradScaler follows the device's state one step behind by the
// same rule, and StepHealth reports a skipped step one step late
// (steps_ago); settle() reads the last one (an epoch's end, a checkpoint).
// Each step's arithmetic is the host-checked path's, bit for bit.
#pragma once

#include <cstddef>
#include <optional>

#include "ddp/optim/grad_scaler.hpp"  // GradScaler
#include "ddp/optim/kernels.hpp"      // Kernels
#include "ddp/optim/optimizer.hpp"    // Optimizer
#include "ddp/train/replica.hpp"      // Backend, StepHealth

namespace ddp::train {

class DeviceLossScale {
 public:
  DeviceLossScale(Backend& backend, optim::GradScaler& host, optim::Optimizer& optimizer);

  // The host's scaler state to the device (at the start, and on a resume),
  // after catch_up: a step still on its way belongs to the state replaced,
  // and is not reported.
  void push();
  // d(loss) of n values times the device's scale.
  void scale(float* dlogits, size_t n);
  // The optimizer's part of a step on g[0, n): the check, the previous
  // step's outcome into health (steps_ago 1), the update (left undone on the
  // device where the check failed), the scale moved on the device.
  void step(double lr, float* p, const float* g, size_t n, StepHealth& health);
  // Note [step graphs]: step() in two, the host's part (the previous step's
  // outcome into health) before a captured optimizer runs, the device's
  // part captured; replayed(): the captured part ran again.
  void before_step(StepHealth& health);
  void issue(double lr, float* p, const float* g, size_t n);
  void replayed() { in_flight_ = true; }
  // The host's state made the device's: the last step's outcome read
  // (waiting for the device) and kept for settle() or the next step to report.
  void catch_up();
  // The last step's outcome where no step has reported it yet (steps_ago 0),
  // else a finite, unskipped health.
  StepHealth settle();

 private:
  // The unreported outcome into h, as of steps_ago steps before.
  void report(StepHealth& h, int steps_ago);
  // The step on the device once found holds its check.
  void finish(double lr, float* p, const float* g, const unsigned* found);
  Backend& backend_;
  optim::Kernels& kernels_;
  optim::GradScaler& host_;
  optim::Optimizer& optimizer_;
  bool in_flight_ = false;                // a step's flag on its way to the host
  std::optional<bool> unreported_;        // a read step's skipped, not yet reported
};

}  // namespace ddp::train
