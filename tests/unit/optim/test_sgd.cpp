// Optimizer with SGD (update_math.hpp on the CPU kernels) against
// torch.optim.SGD's update written out in double.
#include <gtest/gtest.h>

#include <vector>

#include "ddp/core/error.hpp"
#include "optim_test_util.hpp"

namespace ddp::optim {
namespace {

// Reference: torch.optim.SGD's update written out for one scalar, in double.
struct RefSgd {
  double lr, mu, damp, wd;
  bool nesterov;
  double buf = 0;
  bool started = false;
  double step(double p, double g) {
    double d = g + wd * p;
    if (mu != 0) {
      buf = started ? mu * buf + (1 - damp) * d : d;
      started = true;
      d = nesterov ? d + mu * buf : buf;
    }
    return p - lr * d;
  }
};

void check_against_reference(double lr, Options o) {
  const auto t = test::tensors({{3}});
  test::Rig rig(o, t);
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, g(3);
  std::vector<RefSgd> ref(3, RefSgd{lr, o.momentum, o.dampening, o.weight_decay, o.nesterov});
  std::vector<double> pr(p.begin(), p.end());
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < p.size(); ++i) g[i] = test::grad_at(step, i);
    rig.opt->step(lr, p.data(), g.data());
    for (size_t i = 0; i < p.size(); ++i) pr[i] = ref[i].step(pr[i], g[i]);
  }
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(p[i], pr[i], 1e-5) << i;
  EXPECT_EQ(rig.opt->steps(), 5);
}

Options sgd(double mu, double damp, double wd, bool nesterov) {
  Options o;
  o.momentum = mu;
  o.dampening = damp;
  o.weight_decay = wd;
  o.nesterov = nesterov;
  return o;
}

TEST(Sgd, Plain) { check_against_reference(0.2, sgd(0, 0, 0, false)); }
TEST(Sgd, WeightDecay) { check_against_reference(0.1, sgd(0, 0, 0.01, false)); }
TEST(Sgd, Momentum) { check_against_reference(0.1, sgd(0.9, 0, 0.001, false)); }
TEST(Sgd, MomentumDampening) { check_against_reference(0.1, sgd(0.9, 0.3, 0.001, false)); }
TEST(Sgd, Nesterov) { check_against_reference(0.1, sgd(0.9, 0, 0, true)); }

TEST(Sgd, NesterovWithoutMomentumIsAnError) {
  EXPECT_THROW(test::Rig(sgd(0, 0, 0, true), test::tensors({{1}})), Error);
}

TEST(Sgd, PlainStepIsLrTimesGradient) {
  test::Rig rig(sgd(0, 0, 0, false), test::tensors({{1}}));
  std::vector<float> p = {1.0f}, g = {0.5f};
  rig.opt->step(0.2, p.data(), g.data());
  EXPECT_FLOAT_EQ(p[0], 0.9f);
}

TEST(Sgd, HasNoStateWithoutMomentumAndMomentumBufferWithIt) {
  EXPECT_TRUE(buffer_names(sgd(0, 0, 0.1, false)).empty());
  EXPECT_EQ(buffer_names(sgd(0.9, 0, 0, false)), std::vector<std::string>{"momentum_buffer"});
}

}  // namespace
}  // namespace ddp::optim
