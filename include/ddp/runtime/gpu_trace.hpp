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

// Whether a CUPTI record's times can be placed: both set, in order. CUPTI
// leaves them 0 where it could not time an activity (its device buffers
// full), and a forced flush may hand over one that has not ended.
bool activity_timed(uint64_t start_ns, uint64_t end_ns);

// Host clock minus another clock, from readings of the host clock taken
// just before and just after each reading of the other: the reading with
// the tightest bracket, the other's taken at its middle. Throws on none.
struct ClockReading {
  int64_t host_before_ns = 0, other_ns = 0, host_after_ns = 0;
};
int64_t clock_offset_ns(const std::vector<ClockReading>& readings);

class GpuTracer {
 public:
  // Starts recording the process's GPU activity; nullptr, with the reason in
  // *why, where CUPTI cannot be loaded, is of another CUDA major version
  // than this program was built with, or refuses. One tracer at a time.
  static std::unique_ptr<GpuTracer> start(std::string* why);
  ~GpuTracer();  // stops recording
  GpuTracer(const GpuTracer&) = delete;
  GpuTracer& operator=(const GpuTracer&) = delete;

  // What was recorded since start(), and what was lost: records CUPTI could
  // not time (left out) and records it dropped (its buffers full).
  struct Recorded {
    std::vector<GpuActivity> activities;
    uint64_t untimed = 0, dropped = 0;
  };
  // Stops recording and returns what was recorded (the caller waits for the
  // device first, so that every activity has ended).
  Recorded stop();

  struct Cupti;

 private:
  explicit GpuTracer(std::unique_ptr<Cupti> cupti);
  std::unique_ptr<Cupti> cupti_;
};

}  // namespace ddp::cuda
