#include <gtest/gtest.h>

#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/optim/sgd.hpp"

namespace ddp::optim {
namespace {

// Reference: torch.optim.SGD's update written out for one scalar, in double.
struct RefSgd {
  double lr, mu, wd;
  bool nesterov;
  double buf = 0;
  bool started = false;
  double step(double p, double g) {
    double d = g + wd * p;
    if (mu != 0) {
      buf = started ? mu * buf + d : d;
      started = true;
      d = nesterov ? d + mu * buf : buf;
    }
    return p - lr * d;
  }
};

void check_against_reference(SgdOptions o) {
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, g(3), buf(3);
  std::vector<RefSgd> ref(3, RefSgd{o.lr, o.momentum, o.weight_decay, o.nesterov});
  std::vector<double> pr(p.begin(), p.end());
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < p.size(); ++i) g[i] = 0.1f * float(step + 1) * float(i + 1) - 0.2f;
    sgd_step(o, step == 0, p.size(), p.data(), g.data(), o.momentum != 0 ? buf.data() : nullptr);
    for (size_t i = 0; i < p.size(); ++i) pr[i] = ref[i].step(pr[i], g[i]);
  }
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(p[i], pr[i], 1e-5) << i;
}

TEST(Sgd, Plain) { check_against_reference({0.2, 0, 0, 0, false}); }
TEST(Sgd, WeightDecay) { check_against_reference({0.1, 0, 0, 0.01, false}); }
TEST(Sgd, Momentum) { check_against_reference({0.1, 0.9, 0, 0.001, false}); }
TEST(Sgd, Nesterov) { check_against_reference({0.1, 0.9, 0, 0, true}); }

TEST(Sgd, MomentumWithoutItsBufferIsAnError) {
  std::vector<float> p = {1.0f}, g = {0.5f};
  EXPECT_THROW(sgd_step({0.1, 0.9, 0, 0, false}, true, 1, p.data(), g.data(), nullptr), Error);
}

TEST(Sgd, PlainStepIsLrTimesGradient) {
  std::vector<float> p = {1.0f}, g = {0.5f};
  sgd_step({0.2, 0, 0, 0, false}, true, 1, p.data(), g.data(), nullptr);
  EXPECT_FLOAT_EQ(p[0], 0.9f);
}

}  // namespace
}  // namespace ddp::optim
