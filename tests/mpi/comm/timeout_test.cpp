// Timeouts: an operation that a peer never joins must end in an error that
// names it, not a hang. Each test uses its own communicator, whose stuck
// operation cannot block the other tests' collectives (each communicator is
// a separate MPI context), and the late peers then join the operation, so it
// completes and leaves nothing behind (Note [abandoned requests]).
#include <mpi.h>

#include <chrono>
#include <functional>
#include <numeric>
#include <thread>

#include "ddp/comm/communicator.hpp"
#include "ddp/core/error.hpp"
#include "ddp/runtime/world.hpp"  // check_reachable
#include "../test_world.hpp"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using test::expect_contains;
using test::others_join_late;
using test::test_world;

// The start-up reachability check (check_reachable, before anything else
// crosses between nodes): a rank that does not join within the bound makes
// the one waiting fail with the likely causes and the flag to change; the
// others join late and the check completes for them.
TEST(Timeout, ReachabilityCheckThatAPeerMissesNamesTheLikelyCauses) {
  World w = test_world();
  if (w.size < 2) GTEST_SKIP() << "needs two ranks";
  MPI_Comm_dup(MPI_COMM_WORLD, &w.comm);  // its request stays posted on rank 0: not the world's
  if (w.rank == 0) {
    try {
      check_reachable(w, 200ms);
      ADD_FAILURE() << "the check passed although no other rank had joined it";
    } catch (const Error& e) {
      for (const char* needle : {"ranks cannot reach each other (--preflight-timeout 0.2 s)", "firewall",
                                 "btl_tcp_if_include", "oob_tcp_if_include", "NCCL_SOCKET_IFNAME",
                                 "NCCL_P2P_DISABLE", "died or never started"})
        expect_contains(e.what(), needle);
    }
  }
  others_join_late([&] { EXPECT_NO_THROW(check_reachable(w, 60s)); });
}

TEST(Timeout, BarrierThatOnlyOneRankEntersThrowsNamingIt) {
  auto comm = comm::make_mpi_communicator(test_world());
  if (comm->size() < 2) GTEST_SKIP() << "needs two ranks";
  if (comm->rank() == 0) {
    comm->set_timeout(1s);
    try {
      comm->barrier("barrier before checkpoint");
      ADD_FAILURE() << "barrier returned although no other rank entered it";
    } catch (const Error& e) {
      expect_contains(e.what(), "barrier before checkpoint");
      expect_contains(e.what(), "did not complete within 1 s");
      expect_contains(e.what(), "another rank may have failed or be stuck");
    }
    comm->set_timeout(300s);
  }
  others_join_late([&] { comm->barrier("late barrier"); });
  // The communicator still works, in issue order.
  comm->barrier("after the late barrier");
  int mine = comm->rank();
  auto all = comm->allgather(&mine, sizeof mine, "after");
  EXPECT_EQ(all.size(), sizeof(int) * comm->size());
}

TEST(Timeout, AllreduceThatOnlyOneRankIssuesThrowsNamingItThenCompletesLate) {
  auto comm = comm::make_mpi_communicator(test_world());
  if (comm->size() < 2) GTEST_SKIP() << "needs two ranks";
  std::vector<float> v(10, float(comm->rank() + 1));
  std::shared_ptr<comm::Work> w;
  if (comm->rank() == 0) {
    comm->set_timeout(1s);
    w = comm->allreduce_async(v.data(), v.size(), comm::ReduceOp::Sum, "all-reduce of bucket 3");
    try {
      w->wait();
      ADD_FAILURE() << "wait returned although no other rank issued the all-reduce";
    } catch (const Error& e) {
      expect_contains(e.what(), "all-reduce of bucket 3 (40 B) did not complete within 1 s");
      expect_contains(e.what(), "another rank may have failed or be stuck");
    }
    EXPECT_FALSE(w->done());
  }
  others_join_late(
      [&] { comm->allreduce_async(v.data(), v.size(), comm::ReduceOp::Sum, "late")->wait(); });
  if (comm->rank() == 0) {
    // The communication thread kept driving it; the late peers completed it.
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (!w->done() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(1ms);
    ASSERT_TRUE(w->done());
    w->wait();
  }
  const int n = comm->size();
  for (float x : v) EXPECT_EQ(x, n * (n + 1) / 2.0f);
}

}  // namespace
}  // namespace ddp
