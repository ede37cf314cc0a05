// ddp::cuda::GpuTracer: --trace's GPU tracks. What the device itself ran
// (kernels, copies, memsets, NCCL's kernels among them) as CUPTI's activity
// API records it, with its times on the host's steady clock so that the
// spans line up with the host's. CUPTI is loaded at run time (dlopen), so a
// machine without it still starts ddp_train and only the GPU tracks are
// missing (said once, with the reason).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ddp::cuda {

struct GpuActivity {
  enum class Kind { kKernel, kMemcpy, kMemset };
  Kind kind = Kind::kKernel;
  std::string name;  // a kernel's demangled name without its parameters; "memcpy HtoD", "memset"
  uint32_t stream = 0;
  int64_t start_ns = 0, end_ns = 0;  // std::chrono::steady_clock's nanoseconds since its epoch
  uint64_t bytes = 0;                // copies and memsets
};

// A kernel's name as a table of kernels wants it: demangled, without its
// parameter list and return type ("void ns::k<float>(const float*, int)" ->
// "ns::k<float>"); a name that does not demangle is kept as it is.
std::string kernel_display_name(const char* mangled);

class GpuTracer {
 public:
  // Starts recording the process's GPU activity; nullptr, with the reason in
  // *why, where CUPTI cannot be loaded, is of another CUDA major version
  // than this program was built with, or refuses. One tracer at a time.
  static std::unique_ptr<GpuTracer> start(std::string* why);
  ~GpuTracer();  // stops recording
  GpuTracer(const GpuTracer&) = delete;
  GpuTracer& operator=(const GpuTracer&) = delete;

  // Stops recording and returns what was recorded since start() (the caller
  // waits for the device first, so that every activity has ended).
  std::vector<GpuActivity> stop();

  struct Cupti;

 private:
  explicit GpuTracer(std::unique_ptr<Cupti> cupti);
  std::unique_ptr<Cupti> cupti_;
};

}  // namespace ddp::cuda
