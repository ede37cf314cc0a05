// ddp::train::startup_table: the lines a run starts with (rank 0): the job
// (ranks, backend, device, model, batch, steps), the optimizer and what the
// flags make of the step (precision, --deterministic, --accumulate), then a
// table of every rank, so that a misconfigured job is visible in its first
// lines; and the check that every rank takes the same number of steps.
#pragma once

#include <cstdint>
#include <ostream>

#include "ddp/optim/lr_schedule.hpp"  // LrSchedule: described
#include "ddp/runtime/world.hpp"      // World
#include "ddp/train/config.hpp"       // Config
#include "ddp/train/replica.hpp"      // Replica: its device, communicator, model, reducer

namespace ddp::train {

// `shard` is this rank's samples per epoch, `steps` its steps per epoch.
// Throws ddp::Error when the ranks disagree on the steps, or the collectives
// of the last steps would never match. Collective.
void startup_table(Replica& replica, const World& world, const Config& cfg, const optim::LrSchedule& schedule,
                   int64_t shard, int64_t steps, std::ostream& out);

}  // namespace ddp::train
