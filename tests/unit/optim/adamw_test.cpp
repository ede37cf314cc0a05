// Optimizer with AdamW against torch.optim.AdamW's formulas (amsgrad off)
// written out in double; parameter groups, clipping and the state a
// checkpoint keeps.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/optim/update_math.hpp"  // clip_coefficient
#include "optim_test_util.hpp"

namespace ddp::optim {
namespace {

// torch.optim.AdamW for one scalar (its documented algorithm), in double.
struct RefAdamW {
  double lr, b1, b2, eps, wd;
  double m = 0, v = 0;
  int t = 0;
  double step(double p, double g, double step_lr) {
    ++t;
    p *= 1 - step_lr * wd;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double mhat = m / (1 - std::pow(b1, t)), vhat = v / (1 - std::pow(b2, t));
    return p - step_lr * mhat / (std::sqrt(vhat) + eps);
  }
};

Options adamw(double wd, double b1 = 0.9, double b2 = 0.999, double eps = 1e-8) {
  Options o;
  o.kind = Kind::AdamW;
  o.weight_decay = wd;
  o.beta1 = b1;
  o.beta2 = b2;
  o.eps = eps;
  return o;
}

// Five steps, each at its own rate, against the reference.
void check_against_reference(const Options& o) {
  const size_t n = 7;
  test::Rig rig(o, test::tensors({{int64_t(n)}}));
  std::vector<float> p(n), g(n);
  for (size_t i = 0; i < n; ++i) p[i] = 0.3f * float(i) - 1.0f;
  std::vector<double> pr(p.begin(), p.end());
  std::vector<RefAdamW> ref(n, RefAdamW{0, o.beta1, o.beta2, o.eps, o.weight_decay});
  for (int step = 0; step < 5; ++step) {
    const double lr = 0.01 * (step + 1);
    for (size_t i = 0; i < n; ++i) g[i] = test::grad_at(step, i);
    rig.opt->step(lr, p.data(), g.data());
    for (size_t i = 0; i < n; ++i) pr[i] = ref[i].step(pr[i], g[i], lr);
    for (size_t i = 0; i < n; ++i)
      EXPECT_NEAR(p[i], pr[i], 2e-6 * (1 + std::abs(pr[i]))) << "step " << step + 1 << " element " << i;
  }
}

TEST(AdamW, MatchesPyTorchsFormulas) { check_against_reference(adamw(0)); }
TEST(AdamW, MatchesPyTorchsFormulasWithWeightDecay) { check_against_reference(adamw(0.1)); }
TEST(AdamW, MatchesPyTorchsFormulasWithOtherBetasAndEps) { check_against_reference(adamw(0.01, 0.3, 0.9, 1e-3)); }

TEST(AdamW, FirstStepMovesEachParameterByLrTimesTheSignOfItsGradient) {
  // With bias correction, step 1 is lr * g / (|g| + eps): the classic check
  // that the correction is there.
  test::Rig rig(adamw(0), test::tensors({{2}}));
  std::vector<float> p = {1.0f, 1.0f}, g = {0.5f, -2.0f};
  rig.opt->step(0.01, p.data(), g.data());
  EXPECT_NEAR(p[0], 0.99f, 1e-6);
  EXPECT_NEAR(p[1], 1.01f, 1e-6);
}

TEST(AdamW, NoDecayNormBiasKeepsDecayOffOneDimensionalParameters) {
  // A weight [2, 2], a bias [2], another weight [2, 1]: only the bias is
  // exempt. With zero gradients AdamW's update is the decay alone.
  Options o = adamw(0.5);
  o.no_decay_norm_bias = true;
  test::Rig rig(o, test::tensors({{2, 2}, {2}, {2, 1}}));
  std::vector<float> p(8, 1.0f), g(8, 0.0f);
  rig.opt->step(0.1, p.data(), g.data());
  for (size_t i : {0, 1, 2, 3, 6, 7}) EXPECT_FLOAT_EQ(p[i], 0.95f) << i;
  for (size_t i : {4, 5}) EXPECT_FLOAT_EQ(p[i], 1.0f) << i;
}

TEST(AdamW, WithoutNoDecayNormBiasEveryParameterDecays) {
  test::Rig rig(adamw(0.5), test::tensors({{2, 2}, {2}}));
  std::vector<float> p(6, 1.0f), g(6, 0.0f);
  rig.opt->step(0.1, p.data(), g.data());
  for (size_t i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(p[i], 0.95f) << i;
}

TEST(AdamW, StateRoundTripContinuesBitwise) {
  const auto t = test::tensors({{3, 2}, {2}});
  const size_t n = 8;
  auto run = [&](int steps, std::vector<float>& p, test::Rig& rig) {
    std::vector<float> g(n);
    for (int s = 0; s < steps; ++s) {
      for (size_t i = 0; i < n; ++i) g[i] = test::grad_at(int(rig.opt->steps()), i);
      rig.opt->step(0.01, p.data(), g.data());
    }
  };
  std::vector<float> whole(n, 0.5f), parted(n, 0.5f);
  test::Rig a(adamw(0.01), t);
  run(6, whole, a);
  test::Rig b(adamw(0.01), t);
  run(3, parted, b);
  State s;
  b.opt->get_state(s);
  ASSERT_EQ(s.step, 3);
  ASSERT_EQ(s.buffers.size(), 2u);
  EXPECT_EQ(s.buffers[0].first, "exp_avg");
  EXPECT_EQ(s.buffers[1].first, "exp_avg_sq");
  test::Rig c(adamw(0.01), t);
  c.opt->set_state(s);
  run(3, parted, c);
  EXPECT_EQ(whole, parted);
}

TEST(AdamW, StateOfAnotherShapeIsRefused) {
  test::Rig rig(adamw(0.01), test::tensors({{4}}));
  State s;
  s.step = 2;
  s.buffers = {{"exp_avg", std::vector<float>(4)}};
  EXPECT_THROW(rig.opt->set_state(s), Error);
  s.buffers = {{"exp_avg", std::vector<float>(4)}, {"exp_avg_sq", std::vector<float>(3)}};
  EXPECT_THROW(rig.opt->set_state(s), Error);
}

// torch.nn.utils.clip_grad_norm_ then the step: the gradient is scaled by
// max_norm / (norm + 1e-6) when the norm is larger, left alone otherwise.
TEST(Clip, ScalesTheGradientByPyTorchsFactorAndReportsTheNormBeforeClipping) {
  Options o;  // plain SGD: p -= lr * g, so p shows the clipped gradient
  o.max_grad_norm = 0.5;
  test::Rig rig(o, test::tensors({{2}, {2}}));
  std::vector<float> p(4, 0.0f), g = {3.0f, 0.0f, 0.0f, 4.0f};  // norm 5
  rig.opt->step(1.0, p.data(), g.data());
  const double coef = 0.5 / (5.0 + 1e-6);
  EXPECT_NEAR(p[0], -3.0 * coef, 1e-7);
  EXPECT_NEAR(p[3], -4.0 * coef, 1e-7);
  EXPECT_NEAR(rig.opt->take_norm_sum(), 5.0, 1e-12);
  EXPECT_EQ(rig.opt->take_norm_sum(), 0.0);  // taken
  std::vector<float> small = {0.1f, 0.0f, 0.0f, 0.0f};
  std::fill(p.begin(), p.end(), 0.0f);
  rig.opt->step(1.0, p.data(), small.data());
  EXPECT_EQ(p[0], -0.1f);  // below the threshold: untouched, bit for bit
}

// A NaN in the gradients makes the norm NaN, and PyTorch's factor NaN: every
// parameter becomes NaN, not just the NaN's own with the rest unclipped.
TEST(Clip, ANaNNormMakesEveryGradientNaNAsPyTorchDoes) {
  Options o;
  o.max_grad_norm = 0.5;
  test::Rig rig(o, test::tensors({{2}, {2}}));
  std::vector<float> p(4, 0.0f), g = {std::nanf(""), 0.0f, 0.0f, 4.0f};
  rig.opt->step(1.0, p.data(), g.data());
  for (float v : p) EXPECT_TRUE(std::isnan(v)) << v;
  EXPECT_TRUE(std::isnan(clip_coefficient(0.5f, std::nan(""))));
  EXPECT_EQ(clip_coefficient(0.5f, 0.0), 1.0f);
}

TEST(Clip, IsOffWithoutMaxNorm) {
  test::Rig rig(Options{}, test::tensors({{1}}));
  std::vector<float> p = {0.0f}, g = {100.0f};
  rig.opt->step(1.0, p.data(), g.data());
  EXPECT_EQ(p[0], -100.0f);
  EXPECT_EQ(rig.opt->take_norm_sum(), 0.0);
}

}  // namespace
}  // namespace ddp::optim
