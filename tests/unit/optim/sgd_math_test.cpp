// The GPU SGD kernel's update (optim/sgd_math.hpp), run on the host over a
// buffer step after step, against sgd_step: every option PyTorch's SGD has.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ddp/optim/sgd.hpp"
#include "ddp/optim/sgd_math.hpp"

namespace ddp::optim {
namespace {

void check_update_follows_sgd_step(SgdOptions o) {
  const size_t n = 7;
  std::vector<float> p(n), g(n);
  for (size_t i = 0; i < n; ++i) p[i] = 0.3f * float(i) - 1.0f;
  std::vector<float> want = p, buf(n, 42.0f);  // buf's first value is never read
  std::vector<float> want_buf(n, 17.0f);
  const SgdScalars s = sgd_scalars(o);
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < n; ++i) g[i] = 0.1f * float(step + 1) * float(i + 1) - 0.35f;
    sgd_step(o, step == 0, n, want.data(), g.data(), o.momentum != 0 ? want_buf.data() : nullptr);
    for (size_t i = 0; i < n; ++i) sgd_update_at(i, s, /*first=*/step == 0, p.data(), g.data(), buf.data());
    for (size_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << "step " << step << " i " << i;
  }
  if (o.momentum != 0) {
    for (size_t i = 0; i < n; ++i) EXPECT_NEAR(buf[i], want_buf[i], 1e-6) << "momentum " << i;
  }
}

TEST(SgdMath, Plain) { check_update_follows_sgd_step({0.2, 0, 0, 0, false}); }
TEST(SgdMath, WeightDecay) { check_update_follows_sgd_step({0.1, 0, 0, 0.01, false}); }
TEST(SgdMath, Momentum) { check_update_follows_sgd_step({0.1, 0.9, 0, 0.001, false}); }
TEST(SgdMath, MomentumDampening) { check_update_follows_sgd_step({0.1, 0.9, 0.3, 0.001, false}); }
TEST(SgdMath, Nesterov) { check_update_follows_sgd_step({0.1, 0.9, 0, 0.0005, true}); }

}  // namespace
}  // namespace ddp::optim
