// ddp::train::RankUsage: what each rank's device used, for the epoch line
// and the metrics records: the process's peak resident memory on every rank
// (getrusage's high-water mark since start), and on GPUs the peak of the
// device memory the run allocated and the GPU's utilisation.
#pragma once

#include <string>
#include <vector>

#include "ddp/comm/communicator.hpp"  // Communicator: every rank's figures to all

namespace ddp::train {

// A GPU's figures; negative: not measured (a CPU rank, or no NVML).
struct DeviceUsage {
  double mem_peak_mib = -1;  // high-water mark of the device memory this rank allocated
  double util_pct = -1;      // NVML's utilisation when last sampled
};

struct RankUsage {
  double rss_peak_mib = 0;
  DeviceUsage device;
};

// This process's peak resident memory, in MiB.
double rss_peak_mib();

// Every rank's usage, in rank order (collective).
std::vector<RankUsage> gather_usage(comm::Communicator& comm, const RankUsage& mine);

// "peak memory MiB 412 405 401 399" (rank order; beyond 8 ranks the
// smallest, median and largest with their ranks), and the GPUs' where measured.
std::string describe_usage(const std::vector<RankUsage>& ranks);

}  // namespace ddp::train
