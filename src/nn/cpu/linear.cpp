// Fully connected layer on the CPU, W kept [out, in] as PyTorch stores it.
//
// The three GEMMs run on OpenBLAS, single-threaded, one piece per thread of
// the model's pool (Note [serial OpenBLAS] in nn/cpu/gemm.hpp): forward split by
// rows of x, the gradients by columns of `in`. So a training step never wakes
// OpenBLAS's own threads, which spin for a while after each call, competing
// with ours for the cores. One piece per thread, not more: every call packs
// its operands afresh.
#include <algorithm>

#include "ddp/nn/cpu/ops.hpp"
#include "ddp/nn/cpu/gemm.hpp"
#include "ddp/nn/cpu/thread_pool.hpp"

namespace ddp::nn::cpu {

namespace {

// Pieces a GEMM over `size` rows or columns splits into: one per thread,
// none under 16 rows or columns.
int pieces(ThreadPool* pool, int size) {
  return std::max(1, std::min(pool ? pool->size() : 1, size / 16));
}

// fn(piece) for every piece, on the pool's free threads when there are several.
template <typename Fn>
void share(ThreadPool* pool, int n, Fn&& fn) {
  SerialBlas serial;
  if (n > 1) {
    pool->parallel_for(n, [&](int64_t i, int) { fn(int(i)); });
  } else {
    fn(0);
  }
}

}  // namespace

template <typename T>
void linear_forward(int batch, int in, int out, const T* x, const T* w, const T* b, T* y,
                    ThreadPool* pool) {
  if (batch == 0) return;
  // Seed y with the bias so the GEMM adds onto it: no second pass.
  for (int r = 0; r < batch; ++r) {
    T* yr = y + int64_t(r) * out;
    if (b)
      std::copy(b, b + out, yr);
    else
      std::fill(yr, yr + out, T(0));
  }
  // y (batch x out) += x W^T, by blocks of rows.
  const int n = pieces(pool, batch), rows_per = (batch + n - 1) / n;
  share(pool, n, [&](int piece) {
    const int r0 = piece * rows_per, rows = std::min(rows_per, batch - r0);
    if (rows <= 0) return;
    gemm(false, true, rows, out, in, T(1), x + int64_t(r0) * in, in, w, in, T(1),
         y + int64_t(r0) * out, out);
  });
}

template <typename T>
void linear_backward(int batch, int in, int out, const T* x, const T* w, const T* dy, T* dw, T* db,
                     T* dx, ThreadPool* pool) {
  if (batch == 0) return;
  if (db) {
    for (int r = 0; r < batch; ++r) {
      const T* g = dy + int64_t(r) * out;
      for (int o = 0; o < out; ++o) db[o] += g[o];
    }
  }
  // dW (out x in) += dy^T x;  dx (batch x in) = dy W: by blocks of columns of
  // `in`, whole cache lines each.
  const int n = pieces(pool, in), cols_per = ((in + n - 1) / n + 15) / 16 * 16;
  share(pool, n, [&](int piece) {
    const int c0 = piece * cols_per, cols = std::min(cols_per, in - c0);
    if (cols <= 0) return;
    if (dw) gemm(true, false, out, cols, batch, T(1), dy, out, x + c0, in, T(1), dw + c0, in);
    if (dx) gemm(false, false, batch, cols, out, T(1), dy, out, w + c0, in, T(0), dx + c0, in);
  });
}

template void linear_forward<float>(int, int, int, const float*, const float*, const float*,
                                    float*, ThreadPool*);
template void linear_forward<double>(int, int, int, const double*, const double*, const double*,
                                     double*, ThreadPool*);
template void linear_backward<float>(int, int, int, const float*, const float*, const float*,
                                     float*, float*, float*, ThreadPool*);
template void linear_backward<double>(int, int, int, const double*, const double*, const double*,
                                      double*, double*, double*, ThreadPool*);

}  // namespace ddp::nn::cpu
