// Which GPU a rank uses, decided from numbers alone (no CUDA call), so the
// rules and their messages are the same in every build and tested without a
// GPU. The CUDA side (cuda_context.hpp) counts devices and binds one.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp/runtime/world.hpp"

namespace ddp {

// The device index this rank binds, given the GPUs it sees:
// - one visible GPU: device 0 (the launcher gave each rank its own, as
//   Slurm's --gpus-per-task=1 or a per-rank CUDA_VISIBLE_DEVICES does;
//   whether they really differ is checked across ranks by bus id);
// - at least as many GPUs as ranks on the node: the local rank's;
// - otherwise an error naming the rank, host, local ranks and GPUs seen,
//   unless sharing is allowed (--backend mpi), then local rank mod GPUs.
// No GPU at all is an error that says why (no_gpu_reason).
int choose_gpu(const World& w, int visible, bool sharing_allowed, const std::string& no_gpu_reason = "");

struct GpuId {
  std::string host;
  std::string pci_bus_id;
  std::string nccl_hostid = {};  // the rank's NCCL_HOSTID, empty where unset
};

// The host a rank is on as NCCL sees it: its NCCL_HOSTID where that is set
// (NCCL then takes it for the host, whatever the hostname), else its
// hostname. Ranks with different NCCL_HOSTIDs are other hosts to NCCL, which
// connects them with its network transport even on one machine: how several
// ranks test NCCL on one GPU.
const std::string& nccl_host(const GpuId& id);

// The first two ranks (in rank order) bound to the same GPU: same NCCL host
// and bus id. NCCL refuses such a job ("Duplicate GPU detected"); ddp refuses
// it first, with the ranks and the fix.
std::optional<std::pair<int, int>> find_shared_gpu(const std::vector<GpuId>& ranks);

// The error for find_shared_gpu's answer.
std::string shared_gpu_message(const std::vector<GpuId>& ranks, std::pair<int, int> pair, int visible);

}  // namespace ddp
