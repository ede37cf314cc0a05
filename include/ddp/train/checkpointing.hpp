// ddp::train::Checkpointing: the replica's state on its way between the
// device, the ranks and files, in one place. At start-up, the resume point
// or the initial state, the same on every rank; before each evaluation and
// each checkpoint, rank 0's buffers on every rank (Note [buffers],
// nn/graph.hpp); a checkpoint at a step or an epoch's end, and
// --output-model, from the host's copy read back from the device, refused
// while a parameter is not finite. What a checkpoint file holds of that copy
// and what it must satisfy to be resumed from are resume.hpp's.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "ddp/checkpoint/checkpoint.hpp"  // RunState: a checkpoint's position and sums
#include "ddp/core/trace.hpp"             // Trace: the checkpoint's span
#include "ddp/data/dataset.hpp"           // Dataset: part of what a resumed run must share
#include "ddp/optim/lr_schedule.hpp"      // LrSchedule: idem
#include "ddp/optim/optimizer.hpp"        // Options: which optimizer state a checkpoint holds
#include "ddp/runtime/world.hpp"          // World
#include "ddp/train/config.hpp"           // Config
#include "ddp/train/replica.hpp"          // Replica, TrainState: the host's copy

namespace ddp::train {

class Checkpointing {
 public:
  // `replica` outlives this object.
  Checkpointing(const World& world, const Config& cfg, Replica& replica);

  // Where the run starts: the checkpoint --resume names, its state pushed
  // into the replica, or the model's initial state, rank 0's on every rank.
  // The position returned carries the configuration a checkpoint of this
  // run records and this world's size. Collective.
  checkpoint::RunState start(const data::Dataset& train, const optim::LrSchedule& schedule,
                             const optim::Options& optimizer, int64_t steps_per_epoch, std::ostream& out);

  // Rank 0's buffers and counters (BatchNorm's running statistics) to every
  // rank, as rank 0 evaluates with and saves them. Collective.
  void sync_buffers();

  // A checkpoint at `at` in --checkpoint-dir: collective (sync_buffers);
  // rank 0 writes and returns the path, other ranks "". Whether and when
  // must be a function of the step alone, the same on every rank.
  std::string save(const checkpoint::RunState& at, Trace* trace);

  // --output-model (rank 0): the model's state dict, parameters, buffers and
  // counters under PyTorch's names, no optimizer state.
  void write_model(const std::string& path, int epochs_done);

 private:
  // The replica's state read back into host_, checked finite for `what`.
  const TrainState& pull(const std::string& what);

  const World& world_;
  const Config& cfg_;
  Replica& replica_;
  TrainState host_;  // what checkpoints and --output-model are made from
};

}  // namespace ddp::train
