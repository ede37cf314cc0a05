// LrSchedule (lr_schedule.hpp) at chosen steps of each schedule; the Python
// test (tests/python/optim_torch_test.sh) checks every step against
// PyTorch's scheduler classes.
#include <gtest/gtest.h>

#include <cmath>

#include "ddp/core/error.hpp"
#include "ddp/optim/lr_schedule.hpp"

namespace ddp::optim {
namespace {

LrSchedule make(const std::string& kind, int64_t warmup = 0) {
  LrSchedule s;
  s.kind = kind;
  s.base = 0.4;
  s.warmup_steps = warmup;
  s.step_size = 3;
  s.gamma = 0.5;
  s.lr_min = 0.1;
  s.total_steps = 13;
  return s;
}

TEST(LrSchedule, ConstantIsTheBaseRate) {
  for (int64_t t : {0, 5, 1000}) EXPECT_EQ(make("constant").at(t), 0.4);
}

TEST(LrSchedule, WarmupRisesLinearlyToTheBaseRate) {
  const LrSchedule s = make("constant", 3);
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(1), 0.2);
  EXPECT_DOUBLE_EQ(s.at(2), 0.3);
  EXPECT_DOUBLE_EQ(s.at(3), 0.4);
}

TEST(LrSchedule, StepHalvesEveryStepSizeSteps) {
  const LrSchedule s = make("step");
  EXPECT_DOUBLE_EQ(s.at(2), 0.4);
  EXPECT_DOUBLE_EQ(s.at(3), 0.2);
  EXPECT_DOUBLE_EQ(s.at(6), 0.1);
  const LrSchedule w = make("step", 2);  // counted from the warm-up's end
  EXPECT_DOUBLE_EQ(w.at(4), 0.4);
  EXPECT_DOUBLE_EQ(w.at(5), 0.2);
}

TEST(LrSchedule, CosineGoesFromTheBaseRateTowardsLrMin) {
  const LrSchedule s = make("cosine", 3);  // 10 cosine steps
  EXPECT_DOUBLE_EQ(s.at(3), 0.4);
  EXPECT_NEAR(s.at(8), 0.25, 1e-15);  // half way
  EXPECT_NEAR(s.at(13), 0.1, 1e-15);  // T_max: lr_min
  for (int64_t t = 3; t < 12; ++t) EXPECT_GT(s.at(t), s.at(t + 1)) << t;
}

TEST(LrSchedule, RefusesWhatCannotRun) {
  LrSchedule s = make("cosine", 13);
  EXPECT_THROW(validate(s), Error);  // no steps left after the warm-up
  s = make("step");
  s.step_size = 0;
  EXPECT_THROW(validate(s), Error);
  s = make("linear");
  EXPECT_THROW(validate(s), Error);
  EXPECT_NO_THROW(validate(make("cosine", 12)));
}

TEST(LrSchedule, DescribesItself) {
  EXPECT_EQ(make("cosine", 3).describe(), "cosine from 0.4 to 0.1 at step 13 after 3 linear warm-up steps");
}

}  // namespace
}  // namespace ddp::optim
