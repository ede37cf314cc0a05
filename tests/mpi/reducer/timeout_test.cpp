// The reducer's timeout: a bucket that a peer never reduces ends in an
// error naming it, not a hang (as tests/mpi/comm/timeout_test.cpp for the
// communicator's own operations).
#include <mpi.h>

#include <chrono>

#include "ddp/comm/communicator.hpp"
#include "ddp/core/error.hpp"
#include "ddp/reducer/reducer.hpp"
#include "../test_world.hpp"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using test::expect_contains;
using test::others_join_late;
using test::test_world;

TEST(Timeout, ReducerTimeoutNamesTheBucket) {
  auto comm = comm::make_mpi_communicator(test_world());
  if (comm->size() < 2) GTEST_SKIP() << "needs two ranks";
  const std::vector<size_t> numels = {100, 200, 300};
  std::vector<float> g(600, 1.f);
  Reducer red(*comm, g.data(), numels, 1e-6);  // one bucket per parameter
  ASSERT_EQ(red.buckets().size(), 3u);
  if (comm->rank() == 0) {
    comm->set_timeout(1s);
    red.begin_backward();
    red.grads_ready(600);
    try {
      red.finish();
      ADD_FAILURE() << "finish returned although no other rank reduced";
    } catch (const Error& e) {
      expect_contains(e.what(), "bucket 0 of 3");
      expect_contains(e.what(), "did not complete within 1 s");
    }
    comm->set_timeout(300s);
  }
  others_join_late([&] {
    red.begin_backward();
    red.grads_ready(600);
    red.finish();
  });
  // Rank 0's buckets are still in flight on its communication thread; one
  // more all-reduce, completed in issue order, says they are done.
  float marker = 1.f;
  comm->allreduce_async(&marker, 1, comm::ReduceOp::Sum, "drain")->wait();
  EXPECT_EQ(marker, float(comm->size()));
  for (float x : g) EXPECT_EQ(x, 1.f);  // the mean of ones
}

}  // namespace
}  // namespace ddp
