// The watchdog's channel on real ranks (comm/watchdog.hpp): watched
// collectives give their results, and the goodbye at the end completes on
// every rank without a report, whichever rank gets there last, again and
// again. (A stall ends the job, so it is tested on ddp_train itself:
// tests/cli/test_reliability.cpp.)
#include <mpi.h>

#include <chrono>
#include <thread>
#include <vector>

#include "ddp/comm/communicator.hpp"
#include "ddp/comm/watchdog.hpp"
#include "../test_world.hpp"

namespace ddp::comm {
namespace {

using test::test_world;

TEST(Watchdog, WatchedCollectivesGiveTheirResultsAndTheEndIsClean) {
  for (int round = 0; round < 3; ++round) {
    Watchdog dog(test_world(), Watchdog::Options{std::chrono::seconds(20), std::chrono::milliseconds(20)});
    auto comm = dog.watch(make_mpi_communicator(test_world()));
    comm->set_timeout(std::chrono::seconds(20));
    const int rank = comm->rank(), size = comm->size();
    std::vector<float> v(5000);
    for (int step = 0; step < 20; ++step) {
      for (size_t i = 0; i < v.size(); ++i) v[i] = test::rank_value(rank, i);
      comm->allreduce_async(v.data(), v.size(), ReduceOp::Sum, "all-reduce of bucket 0")->wait();
      EXPECT_EQ(v[17], test::sum_over_ranks(size, 17));
      int x = rank == 0 ? step : -1;
      comm->broadcast(&x, sizeof x, 0, "step");
      EXPECT_EQ(x, step);
    }
    comm->barrier("end");
    // Some ranks reach the goodbye later than others, by more than the
    // interval: their reports keep them from counting as silent meanwhile.
    if (rank == (round % size)) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    dog.stop();
  }
}

}  // namespace
}  // namespace ddp::comm
