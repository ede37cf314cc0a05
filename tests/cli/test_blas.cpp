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
