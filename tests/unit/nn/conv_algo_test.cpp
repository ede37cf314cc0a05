// The GPU convolution's algorithm choice (Note [conv algorithms]): cuDNN's
// ranking is kept, deterministic algorithms come first, and the fallback is
// reported as such.
#include <gtest/gtest.h>

#include "ddp/nn/cuda/conv_algo.hpp"

namespace ddp::nn {
namespace {

constexpr ConvAlgoCandidate kFastAtomic{true, false};
constexpr ConvAlgoCandidate kDeterministic{true, true};
constexpr ConvAlgoCandidate kUnusableDeterministic{false, true};
constexpr ConvAlgoCandidate kUnusable{false, false};

TEST(ConvAlgo, DeterministicBeatsAFasterRankedOne) {
  const ConvAlgoChoice c = choose_conv_algo({kFastAtomic, kFastAtomic, kDeterministic, kDeterministic});
  EXPECT_EQ(c.index, 2);
  EXPECT_TRUE(c.deterministic);
}

TEST(ConvAlgo, RankingDecidesAmongDeterministicOnes) {
  const ConvAlgoChoice c = choose_conv_algo({kDeterministic, kDeterministic});
  EXPECT_EQ(c.index, 0);
  EXPECT_TRUE(c.deterministic);
}

TEST(ConvAlgo, UnusableDeterministicOnesAreNotTaken) {
  const ConvAlgoChoice c = choose_conv_algo({kUnusableDeterministic, kFastAtomic, kUnusable, kFastAtomic});
  EXPECT_EQ(c.index, 1);
  EXPECT_FALSE(c.deterministic);
}

TEST(ConvAlgo, NothingUsable) {
  EXPECT_EQ(choose_conv_algo({kUnusable, kUnusableDeterministic}).index, -1);
  EXPECT_EQ(choose_conv_algo({}).index, -1);
}

// Note [measured algorithms]: the fastest usable one, unless a deterministic
// one is within 5% of it; --deterministic: the fastest deterministic one.
TEST(ConvAlgo, TimedFastestUnlessADeterministicOneIsWithinFivePercent) {
  const TimedAlgo fast_atomic{true, false, 1.00f}, det_close{true, true, 1.04f}, det_slow{true, true, 1.30f},
      det_fastest{true, true, 0.90f}, broken_fastest{false, true, 0.10f};
  TimedChoice c = choose_timed_algo({fast_atomic, det_slow}, false);
  EXPECT_EQ(c.index, 0);
  EXPECT_FALSE(c.deterministic);
  c = choose_timed_algo({det_slow, fast_atomic, det_close}, false);
  EXPECT_EQ(c.index, 2);
  EXPECT_TRUE(c.deterministic);
  c = choose_timed_algo({fast_atomic, det_fastest, broken_fastest}, false);
  EXPECT_EQ(c.index, 1);
  EXPECT_TRUE(c.deterministic);
  // Exactly at the bound is within it; just past it is not.
  EXPECT_EQ(choose_timed_algo({fast_atomic, {true, true, 1.05f}}, false).index, 1);
  EXPECT_EQ(choose_timed_algo({fast_atomic, {true, true, 1.0501f}}, false).index, 0);
}

TEST(ConvAlgo, TimedDeterministicOnlyTakesTheFastestDeterministicOne) {
  const TimedAlgo fast_atomic{true, false, 1.0f}, det_slow{true, true, 3.0f}, det_slower{true, true, 4.0f};
  const TimedChoice c = choose_timed_algo({det_slower, fast_atomic, det_slow}, true);
  EXPECT_EQ(c.index, 2);
  EXPECT_TRUE(c.deterministic);
  EXPECT_EQ(choose_timed_algo({fast_atomic, {false, true, 0.5f}}, true).index, -1) << "none deterministic and usable";
  EXPECT_EQ(choose_timed_algo({{false, false, 1.0f}}, false).index, -1);
  EXPECT_EQ(choose_timed_algo({}, false).index, -1);
}

// The cache's key: the same for the same geometry, another for anything that
// changes the convolution's timing.
TEST(ConvAlgo, PlanKeyNamesEverythingTheTimingDependsOn) {
  const Shape in{64, 28, 28};
  const std::string key = conv_plan_key(in, 128, 3, 2, 1, 256, Precision::TF32);
  EXPECT_EQ(key, "64x28x28 -> 128 k3 s2 p1, batch 256, tf32");
  EXPECT_EQ(conv_plan_key(in, 128, 3, 2, 1, 256, Precision::TF32), key);
  for (const std::string& other :
       {conv_plan_key({64, 28, 27}, 128, 3, 2, 1, 256, Precision::TF32),
        conv_plan_key(in, 64, 3, 2, 1, 256, Precision::TF32), conv_plan_key(in, 128, 1, 2, 1, 256, Precision::TF32),
        conv_plan_key(in, 128, 3, 1, 1, 256, Precision::TF32), conv_plan_key(in, 128, 3, 2, 0, 256, Precision::TF32),
        conv_plan_key(in, 128, 3, 2, 1, 255, Precision::TF32), conv_plan_key(in, 128, 3, 2, 1, 256, Precision::F32)})
    EXPECT_NE(other, key);
}

}  // namespace
}  // namespace ddp::nn
