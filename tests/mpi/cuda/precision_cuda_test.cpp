// --precision fp16's loss scaler on GPU ranks (loss_scale_runs.hpp): the
// 16-bit kernels (Note [half kernels]) overflow under a scale of 2^40, and
// the step is skipped on every rank, the scale halved, until a step fits.
// Ranks share the node's GPUs through the staged mpi backend (NCCL where
// each has its own).
#include <gtest/gtest.h>

#include "../train/loss_scale_runs.hpp"  // expect_overflow_skipped_and_halved
#include "gpu_test_support.hpp"           // gpu_world, gpu_backend

namespace ddp::train {
namespace {

TEST(GpuLossScale, AnOverflowSkipsTheStepOnEveryRankAndHalvesTheScale) {
  std::string why;
  if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device (" << why << ")";
  test::expect_overflow_skipped_and_halved(ddp::test::gpu_world(), ddp::test::gpu_backend);
}

// With --gpu-kernels next the decisions are the device's (Note [loss scale
// on the device]): the same skips and halvings.
TEST(GpuLossScale, OnTheDeviceAnOverflowSkipsTheStepOnEveryRankAndHalvesTheScale) {
  std::string why;
  if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device (" << why << ")";
  test::expect_overflow_skipped_and_halved(ddp::test::gpu_world(), [](const World& w, const Config& cfg) {
    Config next = cfg;
    next.gpu_kernels = "next";
    return ddp::test::gpu_backend(w, next);
  });
}

}  // namespace
}  // namespace ddp::train
