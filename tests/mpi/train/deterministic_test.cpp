// --deterministic with SyncBatchNorm on the replica's step, on real ranks: a
// step that must be redone (its gradients outgrew their exponents) moves
// BatchNorm's running statistics once, as any other step does, and every
// rank ends with the same bits (Note [micro-shards], nn/device.hpp).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.hpp"  // make_mpi_communicator
#include "ddp/core/rng.hpp"
#include "ddp/ddp/exact_sum.hpp"      // kMaxExponent
#include "ddp/nn/graph.hpp"           // GraphBuilder
#include "ddp/nn/model.hpp"           // init_state
#include "ddp/train/optim_config.hpp"
#include "ddp/train/replica.hpp"
#include "../ddp/test_world.hpp"

namespace ddp::train {
namespace {

constexpr int kBatch = 16, kShards = 8;

// conv -> BatchNorm -> relu -> pool -> fc: enough to have running statistics.
nn::Graph small_bn_net() {
  nn::GraphBuilder b("small-bn", {2, 6, 6}, /*pytorch_init=*/true);
  int x = b.relu("relu", b.batch_norm("bn", b.conv("conv", b.input(), 4, 3, 1, 1)));
  return b.finish(b.linear("fc", b.flatten("flat", b.global_avg_pool("gap", x)), 3));
}

// This rank's contiguous part of one global batch.
data::Batch my_part(int rank, int world) {
  const int per = kBatch / world;
  data::Batch b;
  b.size = per;
  for (int i = rank * per; i < (rank + 1) * per; ++i) {
    Rng rng(21, uint64_t(i));
    for (int j = 0; j < 2 * 6 * 6; ++j) b.x.push_back(float(rng.normal()));
    b.y.push_back(int32_t(i % 3));
  }
  return b;
}

// One step from `start` (exponents as given; empty: the defaults); the
// replica's state after it and the steps it redid.
std::pair<TrainState, int64_t> one_step(const World& w, const nn::Graph& g, TrainState start) {
  Config cfg;
  cfg.batch_size = kBatch;
  cfg.deterministic_shards = kShards;
  cfg.sync_bn = true;
  Replica replica(cfg, optimizer_options(cfg), make_cpu_backend(comm::make_mpi_communicator(w), 1), g);
  replica.push(start);
  EXPECT_TRUE(replica.train_step(my_part(w.rank, w.size), 0.1).grads_finite);
  TrainState after;
  replica.pull(after);
  return {after, replica.exact_sum()->redone_steps()};
}

TEST(DeterministicStep, ARedoneStepMovesTheRunningStatisticsOnce) {
  const World w = test::test_world();
  if (kShards % w.size != 0) GTEST_SKIP() << "world size " << w.size << " does not divide " << kShards;
  const nn::Graph g = small_bn_net();
  TrainState start;
  start.model = nn::init_state(g, 4);
  const auto [plain, plain_redos] = one_step(w, g, start);
  ASSERT_EQ(plain_redos, 0) << "the default exponents should fit this step";
  // Exponents so high that every gradient overflows: the step is redone.
  start.grad_exponents.assign(g.params.size(), kMaxExponent);
  const auto [redone, redos] = one_step(w, g, start);
  ASSERT_EQ(redos, 1);
  EXPECT_EQ(redone.model.counters, std::vector<int64_t>{1});
  EXPECT_EQ(redone.model.counters, plain.model.counters);
  EXPECT_EQ(redone.model.buffers, plain.model.buffers);
  EXPECT_NE(redone.model.buffers, start.model.buffers) << "the step should move the running statistics";
  // The same bits on every rank.
  const size_t n = redone.model.params.size();
  std::vector<float> all(n * size_t(w.size));
  MPI_Allgather(redone.model.params.data(), int(n), MPI_FLOAT, all.data(), int(n), MPI_FLOAT, w.comm);
  for (int r = 1; r < w.size; ++r)
    EXPECT_TRUE(std::equal(all.begin() + long(r * n), all.begin() + long((r + 1) * n), all.begin()))
        << "rank " << r << " differs from rank 0";
}

}  // namespace
}  // namespace ddp::train
