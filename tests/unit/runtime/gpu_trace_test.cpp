// --trace's GPU tracks (runtime/gpu_trace.hpp): the kernels' names as the
// trace and its tables show them, which records can be placed, and the
// clocks' offset. Recording itself needs a GPU and CUPTI
// (GpuTraining.TraceHasGpuTracks).
#include "ddp/runtime/gpu_trace.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "ddp/core/error.hpp"  // Error

namespace ddp::cuda {
namespace {

TEST(GpuTraceNames, KernelsAreNamedWithoutTheirParameters) {
  EXPECT_EQ(kernel_display_name("_Z14bn_sums_kernelPKfiiPd"), "bn_sums_kernel");
  // A template's return type goes too; "(anonymous namespace)" stays.
  EXPECT_EQ(kernel_display_name("_ZN3ddp2nn12_GLOBAL__N_114bn_sums_kernelIfEEvPKT_i"),
            "ddp::nn::(anonymous namespace)::bn_sums_kernel<float>");
  EXPECT_EQ(kernel_display_name("_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE"),
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL");
}

TEST(GpuTraceNames, NamesThatDoNotDemangleAreKept) {
  EXPECT_EQ(kernel_display_name("sm90_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw"),
            "sm90_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw");
  EXPECT_EQ(kernel_display_name(""), "kernel");
  EXPECT_EQ(kernel_display_name(nullptr), "kernel");
}

// CUPTI leaves an activity it could not time at 0, and a forced flush may
// hand over one not yet ended: such a record would sit decades before the
// step on the timeline.
TEST(GpuTraceTimes, RecordsWithoutTimesAreNotPlaced) {
  EXPECT_TRUE(activity_timed(1'700'000'000'000'000'000ull, 1'700'000'000'000'005'000ull));
  EXPECT_TRUE(activity_timed(5, 5));
  EXPECT_FALSE(activity_timed(0, 0));
  EXPECT_FALSE(activity_timed(0, 1'700'000'000'000'005'000ull));
  EXPECT_FALSE(activity_timed(1'700'000'000'000'000'000ull, 0));
  EXPECT_FALSE(activity_timed(10, 9));
}

// The reading the host bracketed most tightly decides, the other clock's
// value taken at the bracket's middle: a first reading slowed by start-up
// does not shift every span.
TEST(GpuTraceTimes, ClockOffsetComesFromTheTightestReading) {
  const std::vector<ClockReading> readings = {
      {1'000, 500'000, 90'000},  // 89 us: the other clock starting up
      {100'000, 600'000, 100'400},
      {200'000, 700'050, 200'100},  // the tightest: middle 200'050
      {300'000, 800'000, 300'300},
  };
  EXPECT_EQ(clock_offset_ns(readings), 200'050 - 700'050);
  EXPECT_EQ(clock_offset_ns({{10, 4, 30}}), 20 - 4);
  EXPECT_THROW(clock_offset_ns({}), Error);
}

}  // namespace
}  // namespace ddp::cuda
