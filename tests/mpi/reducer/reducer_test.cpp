// The reducer on real ranks: after finish() every gradient is the mean over
// ranks, whatever the buckets and however backward reports readiness.
#include <mpi.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "ddp/comm/communicator.hpp"
#include "ddp/core/error.hpp"
#include "ddp/reducer/reducer.hpp"
#include "../test_world.hpp"

namespace ddp {
namespace {

using test::expect_contains;
using test::rank_value;
using test::sum_over_ranks;
using test::test_world;

// Sizes like a small CNN's, in backward order, with a lone big one.
const std::vector<size_t> kNumels = {10, 1280, 128, 102400, 50, 22500, 20, 180, 300001, 3};

size_t total(const std::vector<size_t>& n) { return std::accumulate(n.begin(), n.end(), size_t(0)); }

// Fills param p's gradients as backward would, with this rank's values.
void fill_param(std::vector<float>& g, const std::vector<size_t>& n, size_t p, int rank,
                float times = 1) {
  const size_t off = std::accumulate(n.begin(), n.begin() + p, size_t(0));
  for (size_t i = off; i < off + n[p]; ++i) g[i] += times * rank_value(rank, i);
}

size_t count_not_mean(const std::vector<float>& g, int size, float times = 1) {
  size_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i)
    bad += std::abs(g[i] - times * sum_over_ranks(size, i) / size) > 1e-4f;
  return bad;
}

// A backward: each parameter's gradient is written, then reported ready, so
// earlier buckets are on the wire while later gradients are being written.
ReducerStats step(Reducer& red, std::vector<float>& g, const std::vector<size_t>& n, int rank) {
  red.begin_backward();
  size_t ready = 0;
  for (size_t p = 0; p < n.size(); ++p) {
    fill_param(g, n, p, rank);
    ready += n[p];
    red.grads_ready(ready);
  }
  return red.finish();
}

class ReducerCaps : public testing::TestWithParam<double> {};

TEST_P(ReducerCaps, AveragesOverRanksWithProgressiveReadiness) {
  auto comm = comm::make_mpi_communicator(test_world());
  std::vector<float> g(total(kNumels), 0.f);
  Reducer red(*comm, g.data(), kNumels, GetParam());
  ReducerStats s = step(red, g, kNumels, comm->rank());
  EXPECT_EQ(count_not_mean(g, comm->size()), 0u) << red.buckets().size() << " buckets";
  // Every bucket but possibly none is complete before finish(); all of them
  // here, since the last grads_ready covers the whole buffer.
  EXPECT_EQ(s.buckets_launched_early, int(red.buckets().size()));
  EXPECT_GE(s.wait_sec, 0.0);

  // A second step on the same reducer (zeroed grads, as the trainer does).
  std::fill(g.begin(), g.end(), 0.f);
  step(red, g, kNumels, comm->rank());
  EXPECT_EQ(count_not_mean(g, comm->size()), 0u);
}

TEST_P(ReducerCaps, AveragesOverRanksWithoutOverlap) {
  auto comm = comm::make_mpi_communicator(test_world());
  std::vector<float> g(total(kNumels), 0.f);
  Reducer red(*comm, g.data(), kNumels, GetParam(), /*overlap=*/false);
  ReducerStats s = step(red, g, kNumels, comm->rank());
  EXPECT_EQ(s.buckets_launched_early, 0);
  EXPECT_EQ(count_not_mean(g, comm->size()), 0u);
}

TEST_P(ReducerCaps, AveragesWhenOnlyFinishIsCalled) {
  auto comm = comm::make_mpi_communicator(test_world());
  std::vector<float> g(total(kNumels), 0.f);
  for (size_t p = 0; p < kNumels.size(); ++p) fill_param(g, kNumels, p, comm->rank());
  Reducer red(*comm, g.data(), kNumels, GetParam());
  red.begin_backward();
  red.grads_ready(kNumels[0] + kNumels[1]);  // a prefix, then the rest at finish
  red.finish();
  EXPECT_EQ(count_not_mean(g, comm->size()), 0u);
}

TEST_P(ReducerCaps, BucketsAreTheSameOnEveryRank) {
  auto comm = comm::make_mpi_communicator(test_world());
  std::vector<float> g(total(kNumels), 0.f);
  Reducer red(*comm, g.data(), kNumels, GetParam());
  std::vector<uint64_t> mine;
  for (const Bucket& b : red.buckets())
    mine.insert(mine.end(), {b.begin, b.end, b.first_param, b.last_param});
  const uint64_t count = mine.size();
  auto counts = comm->allgather(&count, sizeof count, "bucket counts");
  for (int r = 0; r < comm->size(); ++r)
    ASSERT_EQ(std::memcmp(counts.data() + r * sizeof count, &count, sizeof count), 0) << r;
  auto all = comm->allgather(mine.data(), mine.size() * sizeof(uint64_t), "bucket plans");
  const size_t bytes = mine.size() * sizeof(uint64_t);
  for (int r = 0; r < comm->size(); ++r)
    EXPECT_EQ(std::memcmp(all.data() + r * bytes, all.data(), bytes), 0) << "rank " << r;
}

// 1e-6 MiB: one parameter per bucket; 0.1 MiB: a few; 1 GiB: the small first
// bucket and one more.
INSTANTIATE_TEST_SUITE_P(Caps, ReducerCaps, testing::Values(1e-6, 0.1, 1024.0));

TEST(Reducer, TinyCapGivesABucketPerParameter) {
  auto comm = comm::make_mpi_communicator(test_world());
  std::vector<float> g(total(kNumels));
  Reducer red(*comm, g.data(), kNumels, 1e-6);
  EXPECT_EQ(red.buckets().size(), kNumels.size());
}

TEST(Reducer, NoSyncLeavesGradientsLocalThenTheSyncStepAveragesTheSum) {
  auto comm = comm::make_mpi_communicator(test_world());
  std::vector<float> g(total(kNumels), 0.f);
  Reducer red(*comm, g.data(), kNumels, 0.1);
  red.set_sync(false);
  step(red, g, kNumels, comm->rank());
  size_t not_local = 0;
  for (size_t i = 0; i < g.size(); ++i) not_local += g[i] != rank_value(comm->rank(), i);
  EXPECT_EQ(not_local, 0u) << "no_sync step communicated";
  step(red, g, kNumels, comm->rank());  // accumulate a second micro-batch
  red.set_sync(true);
  step(red, g, kNumels, comm->rank());
  EXPECT_EQ(count_not_mean(g, comm->size(), 3.0f), 0u);
}

TEST(Reducer, DifferentModelsOnDifferentRanksAreRefused) {
  auto comm = comm::make_mpi_communicator(test_world());
  if (comm->size() < 2) GTEST_SKIP() << "needs two ranks";
  auto n = kNumels;
  if (comm->rank() == 1) n.back() += 1;
  std::vector<float> g(total(n));
  try {
    Reducer red(*comm, g.data(), n, 25.0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    expect_contains(e.what(), "rank ");
    expect_contains(e.what(), "same model");
  }
}

TEST(BroadcastFromRank0, EveryRankEndsWithRankZeros) {
  auto comm = comm::make_mpi_communicator(test_world());
  // Larger than one broadcast piece (16 Mi floats), so the chunking is used.
  const size_t n = (size_t(16) << 20) + 5;
  std::vector<float> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = rank_value(comm->rank(), i) + 0.5f * comm->rank();
  broadcast_from_rank0(*comm, p.data(), n, "test parameters");
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += p[i] != rank_value(0, i);
  EXPECT_EQ(bad, 0u);
}

}  // namespace
}  // namespace ddp
