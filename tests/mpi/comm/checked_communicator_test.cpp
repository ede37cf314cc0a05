// --debug-collectives (comm/checked_communicator.hpp) on real ranks: the
// collectives still give their results, and one rank's extra all-reduce is
// an error on every rank naming rank 0's call and the odd rank's.
#include <mpi.h>

#include <string>
#include <vector>

#include "ddp/comm/checked_communicator.hpp"
#include "ddp/comm/communicator.hpp"
#include "ddp/core/error.hpp"
#include "../test_world.hpp"

namespace ddp::comm {
namespace {

using test::expect_contains;
using test::test_world;

TEST(CheckedCommunicator, CollectivesThatAgreeGiveTheirResults) {
  auto comm = make_checked_communicator(make_mpi_communicator(test_world()));
  const int rank = comm->rank(), size = comm->size();
  std::vector<float> v(1000, float(rank + 1));
  comm->allreduce_async(v.data(), v.size(), ReduceOp::Sum, "all-reduce of bucket 0")->wait();
  EXPECT_EQ(v[999], float(size * (size + 1) / 2));
  int x = rank == 0 ? 42 : 0;
  comm->broadcast(&x, sizeof x, 0, "answer");
  EXPECT_EQ(x, 42);
  comm->barrier("barrier");
  const std::vector<char> all = comm->allgather(&rank, sizeof rank, "ranks");
  EXPECT_EQ(all.size(), sizeof(int) * size_t(size));
  double d = 1;
  comm->allreduce_doubles(&d, 1, /*max=*/false, "count");
  EXPECT_EQ(d, double(size));
  std::vector<double> sums(3, 0.25 * (rank + 1));
  comm->allreduce_doubles_async(sums.data(), sums.size(), "sync batch norm: sums")->wait();
  EXPECT_EQ(sums[2], 0.25 * (size * (size + 1) / 2));
}

// Rank 1 all-reduces once more than the others ("rank 1 did an extra
// all-reduce"): the next collective fails on every rank alike, naming rank
// 0's call and rank 1's, instead of summing rank 1's extra buffer into the
// others' bucket.
TEST(CheckedCommunicator, AnExtraAllReduceOnOneRankIsNamed) {
  auto comm = make_checked_communicator(make_mpi_communicator(test_world()));
  comm->set_timeout(std::chrono::seconds(30));
  std::vector<float> bucket(100, 1.f), extra(100, 2.f);
  comm->allreduce_async(bucket.data(), bucket.size(), ReduceOp::Avg, "all-reduce of bucket 0")->wait();
  std::string message;
  try {
    if (comm->rank() == 1)
      comm->allreduce_async(extra.data(), extra.size(), ReduceOp::Avg, "extra all-reduce")->wait();
    comm->allreduce_async(bucket.data(), bucket.size(), ReduceOp::Avg, "all-reduce of bucket 0")->wait();
  } catch (const CollectiveError& e) {
    message = e.what();
  }
  ASSERT_FALSE(message.empty()) << "rank " << comm->rank() << ": no error";
  expect_contains(message, "the ranks' collectives differ");
  expect_contains(message, "rank 0's call #2: all-reduce of 100 values (\"all-reduce of bucket 0\")");
  expect_contains(message, "rank 1's call #2: all-reduce of 100 values (\"extra all-reduce\")");
  // Nothing was summed with the extra buffer.
  EXPECT_EQ(bucket[0], 1.f);
}

}  // namespace
}  // namespace ddp::comm
