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
