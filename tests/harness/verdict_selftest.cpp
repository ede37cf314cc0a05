// Tests whose outcome verdict_test.sh chooses, to check the verdict the MPI
// test main gives CTest (Note [process verdict] in mpi_gtest_main.cpp).
// DDP_VERDICT=pass|skip|fail sets what AsAsked does; with fail, only on rank
// DDP_VERDICT_RANK (default 0).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <string>

namespace {

TEST(Verdict, AlwaysSkips) { GTEST_SKIP() << "skipped on purpose"; }

TEST(Verdict, AsAsked) {
  const char* want = std::getenv("DDP_VERDICT");
  const std::string mode = want ? want : "pass";
  if (mode == "skip") GTEST_SKIP() << "skipped on purpose";
  if (mode == "fail") {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const char* on = std::getenv("DDP_VERDICT_RANK");
    if (rank == (on ? std::atoi(on) : 0)) ADD_FAILURE() << "failed on purpose on rank " << rank;
  }
}

}  // namespace
