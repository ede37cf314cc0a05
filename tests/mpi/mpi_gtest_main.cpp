// GoogleTest main for tests that run under mpiexec: every rank runs every
// test; the job fails when any rank fails. Ranks other than 0 print only
// failures, so a failing rank still says what failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "ddp/runtime/world.hpp"

namespace {
class FailuresOnly : public testing::EmptyTestEventListener {
 public:
  explicit FailuresOnly(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                   r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  ddp::World world = ddp::init_world(&argc, &argv);
  if (world.rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnly(world.rank));
  }
  int rc = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (world.rank == 0 && worst != 0 && rc == 0)
    std::fprintf(stderr, "tests failed on another rank\n");
  ddp::finalize_world(world);
  return worst;
}
