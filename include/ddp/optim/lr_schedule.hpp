// ddp::optim::LrSchedule: the learning rate of every optimizer step, a
// function of the global step alone, so a resumed run and a run at another
// world size take the same rates. Each schedule is one of PyTorch's
// (docs/optimizers.md):
//
//   warm-up, t < W:  base * (t + 1) / (W + 1)
//                    (LinearLR(start_factor=1/(W+1), total_iters=W))
//   then u = t - W:
//     constant       base
//     step           base * gamma^floor(u / step_size)        (StepLR)
//     cosine         lr_min + (base - lr_min) * (1 + cos(pi * u / T)) / 2,
//                    T = total_steps - W                       (CosineAnnealingLR)
//
// with the warm-up joined to the rest as SequentialLR(milestones=[W]) does.
#pragma once

#include <cstdint>
#include <string>

namespace ddp::optim {

struct LrSchedule {
  std::string kind = "constant";  // constant | step | cosine
  double base = 0.1;
  int64_t warmup_steps = 0;
  int64_t step_size = 0;  // step: steps between decays
  double gamma = 0.1;     // step: factor per decay
  double lr_min = 0;      // cosine: the rate at total_steps
  int64_t total_steps = 0;  // cosine: steps of the whole run

  // The rate of the step that global step t (0-based) takes.
  double at(int64_t t) const;
  // One line: "cosine from 0.1 to 0 over 1000 steps after 100 warm-up steps".
  std::string describe() const;
};

// Throws ddp::Error naming the flag when the schedule cannot run.
void validate(const LrSchedule& s);

}  // namespace ddp::optim
