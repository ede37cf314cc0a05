// Which of OpenBLAS's kernel families a rank runs, and making it the one the
// CPU can run.
//
// Note [BLAS kernels]: a DYNAMIC_ARCH OpenBLAS (Debian's) picks its kernels
// once, when it is loaded, from a table of CPU models; a model newer than
// the library is not in it and gets the oldest kernels (Prescott: SSE3), 3-4x
// slower than the CPU allows, and it says nothing. So before MPI is
// initialised ddp_train compares the kernels' instruction set with what CPUID
// and the OS grant. Where OpenBLAS fell below and nobody chose
// (OPENBLAS_CORETYPE unset), it sets OPENBLAS_CORETYPE to the family that
// matches the CPU and executes itself again (the pid and the process's name
// stay, so a launcher, ps and pgrep see the same process); DDP_BLAS_DETECTED
// carries what OpenBLAS had picked across, so the start-up table can say both. A choice the user made is
// kept, and named. The decision is a pure function (choose_blas_kernels) so
// that other CPUs' values can be tested on any machine.
#pragma once

#include <optional>
#include <string>

namespace ddp {

// x86 instruction-set levels, each including the ones below.
enum class IsaLevel { kSse = 0, kAvx = 1, kAvx2 = 2, kAvx512 = 3 };

const char* isa_name(IsaLevel l);

// What this CPU can run, from CPUID and XGETBV (the OS's saved register state).
struct CpuInfo {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  int family = 0, model = 0;
  IsaLevel level = IsaLevel::kSse;
};
CpuInfo read_cpu_info();

// The instruction set an OpenBLAS kernel family (openblas_get_corename, as
// OPENBLAS_CORETYPE spells it, any case) needs; nullopt for a name not known
// here (a newer OpenBLAS's), which is then taken as it is.
std::optional<IsaLevel> blas_core_level(const std::string& corename);

// What OpenBLAS reports and what the environment says.
struct BlasReport {
  std::string config;         // openblas_get_config(): version, DYNAMIC_ARCH, ...
  std::string corename;       // openblas_get_corename(): the family it runs
  std::string user_coretype;  // OPENBLAS_CORETYPE as this process found it ("" if unset)
  std::string detected;       // DDP_BLAS_DETECTED: set by ddp_train's own re-execution
};
BlasReport read_blas_report();

struct BlasChoice {
  std::string coretype;     // non-empty: execute again with OPENBLAS_CORETYPE=coretype
  std::string description;  // for the start-up table, e.g. "OpenBLAS 0.3.21 SkylakeX (...)"
};

// Note [BLAS kernels]'s decision.
BlasChoice choose_blas_kernels(const CpuInfo& cpu, const BlasReport& blas);

// main's first step: when choose_blas_kernels says so, executes this program
// again (argv as main got it) with OPENBLAS_CORETYPE set, and does not return;
// otherwise (or when execution fails) returns the line the start-up table
// prints for this rank.
std::string ensure_blas_kernels(char** argv);

}  // namespace ddp
