// --deterministic on the replica's step, on real ranks: a few steps at this
// world size end with the bits of the same steps on one rank alone, and a
// step that must be redone (its gradients outgrew their exponents) moves
// BatchNorm's running statistics once, as any other step does, every rank
// ending with the same bits (Note [micro-shards], nn/device.hpp).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.hpp"  // make_mpi_communicator
#include "ddp/deterministic/exact_sum.hpp"      // kMaxExponent
#include "deterministic_runs.hpp"     // small nets, run_steps, expect_world_matches_one_rank

namespace ddp::train {
namespace {

using test::kShards;
using test::small_bn_net;

// One step from `start` (exponents as given; empty: the defaults), on one
// thread; the replica's state after it and the steps it redid.
std::pair<TrainState, int64_t> one_step(const World& w, const nn::Graph& g, const TrainState& start) {
  int64_t redone = 0;
  const TrainState after = test::run_steps(
      w, g, start, 1,
      [](const World& world, const Config&) { return make_cpu_backend(comm::make_mpi_communicator(world), 1); },
      &redone);
  return {after, redone};
}

TEST(DeterministicStep, ARedoneStepMovesTheRunningStatisticsOnce) {
  const World w = ddp::test::test_world();
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

// The CPU twin of GpuDeterministic (mpi/cuda/deterministic_cuda_test.cpp):
// three steps at this world size and on rank 0 alone, each rank's replica on
// one thread and on two (Note [lanes], nn/device.hpp).
TEST(DeterministicStep, StepsAtThisWorldSizeAreBitwiseThoseOfOneRankAlone) {
  const World w = ddp::test::test_world();
  if (kShards % w.size != 0) GTEST_SKIP() << "world size " << w.size << " does not divide " << kShards;
  for (int threads : {1, 2}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    const test::MakeBackend cpu = [threads](const World& world, const Config&) {
      return make_cpu_backend(comm::make_mpi_communicator(world), threads);
    };
    for (const nn::Graph& g : {small_bn_net(), test::small_lenet()}) {
      SCOPED_TRACE(g.model);
      test::expect_world_matches_one_rank(w, g, cpu);
    }
  }
}

}  // namespace
}  // namespace ddp::train
