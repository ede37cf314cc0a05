// Units for error messages: a timeout or a failure names how much was being
// moved and how long we waited, in words a user reads at a glance.
#include <cstdio>

#include "ddp/comm/communicator.hpp"

namespace ddp::comm {

std::string format_bytes(size_t bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string format_duration(std::chrono::milliseconds t) {
  const long long ms = t.count();
  char buf[48];
  if (ms < 1000)
    std::snprintf(buf, sizeof buf, "%lld ms", ms);
  else if (ms % 1000 == 0)
    std::snprintf(buf, sizeof buf, "%lld s", ms / 1000);
  else
    std::snprintf(buf, sizeof buf, "%.1f s", double(ms) / 1000);
  return buf;
}

}  // namespace ddp::comm
