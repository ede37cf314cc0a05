// Trace (core/trace.hpp): host spans only inside the window; the device's
// spans (which arrive after it) whenever they are given, on a track per
// GPU stream.
#include "ddp/core/trace.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace ddp {
namespace {

using std::chrono::microseconds;

TEST(Trace, DeviceSpansLandOnAGpuStreamTrackWhateverTheWindow) {
  const auto origin = Trace::Clock::now();
  Trace t(3, "node7", 2, 2, origin);
  t.begin_step(1);  // before the window: host spans are dropped
  t.span(Trace::kStep, "forward", "forward", origin, origin + microseconds(5));
  EXPECT_EQ(t.events(), 0u);
  t.begin_step(2);
  t.span(Trace::kStep, "forward", "forward", origin + microseconds(10), origin + microseconds(20));
  t.begin_step(3);  // after it: the device's records arrive now
  t.device_span(7, "gpu kernel", "bn_sums_kernel", origin + microseconds(12), origin + microseconds(15),
                {{"bytes", 0}});
  t.device_span(13, "gpu memcpy", "memcpy HtoD", origin + microseconds(11), origin + microseconds(12),
                {{"bytes", 4096}});
  EXPECT_EQ(t.events(), 3u);

  const auto j = nlohmann::json::parse(t.json());
  std::map<int, std::string> tracks;
  int kernels = 0;
  for (const auto& e : j.at("traceEvents")) {
    if (e["name"] == "thread_name") tracks[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
    if (e.value("cat", "") == "gpu kernel") {
      ++kernels;
      EXPECT_EQ(e["name"], "bn_sums_kernel");
      EXPECT_EQ(e["tid"].get<int>(), Trace::kFirstGpuStream + 7);
      EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 12.0);
      EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 3.0);
      EXPECT_EQ(e["pid"].get<int>(), 3);
    }
  }
  EXPECT_EQ(kernels, 1);
  EXPECT_EQ(tracks[Trace::kStep], "step");
  EXPECT_EQ(tracks[Trace::kFirstGpuStream + 7], "GPU stream 7");
  EXPECT_EQ(tracks[Trace::kFirstGpuStream + 13], "GPU stream 13");
}

}  // namespace
}  // namespace ddp
