// Note [batch norm sums] (nn/cuda/bn_plan.hpp): how a channel's values are
// cut into runs, one GPU block a run.
#include "ddp/nn/cuda/bn_plan.hpp"

#include <gtest/gtest.h>

namespace ddp::nn {
namespace {

// Every value in exactly one run, no run empty, none over per_split.
void expect_covers(const BnSplit& p, int64_t values) {
  ASSERT_GE(p.splits, 1);
  EXPECT_GE(int64_t(p.splits) * p.per_split, values);
  EXPECT_LT(int64_t(p.splits - 1) * p.per_split, values) << "the last run would be empty";
}

TEST(BnPlan, WideLayersFillTheGpu) {
  // ResNet-18's first BatchNorm at batch 256 on 24x24 planes, 132 SMs: 64
  // channels alone would be 64 blocks; cut, they are 8 a SM.
  const int64_t values = 256 * 24 * 24;
  const BnSplit p = plan_bn_split(values, 64, 132);
  expect_covers(p, values);
  EXPECT_EQ(p.splits, max_bn_splits(64, 132));
  EXPECT_GE(int64_t(p.splits) * 64, 8 * 132);
  EXPECT_GE(p.per_split, kBnMinPerSplit);
}

TEST(BnPlan, FewValuesStayInOneBlock) {
  // 512 channels of 3x3 at batch 8: 72 values a channel.
  const BnSplit p = plan_bn_split(72, 512, 132);
  EXPECT_EQ(p.splits, 1);
  EXPECT_EQ(p.per_split, 72);
  EXPECT_EQ(plan_bn_split(kBnMinPerSplit * 3 + 5, 1, 132).splits, 3);
}

TEST(BnPlan, NeverMoreRunsThanAllocatedAndAlwaysCovering) {
  for (int sms : {1, 16, 132})
    for (int c : {1, 3, 64, 512})
      for (int64_t values : {int64_t(1), int64_t(2047), int64_t(2048), int64_t(100000), int64_t(256) * 96 * 96}) {
        SCOPED_TRACE(testing::Message() << sms << " SMs, " << c << " channels, " << values << " values");
        const BnSplit p = plan_bn_split(values, c, sms);
        expect_covers(p, values);
        EXPECT_LE(p.splits, max_bn_splits(c, sms));
      }
  EXPECT_EQ(plan_bn_split(0, 64, 132).splits, 1);
}

}  // namespace
}  // namespace ddp::nn
