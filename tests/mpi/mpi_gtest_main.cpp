// GoogleTest main for tests that run under mpiexec: every rank runs every
// test; the job fails when any rank fails. Ranks other than 0 print only
// failures, so a failing rank still says what failed.
//
// Note [process verdict]: CTest runs this process as one test and takes its
// exit status as the verdict (tests/CMakeLists.txt: SKIP_RETURN_CODE 77).
// The status is 1 when any test failed on any rank, 77 ("skipped") only when
// no test failed or passed on any rank and at least one skipped, else 0. A
// skipped test can therefore never hide a failed one in the same process;
// CTest's SKIP_REGULAR_EXPRESSION would (a "[  SKIPPED ]" line anywhere
// marks the whole process Skipped, whatever its exit status).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "ddp/runtime/blas_kernels.hpp"
#include "ddp/runtime/world.hpp"

namespace {

constexpr int kSkipped = 77;

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
  // The kernels this CPU runs, as ddp_train (Note [BLAS kernels]).
  ddp::ensure_blas_kernels(argv);
  testing::InitGoogleTest(&argc, argv);
  ddp::World world = ddp::init_world(&argc, &argv);
  if (world.rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnly(world.rank));
  }
  const int rc = RUN_ALL_TESTS();
  const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
  // rc also counts failures outside any test (environments, ad hoc results).
  int mine[3] = {rc != 0 || unit.failed_test_count() > 0, unit.successful_test_count() > 0,
                 unit.skipped_test_count() > 0};
  int any[3] = {0, 0, 0};
  MPI_Allreduce(mine, any, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  const bool failed = any[0], passed = any[1], skipped = any[2];
  int verdict = 0;  // Note [process verdict]
  if (failed) {
    verdict = 1;
    if (world.rank == 0 && !mine[0]) std::fprintf(stderr, "tests failed on another rank\n");
  } else if (!passed) {
    verdict = skipped ? kSkipped : 1;
    if (world.rank == 0)
      std::fprintf(stderr, skipped ? "every test skipped on every rank (reasons above): reported as skipped\n"
                                   : "no test ran: the filter matches nothing\n");
  }
  ddp::finalize_world(world);
  return verdict;
}
