// Note [BLAS kernels], whole runs: where OpenBLAS falls back below the CPU,
// ddp_train executes itself again with the kernels the CPU runs and says so;
// a choice the user made is kept and named.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "ddp/runtime/blas_kernels.hpp"
#include "run_process.hpp"

namespace ddp::test {
namespace {

// Sets (or, with nullopt, unsets) an environment variable for the runs a
// test starts, and puts it back.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* v = std::getenv(name)) saved_ = v;
    if (value)
      ::setenv(name, value->c_str(), 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (saved_)
      ::setenv(name_, saved_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

constexpr const char* kRun = "--synthetic 1024 --batch-size 256 --epochs 1";

TEST(BlasKernels, UnknownCpuRunsTheKernelsItSupports) {
  const CpuInfo cpu = read_cpu_info();
  if (cpu.level == IsaLevel::kSse) GTEST_SKIP() << "this CPU has no AVX: no kernels better than a fallback's";
  BlasReport fallback = read_blas_report();
  fallback.corename = "Prescott";
  fallback.user_coretype = fallback.detected = "";
  const std::string want = choose_blas_kernels(cpu, fallback).coretype;
  ASSERT_FALSE(want.empty());
  // OpenBLAS reports Prescott until OPENBLAS_CORETYPE is set (the preloaded
  // library), as on a CPU model it does not know.
  ScopedEnv user("OPENBLAS_CORETYPE", std::nullopt);
  ScopedEnv preload("LD_PRELOAD", DDP_BLAS_FALLBACK_PRELOAD);
  const auto r = run_ddp_train(2, kRun);
  ASSERT_EQ(r.status, 0) << r.err;
  // The kernels named are those OpenBLAS reports after the re-execution:
  // it took OPENBLAS_CORETYPE.
  EXPECT_NE(r.out.find(" BLAS: OpenBLAS "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" " + want + " (chosen by ddp_train for this " + isa_name(cpu.level) +
                       " CPU; OpenBLAS detected Prescott)\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\"event\":\"summary\""), std::string::npos) << r.out;
}

// After the re-execution each rank is still called ddp_train (ps, pgrep,
// top, and the tests that find a rank by its name and signal it).
TEST(BlasKernels, TheRanksKeepTheirNameAcrossTheReExecution) {
  if (read_cpu_info().level == IsaLevel::kSse) GTEST_SKIP() << "this CPU has no AVX: no re-execution";
  ScopedEnv user("OPENBLAS_CORETYPE", std::nullopt);
  ScopedEnv preload("LD_PRELOAD", DDP_BLAS_FALLBACK_PRELOAD);
  const std::string dir = make_temp_dir();
  BackgroundJob job(2, "--synthetic 4096 --batch-size 256 --epochs 1000 --quiet --metrics-out " + dir + "/m.jsonl");
  ASSERT_TRUE(wait_until([&] { return !read_text(dir + "/m.jsonl").empty(); }, 120)) << "no epoch within 120 s";
  for (int rank = 0; rank < 2; ++rank) {
    const int pid = job.rank_pid(rank);  // a process named ddp_train with that rank
    ASSERT_GT(pid, 0) << "no process named ddp_train is rank " << rank;
    std::string env = read_text("/proc/" + std::to_string(pid) + "/environ");
    EXPECT_NE(env.find(std::string("DDP_BLAS_DETECTED=Prescott") + '\0'), std::string::npos)
        << "rank " << rank << " was not executed again";
  }
  job.kill_all();
  job.wait();
  remove_tree(dir);
}

TEST(BlasKernels, TheUsersChoiceIsKeptAndNamed) {
  const CpuInfo cpu = read_cpu_info();
  ScopedEnv user("OPENBLAS_CORETYPE", "Prescott");
  const auto r = run_ddp_train(1, kRun);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(" BLAS: OpenBLAS "), std::string::npos) << r.out;
  const std::string named = " Prescott (OPENBLAS_CORETYPE=Prescott)";
  EXPECT_NE(r.out.find(named + (cpu.level == IsaLevel::kSse ? "\n" : "; this CPU runs ")), std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace ddp::test
