// SerialBlas: OpenBLAS single-threaded while any guard lives (Note [serial
// OpenBLAS] in nn/cpu/gemm.hpp).
#include "ddp/nn/cpu/gemm.hpp"

#include <mutex>

namespace ddp::nn::cpu {

namespace {
std::mutex g_mu;
int g_alive = 0;  // guards alive (g_mu)
int g_saved = 1;  // OpenBLAS's count before the first of them (g_mu)
}  // namespace

SerialBlas::SerialBlas() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_alive++ == 0) {
    g_saved = openblas_get_num_threads();
    if (g_saved != 1) openblas_set_num_threads(1);
  }
}

SerialBlas::~SerialBlas() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (--g_alive == 0 && g_saved != 1) openblas_set_num_threads(g_saved);
}

int blas_threads() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_alive > 0 ? g_saved : openblas_get_num_threads();
}

}  // namespace ddp::nn::cpu
