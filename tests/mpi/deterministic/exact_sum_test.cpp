// --deterministic's sum on real ranks: every rank gets, to the bit, what one
// rank gets from all the micro-shards (deterministic/exact_sum.hpp).
#include <mpi.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/core/rng.hpp"
#include "ddp/deterministic/exact_sum.hpp"
#include "../../unit/deterministic/add_shard.hpp"
#include "../test_world.hpp"

namespace ddp {
namespace {

using test::test_world;

std::vector<float> shard_grads(int step, int shard, size_t n) {
  Rng rng(uint64_t(step) + 7, uint64_t(shard));
  std::vector<float> g(n);
  // Step 2 grows 1000-fold past step 1's exponents: a redo on every rank.
  const double scale = step == 2 ? 300.0 : 0.03;
  for (auto& v : g) v = float(rng.normal() * scale);
  return g;
}

TEST(ExactSum, Int64AllReduceIsExactNearTheTopOfTheRange) {
  auto comm = comm::make_mpi_communicator(test_world());
  std::vector<int64_t> v = {(int64_t(1) << 58) + comm->rank(), -(int64_t(1) << 57) - 1, int64_t(comm->rank())};
  comm->allreduce_int64(v.data(), v.size(), "test int64 sum");
  const int64_t w = comm->size();
  EXPECT_EQ(v[0], w * (int64_t(1) << 58) + w * (w - 1) / 2);
  EXPECT_EQ(v[1], -w * ((int64_t(1) << 57) + 1));
  EXPECT_EQ(v[2], w * (w - 1) / 2);
}

TEST(ExactSum, EveryRankGetsTheSameBitsAsOneRankSummingEveryShard) {
  const int world = test_world().size;
  const int k = 16;
  if (k % world != 0) GTEST_SKIP() << "world size " << world << " does not divide " << k;
  const std::vector<size_t> numels = {513, 9, 2048};
  const size_t n = 2570;
  auto comm = comm::make_mpi_communicator(test_world());
  auto self = comm::make_mpi_communicator(test_world(MPI_COMM_SELF));
  HostExactGradientSum mine(numels, k), alone(numels, k);
  std::vector<float> got(n), want(n);
  const int per = k / world, first = comm->rank() * per;
  int redos = 0;
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    ExactGradientSum::Result r, r1;
    do {
      mine.begin_step();
      for (int s = first; s < first + per; ++s) test::add_shard(mine, numels, shard_grads(step, s, n).data());
      r = mine.finish(*comm, got.data());
      alone.begin_step();
      for (int s = 0; s < k; ++s) test::add_shard(alone, numels, shard_grads(step, s, n).data());
      r1 = alone.finish(*self, want.data());
      ASSERT_EQ(r, r1);
      redos += r == ExactGradientSum::Result::Redo;
    } while (r == ExactGradientSum::Result::Redo);
    ASSERT_EQ(r, ExactGradientSum::Result::Done);
    EXPECT_EQ(got, want);
    EXPECT_EQ(mine.exponents(), alone.exponents());
  }
  EXPECT_EQ(redos, 1);  // step 2's growth
}

// SyncBatchNorm's statistics under --deterministic (Note [micro-shards]):
// values whose sum depends on the order (1e16 + 1 is 1e16 in double) come out
// as one rank adding all 8 shards in order, whoever holds which.
TEST(ExactSum, ShardSumsAreAddedInGlobalShardOrderAtAnyWorldSize) {
  const int world = test_world().size;
  const int k = 8;
  if (k % world != 0) GTEST_SKIP() << "world size " << world << " does not divide " << k;
  const auto shard_values = [](int s) {
    const double big[] = {1e16, 1.0, -1e16, 1.0, 3.0, -2e16, 2e16, 1.0};
    return std::vector<double>{big[s], 0.5 * s, big[(s + 3) % 8]};
  };
  auto comm = comm::make_mpi_communicator(test_world());
  const int per = k / world, first = comm->rank() * per;
  std::vector<double> mine;
  for (int s = first; s < first + per; ++s)
    for (double v : shard_values(s)) mine.push_back(v);
  std::vector<double> got(3, -1.0), want(3, 0.0);
  sum_shards_in_order(*comm, mine.data(), per, 3, got.data(), "test shard sums");
  for (int s = 0; s < k; ++s)
    for (size_t i = 0; i < 3; ++i) want[i] += shard_values(s)[i];
  EXPECT_EQ(got, want);
  // In shard order the first column sums to 5; added as an all-reduce
  // would, the halves first (2 ranks) give 6 and the pairs first (4) give 4.
  EXPECT_EQ(got[0], 5.0);
}

TEST(ExactSum, ANonFiniteGradientOnOneRankIsSeenByAll) {
  auto comm = comm::make_mpi_communicator(test_world());
  const std::vector<size_t> numels = {64};
  HostExactGradientSum sum(numels, comm->size());
  std::vector<float> g(64, 0.25f), out(64, 0);
  if (comm->rank() == comm->size() - 1) g[5] = std::numeric_limits<float>::quiet_NaN();
  sum.begin_step();
  test::add_shard(sum, numels, g.data());
  EXPECT_EQ(sum.finish(*comm, out.data()), ExactGradientSum::Result::NonFinite);
  EXPECT_TRUE(std::isnan(out[0]));
}

}  // namespace
}  // namespace ddp
