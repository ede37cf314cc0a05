// How a run that diverged ends: the checks of each step's health and of
// each epoch's loss, which every rank makes alike and which end the job with
// one CollectiveError naming the step, before anything of it is saved.
#pragma once

#include <cstdint>

#include "ddp/comm/communicator.hpp"  // Communicator: every rank's loss, to name the ranks
#include "ddp/train/replica.hpp"      // StepHealth, GradScaler

namespace ddp::train {

// After a step (epoch 0-based; step, in the epoch, and global_step 1-based:
// the step just taken): throws when its averaged gradients are not finite
// (naming the ranks whose loss was not, where the host has it: a collective
// then), or when --precision fp16's scaler skipped it and its scale has
// fallen so low that the gradients are not finite at any scale (the step
// health.steps_ago before it: Note [loss scale on the device]). Returns
// whether the scaler skipped it.
bool check_step(comm::Communicator& comm, const StepHealth& health, const optim::GradScaler* scaler, int64_t epoch,
                int64_t step, int64_t global_step);

// Where steps are not checked one by one (GPUs: replica.hpp), the epoch's
// loss, summed over the ranks, is, before its checkpoint.
void check_epoch_loss(double loss_sum, int64_t epoch);

}  // namespace ddp::train
