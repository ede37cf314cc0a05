// Note [BLAS kernels] (runtime/blas_kernels.hpp): the CPU's level, the
// kernels' level, the decision, and the re-execution.
#include "ddp/runtime/blas_kernels.hpp"

#include <cblas.h>
#include <cpuid.h>
#include <strings.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>

namespace ddp {

namespace {

constexpr const char* kDetectedEnv = "DDP_BLAS_DETECTED";

bool has_bit(unsigned reg, int bit) { return (reg >> bit) & 1u; }

// The register state the OS saves on a context switch (XCR0): AVX's YMM
// halves, AVX-512's opmask and ZMM registers are usable only when it does.
uint64_t os_saved_state() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !has_bit(c, 27)) return 0;  // OSXSAVE
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

// What OPENBLAS_CORETYPE names for a level on this vendor's CPUs.
const char* coretype_for(IsaLevel level, const std::string& vendor) {
  switch (level) {
    case IsaLevel::kAvx512: return "SkylakeX";
    case IsaLevel::kAvx2: return vendor == "AuthenticAMD" ? "Zen" : "Haswell";
    case IsaLevel::kAvx: return "Sandybridge";
    case IsaLevel::kSse: break;
  }
  return "";
}

// "OpenBLAS 0.3.21" from the configuration string, or the whole string.
std::string library_name(const std::string& config) {
  const size_t first = config.find(' ');
  if (first == std::string::npos) return config;
  const size_t second = config.find(' ', first + 1);
  return config.substr(0, second);
}

}  // namespace

const char* isa_name(IsaLevel l) {
  switch (l) {
    case IsaLevel::kAvx512: return "AVX-512";
    case IsaLevel::kAvx2: return "AVX2+FMA";
    case IsaLevel::kAvx: return "AVX";
    case IsaLevel::kSse: break;
  }
  return "SSE";
}

CpuInfo read_cpu_info() {
  CpuInfo info;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return info;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  info.vendor = vendor;
  const unsigned max_leaf = a;
  __get_cpuid(1, &a, &b, &c, &d);
  const unsigned base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
  info.family = int(base_family == 0xf ? base_family + ((a >> 20) & 0xff) : base_family);
  info.model = int(base_family == 0x6 || base_family == 0xf ? base_model | (((a >> 16) & 0xf) << 4) : base_model);
  const bool avx = has_bit(c, 28), fma = has_bit(c, 12);
  const uint64_t xcr0 = os_saved_state();
  const bool os_ymm = (xcr0 & 0x6) == 0x6, os_zmm = (xcr0 & 0xe6) == 0xe6;
  unsigned b7 = 0;
  if (max_leaf >= 7) __get_cpuid_count(7, 0, &a, &b7, &c, &d);
  const bool avx2 = has_bit(b7, 5);
  // What OpenBLAS's SkylakeX kernels use: F, DQ, CD, BW, VL.
  const bool avx512 = has_bit(b7, 16) && has_bit(b7, 17) && has_bit(b7, 28) && has_bit(b7, 30) && has_bit(b7, 31);
  if (avx && os_ymm) info.level = IsaLevel::kAvx;
  if (info.level == IsaLevel::kAvx && avx2 && fma) info.level = IsaLevel::kAvx2;
  if (info.level == IsaLevel::kAvx2 && avx512 && os_zmm) info.level = IsaLevel::kAvx512;
  return info;
}

std::optional<IsaLevel> blas_core_level(const std::string& corename) {
  static const struct {
    const char* name;
    IsaLevel level;
  } kCores[] = {
      {"SkylakeX", IsaLevel::kAvx512},   {"Cooperlake", IsaLevel::kAvx512}, {"SapphireRapids", IsaLevel::kAvx512},
      {"Haswell", IsaLevel::kAvx2},      {"Zen", IsaLevel::kAvx2},          {"Excavator", IsaLevel::kAvx2},
      {"Sandybridge", IsaLevel::kAvx},   {"Bulldozer", IsaLevel::kAvx},     {"Piledriver", IsaLevel::kAvx},
      {"Steamroller", IsaLevel::kAvx},   {"Prescott", IsaLevel::kSse},      {"Core2", IsaLevel::kSse},
      {"Penryn", IsaLevel::kSse},        {"Dunnington", IsaLevel::kSse},    {"Nehalem", IsaLevel::kSse},
      {"Atom", IsaLevel::kSse},          {"Nano", IsaLevel::kSse},          {"Opteron", IsaLevel::kSse},
      {"Opteron(SSE3)", IsaLevel::kSse}, {"Barcelona", IsaLevel::kSse},     {"Bobcat", IsaLevel::kSse},
      {"Katmai", IsaLevel::kSse},        {"Coppermine", IsaLevel::kSse},    {"Northwood", IsaLevel::kSse},
      {"Banias", IsaLevel::kSse},        {"Athlon", IsaLevel::kSse},
  };
  for (const auto& c : kCores)
    if (strcasecmp(c.name, corename.c_str()) == 0) return c.level;
  return std::nullopt;
}

BlasReport read_blas_report() {
  BlasReport r;
  if (const char* s = openblas_get_config()) r.config = s;
  if (const char* s = openblas_get_corename()) r.corename = s;
  if (const char* s = std::getenv("OPENBLAS_CORETYPE")) r.user_coretype = s;
  if (const char* s = std::getenv(kDetectedEnv)) r.detected = s;
  return r;
}

BlasChoice choose_blas_kernels(const CpuInfo& cpu, const BlasReport& blas) {
  BlasChoice out;
  const std::string runs = library_name(blas.config) + " " + blas.corename;
  // A family not named here (a newer OpenBLAS's) is taken as it is.
  const IsaLevel kernels = blas_core_level(blas.corename).value_or(cpu.level);
  const char* best = coretype_for(cpu.level, cpu.vendor);
  if (!blas.detected.empty()) {
    // The second execution: OPENBLAS_CORETYPE is ours.
    out.description = runs + " (chosen by ddp_train for this " + isa_name(cpu.level) +
                      " CPU; OpenBLAS detected " + blas.detected + ")";
    if (kernels < cpu.level)
      out.description += "; OpenBLAS did not take OPENBLAS_CORETYPE=" + blas.user_coretype + ": slower than this CPU allows";
    return out;
  }
  if (!blas.user_coretype.empty()) {
    out.description = runs + " (OPENBLAS_CORETYPE=" + blas.user_coretype + ")";
    if (kernels < cpu.level)
      out.description += std::string("; this CPU runs ") + best + " kernels (" + isa_name(cpu.level) + "): slower";
    return out;
  }
  out.description = runs + " (OpenBLAS's choice for this " + isa_name(cpu.level) + " CPU)";
  if (kernels >= cpu.level) return out;
  if (blas.config.find("DYNAMIC_ARCH") == std::string::npos) {
    // One kernel family compiled in: no other to choose.
    out.description += std::string("; built for ") + isa_name(kernels) + " only: slower than this CPU allows";
    return out;
  }
  out.coretype = best;
  return out;
}

std::string ensure_blas_kernels(char** argv) {
  const BlasReport report = read_blas_report();
  BlasChoice choice = choose_blas_kernels(read_cpu_info(), report);
  if (choice.coretype.empty()) return choice.description;
  ::setenv("OPENBLAS_CORETYPE", choice.coretype.c_str(), 1);
  ::setenv(kDetectedEnv, report.corename.c_str(), 1);
  // By its own path, so the process keeps its name (the kernel names it after
  // the file executed: "/proc/self/exe" would call every rank "exe", out of
  // reach of ps, pgrep and top); /proc/self/exe where that path is gone.
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    ::execv(self, argv);
  }
  ::execv("/proc/self/exe", argv);
  // Still here: run with what OpenBLAS picked, and say so.
  const int e = errno;
  ::unsetenv("OPENBLAS_CORETYPE");
  ::unsetenv(kDetectedEnv);
  return choice.description + "; could not execute again with OPENBLAS_CORETYPE=" + choice.coretype + " (" +
         std::strerror(e) + "): slower than this CPU allows";
}

}  // namespace ddp
