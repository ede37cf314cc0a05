// From the command line (Config) to the optimizer and its schedule: the one
// place the flags' meaning is turned into optim's types, for the replica,
// the start-up line and the checkpoint's configuration alike.
#pragma once

#include <cstdint>
#include <string>

#include "ddp/optim/lr_schedule.hpp"  // LrSchedule
#include "ddp/optim/optimizer.hpp"    // Options
#include "ddp/train/config.hpp"

namespace ddp::train {

optim::Options optimizer_options(const Config& cfg);

// --lr, times global batch / 256 with --scale-lr.
double base_lr(const Config& cfg);

// The run's schedule over total_steps optimizer steps. Throws UsageError
// (every rank alike) when it cannot run, e.g. a warm-up as long as the run.
optim::LrSchedule lr_schedule(const Config& cfg, int64_t total_steps);

}  // namespace ddp::train
