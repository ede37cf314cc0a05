// 3x3 convolutions with stride 1 and padding 1 by Winograd's F(2x2, 3x3)
// (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2015).
//
// Note [winograd]: each 2x2 block of outputs ("tile") is computed from the
// 4x4 block of input around it as
//   y = A^T [ sum over input channels (G g G^T) .* (B^T d B) ] A
// so the multiply-adds over channels are 16 GEMMs, one per position xi of the
// 4x4 transformed tile: M[xi] (out_c x tiles) = U[xi] (out_c x in_c) V[xi]
// (in_c x tiles). Per output that is 16/4 = 4 multiply-adds per channel pair
// where im2col's GEMM does 9: 2.25x fewer (less where a side is odd and the
// last tile half empty). The transforms take only additions and halvings,
// but their values cancel, so the result rounds more than a direct sum (in
// double: 4e-14 of outputs up to 33). In float that stays below training's
// own noise: a resnet18 step is as close to float64 PyTorch's as before
// (tests/python/resnet18_step.py).
//
// Measured with bench_nn (resnet18, batch 128 on 1 thread, 2-core AVX-512
// EPYC): 38-40 samples/s against im2col's 28-30. A 3x3 layer's forward and
// backward are each 1.2x to 1.6x faster, not 2.25x: the transforms stream V
// and M through memory, and the 7x7 layers' last tiles are half empty.
//
// The input gradient of such a layer is the same kind of convolution: dy
// (out_c channels) with the kernels transposed and turned by 180 degrees, so
// backward runs the same code. The weight gradient is the adjoint of the
// forward: dU[xi] = sum over tiles of (A dy A^T)[xi] (B^T d B)[xi], 16 GEMMs
// over the tiles, then dw = G^T dU G.
//
// Chunks of images go to the pool's threads as in conv_engine.hpp, each with
// its own V and M. A chunk's outputs come from its own images alone, so which
// thread runs it never changes them (Note [deterministic sums]).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "ddp/nn/conv_engine.hpp"  // for_each_chunk, aligned buffers
#include "ddp/nn/cpu_ops.hpp"
#include "ddp/nn/gemm.hpp"
#include "ddp/nn/simd.hpp"

namespace ddp::nn::cpu {

namespace {

// Tile columns (images x tiles) a chunk's 16 GEMMs get at least. bench_nn
// (resnet18, batch 128, 1 thread): 128 and 512 alike, 2048 slower (V and M
// then leave the caches).
constexpr int64_t kWinogradMinColumns = 512;

// Tile columns (images x tiles) a whole call needs for Winograd to pay. Its
// fixed costs grow with out_c x in_c, not with the batch: the weights'
// transforms (forward; and backward's turned kernels and weight gradient)
// and the packing of 16 weight matrices per chunk where im2col packs one of
// 9/16 the size. Only the columns repay them. bench_nn (resnet18, 1 thread,
// AVX-512 EPYC), a layer's forward + backward, Winograd / im2col: 512
// channels on 4x4 (4 tiles an image) 2.1 at 32 columns, 1.4 at 64, 1.04 at
// 128, 0.86 at 256, 0.75 at 512; 256 channels on 7x7 (16 tiles) 1.27 at 128,
// 1.07 at 256, 0.97 at 512, 0.86 at 2048; 128 and 64 channels 0.66 to 0.76
// from 392 columns up. --deterministic's micro-shards of 8 images are where
// it matters.
constexpr int64_t kWinogradMinCallColumns = 256;

struct Tiles {
  int h, w, th, tw;  // image size; tiles down and across
  int per_image() const { return th * tw; }
};

Tiles tiles_of(int h, int w) { return {h, w, (h + 1) / 2, (w + 1) / 2}; }

// U[xi][k][c] = (G g G^T)[xi] of kernel (k, c); with flip, of the kernel that
// maps dy to dx: w[c][k] turned by 180 degrees (U is then in_c x out_c).
template <typename T>
void transform_weights(int out_c, int in_c, const T* w, bool flip, T* u) {
  const int K = flip ? in_c : out_c, C = flip ? out_c : in_c;
  const int64_t plane = int64_t(K) * C;
  for (int k = 0; k < K; ++k)
    for (int c = 0; c < C; ++c) {
      T g[3][3];
      const T* src = flip ? w + (int64_t(c) * in_c + k) * 9 : w + (int64_t(k) * in_c + c) * 9;
      for (int r = 0; r < 3; ++r)
        for (int s = 0; s < 3; ++s) g[r][s] = flip ? src[(2 - r) * 3 + (2 - s)] : src[r * 3 + s];
      T gg[4][3];  // G g
      for (int s = 0; s < 3; ++s) {
        gg[0][s] = g[0][s];
        gg[1][s] = T(0.5) * (g[0][s] + g[1][s] + g[2][s]);
        gg[2][s] = T(0.5) * (g[0][s] - g[1][s] + g[2][s]);
        gg[3][s] = g[2][s];
      }
      T* dst = u + int64_t(k) * C + c;
      for (int a = 0; a < 4; ++a) {
        dst[(a * 4 + 0) * plane] = gg[a][0];
        dst[(a * 4 + 1) * plane] = T(0.5) * (gg[a][0] + gg[a][1] + gg[a][2]);
        dst[(a * 4 + 2) * plane] = T(0.5) * (gg[a][0] - gg[a][1] + gg[a][2]);
        dst[(a * 4 + 3) * plane] = gg[a][2];
      }
    }
}

// to[0, n) = from[0, n) for the short rows of tiles (2 to 14 here): one
// masked vector where a plain loop would end in a scalar tail.
template <typename T>
inline void copy_short(const T* from, int n, T* to) {
#if DDP_NN_SIMD
  using S = simd::Vec<T>;
  int j = 0;
  for (; j + S::kLanes <= n; j += S::kLanes) S::store(to + j, S::load(from + j));
  if (j < n) {
    const auto m = simd::lanes<T>(0, n - j);
    S::store(to + j, m, S::loadz(m, from + j));
  }
#else
  std::copy_n(from, n, to);
#endif
}

// Scratch values the transforms of one image need (transform_input's parity
// planes and rows, transform_output's outputs).
size_t transform_scratch(const Tiles& t) {
  const size_t rows = size_t(t.th) * (t.tw + 1);
  return std::max(4 * size_t(t.th + 1) * (t.tw + 1) + 16 * rows, 4 * size_t(t.per_image()));
}

// V[xi][c][col0 + tile] = (B^T d B)[xi] for every tile of image x (C planes),
// d the 4x4 input block at (2i - 1, 2j - 1), zero outside the image.
//
// Note [parity planes]: the zero-padded image P (P[r][s] = x[r - 1][s - 1])
// is split by row and column parity into four planes Q[rp][cp][i][j] =
// P[2i + rp][2j + cp], each (th + 1) x (tw + 1). Element (q, s) of tile (i,
// j)'s block is then Q[q & 1][s & 1] at flat index (i + q / 2) (tw + 1) + j +
// s / 2: sixteen fixed offsets from f = i (tw + 1) + j. So the transform is
// one loop over f that the compiler vectorises, whatever the image's size;
// f = i (tw + 1) + tw is a column past the last tile, computed and dropped
// when the rows are copied into V.
template <typename T>
void transform_input(const Tiles& t, int C, const T* x, int64_t col0, int64_t ld, T* v, T* scratch) {
  const int tw1 = t.tw + 1;
  const int64_t pl = int64_t(t.th + 1) * tw1, rows = int64_t(t.th) * tw1, plane = int64_t(C) * ld;
  T* q[2][2] = {{scratch, scratch + pl}, {scratch + 2 * pl, scratch + 3 * pl}};
  T* out = scratch + 4 * pl;  // 16 x rows
  for (int c = 0; c < C; ++c) {
    const T* xc = x + int64_t(c) * t.h * t.w;
    std::fill(scratch, scratch + 4 * pl, T(0));
    for (int y = 0; y < t.h; ++y) {
      const int r = y + 1;
      T* even = q[r & 1][0] + int64_t(r >> 1) * tw1;  // P columns 0, 2, ...: x columns -1, 1, ...
      T* odd = q[r & 1][1] + int64_t(r >> 1) * tw1;   // P columns 1, 3, ...: x columns 0, 2, ...
      const T* src = xc + int64_t(y) * t.w;
      for (int j = 0; 2 * j < t.w; ++j) odd[j] = src[2 * j];
      for (int j = 1; 2 * j - 1 < t.w; ++j) even[j] = src[2 * j - 1];
    }
    const T *e0 = q[0][0], *o0 = q[0][1], *e1 = q[1][0], *o1 = q[1][1];
#pragma GCC ivdep
    for (int64_t f = 0; f < rows; ++f) {
      T d[4][4];
      for (int qq = 0; qq < 4; ++qq) {
        const int64_t at = f + (qq >> 1) * tw1;
        const T* ev = (qq & 1) ? e1 : e0;
        const T* od = (qq & 1) ? o1 : o0;
        d[qq][0] = ev[at];
        d[qq][1] = od[at];
        d[qq][2] = ev[at + 1];
        d[qq][3] = od[at + 1];
      }
      for (int s = 0; s < 4; ++s) {  // B^T d
        const T a0 = d[0][s] - d[2][s], a1 = d[1][s] + d[2][s], a2 = d[2][s] - d[1][s], a3 = d[1][s] - d[3][s];
        d[0][s] = a0;
        d[1][s] = a1;
        d[2][s] = a2;
        d[3][s] = a3;
      }
      for (int a = 0; a < 4; ++a) {  // (B^T d) B
        out[(a * 4 + 0) * rows + f] = d[a][0] - d[a][2];
        out[(a * 4 + 1) * rows + f] = d[a][1] + d[a][2];
        out[(a * 4 + 2) * rows + f] = d[a][2] - d[a][1];
        out[(a * 4 + 3) * rows + f] = d[a][1] - d[a][3];
      }
    }
    T* vc = v + int64_t(c) * ld + col0;
    for (int xi = 0; xi < 16; ++xi)
      for (int i = 0; i < t.th; ++i)
        copy_short(out + xi * rows + int64_t(i) * tw1, t.tw, vc + xi * plane + int64_t(i) * t.tw);
  }
}

// y (K planes of image n) = A^T M A for every tile, plus bias; the last row
// and column of tiles are clipped to the image. One loop over the image's
// tiles per channel computes the four outputs of each; then they are
// interleaved into the rows of y.
template <typename T>
void transform_output(const Tiles& t, int K, const T* m, int64_t col0, int64_t ld, const T* bias, T* y, T* scratch) {
  const int64_t plane = int64_t(K) * ld, per = t.per_image();
  T* o[4] = {scratch, scratch + per, scratch + 2 * per, scratch + 3 * per};  // y[2i + p][2j + q]: o[2p + q]
  for (int k = 0; k < K; ++k) {
    const T b = bias ? bias[k] : T(0);
    const T* mk = m + int64_t(k) * ld + col0;
#pragma GCC ivdep
    for (int64_t p = 0; p < per; ++p) {
      T v[16];
      for (int xi = 0; xi < 16; ++xi) v[xi] = mk[xi * plane + p];
      // A^T m: rows 0 + 1 + 2 and 1 - 2 - 3; then the same along columns.
      T a0[4], a1[4];
      for (int s = 0; s < 4; ++s) {
        a0[s] = v[s] + v[4 + s] + v[8 + s];
        a1[s] = v[4 + s] - v[8 + s] - v[12 + s];
      }
      o[0][p] = a0[0] + a0[1] + a0[2] + b;
      o[1][p] = a0[1] - a0[2] - a0[3] + b;
      o[2][p] = a1[0] + a1[1] + a1[2] + b;
      o[3][p] = a1[1] - a1[2] - a1[3] + b;
    }
    T* yk = y + int64_t(k) * t.h * t.w;
    for (int yy = 0; yy < t.h; ++yy) {
      const int i = yy >> 1, pr = yy & 1;
      const T* e = o[2 * pr] + int64_t(i) * t.tw;
      const T* od = o[2 * pr + 1] + int64_t(i) * t.tw;
      T* dst = yk + int64_t(yy) * t.w;
      const int pairs = t.w / 2;
#pragma GCC ivdep
      for (int j = 0; j < pairs; ++j) {
        dst[2 * j] = e[j];
        dst[2 * j + 1] = od[j];
      }
      if (t.w % 2) dst[t.w - 1] = e[pairs];
    }
  }
}

// dL/dM = A dy A^T for every tile of image dy (K planes): the adjoint of
// transform_output. Each tile's 2x2 block of dy (zero past the image's
// edge) comes from dy's four parity planes (Note [parity planes]) at the
// tile's own index, so one loop over the tiles does it.
template <typename T>
void transform_output_grad(const Tiles& t, int K, const T* dy, int64_t col0, int64_t ld, T* m, T* scratch) {
  const int64_t plane = int64_t(K) * ld, per = t.per_image();
  T* q[2][2] = {{scratch, scratch + per}, {scratch + 2 * per, scratch + 3 * per}};  // dy[2i + rp][2j + cp]
  for (int k = 0; k < K; ++k) {
    const T* dk = dy + int64_t(k) * t.h * t.w;
    if (t.h % 2 || t.w % 2) std::fill(scratch, scratch + 4 * per, T(0));
    for (int yy = 0; yy < t.h; ++yy) {
      T* even = q[yy & 1][0] + int64_t(yy >> 1) * t.tw;
      T* odd = q[yy & 1][1] + int64_t(yy >> 1) * t.tw;
      const T* src = dk + int64_t(yy) * t.w;
      for (int j = 0; 2 * j < t.w; ++j) even[j] = src[2 * j];
      for (int j = 0; 2 * j + 1 < t.w; ++j) odd[j] = src[2 * j + 1];
    }
    T* mk = m + int64_t(k) * ld + col0;
    const T *d00 = q[0][0], *d01 = q[0][1], *d10 = q[1][0], *d11 = q[1][1];
#pragma GCC ivdep
    for (int64_t p = 0; p < per; ++p) {
      // A d: rows d0, d0 + d1, d0 - d1, -d1; then the same along columns.
      const T r[4][2] = {{d00[p], d01[p]},
                         {d00[p] + d10[p], d01[p] + d11[p]},
                         {d00[p] - d10[p], d01[p] - d11[p]},
                         {-d10[p], -d11[p]}};
      for (int a = 0; a < 4; ++a) {
        mk[(a * 4 + 0) * plane + p] = r[a][0];
        mk[(a * 4 + 1) * plane + p] = r[a][0] + r[a][1];
        mk[(a * 4 + 2) * plane + p] = r[a][0] - r[a][1];
        mk[(a * 4 + 3) * plane + p] = -r[a][1];
      }
    }
  }
}

// dw[k][c] += G^T dU G: from the gradient of the transformed kernels (16
// planes of K x C) to the 3x3 kernels', the adjoint of transform_weights.
template <typename T>
void transform_weights_grad(int K, int C, const T* du, T* dw) {
  const int64_t plane = int64_t(K) * C;
  for (int k = 0; k < K; ++k)
    for (int c = 0; c < C; ++c) {
      const T* src = du + int64_t(k) * C + c;
      T x[4][4];
      for (int xi = 0; xi < 16; ++xi) x[xi / 4][xi % 4] = src[xi * plane];
      T t3[3][4];  // G^T X: rows 0 + (1 + 2) / 2, (1 - 2) / 2, (1 + 2) / 2 + 3
      for (int b = 0; b < 4; ++b) {
        t3[0][b] = x[0][b] + T(0.5) * (x[1][b] + x[2][b]);
        t3[1][b] = T(0.5) * (x[1][b] - x[2][b]);
        t3[2][b] = T(0.5) * (x[1][b] + x[2][b]) + x[3][b];
      }
      T* out = dw + (int64_t(k) * C + c) * 9;
      for (int r = 0; r < 3; ++r) {
        out[r * 3 + 0] += t3[r][0] + T(0.5) * (t3[r][1] + t3[r][2]);
        out[r * 3 + 1] += T(0.5) * (t3[r][1] - t3[r][2]);
        out[r * 3 + 2] += T(0.5) * (t3[r][1] + t3[r][2]) + t3[r][3];
      }
    }
}

// Images per chunk: at least kWinogradMinColumns tiles, at most an even
// share of the batch so that every thread gets a chunk.
int winograd_chunk(int batch, int64_t per, int threads) {
  const int64_t share = (int64_t(batch) + threads - 1) / threads;
  return int(std::clamp<int64_t>((kWinogradMinColumns + per - 1) / per, 1, share));
}

// A thread's buffers for a chunk: V (16 x C x ld), M (16 x K x ld) and the
// transforms' scratch. reserve_buffers makes them for chunks of `chunk`
// images on `threads` threads and returns their row stride.
template <typename T>
int64_t reserve_buffers(ConvScratch<T>& s, int threads, int C, int K, const Tiles& t, int chunk) {
  const int64_t max_ld = aligned_stride<T>(int64_t(chunk) * t.per_image());
  if (int(s.thread.size()) < threads) s.thread.resize(threads);
  for (int th = 0; th < threads; ++th)
    reserve_aligned(s.thread[th], size_t(16) * size_t(C + K) * size_t(max_ld) + transform_scratch(t));
  return max_ld;
}

template <typename T>
struct Buffers {
  T *v, *m, *tmp;
};

template <typename T>
Buffers<T> buffers(ConvScratch<T>& s, int th, int C, int K, int64_t max_ld) {
  T* v = align_up(s.thread[size_t(th)].data());
  T* m = v + int64_t(16) * C * max_ld;
  return {v, m, m + int64_t(16) * K * max_ld};
}

// y = conv3x3(x) + bias over a batch of C-channel images, from U (transform_weights).
template <typename T>
void winograd_run(int batch, int C, int K, const Tiles& t, const T* x, const T* u, const T* bias, T* y,
                  ConvScratch<T>& s, ThreadPool* pool) {
  const int64_t per = t.per_image();
  const int threads = conv_threads(pool), chunk = winograd_chunk(batch, per, threads);
  const int64_t max_ld = reserve_buffers(s, threads, C, K, t, chunk);
  const int64_t in_img = int64_t(C) * t.h * t.w, out_img = int64_t(K) * t.h * t.w;
  SerialBlas serial;
  for_each_chunk(pool, threads, batch, chunk, [&](int n0, int nb, int th) {
    const auto [v, m, tmp] = buffers(s, th, C, K, max_ld);
    const int64_t n = nb * per, ld = aligned_stride<T>(n);
    for (int i = 0; i < nb; ++i) transform_input(t, C, x + (n0 + i) * in_img, i * per, ld, v, tmp);
    for (int xi = 0; xi < 16; ++xi)
      gemm(false, false, K, int(n), C, T(1), u + int64_t(xi) * K * C, C, v + int64_t(xi) * C * ld, int(ld), T(0),
           m + int64_t(xi) * K * ld, int(ld));
    for (int i = 0; i < nb; ++i) transform_output(t, K, m, i * per, ld, bias, y + (n0 + i) * out_img, tmp);
  });
}

// dw += d(loss)/d(kernels), db += d(loss)/d(bias): for every chunk the 16
// GEMMs dU[xi] (K x C) += dM[xi] (K x tiles) V[xi]^T (tiles x C), then
// transform_weights_grad once. Chunk c adds into group c % groups's dU, the
// groups are added in order at the end (Note [deterministic sums]).
template <typename T>
void winograd_weight_grad(int batch, int C, int K, const Tiles& t, const T* x, const T* dy, T* dw, T* db,
                          ConvScratch<T>& s, ThreadPool* pool) {
  const int64_t per = t.per_image();
  const int threads = conv_threads(pool), chunk = winograd_chunk(batch, per, threads);
  const int64_t max_ld = reserve_buffers(s, threads, C, K, t, chunk);
  const int64_t chunks = (batch + chunk - 1) / chunk;
  const int groups = int(std::min<int64_t>(threads, chunks));
  const size_t grad_size = size_t(16) * K * C + size_t(K);  // dU | db
  if (int(s.grad.size()) < groups) s.grad.resize(groups);
  for (int k = 0; k < groups; ++k) s.grad[k].assign(grad_size, T(0));
  const int64_t in_img = int64_t(C) * t.h * t.w, out_img = int64_t(K) * t.h * t.w;
  SerialBlas serial;
  auto run_chunk = [&](int64_t c, int group, int th) {
    const int n0 = int(c * chunk), nb = std::min(chunk, batch - n0);
    const auto [v, m, tmp] = buffers(s, th, C, K, max_ld);
    T* du = s.grad[group].data();
    const int64_t n = nb * per, ld = aligned_stride<T>(n);
    for (int i = 0; i < nb; ++i) {
      transform_input(t, C, x + (n0 + i) * in_img, i * per, ld, v, tmp);
      transform_output_grad(t, K, dy + (n0 + i) * out_img, i * per, ld, m, tmp);
    }
    for (int xi = 0; xi < 16; ++xi)
      gemm(false, true, K, C, int(n), T(1), m + int64_t(xi) * K * ld, int(ld), v + int64_t(xi) * C * ld, int(ld),
           T(1), du + int64_t(xi) * K * C, C);
    if (db)
      for (int i = 0; i < nb; ++i)
        for (int k = 0; k < K; ++k) du[size_t(16) * K * C + k] += row_sum(dy + (n0 + i) * out_img + int64_t(k) * t.h * t.w, t.h * t.w);
  };
  auto run_group = [&](int64_t group, int th) {
    for (int64_t c = group; c < chunks; c += groups) run_chunk(c, int(group), th);
  };
  if (groups == 1) {
    run_group(0, 0);
  } else {
    pool->parallel_for(groups, run_group);
    for (int k = 1; k < groups; ++k)
      for (size_t i = 0; i < grad_size; ++i) s.grad[0][i] += s.grad[k][i];
  }
  transform_weights_grad(K, C, s.grad[0].data(), dw);
  if (db)
    for (int k = 0; k < K; ++k) db[k] += s.grad[0][size_t(16) * K * C + k];
}

}  // namespace

bool winograd_fits(const ConvGeom& g) {
  // A handful of input channels gives GEMMs too thin to gain (the stem: 1).
  return g.k == 3 && g.stride == 1 && g.pad == 1 && g.in_c >= 16 && g.out_c >= 16;
}

bool winograd_applies(const ConvGeom& g) {
  return winograd_fits(g) && int64_t(g.batch) * tiles_of(g.in_h, g.in_w).per_image() >= kWinogradMinCallColumns;
}

template <typename T>
void winograd_conv3x3_forward(const ConvGeom& g, const T* x, const T* w, const T* b, T* y, ConvScratch<T>& s,
                              ThreadPool* pool) {
  check_conv_geom(g);
  if (g.batch == 0) return;
  s.winograd_weights.resize(size_t(16) * g.out_c * g.in_c);
  transform_weights(g.out_c, g.in_c, w, /*flip=*/false, s.winograd_weights.data());
  winograd_run(g.batch, g.in_c, g.out_c, tiles_of(g.in_h, g.in_w), x, s.winograd_weights.data(), b, y, s, pool);
}

template <typename T>
void winograd_conv3x3_backward(const ConvGeom& g, const T* x, const T* w, const T* dy, T* dw, T* db, T* dx,
                               ConvScratch<T>& s, ThreadPool* pool) {
  check_conv_geom(g);
  if (g.batch == 0) return;
  winograd_weight_grad(g.batch, g.in_c, g.out_c, tiles_of(g.in_h, g.in_w), x, dy, dw, db, s, pool);
  if (!dx) return;
  s.winograd_weights.resize(size_t(16) * g.out_c * g.in_c);
  transform_weights(g.out_c, g.in_c, w, /*flip=*/true, s.winograd_weights.data());
  winograd_run(g.batch, g.out_c, g.in_c, tiles_of(g.in_h, g.in_w), dy, s.winograd_weights.data(),
               static_cast<const T*>(nullptr), dx, s, pool);
}

template void winograd_conv3x3_forward<float>(const ConvGeom&, const float*, const float*, const float*, float*,
                                              ConvScratch<float>&, ThreadPool*);
template void winograd_conv3x3_forward<double>(const ConvGeom&, const double*, const double*, const double*,
                                               double*, ConvScratch<double>&, ThreadPool*);
template void winograd_conv3x3_backward<float>(const ConvGeom&, const float*, const float*, const float*, float*,
                                               float*, float*, ConvScratch<float>&, ThreadPool*);
template void winograd_conv3x3_backward<double>(const ConvGeom&, const double*, const double*, const double*,
                                                double*, double*, double*, ConvScratch<double>&, ThreadPool*);

}  // namespace ddp::nn::cpu
