// --precision fp16's loss scaler on CPU ranks (loss_scale_runs.hpp), and what
// the scale is for: small gradients that fp16 alone would lose.
#include <gtest/gtest.h>

#include <vector>

#include "ddp/comm/communicator.hpp"  // make_mpi_communicator
#include "loss_scale_runs.hpp"

namespace ddp::train {
namespace {

using test::loss_scale_batch;

TEST(LossScale, AnOverflowSkipsTheStepOnEveryRankAndHalvesTheScale) {
  test::expect_overflow_skipped_and_halved(ddp::test::test_world(), [](const World& w, const Config&) {
    return make_cpu_backend(comm::make_mpi_communicator(w));
  });
}

// The GPU's flow with --gpu-kernels next (Note [loss scale on the device]),
// on the host: the same skips and halvings.
TEST(LossScale, OnTheDeviceAnOverflowSkipsTheStepOnEveryRankAndHalvesTheScale) {
  test::expect_overflow_skipped_and_halved(ddp::test::test_world(), [](const World& w, const Config&) {
    return make_cpu_backend(comm::make_mpi_communicator(w), 0, /*loss_scale_on_device=*/true);
  });
}

// A state pushed while a step's outcome is still on its way (a step that
// overflowed) stands as pushed: the late outcome belongs to the state it
// replaces, and moves neither the scale nor the optimizer's step count.
TEST(LossScale, OnTheDeviceAPushedStateIsNotMovedByTheStepBeforeIt) {
  const World w = ddp::test::test_world();
  const nn::Graph g = nn::model_graph("lenet", {1, 28, 28}, 10);
  Config cfg = test::fp16_config(w, 0x1p40);  // the first step overflows
  cfg.momentum = 0.9;
  Replica replica(cfg, optimizer_options(cfg),
                  make_cpu_backend(comm::make_mpi_communicator(w), 0, /*loss_scale_on_device=*/true), g);
  TrainState start;
  start.model = nn::init_state(g, 5);
  replica.push(start);
  replica.train_step(loss_scale_batch(w.rank, 0), 0.05);  // skipped: read at the next step
  TrainState resumed;
  resumed.model = nn::init_state(g, 6);
  resumed.loss_scale = 1024.0f;
  resumed.scaler_growth_tracker = 3;
  replica.push(resumed);
  EXPECT_EQ(replica.scaler()->scale(), 1024.0f);
  EXPECT_EQ(replica.scaler()->growth_tracker(), 3);
  EXPECT_EQ(replica.optimizer().steps(), 0);
  const StepHealth h = replica.train_step(loss_scale_batch(w.rank, 1), 0.05);
  EXPECT_FALSE(h.skipped) << "the step before the push was reported after it";
}

// Note [loss scale on the device]: the decisions made on the device and read
// a step late take every step the host's do, bit for bit: parameters,
// AdamW's moments and step count (its bias corrections), the clipping
// norms, the scale and its count, through skips (a scale of 2^26 overflows
// at first) and growth (every 3 good steps), clipped.
TEST(LossScale, DecisionsOnTheDeviceAreTheHostsBitForBit) {
  const World w = ddp::test::test_world();
  const nn::Graph g = nn::model_graph("lenet", {1, 28, 28}, 10);
  Config cfg = test::fp16_config(w, 0x1p26);
  cfg.growth_interval = 3;
  cfg.optimizer = "adamw";
  cfg.clip_grad_norm = 0.1;  // below the norms: every step clips
  TrainState start;
  start.model = nn::init_state(g, 7);
  struct Run {
    TrainState end;
    int64_t skipped = 0;
    double norms = 0;
  };
  auto run = [&](bool on_device) {
    Replica replica(cfg, optimizer_options(cfg), make_cpu_backend(comm::make_mpi_communicator(w), 0, on_device), g);
    replica.push(start);
    Run r;
    for (int step = 0; step < 16; ++step) {
      const StepHealth h = replica.train_step(loss_scale_batch(w.rank, step), 1e-3);
      EXPECT_EQ(h.steps_ago, on_device && step > 0 ? 1 : 0) << "step " << step;
      r.skipped += h.skipped;
    }
    r.skipped += replica.settle().skipped;
    r.norms = replica.take_sums().grad_norm;
    replica.pull(r.end);
    return r;
  };
  const Run host = run(false), device = run(true);
  EXPECT_GE(host.skipped, 3) << "2^26 overflows fp16 for a few halvings";
  EXPECT_LE(host.skipped, 12) << "and then steps fit, and the scale grows";
  EXPECT_EQ(device.skipped, host.skipped);
  EXPECT_EQ(device.norms, host.norms);
  EXPECT_EQ(device.end.model.params, host.end.model.params);
  EXPECT_EQ(device.end.optimizer.step, host.end.optimizer.step);
  EXPECT_EQ(device.end.optimizer.buffers, host.end.optimizer.buffers);
  EXPECT_EQ(device.end.loss_scale, host.end.loss_scale);
  EXPECT_EQ(device.end.scaler_growth_tracker, host.end.scaler_growth_tracker);
}

// Small gradients survive the scale: of the parameters an fp32 step moves,
// fp16 with its default scale leaves far fewer in place (their gradients
// underflowed to zero) than fp16 with a scale of 1.
TEST(LossScale, TheScaleKeepsSmallGradientsThatFp16WouldLose) {
  const World w = ddp::test::test_world();
  const nn::Graph g = nn::model_graph("lenet", {1, 28, 28}, 10);
  TrainState start;
  start.model = nn::init_state(g, 5);
  auto step = [&](const char* precision, double init_scale) {
    Config cfg;
    cfg.batch_size = test::kLossScalePerRank * w.size;
    cfg.precision = precision;
    cfg.init_scale = init_scale;
    Replica replica(cfg, optimizer_options(cfg), make_cpu_backend(comm::make_mpi_communicator(w)), g);
    replica.push(start);
    EXPECT_FALSE(replica.train_step(loss_scale_batch(w.rank, 0), 0.5).skipped) << precision << ", scale " << init_scale;
    TrainState after;
    replica.pull(after);
    return after.model.params;
  };
  const std::vector<float> fp32 = step("fp32", 65536), unscaled = step("fp16", 1), scaled = step("fp16", 65536);
  auto lost = [&](const std::vector<float>& p) {
    size_t n = 0;
    for (size_t i = 0; i < p.size(); ++i) n += fp32[i] != start.model.params[i] && p[i] == start.model.params[i];
    return n;
  };
  EXPECT_GT(lost(unscaled), 1000u) << "LeNet's d2l initialisation has gradients below fp16's range";
  EXPECT_LT(lost(scaled) * 10, lost(unscaled));
}

}  // namespace
}  // namespace ddp::train
