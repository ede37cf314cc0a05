// The residual add on the CPU (with the ReLU that follows it in a residual
// block): element-wise passes the compiler vectorises.
#include "ddp/nn/cpu/ops.hpp"

namespace ddp::nn::cpu {

template <typename T>
void add_forward(int64_t n, const T* a, const T* b, bool relu, T* y) {
  if (relu) {
    for (int64_t i = 0; i < n; ++i) {
      const T s = a[i] + b[i];
      y[i] = s > T(0) ? s : T(0);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
  }
}

template <typename T>
void add_backward(int64_t n, const T* y, bool relu, const T* dy, T* da, T* db) {
  for (int64_t i = 0; i < n; ++i) {
    const T g = !relu || y[i] > T(0) ? dy[i] : T(0);
    if (da) da[i] = g;
    if (db) db[i] = g;
  }
}

template void add_forward<float>(int64_t, const float*, const float*, bool, float*);
template void add_forward<double>(int64_t, const double*, const double*, bool, double*);
template void add_backward<float>(int64_t, const float*, bool, const float*, float*, float*);
template void add_backward<double>(int64_t, const double*, bool, const double*, double*, double*);

}  // namespace ddp::nn::cpu
