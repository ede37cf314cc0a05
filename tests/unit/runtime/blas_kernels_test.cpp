// Note [BLAS kernels]: the decision, with the values of CPUs met so far, and
// this machine's own reading of its CPU and its OpenBLAS.
#include "ddp/runtime/blas_kernels.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace ddp {
namespace {

constexpr const char* kDebianConfig = "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64";

CpuInfo cpu(const char* vendor, int family, int model, IsaLevel level) { return CpuInfo{vendor, family, model, level}; }

BlasReport report(const char* corename, const char* user = "", const char* detected = "") {
  return BlasReport{kDebianConfig, corename, user, detected};
}

// An Intel Xeon of family 6, model 207 (AVX-512) that Debian's OpenBLAS
// 0.3.21 does not know: it ran Prescott's SSE3 kernels.
TEST(BlasKernels, UnknownAvx512CpuOnPrescottKernelsGetsSkylakeX) {
  const BlasChoice c = choose_blas_kernels(cpu("GenuineIntel", 6, 207, IsaLevel::kAvx512), report("Prescott"));
  EXPECT_EQ(c.coretype, "SkylakeX");
}

TEST(BlasKernels, Avx2CpusOnFallbackKernelsGetTheirVendorsFamily) {
  EXPECT_EQ(choose_blas_kernels(cpu("GenuineIntel", 6, 250, IsaLevel::kAvx2), report("Prescott")).coretype, "Haswell");
  EXPECT_EQ(choose_blas_kernels(cpu("AuthenticAMD", 26, 2, IsaLevel::kAvx2), report("Barcelona")).coretype, "Zen");
  EXPECT_EQ(choose_blas_kernels(cpu("GenuineIntel", 6, 250, IsaLevel::kAvx), report("Nehalem")).coretype,
            "Sandybridge");
  // An AVX-512 CPU on AVX2 kernels (an AMD Zen 4 that an older OpenBLAS
  // takes for a Zen) runs AVX-512's.
  EXPECT_EQ(choose_blas_kernels(cpu("AuthenticAMD", 25, 17, IsaLevel::kAvx512), report("Zen")).coretype, "SkylakeX");
}

// The machines these tests ran on: an AMD EPYC of family 25, model 1 (AVX2)
// and one with AVX-512, each on the kernels OpenBLAS picked.
TEST(BlasKernels, KernelsThatMatchTheCpuAreKept) {
  const BlasChoice zen = choose_blas_kernels(cpu("AuthenticAMD", 25, 1, IsaLevel::kAvx2), report("Zen"));
  EXPECT_EQ(zen.coretype, "");
  EXPECT_EQ(zen.description, "OpenBLAS 0.3.21 Zen (OpenBLAS's choice for this AVX2+FMA CPU)");
  EXPECT_EQ(choose_blas_kernels(cpu("AuthenticAMD", 25, 17, IsaLevel::kAvx512), report("SkylakeX")).coretype, "");
  EXPECT_EQ(choose_blas_kernels(cpu("GenuineIntel", 6, 143, IsaLevel::kAvx512), report("Cooperlake")).coretype, "");
  // A CPU without AVX has nothing better to run.
  EXPECT_EQ(choose_blas_kernels(cpu("GenuineIntel", 6, 23, IsaLevel::kSse), report("Penryn")).coretype, "");
}

TEST(BlasKernels, TheUsersChoiceIsKeptAndNamed) {
  const BlasChoice c =
      choose_blas_kernels(cpu("GenuineIntel", 6, 207, IsaLevel::kAvx512), report("Prescott", "Prescott"));
  EXPECT_EQ(c.coretype, "");
  EXPECT_EQ(c.description,
            "OpenBLAS 0.3.21 Prescott (OPENBLAS_CORETYPE=Prescott); this CPU runs SkylakeX kernels (AVX-512): slower");
  const BlasChoice h = choose_blas_kernels(cpu("AuthenticAMD", 25, 1, IsaLevel::kAvx2), report("Haswell", "haswell"));
  EXPECT_EQ(h.coretype, "");
  EXPECT_EQ(h.description, "OpenBLAS 0.3.21 Haswell (OPENBLAS_CORETYPE=haswell)");
}

// After the re-execution: what runs, who chose it, and what OpenBLAS had
// picked; and should OpenBLAS not have taken the name, that it did not
// (and no second re-execution).
TEST(BlasKernels, TheSecondExecutionSaysWhoChose) {
  const BlasChoice c = choose_blas_kernels(cpu("GenuineIntel", 6, 207, IsaLevel::kAvx512),
                                           report("SkylakeX", "SkylakeX", "Prescott"));
  EXPECT_EQ(c.coretype, "");
  EXPECT_EQ(c.description,
            "OpenBLAS 0.3.21 SkylakeX (chosen by ddp_train for this AVX-512 CPU; OpenBLAS detected Prescott)");
  const BlasChoice refused = choose_blas_kernels(cpu("GenuineIntel", 6, 207, IsaLevel::kAvx512),
                                                 report("Prescott", "SkylakeX", "Prescott"));
  EXPECT_EQ(refused.coretype, "");
  EXPECT_NE(refused.description.find("OpenBLAS did not take OPENBLAS_CORETYPE=SkylakeX"), std::string::npos)
      << refused.description;
}

TEST(BlasKernels, AnOpenBlasWithOneKernelFamilyOrAnUnknownNameIsLeftAlone) {
  BlasReport fixed = report("Prescott");
  fixed.config = "OpenBLAS 0.3.26 NO_AFFINITY Prescott MAX_THREADS=8";
  const BlasChoice c = choose_blas_kernels(cpu("GenuineIntel", 6, 207, IsaLevel::kAvx512), fixed);
  EXPECT_EQ(c.coretype, "");
  EXPECT_NE(c.description.find("built for SSE only: slower than this CPU allows"), std::string::npos)
      << c.description;
  EXPECT_EQ(choose_blas_kernels(cpu("AuthenticAMD", 26, 2, IsaLevel::kAvx512), report("Zen5")).coretype, "");
}

TEST(BlasKernels, CoreNamesAreReadInAnyCase) {
  EXPECT_EQ(blas_core_level("skylakex"), IsaLevel::kAvx512);
  EXPECT_EQ(blas_core_level("HASWELL"), IsaLevel::kAvx2);
  EXPECT_EQ(blas_core_level("Prescott"), IsaLevel::kSse);
  EXPECT_FALSE(blas_core_level("NotACore").has_value());
}

// This machine: CPUID's level agrees with the kernel's /proc/cpuinfo flags,
// and the OpenBLAS loaded here reports a family the table knows.
TEST(BlasKernels, ThisMachinesCpuAndBlas) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      flags = line;
      break;
    }
  ASSERT_FALSE(flags.empty()) << "no flags line in /proc/cpuinfo";
  std::set<std::string> have;
  std::istringstream words(flags.substr(flags.find(':') + 1));
  for (std::string w; words >> w;) have.insert(w);
  auto all = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (!have.count(n)) return false;
    return true;
  };
  IsaLevel expected = IsaLevel::kSse;
  if (all({"avx"})) expected = IsaLevel::kAvx;
  if (all({"avx", "avx2", "fma"})) expected = IsaLevel::kAvx2;
  if (all({"avx", "avx2", "fma", "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl"}))
    expected = IsaLevel::kAvx512;
  const CpuInfo info = read_cpu_info();
  EXPECT_EQ(info.level, expected) << isa_name(info.level) << " against " << isa_name(expected);
  EXPECT_FALSE(info.vendor.empty());
  const BlasReport blas = read_blas_report();
  EXPECT_EQ(blas.config.rfind("OpenBLAS ", 0), 0u) << blas.config;
  EXPECT_TRUE(blas_core_level(blas.corename).has_value()) << blas.corename;
}

}  // namespace
}  // namespace ddp
