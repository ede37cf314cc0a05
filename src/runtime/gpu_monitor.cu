// GpuMonitor (runtime/gpu_monitor.hpp).
#include "ddp/runtime/gpu_monitor.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdint>
#include <cstdio>

#include "ddp/runtime/cuda_check.hpp"  // DDP_CUDA_CHECK

namespace ddp::cuda {

// The few NVML entry points used, declared by their documented C ABI (the
// toolkit ships no nvml.h here) and looked up in the driver's library.
struct GpuMonitor::Nvml {
  using Device = void*;
  struct Utilization {
    unsigned gpu, memory;
  };
  void* lib = nullptr;
  Device device = nullptr;
  int (*shutdown)() = nullptr;
  int (*utilization)(Device, Utilization*) = nullptr;
  std::string driver;

  explicit Nvml(const std::string& bus) {
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    auto init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    auto by_bus = reinterpret_cast<int (*)(const char*, Device*)>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    auto version = reinterpret_cast<int (*)(char*, unsigned)>(dlsym(lib, "nvmlSystemGetDriverVersion"));
    shutdown = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlShutdown"));
    utilization = reinterpret_cast<int (*)(Device, Utilization*)>(dlsym(lib, "nvmlDeviceGetUtilizationRates"));
    if (!init || !by_bus || !shutdown || !utilization || init() != 0) {
      utilization = nullptr;
      shutdown = nullptr;
      return;
    }
    if (by_bus(bus.c_str(), &device) != 0) utilization = nullptr;
    char v[96] = {};
    if (version && version(v, sizeof v) == 0) driver = v;
  }
  ~Nvml() {
    if (shutdown) shutdown();
    if (lib) dlclose(lib);
  }
};

GpuMonitor::GpuMonitor(const DeviceInfo& info) : info_(info), nvml_(std::make_unique<Nvml>(info.pci_bus_id)) {}

GpuMonitor::~GpuMonitor() = default;

std::string GpuMonitor::describe() const {
  std::string driver = nvml_->driver;
  if (driver.empty()) {
    int v = 0;
    if (cudaDriverGetVersion(&v) == cudaSuccess) driver = "CUDA " + std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  }
  int nccl = 0;
  ncclGetVersion(&nccl);
  char line[320];
  std::snprintf(line, sizeof line, "%s, %.1f GiB, sm_%d%d, bus %s, driver %s, NCCL %d.%d.%d", info_.name.c_str(),
                double(info_.memory) / double(1 << 30), info_.cc_major, info_.cc_minor, info_.pci_bus_id.c_str(),
                driver.empty() ? "unknown" : driver.c_str(), nccl / 10000, nccl / 100 % 100, nccl % 100);
  return line;
}

double GpuMonitor::mem_peak_mib() const {
  cudaMemPool_t pool;
  DDP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, info_.index));
  std::uint64_t high = 0;  // cuuint64_t
  DDP_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high));
  return double(high) / double(1 << 20);
}

double GpuMonitor::util_pct() const {
  Nvml::Utilization u{};
  if (!nvml_->utilization || nvml_->utilization(nvml_->device, &u) != 0) return -1;
  return double(u.gpu);
}

}  // namespace ddp::cuda
