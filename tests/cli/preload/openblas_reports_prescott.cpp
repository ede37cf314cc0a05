// LD_PRELOAD'ed into ddp_train by BlasKernels.UnknownCpuRunsTheKernelsItSupports:
// OpenBLAS reports Prescott, as Debian's does on a CPU model it does not know,
// until OPENBLAS_CORETYPE is set; from then on it reports what it runs.
#include <dlfcn.h>

#include <cstdlib>

extern "C" char* openblas_get_corename(void) {
  if (!std::getenv("OPENBLAS_CORETYPE")) return const_cast<char*>("Prescott");
  using Fn = char* (*)(void);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "openblas_get_corename"));
  return real ? real() : const_cast<char*>("unknown");
}
