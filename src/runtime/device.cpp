// The rules of runtime/device.hpp.
#include "ddp/runtime/device.hpp"

#include <cstdlib>
#include <map>

#include "ddp/core/error.hpp"

namespace ddp {

namespace {

std::string visible_devices_env() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v ? std::string(" (CUDA_VISIBLE_DEVICES=") + v + ")" : std::string();
}

}  // namespace

int choose_gpu(const World& w, int visible, bool sharing_allowed, const std::string& no_gpu_reason) {
  DDP_CHECK(visible > 0, "--device cuda: no CUDA device on host ", w.host, " (GPUs seen: 0",
            no_gpu_reason.empty() ? "" : "; ", no_gpu_reason, ")", visible_devices_env(),
            "; run on a node with GPUs, or use --device cpu");
  if (visible == 1) return 0;
  if (visible >= w.local_size) return w.local_rank;
  if (sharing_allowed) return w.local_rank % visible;
  DDP_FAIL("more ranks than GPUs on host ", w.host, ": rank ", w.rank, " is local rank ", w.local_rank, " of ",
           w.local_size, " there, and ", visible, " GPUs are visible", visible_devices_env(),
           "; start one rank per GPU (mpirun -np ", visible, " per node, Slurm --ntasks-per-node=", visible,
           " --gpus-per-task=1), or use --backend mpi to share GPUs between ranks");
}

const std::string& nccl_host(const GpuId& id) { return id.nccl_hostid.empty() ? id.host : id.nccl_hostid; }

std::optional<std::pair<int, int>> find_shared_gpu(const std::vector<GpuId>& ranks) {
  std::map<std::pair<std::string, std::string>, int> first;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    const auto [it, fresh] = first.emplace(std::make_pair(nccl_host(ranks[r]), ranks[r].pci_bus_id), r);
    if (!fresh) return std::make_pair(it->second, r);
  }
  return std::nullopt;
}

std::string shared_gpu_message(const std::vector<GpuId>& ranks, std::pair<int, int> pair, int visible) {
  const GpuId& g = ranks[pair.first];
  int on_host = 0;
  for (const GpuId& r : ranks) on_host += nccl_host(r) == nccl_host(g);
  const std::string where = g.nccl_hostid.empty()
                                ? "host " + g.host
                                : "host " + g.host + " with NCCL_HOSTID=" + g.nccl_hostid + " (NCCL's host for both)";
  return detail::concat("ranks ", pair.first, " and ", pair.second, " both use GPU ", g.pci_bus_id, " on ", where,
                        ": ", on_host, " ranks there, ", visible, " GPU", visible == 1 ? "" : "s", " visible to each",
                        visible_devices_env(),
                        "; NCCL needs one GPU per rank: start one rank per GPU (Slurm --gpus-per-task=1), "
                        "or use --backend mpi to share GPUs between ranks",
                        g.nccl_hostid.empty() ? "" : ", or (to test NCCL) give each rank its own NCCL_HOSTID");
}

}  // namespace ddp
