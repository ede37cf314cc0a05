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

}  // namespace
}  // namespace ddp::nn
