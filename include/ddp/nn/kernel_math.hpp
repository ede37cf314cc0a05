// The arithmetic of the GPU layers' own kernels and the shapes of their cuBLAS
// calls, as plain functions: the kernels in src/nn/cuda/*.cu call them on the
// device, and tests/unit/nn/kernel_math_test.cpp calls them on the host
// against the CPU layers, so their index math and formulas are checked on any
// machine. What only a GPU can check (launches, cuDNN, cuBLAS itself,
// streams) is left to the Cuda* tests.
//
// Each *_at function computes one output element from its flat index i; a
// kernel runs it for every i in a grid-stride loop, the host test in a plain
// loop. NCHW throughout, as the CPU layers (nn/cpu/ops.hpp), but for the
// NHWC twins Note [channels last] (nn/layout.hpp) needs.
#pragma once

#include <math.h>  // exp, log on both sides (::exp(double) under nvcc too)

#include <cstdint>
#include <limits>

#include "ddp/core/host_device.hpp"  // DDP_HOST_DEVICE

namespace ddp::nn::kernel {

// 2x2 / stride-2 average pooling, floor on odd sizes (nn/cpu/pool.cpp). Output
// element i of planes x (h/2) x (w/2); with relu the window is max(x, 0)
// first (ConvReluPool).
DDP_HOST_DEVICE inline float avgpool2_forward_at(int64_t i, int h, int w, const float* x, bool relu) {
  const int oh = h / 2, ow = w / 2;
  const int c = int(i % ow);
  const int64_t t = i / ow;
  const int r = int(t % oh);
  const int64_t p = t / oh;
  const float* a = x + (p * h + 2 * r) * int64_t(w) + 2 * c;
  const float* b = a + w;
  float a0 = a[0], a1 = a[1], b0 = b[0], b1 = b[1];
  if (relu) {
    a0 = a0 > 0.0f ? a0 : 0.0f;
    a1 = a1 > 0.0f ? a1 : 0.0f;
    b0 = b0 > 0.0f ? b0 : 0.0f;
    b1 = b1 > 0.0f ? b1 : 0.0f;
  }
  return 0.25f * ((a0 + a1) + (b0 + b1));  // nn/cpu/pool.cpp's order
}

// Input gradient element i of planes x h x w: a quarter of its window's
// output gradient, zero where an odd row or column fed no output, and with a
// mask (the pooled input; nullptr: none) zero where mask <= 0 (the relu).
DDP_HOST_DEVICE inline float avgpool2_backward_at(int64_t i, int h, int w, const float* dy, const float* mask) {
  const int oh = h / 2, ow = w / 2;
  const int col = int(i % w);
  const int64_t t = i / w;
  const int row = int(t % h);
  const int64_t p = t / h;
  if (row >= 2 * oh || col >= 2 * ow || (mask != nullptr && !(mask[i] > 0.0f))) return 0.0f;
  return 0.25f * dy[(p * oh + row / 2) * int64_t(ow) + col / 2];
}

// nn/cpu/relu.cpp's comparisons, so a NaN and a zero take the same branch on
// both devices; backward reads the output (y > 0 exactly where x > 0).
DDP_HOST_DEVICE inline float relu_at(float x) { return x > 0.0f ? x : 0.0f; }
DDP_HOST_DEVICE inline float relu_grad_at(float y, float dy) { return y > 0.0f ? dy : 0.0f; }

// The residual add (nn/cpu/add.cpp): y = a + b, then max(y, 0) with relu; its
// gradient passes where the output is positive (or everywhere without relu).
DDP_HOST_DEVICE inline float add_at(float a, float b, bool relu) {
  const float s = a + b;
  return relu ? (s > 0.0f ? s : 0.0f) : s;
}
DDP_HOST_DEVICE inline float add_grad_at(float y, float dy, bool relu) { return !relu || y > 0.0f ? dy : 0.0f; }

// Global average pooling (nn/cpu/pool.cpp): plane p's mean, summed in order, and
// the gradient of element i of planes x hw.
DDP_HOST_DEVICE inline float global_avgpool_at(int64_t p, int hw, const float* x) {
  const float inv = 1.0f / float(hw);
  float s = 0.0f;
  for (int i = 0; i < hw; ++i) s += x[p * hw + i];
  return s * inv;
}
DDP_HOST_DEVICE inline float global_avgpool_grad_at(int64_t i, int hw, const float* dy) {
  return dy[i / hw] * (1.0f / float(hw));
}

// The same over an NHWC batch (Note [channels last], nn/layout.hpp): output
// i = image * c + channel, summed in global_avgpool_at's order, so the two
// layouts give the same bits; the gradient of input element i (image,
// pixel, channel).
DDP_HOST_DEVICE inline float global_avgpool_nhwc_at(int64_t i, int c, int hw, const float* x) {
  const int64_t image = i / c;
  const int ch = int(i % c);
  const float inv = 1.0f / float(hw);
  float s = 0.0f;
  for (int p = 0; p < hw; ++p) s += x[(image * hw + p) * c + ch];
  return s * inv;
}
DDP_HOST_DEVICE inline float global_avgpool_grad_nhwc_at(int64_t i, int c, int hw, const float* dy) {
  return dy[i / (int64_t(hw) * c) * c + i % c] * (1.0f / float(hw));
}

// Note [channels last]: cuDNN's NHWC convolutions take their filters as
// KRSC (out channel, kernel row, kernel column, in channel), PyTorch's
// weights are KCRS. Element i of the KRSC copy is element krsc_to_kcrs(i)
// of the weights; rs = kernel rows x columns.
DDP_HOST_DEVICE inline int64_t krsc_to_kcrs(int64_t i, int c, int rs) {
  const int ch = int(i % c);
  const int64_t t = i / c;
  const int pos = int(t % rs);
  return (t / rs * c + ch) * rs + pos;
}

// BatchNorm2d's per-channel constants (nn/cpu/device.cpp's BatchNorm and the GPU
// kernels both take them from here). count is the number of values the
// statistics cover (every rank's with a synchronised BatchNorm).
DDP_HOST_DEVICE inline float bn_mean(double sum, double count) { return float(sum / count); }

// From the sum of squared deviations from mean: invstd, the affine scale and
// shift, and the running statistics moved by momentum m (the running variance
// takes the unbiased estimate, as torch.nn.BatchNorm2d's).
DDP_HOST_DEVICE inline void bn_train_channel(double sq, double count, double eps, double m, float mean, float w,
                                             float b, float* invstd, float* scale, float* shift, float* running_mean,
                                             float* running_var) {
  const double var = sq / count;  // biased: what normalises
  *invstd = float(1.0 / sqrt(var + eps));
  *scale = w * *invstd;
  *shift = b - mean * *scale;
  *running_mean = float((1 - m) * *running_mean + m * mean);
  *running_var = float((1 - m) * *running_var + m * var * count / (count - 1));
}

// Eval mode: the running statistics as the normalisation.
DDP_HOST_DEVICE inline void bn_eval_channel(float w, float b, float running_mean, float running_var, double eps,
                                            float* scale, float* shift) {
  *scale = float(double(w) / sqrt(double(running_var) + eps));
  *shift = b - running_mean * *scale;
}

DDP_HOST_DEVICE inline float bn_apply_at(float x, float scale, float shift) { return x * scale + shift; }

// Backward, from the channel's sum(dy) and sum(dy * (x - mean)): dx = k * (dy
// - mean_dy - (x - mean) * proj).
DDP_HOST_DEVICE inline void bn_backward_channel(float w, float invstd, double sum_dy, double sum_dy_xmu,
                                                double count, float* k, float* mean_dy, float* proj) {
  const double is = double(invstd);
  *k = float(double(w) * is);
  *mean_dy = float(sum_dy / count);
  *proj = float(sum_dy_xmu / count * is * is);
}
DDP_HOST_DEVICE inline float bn_backward_at(float x, float dy, float mean, float k, float mean_dy, float proj) {
  return k * (dy - mean_dy - (x - mean) * proj);
}

// Linear's output before its GEMM adds x W^T: element i of [batch, out] is
// the bias (zero without one).
DDP_HOST_DEVICE inline float linear_bias_at(int64_t i, int out, const float* b) {
  return b ? b[i % out] : 0.0f;
}

// Linear's bias gradient for feature o: db[o] + the sum of dy[r, o] over the
// rows, in row order (the CPU's summation order).
DDP_HOST_DEVICE inline float linear_bias_grad_at(int o, int batch, int out, const float* dy, float db) {
  float acc = db;
  for (int r = 0; r < batch; ++r) acc += dy[int64_t(r) * out + o];
  return acc;
}

// The row's arg-max: the first maximum wins ties, as torch.argmax, the CPU's
// count_correct and std::max_element (the CPU loss's shift) pick.
DDP_HOST_DEVICE inline int argmax_row(const float* z, int classes) {
  int best = 0;
  for (int c = 1; c < classes; ++c)
    if (z[c] > z[best]) best = c;
  return best;
}

// One row of softmax cross-entropy as nn/cpu/loss.cpp computes it (shifted by
// z[best], the row's max; exp and log in double): returns the row's loss and
// writes d(mean loss)/d(z) into d (if not nullptr), inv_batch being 1/batch.
// A label outside [0, classes) cannot throw on the device as the CPU does:
// the row's loss and gradient are NaN, so the epoch's loss shows it.
DDP_HOST_DEVICE inline double softmax_xent_row(const float* z, int best, int32_t label, int classes,
                                               double inv_batch, float* d) {
  if (label < 0 || label >= classes) {
    if (d)
      for (int c = 0; c < classes; ++c) d[c] = std::numeric_limits<float>::quiet_NaN();
    return std::numeric_limits<double>::quiet_NaN();
  }
  const double m = double(z[best]);
  double sum = 0.0;
  for (int c = 0; c < classes; ++c) sum += exp(double(z[c]) - m);
  const double log_sum = log(sum);
  if (d)
    for (int c = 0; c < classes; ++c) {
      const double p = exp(double(z[c]) - m - log_sum);
      d[c] = float((p - (c == label ? 1.0 : 0.0)) * inv_batch);
    }
  return log_sum - (double(z[label]) - m);
}

// Note [row-major gemm]: cuBLAS is column-major, and a row-major [r, c]
// matrix is, byte for byte, its column-major transpose [c, r] with leading
// dimension c. So x [batch, in] is x^T (in x batch, ld in), W [out, in] is
// W^T (in x out, ld in), y and dy [batch, out] are y^T, dy^T (out x batch,
// ld out), and each product is written for the transposes:
//   y^T  = W x^T      gemm(T, N, out, batch, in:  W, x)   beta 1 onto the bias
//   dW^T += x^T dy    gemm(N, T, in, out, batch:  x, dy)  beta 1 (accumulate)
//   dx^T = W^T dy^T   gemm(N, N, in, batch, out:  W, dy)  beta 0
// `gemm` is called as gemm(trans_a, trans_b, m, n, k, A, lda, B, ldb, beta, C,
// ldc) for C = op(A) op(B) + beta C, column-major, alpha 1: cublasSgemm on the
// GPU, a column-major cblas_sgemm in the test. The operands are T (float, or
// the 16-bit bits of Note [half kernels]: cublasGemmEx), C always float.
template <typename T, typename Gemm>
void linear_forward_gemm(int batch, int in, int out, const T* x, const T* w, float* y, Gemm&& gemm) {
  gemm(true, false, out, batch, in, w, in, x, in, 1.0f, y, out);
}

// dW += dy^T x when dw is not nullptr (a run of micro-shards' call takes
// none: Note [checked runs]), and dx = dy W when dx is not nullptr.
template <typename T, typename Gemm>
void linear_backward_gemm(int batch, int in, int out, const T* x, const T* w, const T* dy, float* dw, float* dx,
                          Gemm&& gemm) {
  if (dw) gemm(false, true, in, out, batch, x, in, dy, out, 1.0f, dw, in);
  if (dx) gemm(false, false, in, batch, out, w, in, dy, out, 0.0f, dx, in);
}

}  // namespace ddp::nn::kernel
