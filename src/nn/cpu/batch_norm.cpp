// BatchNorm2d on the CPU, in the steps nn/cpu/ops.hpp lists. Each step is one
// pass over a channel's plane of every image; channels go to the pool's
// threads, each summed in image order, so no result depends on the threads.
#include <cmath>

#include "ddp/nn/cpu/ops.hpp"
#include "ddp/nn/cpu/thread_pool.hpp"

namespace ddp::nn::cpu {

namespace {

// fn(c) for every channel, on the pool's free threads.
template <typename Fn>
void per_channel(int c, ThreadPool* pool, Fn&& fn) {
  if (pool && pool->size() > 1 && c > 1) {
    pool->parallel_for(c, [&](int64_t ch, int) { fn(int(ch)); });
  } else {
    for (int ch = 0; ch < c; ++ch) fn(ch);
  }
}

// Note [lane sums]: a channel's sums run in double over kLanes interleaved
// accumulators (element i of a plane goes to lane i % kLanes), combined in a
// fixed tree at the end. One accumulator would be a chain of dependent adds,
// as slow as the add's latency; independent lanes let the compiler keep them
// in vector registers. The order depends on the plane's size only, never on
// the threads, so the sums are as repeatable as before.
constexpr int kLanes = 8;

struct LaneSum {
  double acc[kLanes] = {};
  // Adds term(i) for i in [0, n) into the lanes.
  template <typename Fn>
  void add(int n, Fn&& term) {
    int i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int j = 0; j < kLanes; ++j) acc[j] += term(i + j);
    for (int j = 0; i + j < n; ++j) acc[j] += term(i + j);
  }
  double total() const {
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  }
};

}  // namespace

template <typename T>
void bn_sum(int batch, int c, int hw, const T* x, double* sum, ThreadPool* pool) {
  per_channel(c, pool, [&](int ch) {
    LaneSum s;
    for (int n = 0; n < batch; ++n) {
      const T* p = x + (int64_t(n) * c + ch) * hw;
      s.add(hw, [p](int i) { return double(p[i]); });
    }
    sum[ch] = s.total();
  });
}

template <typename T>
void bn_sum_sq_dev(int batch, int c, int hw, const T* x, const T* mean, double* sq, ThreadPool* pool) {
  per_channel(c, pool, [&](int ch) {
    const double m = double(mean[ch]);
    LaneSum s;
    for (int n = 0; n < batch; ++n) {
      const T* p = x + (int64_t(n) * c + ch) * hw;
      s.add(hw, [p, m](int i) {
        const double d = double(p[i]) - m;
        return d * d;
      });
    }
    sq[ch] = s.total();
  });
}

template <typename T>
void bn_apply(int batch, int c, int hw, const T* x, const T* scale, const T* shift, T* y, ThreadPool* pool) {
  per_channel(c, pool, [&](int ch) {
    const T a = scale[ch], b = shift[ch];
    for (int n = 0; n < batch; ++n) {
      const int64_t o = (int64_t(n) * c + ch) * hw;
      for (int i = 0; i < hw; ++i) y[o + i] = x[o + i] * a + b;
    }
  });
}

template <typename T>
void bn_grad_sums(int batch, int c, int hw, const T* x, const T* mean, const T* dy, double* sum_dy,
                  double* sum_dy_xmu, ThreadPool* pool) {
  per_channel(c, pool, [&](int ch) {
    const double m = double(mean[ch]);
    LaneSum s, sx;
    for (int n = 0; n < batch; ++n) {
      const T* g = dy + (int64_t(n) * c + ch) * hw;
      const T* p = x + (int64_t(n) * c + ch) * hw;
      s.add(hw, [g](int i) { return double(g[i]); });
      sx.add(hw, [g, p, m](int i) { return double(g[i]) * (double(p[i]) - m); });
    }
    sum_dy[ch] = s.total();
    sum_dy_xmu[ch] = sx.total();
  });
}

template <typename T>
void bn_backward_apply(int batch, int c, int hw, const T* x, const T* mean, const T* invstd, const T* w,
                       const T* dy, const double* sum_dy, const double* sum_dy_xmu, double count, T* dx,
                       ThreadPool* pool) {
  per_channel(c, pool, [&](int ch) {
    const double is = double(invstd[ch]);
    const T k = T(double(w[ch]) * is);                        // w * invstd
    const T mean_dy = T(sum_dy[ch] / count);                  // sum(dy) / count
    const T proj = T(sum_dy_xmu[ch] / count * is * is);       // sum(dy (x - mean)) invstd^2 / count
    const T m = mean[ch];
    for (int n = 0; n < batch; ++n) {
      const int64_t o = (int64_t(n) * c + ch) * hw;
      for (int i = 0; i < hw; ++i) dx[o + i] = k * (dy[o + i] - mean_dy - (x[o + i] - m) * proj);
    }
  });
}

#define DDP_BN_INSTANTIATE(T)                                                                                   \
  template void bn_sum<T>(int, int, int, const T*, double*, ThreadPool*);                                      \
  template void bn_sum_sq_dev<T>(int, int, int, const T*, const T*, double*, ThreadPool*);                     \
  template void bn_apply<T>(int, int, int, const T*, const T*, const T*, T*, ThreadPool*);                     \
  template void bn_grad_sums<T>(int, int, int, const T*, const T*, const T*, double*, double*, ThreadPool*);   \
  template void bn_backward_apply<T>(int, int, int, const T*, const T*, const T*, const T*, const T*,           \
                                     const double*, const double*, double, T*, ThreadPool*);
DDP_BN_INSTANTIATE(float)
DDP_BN_INSTANTIATE(double)
#undef DDP_BN_INSTANTIATE

}  // namespace ddp::nn::cpu
