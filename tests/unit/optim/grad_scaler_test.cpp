// GradScaler: torch.amp.GradScaler's update rule (at::_amp_update_scale_),
// step by step, and the checks on its options and on a checkpoint's state.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/rng.hpp"
#include "ddp/nn/device.hpp"
#include "ddp/optim/grad_scaler.hpp"
#include "ddp/optim/kernels.hpp"
#include "ddp/optim/optimizer.hpp"

namespace ddp::optim {
namespace {

ScalerOptions options(double init, int64_t interval) {
  ScalerOptions o;
  o.init_scale = init;
  o.growth_interval = interval;
  return o;
}

TEST(GradScaler, HalvesOnAnOverflowAndDoublesAfterTheIntervalOfGoodSteps) {
  GradScaler s(options(8, 3));
  EXPECT_EQ(s.scale(), 8.0f);
  // (found_inf, scale after, good steps counted after), as PyTorch moves them.
  const struct {
    bool inf;
    float scale;
    int64_t tracker;
  } steps[] = {{false, 8, 1}, {false, 8, 2}, {true, 4, 0},  {false, 4, 1}, {false, 4, 2},
               {false, 8, 0}, {false, 8, 1}, {true, 4, 0},  {true, 2, 0},  {false, 2, 1}};
  int i = 0;
  for (const auto& st : steps) {
    s.update(st.inf);
    EXPECT_EQ(s.scale(), st.scale) << "after update " << i;
    EXPECT_EQ(s.growth_tracker(), st.tracker) << "after update " << i;
    ++i;
  }
}

TEST(GradScaler, DefaultsArePyTorchs) {
  const GradScaler s{ScalerOptions{}};
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.options().growth_interval, 2000);
  EXPECT_EQ(s.options().growth_factor, 2.0);
  EXPECT_EQ(s.options().backoff_factor, 0.5);
}

TEST(GradScaler, GrowthStopsWhereTheScaleWouldNoLongerBeFinite) {
  GradScaler s(options(0x1p127, 1));
  s.update(false);
  EXPECT_EQ(s.scale(), 0x1p127f);
  EXPECT_EQ(s.growth_tracker(), 0);
  s.update(true);
  EXPECT_EQ(s.scale(), 0x1p126f);
}

TEST(GradScaler, RefusesOptionsAndStatesOutOfRange) {
  EXPECT_THROW(GradScaler(options(0, 10)), Error);
  EXPECT_THROW(GradScaler(options(1e39, 10)), Error);  // not a float
  EXPECT_THROW(GradScaler(options(NAN, 10)), Error);
  EXPECT_THROW(GradScaler(options(1, 0)), Error);
  ScalerOptions bad_backoff;
  bad_backoff.backoff_factor = 1;
  EXPECT_THROW(GradScaler{bad_backoff}, Error);
  GradScaler s(options(1024, 10));
  EXPECT_THROW(s.set_state(0.0f, 0), Error);
  EXPECT_THROW(s.set_state(INFINITY, 0), Error);
  EXPECT_THROW(s.set_state(2.0f, 10), Error);  // as many good steps as the interval: it would have grown
  EXPECT_THROW(s.set_state(2.0f, -1), Error);
  s.set_state(2.0f, 9);
  EXPECT_EQ(s.scale(), 2.0f);
  s.update(false);
  EXPECT_EQ(s.scale(), 4.0f);
}

// GradScaler's unscale inside the optimizer's step: gradients scaled by a
// power of two and unscaled give the very step (and clipping norm) of the
// gradients themselves.
TEST(Unscale, AStepOnScaledGradientsIsTheStepOnTheGradients) {
  const size_t n = 300;
  nn::TensorInfo t;
  t.name = "w";
  t.shape = {int64_t(n)};
  t.numel = n;
  Options o;
  o.kind = Kind::AdamW;
  o.weight_decay = 0.01;
  o.max_grad_norm = 0.05;  // below the norm: every step clips
  auto dev = nn::make_cpu_device(1);
  auto ka = make_cpu_kernels(), kb = make_cpu_kernels();
  Optimizer a(o, {t}, *dev, *ka), b(o, {t}, *dev, *kb);
  std::vector<float> pa(n, 0.5f), pb(n, 0.5f), g(n), scaled(n);
  Rng rng(7, 1);
  for (int step = 0; step < 4; ++step) {
    for (size_t i = 0; i < n; ++i) {
      g[i] = float(rng.normal()) * 1e-3f;
      scaled[i] = g[i] * 1024.0f;
    }
    a.step(1e-2, pa.data(), g.data());
    b.step(1e-2, pb.data(), scaled.data(), 1.0f / 1024.0f);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(pa[i], pb[i]) << "step " << step << ", element " << i;
  }
  EXPECT_NE(pa[0], 0.5f);
  EXPECT_EQ(a.take_norm_sum(), b.take_norm_sum());
}

// found_inf: the kernels' flag says whether any value is a NaN or an
// infinity, wherever it sits (the CPU's check reads blocks of 1024 values).
TEST(NonFinite, TheFlagSeesANanOrAnInfinityAnywhere) {
  auto k = make_cpu_kernels();
  const size_t n = 5000;
  std::vector<float> g(n, 1.5f);
  g[17] = 0x1p127f;  // large, finite
  g[18] = -0.0f;
  EXPECT_EQ(*k->non_finite(g.data(), n), 0u);
  EXPECT_EQ(*k->non_finite(g.data(), 0), 0u);
  for (size_t at : {size_t(0), size_t(1023), size_t(1024), n - 1})
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      std::vector<float> h = g;
      h[at] = bad;
      EXPECT_NE(*k->non_finite(h.data(), n), 0u) << bad << " at " << at;
      EXPECT_EQ(*k->non_finite(h.data(), at), 0u) << "the values before " << at;
    }
}

}  // namespace
}  // namespace ddp::optim
