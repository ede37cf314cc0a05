// RankUsage (usage.hpp).
#include "ddp/train/usage.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>

namespace ddp::train {

double rss_peak_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;  // Linux: KiB
}

std::vector<RankUsage> gather_usage(comm::Communicator& comm, const RankUsage& mine) {
  const double v[3] = {mine.rss_peak_mib, mine.device.mem_peak_mib, mine.device.util_pct};
  const std::vector<char> all = comm.allgather(v, sizeof v, "every rank's memory use");
  std::vector<RankUsage> out(size_t(comm.size()));
  for (size_t r = 0; r < out.size(); ++r) {
    double w[3];
    std::memcpy(w, all.data() + r * sizeof w, sizeof w);
    out[r].rss_peak_mib = w[0];
    out[r].device = {w[1], w[2]};
  }
  return out;
}

namespace {

// One figure per rank: all of them up to 8 ranks, else the smallest, the
// median and the largest, with their ranks.
template <typename Get>
std::string per_rank(const std::vector<RankUsage>& ranks, Get get) {
  char buf[96];
  std::string s;
  if (ranks.size() <= 8) {
    for (const auto& r : ranks) {
      std::snprintf(buf, sizeof buf, "%s%.0f", s.empty() ? "" : " ", get(r));
      s += buf;
    }
    return s;
  }
  std::vector<size_t> order(ranks.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return get(ranks[a]) < get(ranks[b]); });
  const char* names[3] = {"min", "median", "max"};
  const size_t at[3] = {order.front(), order[order.size() / 2], order.back()};
  for (int i = 0; i < 3; ++i) {
    std::snprintf(buf, sizeof buf, "%s%s %.0f (rank %zu)", i ? ", " : "", names[i], get(ranks[at[i]]), at[i]);
    s += buf;
  }
  return s;
}

}  // namespace

std::string describe_usage(const std::vector<RankUsage>& ranks) {
  std::string s = "peak memory MiB " + per_rank(ranks, [](const RankUsage& r) { return r.rss_peak_mib; });
  const bool gpu = std::any_of(ranks.begin(), ranks.end(), [](const RankUsage& r) { return r.device.mem_peak_mib >= 0; });
  if (gpu) s += "; GPU memory MiB " + per_rank(ranks, [](const RankUsage& r) { return r.device.mem_peak_mib; });
  const bool util = std::any_of(ranks.begin(), ranks.end(), [](const RankUsage& r) { return r.device.util_pct >= 0; });
  if (util) s += "; GPU utilisation % " + per_rank(ranks, [](const RankUsage& r) { return r.device.util_pct; });
  return s;
}

}  // namespace ddp::train
