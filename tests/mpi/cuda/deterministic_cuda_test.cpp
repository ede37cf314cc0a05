// --deterministic on GPUs (Note [fixed-point gradients], deterministic/exact_sum.hpp):
// the CPU's DeterministicStep test (mpi/train/deterministic_test.cpp) with
// GPU replicas. Three steps at this world size (ranks on GPUs of their own
// use NCCL's integer all-reduce, ranks sharing one the staged mpi backend)
// end with the bits of the same steps on rank 0's GPU alone: cuDNN's
// deterministic algorithms on micro-shards of one size, the fixed-point sums
// on the device, SyncBatchNorm's shard sums in global shard order, and
// LeNet's fused conv-relu-pool keeping each micro-shard's conv output.
#include <gtest/gtest.h>

#include "../train/deterministic_runs.hpp"  // small nets, expect_world_matches_one_rank
#include "gpu_test_support.hpp"             // gpu_world, gpu_backend

namespace ddp::train {
namespace {

class GpuDeterministic : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device (" << why << ")";
  }
};

TEST_F(GpuDeterministic, StepsAtThisWorldSizeAreBitwiseThoseOfOneRankAlone) {
  const World w = ddp::test::gpu_world();
  if (test::kShards % w.size != 0) GTEST_SKIP() << "world size " << w.size << " does not divide " << test::kShards;
  for (const nn::Graph& g : {test::small_bn_net(), test::small_lenet()}) {
    SCOPED_TRACE(g.model);
    test::expect_world_matches_one_rank(w, g, ddp::test::gpu_backend);
  }
}

}  // namespace
}  // namespace ddp::train
