// The MPI communicator on real ranks: results, ordering, sizes, and the
// blocking collectives.
#include <mpi.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>

#include "ddp/comm/communicator.hpp"
#include "ddp/core/error.hpp"
#include "ddp/core/half.hpp"  // float_to_bf16, float_to_fp16 and back
#include "../test_world.hpp"

namespace ddp::comm {
namespace {

using test::expect_contains;
using test::rank_value;
using test::sum_over_ranks;
using test::test_world;

std::vector<float> rank_data(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = rank_value(rank, i);
  return v;
}

// Element-wise check without one gtest failure per element.
void expect_sum(const std::vector<float>& v, int size, float scale, const char* what) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != sum_over_ranks(size, i) * scale && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": first wrong element " << first << " is "
                     << (bad ? v[first] : 0.f) << ", expected "
                     << sum_over_ranks(size, first) * scale;
}

TEST(MpiCommunicator, RankAndSizeAreTheWorlds) {
  World w = test_world();
  auto comm = make_mpi_communicator(w);
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(comm->rank(), rank);
  EXPECT_EQ(comm->size(), size);
  EXPECT_STREQ(comm->backend(), "mpi");
}

TEST(MpiCommunicator, AllreduceSumOfRankDependentData) {
  auto comm = make_mpi_communicator(test_world());
  for (size_t n : {size_t(1), size_t(1000), size_t(1 << 20) + 3}) {
    auto v = rank_data(comm->rank(), n);
    comm->allreduce_async(v.data(), n, ReduceOp::Sum, "sum")->wait();
    expect_sum(v, comm->size(), 1.0f, "sum");
  }
}

// --deterministic's sums on the communication thread: values far beyond
// float's and double's exact range come back exact, in flight between two
// float all-reduces, each finishing in issue order.
TEST(MpiCommunicator, Int64AllreducesInFlightWithFloatOnesAreExact) {
  auto comm = make_mpi_communicator(test_world());
  const int w = comm->size();
  const size_t n = 100003;
  std::vector<int64_t> ints(n);
  for (size_t i = 0; i < n; ++i)
    ints[i] = (int64_t(1) << 60) / w * (i % 2 ? -1 : 1) + int64_t(comm->rank() + 1) * int64_t(i % 977);
  auto a = rank_data(comm->rank(), n), b = rank_data(comm->rank(), n);
  auto wa = comm->allreduce_async(a.data(), n, ReduceOp::Sum, "first floats");
  auto wi = comm->allreduce_int64_async(ints.data(), n, "int64 sums");
  auto wb = comm->allreduce_async(b.data(), n, ReduceOp::Sum, "second floats");
  wb->wait();
  EXPECT_TRUE(wa->done());
  EXPECT_TRUE(wi->done());
  wi->wait();
  wa->wait();
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i)
    wrong += ints[i] != (int64_t(1) << 60) / w * w * (i % 2 ? -1 : 1) + int64_t(w) * (w + 1) / 2 * int64_t(i % 977);
  EXPECT_EQ(wrong, 0u);
  expect_sum(a, w, 1.0f, "first floats");
  expect_sum(b, w, 1.0f, "second floats");
}

// SyncBatchNorm's sums on host memory: done when the call returns, in
// double (2^20 apart from 2^-30 steps: beyond float's precision).
TEST(MpiCommunicator, DoublesAllreduceAsyncSumsBeforeItReturns) {
  auto comm = make_mpi_communicator(test_world());
  const int w = comm->size();
  std::vector<double> v(1001);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0x1p20 + double(comm->rank() + 1) * double(i) * 0x1p-30;
  auto work = comm->allreduce_doubles_async(v.data(), v.size(), "sync batch norm: sums");
  EXPECT_TRUE(work->done());
  work->wait();
  size_t wrong = 0;
  for (size_t i = 0; i < v.size(); ++i) wrong += v[i] != 0x1p20 * w + double(w) * (w + 1) / 2 * double(i) * 0x1p-30;
  EXPECT_EQ(wrong, 0u);
}

TEST(MpiCommunicator, AllreduceAvgOfRankDependentData) {
  auto comm = make_mpi_communicator(test_world());
  const size_t n = 123457;
  auto v = rank_data(comm->rank(), n);
  auto w = comm->allreduce_async(v.data(), n, ReduceOp::Avg, "avg");
  w->wait();
  EXPECT_TRUE(w->done());
  const float scale = 1.0f / float(comm->size());
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i)
    bad += std::abs(v[i] - sum_over_ranks(comm->size(), i) * scale) > 1e-5f;
  EXPECT_EQ(bad, 0u);
}

// --grad-compression: small integers and their sums are exact in both
// 16-bit formats, so the sum must be too, whatever the order of additions.
TEST(MpiCommunicator, SixteenBitSumsOfSmallIntegersAreExact) {
  auto comm = make_mpi_communicator(test_world());
  for (Wire wire : {Wire::F16, Wire::BF16})
    for (size_t n : {size_t(1), size_t(1 << 20) + 3}) {
      auto v = rank_data(comm->rank(), n);
      comm->allreduce_compressed_async(v.data(), n, ReduceOp::Sum, wire, "sum")->wait();
      expect_sum(v, comm->size(), 1.0f, wire_name(wire));
    }
}

// The mean of values 16 bits cannot hold: within the format's rounding of
// each rank's share and of each partial sum, and the same bits on every rank.
TEST(MpiCommunicator, SixteenBitMeanIsTheRoundedMeanOnEveryRank) {
  auto comm = make_mpi_communicator(test_world());
  const size_t n = 10007;
  for (Wire wire : {Wire::F16, Wire::BF16}) {
    SCOPED_TRACE(wire_name(wire));
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = 0.001f * float(i % 97) * (1.0f + 0.37f * float(comm->rank())) - 0.04f;
    std::vector<double> want(v.begin(), v.end()), scale(n);
    for (size_t i = 0; i < n; ++i) scale[i] = std::abs(want[i]);
    comm->allreduce_doubles(want.data(), n, false, "reference sum");
    comm->allreduce_doubles(scale.data(), n, false, "reference scale");
    comm->allreduce_compressed_async(v.data(), n, ReduceOp::Avg, wire, "mean")->wait();
    const double unit = wire == Wire::BF16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);  // half an ulp, relative
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      const double mean = want[i] / comm->size(), bound = (comm->size() + 1) * unit * scale[i] / comm->size() + 1e-7;
      bad += std::abs(double(v[i]) - mean) > bound;
    }
    EXPECT_EQ(bad, 0u);
    std::vector<char> all = comm->allgather(v.data(), n * sizeof(float), "results");
    for (int r = 1; r < comm->size(); ++r)
      EXPECT_EQ(std::memcmp(all.data(), all.data() + size_t(r) * n * sizeof(float), n * sizeof(float)), 0)
          << "rank " << r << " holds other bits than rank 0";
  }
}

// --grad-compression at one rank rounds the gradients to 16 bits as at two
// or more (a run at np 1 trains as the same recipe at np 2 would): the mean
// of one rank's values is each value in the wire's format.
TEST(MpiCommunicator, OneRanksSixteenBitAllReduceRoundsToTheWiresFormat) {
  auto comm = make_mpi_communicator(test_world(MPI_COMM_SELF));
  ASSERT_EQ(comm->size(), 1);
  const size_t n = 1001;
  for (Wire wire : {Wire::F16, Wire::BF16})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      SCOPED_TRACE(wire_name(wire));
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = 0.001f * float(i) + 1.0f / 3.0f;
      const std::vector<float> before = v;
      comm->allreduce_compressed_async(v.data(), n, op, wire, "one rank")->wait();
      size_t bad = 0, moved = 0;
      for (size_t i = 0; i < n; ++i) {
        const float want = wire == Wire::BF16 ? bf16_to_float(float_to_bf16(before[i]))
                                              : fp16_to_float(float_to_fp16(before[i]));
        bad += v[i] != want;
        moved += v[i] != before[i];
      }
      EXPECT_EQ(bad, 0u);
      EXPECT_GT(moved, n / 2) << "values 16 bits cannot hold";
    }
}

TEST(MpiCommunicator, ZeroCountIsDoneAtOnce) {
  auto comm = make_mpi_communicator(test_world());
  auto w = comm->allreduce_async(nullptr, 0, ReduceOp::Sum, "nothing");
  EXPECT_TRUE(w->done());
  w->wait();
}

TEST(MpiCommunicator, ManyOutstandingOperationsCompleteInIssueOrder) {
  auto comm = make_mpi_communicator(test_world());
  const int kOps = 64;
  std::vector<std::vector<float>> bufs;
  std::vector<std::shared_ptr<Work>> works;
  for (int k = 0; k < kOps; ++k) bufs.push_back(rank_data(comm->rank(), 1 + 997 * k));
  for (int k = 0; k < kOps; ++k)
    works.push_back(comm->allreduce_async(bufs[k].data(), bufs[k].size(),
                                          k % 2 ? ReduceOp::Sum : ReduceOp::Avg,
                                          "op " + std::to_string(k)));
  // Issue order is completion order: once the last is done, all are.
  works.back()->wait();
  for (int k = 0; k < kOps; ++k) EXPECT_TRUE(works[k]->done()) << "op " << k;
  for (int k = 0; k < kOps; ++k) {
    works[k]->wait();
    if (k % 2) expect_sum(bufs[k], comm->size(), 1.0f, "sum");
  }
}

TEST(MpiCommunicator, LargeBuffer) {
  auto comm = make_mpi_communicator(test_world());
  const size_t n = size_t(8) << 20;  // 32 MiB
  auto v = rank_data(comm->rank(), n);
  comm->allreduce_async(v.data(), n, ReduceOp::Sum, "large")->wait();
  expect_sum(v, comm->size(), 1.0f, "large");
}

TEST(MpiCommunicator, BlockingCollectivesWhileAllreducesAreInFlight) {
  // Note [two communicators]: the caller's collectives and the thread's
  // all-reduces must not be matched against each other.
  auto comm = make_mpi_communicator(test_world());
  const size_t n = size_t(2) << 20;
  std::vector<std::vector<float>> bufs;
  std::vector<std::shared_ptr<Work>> works;
  for (int k = 0; k < 4; ++k) bufs.push_back(rank_data(comm->rank(), n));
  for (int k = 0; k < 4; ++k) {
    works.push_back(comm->allreduce_async(bufs[k].data(), n, ReduceOp::Sum, "bg"));
    const int mine = comm->rank() * 10 + k;
    auto all = comm->allgather(&mine, sizeof mine, "gather during all-reduce");
    for (int r = 0; r < comm->size(); ++r) {
      int theirs;
      std::memcpy(&theirs, all.data() + r * sizeof(int), sizeof(int));
      EXPECT_EQ(theirs, r * 10 + k);
    }
    comm->barrier("barrier during all-reduce");
  }
  for (int k = 0; k < 4; ++k) {
    works[k]->wait();
    expect_sum(bufs[k], comm->size(), 1.0f, "bg");
  }
}

TEST(MpiCommunicator, BroadcastFromEveryRoot) {
  auto comm = make_mpi_communicator(test_world());
  for (int root = 0; root < comm->size(); ++root) {
    std::vector<int> v(1001);
    for (size_t i = 0; i < v.size(); ++i) v[i] = comm->rank() * 100000 + int(i);
    comm->broadcast(v.data(), v.size() * sizeof(int), root, "bcast");
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], root * 100000 + int(i)) << i;
  }
}

TEST(MpiCommunicator, BroadcastLargerThanOneStagingChunk) {
  auto comm = make_mpi_communicator(test_world());
  const size_t bytes = (size_t(64) << 20) + 12345;
  const int root = comm->size() - 1;
  std::vector<unsigned char> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = (unsigned char)(i * 7 + comm->rank());
  comm->broadcast(v.data(), bytes, root, "big bcast");
  size_t bad = 0;
  for (size_t i = 0; i < bytes; ++i) bad += v[i] != (unsigned char)(i * 7 + root);
  EXPECT_EQ(bad, 0u);
}

TEST(MpiCommunicator, BroadcastRootOutOfRangeNamesTheOperation) {
  auto comm = make_mpi_communicator(test_world());
  int x = 0;
  try {
    comm->broadcast(&x, sizeof x, comm->size(), "config broadcast");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    expect_contains(e.what(), "config broadcast");
  }
}

TEST(MpiCommunicator, BarrierHoldsEveryRankUntilAllArrive) {
  // Shared memory across the node's ranks: each rank raises its flag, then
  // passes the barrier; after it every flag must be seen raised.
  auto comm = make_mpi_communicator(test_world());
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  if (node_size != comm->size()) {
    MPI_Comm_free(&node);
    GTEST_SKIP() << "ranks on more than one node";
  }
  std::atomic<int>* flags = nullptr;
  MPI_Win win;
  MPI_Win_allocate_shared(comm->rank() == 0 ? comm->size() * sizeof(std::atomic<int>) : 0,
                          sizeof(std::atomic<int>), MPI_INFO_NULL, node, &flags, &win);
  MPI_Aint sz;
  int disp;
  MPI_Win_shared_query(win, 0, &sz, &disp, &flags);
  if (comm->rank() == 0)
    for (int r = 0; r < comm->size(); ++r) new (&flags[r]) std::atomic<int>(0);
  MPI_Barrier(node);
  for (int round = 1; round <= 20; ++round) {
    // The last rank dawdles, so a barrier that let ranks through early would
    // be caught reading its old flag.
    if (comm->rank() == comm->size() - 1) {
      volatile double x = 0;
      for (int i = 0; i < 200000 * round; ++i) x = x + 1.0;
    }
    flags[comm->rank()].store(round);
    comm->barrier("round barrier");
    for (int r = 0; r < comm->size(); ++r)
      EXPECT_GE(flags[r].load(), round) << "rank " << r << " round " << round;
  }
  MPI_Barrier(node);
  MPI_Win_free(&win);
  MPI_Comm_free(&node);
}

TEST(MpiCommunicator, AllgatherInRankOrder) {
  auto comm = make_mpi_communicator(test_world());
  const char mine[5] = {char(comm->rank()), char(comm->rank() + 1), 'x', 'y', 'z'};
  auto all = comm->allgather(mine, sizeof mine, "gather");
  ASSERT_EQ(all.size(), sizeof mine * comm->size());
  for (int r = 0; r < comm->size(); ++r) {
    EXPECT_EQ(all[r * 5], char(r));
    EXPECT_EQ(all[r * 5 + 1], char(r + 1));
    EXPECT_EQ(all[r * 5 + 4], 'z');
  }
  EXPECT_TRUE(comm->allgather(mine, 0, "empty gather").empty());
}

TEST(MpiCommunicator, AllreduceDoublesSumAndMax) {
  auto comm = make_mpi_communicator(test_world());
  const int n = comm->size();
  double v[3] = {double(comm->rank()), 1.5, -double(comm->rank())};
  comm->allreduce_doubles(v, 3, false, "metrics");
  EXPECT_EQ(v[0], n * (n - 1) / 2.0);
  EXPECT_EQ(v[1], 1.5 * n);
  EXPECT_EQ(v[2], -n * (n - 1) / 2.0);
  double m[2] = {double(comm->rank()), -double(comm->rank())};
  comm->allreduce_doubles(m, 2, true, "max");
  EXPECT_EQ(m[0], n - 1);
  EXPECT_EQ(m[1], 0.0);
}

TEST(MpiCommunicator, WorldOfOne) {
  // Each rank alone in its own world: what a plain process without mpirun is.
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm self;
  MPI_Comm_split(MPI_COMM_WORLD, rank, 0, &self);
  {
    auto comm = make_mpi_communicator(test_world(self));
    EXPECT_EQ(comm->size(), 1);
    EXPECT_EQ(comm->rank(), 0);
    auto v = rank_data(rank, 100);
    const auto before = v;
    comm->allreduce_async(v.data(), v.size(), ReduceOp::Avg, "alone")->wait();
    EXPECT_EQ(v, before);
    comm->broadcast(v.data(), v.size() * sizeof(float), 0, "alone");
    comm->barrier("alone");
    auto all = comm->allgather(v.data(), 8, "alone");
    EXPECT_EQ(all.size(), 8u);
    double d = 2.5;
    comm->allreduce_doubles(&d, 1, false, "alone");
    EXPECT_EQ(d, 2.5);
  }
  MPI_Comm_free(&self);
}

}  // namespace
}  // namespace ddp::comm
