// kernel_display_name, activity_timed and clock_offset_ns
// (runtime/gpu_trace.hpp): host code, so that it is tested on machines
// without a GPU.
#include <cxxabi.h>

#include <cstdlib>
#include <string>

#include "ddp/core/error.hpp"  // DDP_CHECK
#include "ddp/runtime/gpu_trace.hpp"

namespace ddp::cuda {

std::string kernel_display_name(const char* mangled) {
  if (!mangled || !*mangled) return "kernel";
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  // The parameter list: the parenthesis that closes the name (before any
  // " const") and the one that opens it, matched backwards, so that
  // "(anonymous namespace)" in the name stays.
  size_t close = name.size();
  while (close > 0 && name[close - 1] != ')') --close;
  if (close > 0 && name.find_first_not_of(" const", close) == std::string::npos) {
    int depth = 0;
    for (size_t i = close; i-- > 0;) {
      if (name[i] == ')') ++depth;
      if (name[i] == '(' && --depth == 0) {
        if (i > 0) name.resize(i);
        break;
      }
    }
  }
  // A template function's demangled name starts with its return type.
  if (name.compare(0, 5, "void ") == 0) name.erase(0, 5);
  return name;
}

bool activity_timed(uint64_t start_ns, uint64_t end_ns) { return start_ns > 0 && end_ns >= start_ns; }

int64_t clock_offset_ns(const std::vector<ClockReading>& readings) {
  DDP_CHECK(!readings.empty(), "no clock readings");
  const ClockReading* best = &readings.front();
  for (const ClockReading& r : readings)
    if (r.host_after_ns - r.host_before_ns < best->host_after_ns - best->host_before_ns) best = &r;
  return best->host_before_ns + (best->host_after_ns - best->host_before_ns) / 2 - best->other_ns;
}

}  // namespace ddp::cuda
