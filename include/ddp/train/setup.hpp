// The parts of a run's set-up, in the order the trainer takes them: the
// paths checked and the checkpoint directory locked, the host's
// communicator and the preflight, the data every rank trains on, the device
// each rank is placed on, the replica there.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "ddp/checkpoint/dir_lock.hpp"  // DirLock: one job per checkpoint directory
#include "ddp/comm/communicator.hpp"  // Communicator: MPI backend
#include "ddp/comm/watchdog.hpp"      // Watchdog: the replica's communicator watched
#include "ddp/data/dataset.hpp"       // Split
#include "ddp/data/sampler.hpp"       // DistributedSampler
#include "ddp/nn/graph.hpp"           // Graph: the model, described once
#include "ddp/optim/optimizer.hpp"    // Options
#include "ddp/runtime/world.hpp"      // World
#include "ddp/train/config.hpp"       // Config
#include "ddp/train/placement.hpp"    // Placement, place_rank
#include "ddp/train/replica.hpp"      // Replica

namespace ddp::train {

// Rank 0, before anything is read or trained: the paths the run writes
// checked and the checkpoint directory locked for this job (run_paths.hpp),
// with a warning where the lock cannot guard it; nullptr on other ranks and
// without --checkpoint-dir. Hold it until the run ends.
std::unique_ptr<checkpoint::DirLock> lock_run_paths(const World& world, const Config& cfg);

// --timeout: the bound on every collective.
std::chrono::milliseconds collective_timeout(const Config& cfg);

// The host's MPI communicator (checked before each collective under
// --debug-collectives), bounded by --timeout, once the preflight has found
// every rank reachable (preflight.hpp). Collective.
std::unique_ptr<comm::Communicator> open_host_comm(const World& world, const Config& cfg);

// What this rank trains on: the dataset (--train-limit applied: the sampler
// then works on those samples alone), its shard of each epoch, and the steps
// of an epoch, the same on every rank.
struct TrainingData {
  data::Split data;
  data::DistributedSampler sampler;
  int per_rank = 0;  // this rank's samples per step
  int64_t steps = 0;
};

// Loads the dataset on every rank; one that fails on any rank (or does not
// fill a global batch) is every rank's error, said once. Collective.
TrainingData load_training_data(comm::Communicator& comm, const World& world, const Config& cfg);

// place_rank, with rank 0's note on what auto chose, and the refusals that
// need the device known. Collective.
Placement place(comm::Communicator& host_comm, const World& world, const Config& cfg);

// This rank's replica of `graph` on the placed device, its communicator
// built over host_comm and watched by `watchdog` (nullptr: none).
std::unique_ptr<Replica> make_replica(const World& world, const Config& cfg, const Placement& place,
                                      std::unique_ptr<comm::Communicator> host_comm, comm::Watchdog* watchdog,
                                      nn::Graph graph, const optim::Options& optimizer);

}  // namespace ddp::train
