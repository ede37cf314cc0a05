// ddp::cuda::GpuMonitor: what the start-up table and the epoch lines say of a
// rank's GPU. Its description (model, memory, compute capability, bus id,
// driver and NCCL versions); the high-water mark of the memory the run
// allocated from the device's default pool (where every array of the model
// and the optimizer comes from: cudaMallocAsync); and utilisation from NVML,
// which is loaded at run time (dlopen), so that a machine without the driver
// still starts ddp_train and only the utilisation is missing.
#pragma once

#include <memory>
#include <string>

#include "ddp/runtime/cuda_context.hpp"  // DeviceInfo

namespace ddp::cuda {

class GpuMonitor {
 public:
  explicit GpuMonitor(const DeviceInfo& info);
  ~GpuMonitor();
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;

  // "NVIDIA H100 80GB HBM3, 79.1 GiB, sm_90, bus 0000:19:00.0, driver 570.124.06, NCCL 2.21.5"
  std::string describe() const;
  // MiB: the pool's high-water mark since start.
  double mem_peak_mib() const;
  // Percent of the last NVML sample period in which a kernel ran; -1
  // without NVML.
  double util_pct() const;

 private:
  struct Nvml;
  DeviceInfo info_;
  std::unique_ptr<Nvml> nvml_;
};

}  // namespace ddp::cuda
