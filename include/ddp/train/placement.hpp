// ddp::train::place_rank: --device and --backend resolved to what this rank
// runs on (README, GPUs): device auto is cuda when every rank sees a GPU
// (and this build has the CUDA backend), else cpu; backend auto is nccl when
// every rank has a GPU of its own, else mpi.
#pragma once

#include <string>

#include "ddp/comm/communicator.hpp"
#include "ddp/runtime/world.hpp"
#include "ddp/train/config.hpp"

namespace ddp::train {

struct Placement {
  std::string device;   // "cpu" or "cuda"
  std::string backend;  // "mpi" or "nccl"; on cuda also "auto" (make_cuda_backend decides)
  int gpu = -1;         // device index on cuda (runtime/device.hpp's choose_gpu)
  std::string note;     // for rank 0 to print, when auto made a choice worth saying
};

// Collective over comm (device auto asks every rank). Throws ddp::Error
// naming the rank's host and the GPUs it sees when the request cannot be met.
Placement place_rank(comm::Communicator& comm, const World& world, const Config& cfg);

}  // namespace ddp::train
