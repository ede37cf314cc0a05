// Average pooling on the CPU, NCHW: 2x2 / stride 2, and global (AdaptiveAvgPool2d(1)).
// 2x2: Rows are handled in pairs so
// the inner loop is a contiguous, vectorisable pass over one output row.
#include <algorithm>

#include "ddp/nn/cpu/ops.hpp"

namespace ddp::nn::cpu {

template <typename T>
void avgpool2_forward(int planes, int h, int w, const T* x, T* y) {
  const int oh = h / 2, ow = w / 2;
  for (int p = 0; p < planes; ++p) {
    const T* xp = x + int64_t(p) * h * w;
    T* yp = y + int64_t(p) * oh * ow;
    for (int r = 0; r < oh; ++r) {
      const T* a = xp + int64_t(2 * r) * w;
      const T* b = a + w;
      T* out = yp + int64_t(r) * ow;
      for (int c = 0; c < ow; ++c)
        out[c] = T(0.25) * ((a[2 * c] + a[2 * c + 1]) + (b[2 * c] + b[2 * c + 1]));
    }
  }
}

template <typename T>
void avgpool2_backward(int planes, int h, int w, const T* dy, T* dx) {
  const int oh = h / 2, ow = w / 2;
  for (int p = 0; p < planes; ++p) {
    const T* dp = dy + int64_t(p) * oh * ow;
    T* xp = dx + int64_t(p) * h * w;
    for (int r = 0; r < oh; ++r) {
      T* a = xp + int64_t(2 * r) * w;
      T* b = a + w;
      const T* g = dp + int64_t(r) * ow;
      for (int c = 0; c < ow; ++c) {
        const T v = T(0.25) * g[c];
        a[2 * c] = v;
        a[2 * c + 1] = v;
        b[2 * c] = v;
        b[2 * c + 1] = v;
      }
      // An odd width's last column fed no output.
      if (w & 1) a[w - 1] = b[w - 1] = T(0);
    }
    if (h & 1) std::fill(xp + int64_t(h - 1) * w, xp + int64_t(h) * w, T(0));
  }
}

template <typename T>
void global_avgpool_forward(int64_t planes, int hw, const T* x, T* y) {
  const T inv = T(1) / T(hw);
  for (int64_t p = 0; p < planes; ++p) {
    const T* xp = x + p * hw;
    T s = T(0);
    for (int i = 0; i < hw; ++i) s += xp[i];
    y[p] = s * inv;
  }
}

template <typename T>
void global_avgpool_backward(int64_t planes, int hw, const T* dy, T* dx) {
  const T inv = T(1) / T(hw);
  for (int64_t p = 0; p < planes; ++p) {
    const T g = dy[p] * inv;
    T* d = dx + p * hw;
    for (int i = 0; i < hw; ++i) d[i] = g;
  }
}

template void avgpool2_forward<float>(int, int, int, const float*, float*);
template void avgpool2_forward<double>(int, int, int, const double*, double*);
template void avgpool2_backward<float>(int, int, int, const float*, float*);
template void avgpool2_backward<double>(int, int, int, const double*, double*);
template void global_avgpool_forward<float>(int64_t, int, const float*, float*);
template void global_avgpool_forward<double>(int64_t, int, const double*, double*);
template void global_avgpool_backward<float>(int64_t, int, const float*, float*);
template void global_avgpool_backward<double>(int64_t, int, const double*, double*);

}  // namespace ddp::nn::cpu
