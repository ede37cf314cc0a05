// --precision fp16's loss scaler on the replica's step (optim/grad_scaler.hpp):
// a scale that overflows fp16 skips the step on every rank alike, leaving the
// parameters and the optimizer as they were, and halves the scale until the
// steps fit; then they move the parameters, the same bits on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "ddp/comm/communicator.hpp"  // make_mpi_communicator
#include "ddp/core/rng.hpp"
#include "ddp/nn/graph.hpp"           // model_graph
#include "ddp/nn/model.hpp"           // init_state
#include "ddp/train/optim_config.hpp"
#include "ddp/train/replica.hpp"
#include "../ddp/test_world.hpp"

namespace ddp::train {
namespace {

constexpr int kPerRank = 8;

data::Batch batch_of(int rank, int step) {
  data::Batch b;
  b.size = kPerRank;
  Rng rng(13 + uint64_t(step), uint64_t(rank));
  b.x.resize(size_t(kPerRank) * 28 * 28);
  for (float& v : b.x) v = rng.uniform();
  for (int i = 0; i < kPerRank; ++i) b.y.push_back(int32_t(rng.below(10)));
  return b;
}

// Every rank's copy of v, each checked against rank 0's.
void expect_same_on_every_rank(const World& w, const std::vector<float>& v, const char* what) {
  std::vector<float> all(v.size() * size_t(w.size));
  MPI_Allgather(v.data(), int(v.size()), MPI_FLOAT, all.data(), int(v.size()), MPI_FLOAT, w.comm);
  for (int r = 1; r < w.size; ++r)
    for (size_t i = 0; i < v.size(); ++i)
      ASSERT_EQ(all[size_t(r) * v.size() + i], all[i]) << what << ": rank " << r << " differs at " << i;
}

TEST(LossScale, AnOverflowSkipsTheStepOnEveryRankAndHalvesTheScale) {
  const World w = test::test_world();
  Config cfg;
  cfg.batch_size = kPerRank * w.size;
  cfg.precision = "fp16";
  cfg.init_scale = 0x1p40;  // d(loss) * 2^40 is far past fp16's 65504
  cfg.growth_interval = 1000;
  cfg.momentum = 0.9;
  const nn::Graph g = nn::model_graph("lenet", {1, 28, 28}, 10);
  TrainState start;
  start.model = nn::init_state(g, 5);
  Replica replica(cfg, optimizer_options(cfg), make_cpu_backend(comm::make_mpi_communicator(w)), g);
  replica.push(start);
  float scale = 0x1p40f;
  int step = 0, skipped = 0;
  for (;; ++step) {
    ASSERT_LT(step, 60) << "the scale never came down to one that fits";
    const StepHealth h = replica.train_step(batch_of(w.rank, step), 0.05);
    std::vector<float> flags = {h.skipped ? 1.0f : 0.0f, replica.scaler()->scale()};
    expect_same_on_every_rank(w, flags, "skipped, and the scale after");
    if (!h.skipped) break;
    ++skipped;
    scale /= 2;
    EXPECT_FALSE(h.grads_finite);
    EXPECT_EQ(replica.scaler()->scale(), scale) << "step " << step;
    EXPECT_EQ(replica.optimizer().steps(), 0) << "a skipped step is no optimizer step";
    TrainState now;
    replica.pull(now);
    ASSERT_EQ(now.model.params, start.model.params) << "skipped step " << step << " moved the parameters";
  }
  EXPECT_GE(skipped, 10) << "2^40 should overflow for many halvings";
  EXPECT_EQ(replica.scaler()->scale(), scale) << "a good step keeps the scale";
  EXPECT_EQ(replica.scaler()->growth_tracker(), 1);
  EXPECT_EQ(replica.optimizer().steps(), 1);
  TrainState after;
  replica.pull(after);
  EXPECT_NE(after.model.params, start.model.params) << "the first good step should move the parameters";
  expect_same_on_every_rank(w, after.model.params, "parameters after the first good step");
  EXPECT_EQ(after.loss_scale, scale);
  EXPECT_EQ(after.scaler_growth_tracker, 1);
}

// Small gradients survive the scale: of the parameters an fp32 step moves,
// fp16 with its default scale leaves far fewer in place (their gradients
// underflowed to zero) than fp16 with a scale of 1.
TEST(LossScale, TheScaleKeepsSmallGradientsThatFp16WouldLose) {
  const World w = test::test_world();
  const nn::Graph g = nn::model_graph("lenet", {1, 28, 28}, 10);
  TrainState start;
  start.model = nn::init_state(g, 5);
  auto step = [&](const char* precision, double init_scale) {
    Config cfg;
    cfg.batch_size = kPerRank * w.size;
    cfg.precision = precision;
    cfg.init_scale = init_scale;
    Replica replica(cfg, optimizer_options(cfg), make_cpu_backend(comm::make_mpi_communicator(w)), g);
    replica.push(start);
    EXPECT_FALSE(replica.train_step(batch_of(w.rank, 0), 0.5).skipped) << precision << ", scale " << init_scale;
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
