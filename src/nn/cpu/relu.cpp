// ReLU on the CPU: branch-free element-wise passes the compiler vectorises.
#include "ddp/nn/cpu/ops.hpp"

namespace ddp::nn::cpu {

template <typename T>
void relu_forward(int64_t n, const T* x, T* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > T(0) ? x[i] : T(0);
}

template <typename T>
void relu_backward(int64_t n, const T* y, const T* dy, T* dx) {
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > T(0) ? dy[i] : T(0);
}

template void relu_forward<float>(int64_t, const float*, float*);
template void relu_forward<double>(int64_t, const double*, double*);
template void relu_backward<float>(int64_t, const float*, const float*, float*);
template void relu_backward<double>(int64_t, const double*, const double*, double*);

}  // namespace ddp::nn::cpu
