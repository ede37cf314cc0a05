// 3x3 convolutions with stride 1 and padding 1 by Winograd's F(2x2, 3x3) and
// F(4x4, 3x3) (Lavin and Gray, "Fast Algorithms for Convolutional Neural
// Networks", 2015).
//
// Note [winograd]: each MxM block of outputs ("tile", M = 2 or 4) is
// computed from the NxN block of input around it (N = M + 2) as
//   y = A^T [ sum over input channels (G g G^T) .* (B^T d B) ] A
// so the multiply-adds over channels are N^2 GEMMs, one per position xi of
// the NxN transformed tile: M[xi] (out_c x tiles) = U[xi] (out_c x in_c)
// V[xi] (in_c x tiles). Per output that is N^2 / M^2 multiply-adds per
// channel pair where im2col's GEMM does 9: 16/4 = 4 for F(2x2), 2.25x
// fewer; 36/16 = 2.25 for F(4x4), 4x fewer (less where a side is not a
// multiple of M and the last tiles are part empty: a 7x7 image takes 2x2
// tiles of 4x4, 49 of their 64 outputs used).
//
// The transforms' values cancel, so the result rounds more than a direct
// sum, F(4x4)'s more than F(2x2)'s: its points 2 and -2 bring coefficients
// up to 8 and the fractions 1/6 and 1/24. In float, on resnet18's layers,
// F(2x2) rounds to about 5e-7 of the outputs' scale, as im2col does, and
// F(4x4) to 4e-6 to 1e-5 (Conv2d.WinogradFloatRoundingPerTileSize). That
// stays below training's own noise: one resnet18 step is about as far from
// float64 PyTorch's as float32 PyTorch's is (tests/python/resnet18_step.py).
//
// The input gradient of such a layer is the same kind of convolution: dy
// (out_c channels) with the kernels transposed and turned by 180 degrees, so
// backward runs the same code. The weight gradient is the adjoint of the
// forward: dU[xi] = sum over tiles of (A dy A^T)[xi] (B^T d B)[xi], N^2
// GEMMs over the tiles, then dw = G^T dU G.
//
// Chunks of images go to the pool's threads as in conv_engine.hpp, each with
// its own V and M. A chunk's outputs come from its own images alone, so which
// thread runs it never changes them (Note [deterministic sums]). Which tile
// size a layer takes depends on its geometry and batch alone
// (winograd_tile), so the same micro-shard takes the same path on every
// rank.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/nn/cpu/conv_engine.hpp"  // for_each_chunk, aligned buffers
#include "ddp/nn/cpu/ops.hpp"
#include "ddp/nn/cpu/gemm.hpp"
#include "ddp/nn/cpu/thread_pool.hpp"

namespace ddp::nn::cpu {

namespace {

// Tile columns (images x tiles) a chunk's GEMMs get at least: fewer starve
// the GEMMs, more push V and M out of the caches, and F(4x4)'s 36 rows a
// column want fewer than F(2x2)'s 16 (measurements: bench/RESULTS.md,
// "Winograd: tile columns per chunk").
constexpr int64_t kWinogradMinColumns2 = 512;
constexpr int64_t kWinogradMinColumns4 = 128;

// Which algorithm a layer takes, by its batch's 2x2 output blocks
// (images x F(2x2) tiles; an image of 4x4 has 4, of 7x7 16, of 14x14 49).
// Winograd's fixed costs grow with out_c x in_c, not with the batch: the
// weights' transforms (forward; and backward's turned kernels and weight
// gradient) and the packing of N^2 weight matrices per chunk where im2col
// packs one of 9/N^2 the size. Only the columns repay them, F(4x4)'s 36
// matrices later than F(2x2)'s 16. Hence F(2x2) from 64 blocks, F(4x4)
// from 96, im2col below; --deterministic's micro-shards of 8 images are
// where it matters (measurements: bench/RESULTS.md, "Winograd or im2col, by
// output blocks").
constexpr int64_t kWinogradMinCallColumns = 64;
constexpr int64_t kWinogradTile4Columns = 96;

// Micro-shards that share one transform of the kernels (LaneKernel::begin_shards,
// nn/cpu/device.cpp) pay the forward's and the input gradient's weight
// transforms once per op, not per call; only the weight gradient's remain.
// That moves the break-even down to 32 blocks (winograd_applies_to_shards;
// measurements: bench/RESULTS.md, "Winograd for micro-shards").
constexpr int64_t kWinogradMinShardColumns = 32;

// A micro-shard's weight gradient on Winograd's path is N^2 GEMMs as deep as
// the shard has tiles, whose K x C outputs are written, then transformed
// back to 9 x K x C: at 512 channels 17 MB a shard for F(2x2). im2col's
// writes the 9 x K x C directly, from GEMMs four times as deep (a 2x2 block's
// pixels). On few tiles that costs more than im2col's deeper GEMMs: below
// 48 blocks im2col's (shard_weight_grad_by_im2col; measurements:
// bench/RESULTS.md, "A micro-shard's weight gradient: Winograd or im2col").
constexpr int64_t kWinogradMinShardWeightGradColumns = 48;

// F(MxM, 3x3) along one axis of a block (N = M + 2 values): B^T for the
// input (N -> N), A^T for the output (N -> M), G for the kernel (3 -> N),
// and the adjoints backward takes, A (M -> N) and G^T (N -> 3). F(2x2, 3x3)
// uses the points 0, 1, -1 and infinity, F(4x4, 3x3) also 2 and -2 (Lavin
// and Gray's matrices); the tests check each against a direct sum in
// double.
template <int M>
struct Wino;

template <>
struct Wino<2> {
  static constexpr int N = 4;
  template <typename T>
  static void input(const T* d, T* o) {
    o[0] = d[0] - d[2];
    o[1] = d[1] + d[2];
    o[2] = d[2] - d[1];
    o[3] = d[1] - d[3];
  }
  template <typename T>
  static void output(const T* m, T* y) {
    y[0] = m[0] + m[1] + m[2];
    y[1] = m[1] - m[2] - m[3];
  }
  template <typename T>
  static void output_grad(const T* dy, T* m) {
    m[0] = dy[0];
    m[1] = dy[0] + dy[1];
    m[2] = dy[0] - dy[1];
    m[3] = -dy[1];
  }
  template <typename T>
  static void weight(const T* g, T* u) {
    u[0] = g[0];
    u[1] = T(0.5) * (g[0] + g[1] + g[2]);
    u[2] = T(0.5) * (g[0] - g[1] + g[2]);
    u[3] = g[2];
  }
  template <typename T>
  static void weight_grad(const T* du, T* dg) {
    dg[0] = du[0] + T(0.5) * (du[1] + du[2]);
    dg[1] = T(0.5) * (du[1] - du[2]);
    dg[2] = T(0.5) * (du[1] + du[2]) + du[3];
  }
};

template <>
struct Wino<4> {
  static constexpr int N = 6;
  template <typename T>
  static void input(const T* d, T* o) {
    const T s12 = d[1] + d[2], d12 = d[1] - d[2], e42 = d[4] - d[2], d31 = d[3] - d[1];
    o[0] = T(4) * d[0] - T(5) * d[2] + d[4];
    o[1] = (d[3] + d[4]) - T(4) * s12;
    o[2] = (d[4] - d[3]) + T(4) * d12;
    o[3] = e42 + T(2) * d31;
    o[4] = e42 - T(2) * d31;
    o[5] = T(4) * d[1] - T(5) * d[3] + d[5];
  }
  template <typename T>
  static void output(const T* m, T* y) {
    const T s12 = m[1] + m[2], d12 = m[1] - m[2], s34 = m[3] + m[4], d34 = m[3] - m[4];
    y[0] = m[0] + s12 + s34;
    y[1] = d12 + T(2) * d34;
    y[2] = s12 + T(4) * s34;
    y[3] = d12 + T(8) * d34 + m[5];
  }
  template <typename T>
  static void output_grad(const T* dy, T* m) {
    const T e1 = dy[0] + dy[2], o1 = dy[1] + dy[3], e2 = dy[0] + T(4) * dy[2], o2 = T(2) * dy[1] + T(8) * dy[3];
    m[0] = dy[0];
    m[1] = e1 + o1;
    m[2] = e1 - o1;
    m[3] = e2 + o2;
    m[4] = e2 - o2;
    m[5] = dy[3];
  }
  template <typename T>
  static void weight(const T* g, T* u) {
    const T sixth = T(1) / T(6), twentyfourth = T(1) / T(24);
    u[0] = T(0.25) * g[0];
    u[1] = -sixth * (g[0] + g[1] + g[2]);
    u[2] = -sixth * (g[0] - g[1] + g[2]);
    u[3] = twentyfourth * (g[0] + T(2) * g[1] + T(4) * g[2]);
    u[4] = twentyfourth * (g[0] - T(2) * g[1] + T(4) * g[2]);
    u[5] = g[2];
  }
  template <typename T>
  static void weight_grad(const T* du, T* dg) {
    const T sixth = T(1) / T(6), twelfth = T(1) / T(12), twentyfourth = T(1) / T(24);
    const T s12 = du[1] + du[2], s34 = du[3] + du[4];
    dg[0] = T(0.25) * du[0] - sixth * s12 + twentyfourth * s34;
    dg[1] = sixth * (du[2] - du[1]) + twelfth * (du[3] - du[4]);
    dg[2] = sixth * (s34 - s12) + du[5];
  }
};

// out = F in F'^T for a block: f (R -> R2 values) down every column, then
// g (C -> C2) along every row. Loops of compile-time length, unrolled so
// that the blocks live in registers inside the callers' vectorised loops.
template <int R, int C, int R2, int C2, typename T, typename F, typename G>
[[gnu::always_inline]] inline void transform_2d(const T (&in)[R][C], T (&out)[R2][C2], F f, G g) {
  T mid[R2][C];
#pragma GCC unroll 8
  for (int s = 0; s < C; ++s) {
    T col[R], res[R2];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) col[r] = in[r][s];
    f(col, res);
#pragma GCC unroll 8
    for (int r = 0; r < R2; ++r) mid[r][s] = res[r];
  }
#pragma GCC unroll 8
  for (int r = 0; r < R2; ++r) g(mid[r], out[r]);
}

// out[(a C2 + b) out_stride] = (f in f^T)[a][b] + add for the block
// in[(a C + b) in_stride], a R x C block of planes: one position of each
// plane in, one of each out. Inlined always: only in its caller's loop over
// positions does it vectorise.
template <int R, int C, int R2, int C2, typename T, typename F>
[[gnu::always_inline]] inline void transform_planes(const T* in, int64_t in_stride, T* out, int64_t out_stride, F f,
                                                    T add = T(0)) {
  T a[R][C], b[R2][C2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) a[r][c] = in[(r * C + c) * in_stride];
  transform_2d(a, b, f, f);
#pragma GCC unroll 8
  for (int r = 0; r < R2; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C2; ++c) out[(r * C2 + c) * out_stride] = b[r][c] + add;
}

struct Tiles {
  int m;            // outputs per tile side
  int h, w, th, tw;  // image size; tiles down and across
  int per_image() const { return th * tw; }
  int64_t planes() const { return int64_t(m + 2) * (m + 2); }  // N^2: V's and M's planes, U's matrices
};

Tiles tiles_of(int m, int h, int w) { return {m, h, w, (h + m - 1) / m, (w + m - 1) / m}; }

// U[xi][k][c] = (G g G^T)[xi] of kernel (k, c), for k in [k0, k1); with Flip, of
// the kernel that maps dy to dx: w[c][k] turned by 180 degrees (U is then
// in_c x out_c). Per k, the C kernels' 9 taps are first copied into 9 rows of C,
// so that the transform is a loop over c that reads and writes in order,
// and vectorises.
template <int M, bool Flip, typename T>
void transform_weights(int out_c, int in_c, const T* w, T* u, int k0, int k1) {
  using W = Wino<M>;
  constexpr int N = W::N;
  const int K = Flip ? in_c : out_c, C = Flip ? out_c : in_c;
  const int64_t plane = int64_t(K) * C;
  std::vector<T> rows(size_t(9) * C);
  T* g9 = rows.data();
  for (int k = k0; k < k1; ++k) {
    for (int c = 0; c < C; ++c) {
      const T* src = w + (Flip ? int64_t(c) * in_c + k : int64_t(k) * in_c + c) * 9;
      for (int rs = 0; rs < 9; ++rs) g9[rs * C + c] = src[Flip ? 8 - rs : rs];
    }
    T* uk = u + int64_t(k) * C;
    const auto op = [](const T* in, T* out) { W::weight(in, out); };
#pragma GCC ivdep
    for (int c = 0; c < C; ++c) transform_planes<3, 3, N, N>(g9 + c, C, uk + c, plane, op);
  }
}

// Scratch values the transforms of a chunk of nb images need
// (transform_input's tile planes, transform_output's outputs,
// transform_output_grad's planes).
size_t transform_scratch(const Tiles& t, int nb) { return size_t(t.planes()) * nb * size_t(t.per_image()); }

// V[xi][c][tile] = (B^T d B)[xi] for every tile of the nb images at x (C
// planes each, in_img apart), d the N x N input block at (M i - 1, M j - 1),
// zero outside the image; tiles image after image, row after row.
//
// Note [tile planes]: per channel, the blocks are first gathered into N x N
// planes, D[a][b][tile] = d[a][b] of that tile, one strided row copy per
// tile row and block element. The transform is then one loop over the
// chunk's tiles, reading each plane and writing each row of V in order,
// which the compiler vectorises however small the images (a 4x4 image is
// one F(4x4) tile; a per-image loop would run a vector's single lane).
// Note [tile planes]' gather of one input row: D[a][b][j] = rb[M j + b],
// where rb is the row padded (rb[k] = x column k - 1, zero outside the
// image). Elements b < M of every tile are the row cut into M phases, one
// interleaved pass the compiler vectorises; elements b >= M (the N - M = 2
// a tile shares with the next) are phase b - M one tile on.
template <int M, typename T>
[[gnu::always_inline]] inline void gather_row(const T* __restrict rb, int tw, int64_t n, T* __restrict row) {
  constexpr int N = M + 2;
  for (int j = 0; j < tw; ++j)
#pragma GCC unroll 4
    for (int b = 0; b < M; ++b) row[b * n + j] = rb[M * j + b];
  for (int b = M; b < N; ++b) {
    std::copy_n(row + (b - M) * n + 1, tw - 1, row + b * n);
    row[b * n + tw - 1] = rb[M * (tw - 1) + b];
  }
}

template <int M, typename T>
void transform_input(const Tiles& t, int C, const T* x, int nb, int64_t in_img, int64_t ld, T* v, T* scratch) {
  using W = Wino<M>;
  constexpr int N = W::N;
  const int64_t plane = int64_t(C) * ld, per = t.per_image(), n = nb * per;
  T* dp = scratch;  // D[a][b] at (a N + b) n
  // The padded row: x's row at rb[1 .. w], zeros around it, as long as the
  // last tile's block reaches (M tw + N - M).
  std::vector<T> padded(static_cast<size_t>(M * t.tw + N), T(0));
  T* rb = padded.data();
  for (int c = 0; c < C; ++c) {
    for (int im = 0; im < nb; ++im) {
      const T* xc = x + im * in_img + int64_t(c) * t.h * t.w;
      for (int i = 0; i < t.th; ++i)
        for (int a = 0; a < N; ++a) {
          const int r = M * i + a - 1;
          T* row = dp + int64_t(a) * N * n + im * per + int64_t(i) * t.tw;
          if (r < 0 || r >= t.h) {
            for (int b = 0; b < N; ++b) std::fill_n(row + b * n, t.tw, T(0));
            continue;
          }
          std::copy_n(xc + int64_t(r) * t.w, t.w, rb + 1);
          gather_row<M>(rb, t.tw, n, row);
        }
    }
    T* vc = v + int64_t(c) * ld;
    const auto op = [](const T* in, T* out) { W::input(in, out); };
#pragma GCC ivdep
    for (int64_t p = 0; p < n; ++p) transform_planes<N, N, N, N>(dp + p, n, vc + p, plane, op);
  }
}

// One row of an image and its M residue planes: dst[M j + p] = src[p n + j]
// for the w columns (interleave_row), and back (deinterleave_row, which
// leaves a partial last tile's columns past w as they were). The whole
// tiles in one interleaved pass the compiler vectorises, the partial one
// after it.
template <int M, typename T>
[[gnu::always_inline]] inline void interleave_row(const T* __restrict src, int64_t n, int w, T* __restrict dst) {
  const int whole = w / M;
  for (int j = 0; j < whole; ++j)
#pragma GCC unroll 4
    for (int p = 0; p < M; ++p) dst[M * j + p] = src[p * n + j];
  for (int xx = whole * M; xx < w; ++xx) dst[xx] = src[(xx - whole * M) * n + whole];
}

template <int M, typename T>
[[gnu::always_inline]] inline void deinterleave_row(const T* __restrict src, int w, int64_t n, T* __restrict dst) {
  const int whole = w / M;
  for (int j = 0; j < whole; ++j)
#pragma GCC unroll 4
    for (int p = 0; p < M; ++p) dst[p * n + j] = src[M * j + p];
  for (int xx = whole * M; xx < w; ++xx) dst[(xx - whole * M) * n + whole] = src[xx];
}

// y (K planes of each of nb images, out_img apart) = A^T M A for every
// tile, plus bias; the last row and column of tiles are clipped to the
// image. One loop over the chunk's tiles per channel computes the M x M
// outputs of each; then they are interleaved into the rows of y.
template <int M, typename T>
void transform_output(const Tiles& t, int K, const T* m, int nb, int64_t ld, const T* bias, T* y, int64_t out_img,
                      T* scratch) {
  using W = Wino<M>;
  constexpr int N = W::N;
  const int64_t plane = int64_t(K) * ld, per = t.per_image(), n = nb * per;
  T* o = scratch;  // plane pr * M + pc: y[M i + pr][M j + pc] of image im at im per + i tw + j
  for (int k = 0; k < K; ++k) {
    const T b = bias ? bias[k] : T(0);
    const T* mk = m + int64_t(k) * ld;
    const auto op = [](const T* in, T* out) { W::output(in, out); };
#pragma GCC ivdep
    for (int64_t p = 0; p < n; ++p) transform_planes<N, N, M, M>(mk + p, plane, o + p, n, op, b);
    for (int im = 0; im < nb; ++im) {
      T* yk = y + im * out_img + int64_t(k) * t.h * t.w;
      for (int yy = 0; yy < t.h; ++yy)
        interleave_row<M>(o + int64_t(yy % M) * M * n + im * per + int64_t(yy / M) * t.tw, n, t.w,
                          yk + int64_t(yy) * t.w);
    }
  }
}

// dL/dM = A dy A^T for every tile of the nb images at dy (K planes each,
// out_img apart): the adjoint of transform_output. dy is first split into
// M x M residue planes, Q[rp][cp][tile (i, j)] = dy[M i + rp][M j + cp]
// (zero past the image's edge), so that each tile's block sits at the
// tile's own index in every plane and one loop over the chunk's tiles does
// the rest.
template <int M, typename T>
void transform_output_grad(const Tiles& t, int K, const T* dy, int nb, int64_t out_img, int64_t ld, T* m,
                           T* scratch) {
  using W = Wino<M>;
  constexpr int N = W::N;
  const int64_t plane = int64_t(K) * ld, per = t.per_image(), n = nb * per;
  T* q = scratch;  // plane rp * M + cp: dy[M i + rp][M j + cp] of image im at im per + i tw + j
  for (int k = 0; k < K; ++k) {
    if (t.h % M || t.w % M) std::fill(scratch, scratch + M * M * n, T(0));
    for (int im = 0; im < nb; ++im) {
      const T* dk = dy + im * out_img + int64_t(k) * t.h * t.w;
      for (int yy = 0; yy < t.h; ++yy)
        deinterleave_row<M>(dk + int64_t(yy) * t.w, t.w, n, q + int64_t(yy % M) * M * n + im * per +
                                                                 int64_t(yy / M) * t.tw);
    }
    T* mk = m + int64_t(k) * ld;
    const auto op = [](const T* in, T* out) { W::output_grad(in, out); };
#pragma GCC ivdep
    for (int64_t p = 0; p < n; ++p) transform_planes<M, M, N, N>(q + p, n, mk + p, plane, op);
  }
}

// dw[k][c] += G^T dU G: from the gradient of the transformed kernels (N x N
// planes of K x C) to the 3x3 kernels', the adjoint of transform_weights.
// The loop over c reads each plane in order and writes 9 rows of C (then
// added into dw's kernels), and vectorises.
template <int M, typename T>
void transform_weights_grad(int K, int C, const T* du, T* dw) {
  using W = Wino<M>;
  constexpr int N = W::N;
  const int64_t plane = int64_t(K) * C;
  std::vector<T> rows(size_t(9) * C);
  T* g9 = rows.data();
  for (int k = 0; k < K; ++k) {
    const T* duk = du + int64_t(k) * C;
    const auto op = [](const T* in, T* out) { W::weight_grad(in, out); };
#pragma GCC ivdep
    for (int c = 0; c < C; ++c) transform_planes<N, N, 3, 3>(duk + c, plane, g9 + c, C, op);
    T* dwk = dw + int64_t(k) * C * 9;
    for (int c = 0; c < C; ++c)
      for (int rs = 0; rs < 9; ++rs) dwk[int64_t(c) * 9 + rs] += g9[rs * C + c];
  }
}

// Images per chunk: at least min_columns tiles, at most an even share of
// the batch so that every thread gets a chunk.
int winograd_chunk(int batch, int64_t per, int threads, int64_t min_columns) {
  const int64_t share = (int64_t(batch) + threads - 1) / threads;
  return int(std::clamp<int64_t>((min_columns + per - 1) / per, 1, share));
}

int64_t min_columns(int m) { return m == 2 ? kWinogradMinColumns2 : kWinogradMinColumns4; }

// A thread's buffers for a chunk: V (N^2 x C x ld), M (N^2 x K x ld) and the
// transforms' scratch. reserve_buffers makes them for chunks of `chunk`
// images on `threads` threads and returns their row stride.
template <typename T>
int64_t reserve_buffers(ConvScratch<T>& s, int threads, int C, int K, const Tiles& t, int chunk) {
  const int64_t max_ld = aligned_stride<T>(int64_t(chunk) * t.per_image());
  if (int(s.thread.size()) < threads) s.thread.resize(threads);
  for (int th = 0; th < threads; ++th)
    reserve_aligned(s.thread[th], size_t(t.planes() * (C + K) * max_ld) + transform_scratch(t, chunk));
  return max_ld;
}

template <typename T>
struct Buffers {
  T *v, *m, *tmp;
};

template <typename T>
Buffers<T> buffers(ConvScratch<T>& s, const Tiles& t, int th, int C, int K, int64_t max_ld) {
  T* v = align_up(s.thread[size_t(th)].data());
  T* m = v + t.planes() * C * max_ld;
  return {v, m, m + t.planes() * K * max_ld};
}

// y = conv3x3(x) + bias over a batch of C-channel images, from U
// (transform_weights), or from U's planes packed (packed: N^2 of them).
template <int M, typename T>
void winograd_run(int batch, int C, int K, const Tiles& t, const T* x, const T* u, const PackedMatrix* packed,
                  const T* bias, T* y, ConvScratch<T>& s, ThreadPool* pool) {
  constexpr int N2 = (M + 2) * (M + 2);
  const int64_t per = t.per_image();
  const int threads = conv_threads(pool), chunk = winograd_chunk(batch, per, threads, min_columns(M));
  const int64_t max_ld = reserve_buffers(s, threads, C, K, t, chunk);
  const int64_t in_img = int64_t(C) * t.h * t.w, out_img = int64_t(K) * t.h * t.w;
  SerialBlas serial;
  for_each_chunk(pool, threads, batch, chunk, [&](int n0, int nb, int th) {
    const auto [v, m, tmp] = buffers(s, t, th, C, K, max_ld);
    const int64_t n = nb * per, ld = aligned_stride<T>(n);
    transform_input<M>(t, C, x + n0 * in_img, nb, in_img, ld, v, tmp);
    for (int xi = 0; xi < N2; ++xi)
      weights_gemm(packed ? packed + xi : nullptr, false, K, int(n), C, u ? u + int64_t(xi) * K * C : nullptr, C,
                   v + int64_t(xi) * C * ld, int(ld), m + int64_t(xi) * K * ld, int(ld));
    transform_output<M>(t, K, m, nb, ld, bias, y + n0 * out_img, out_img, tmp);
  });
}

// dw += d(loss)/d(kernels), db += d(loss)/d(bias): for every chunk the N^2
// GEMMs dU[xi] (K x C) += dM[xi] (K x tiles) V[xi]^T (tiles x C), then
// transform_weights_grad once. Chunk c adds into group c % groups's dU, the
// groups are added in order at the end (Note [deterministic sums]).
template <int M, typename T>
void winograd_weight_grad(int batch, int C, int K, const Tiles& t, const T* x, const T* dy, T* dw, T* db,
                          ConvScratch<T>& s, ThreadPool* pool) {
  constexpr int N2 = (M + 2) * (M + 2);
  const int64_t per = t.per_image();
  const int threads = conv_threads(pool), chunk = winograd_chunk(batch, per, threads, min_columns(M));
  const int64_t max_ld = reserve_buffers(s, threads, C, K, t, chunk);
  const int64_t chunks = (batch + chunk - 1) / chunk;
  const int groups = int(std::min<int64_t>(threads, chunks));
  const size_t grad_size = size_t(N2) * K * C + size_t(K);  // dU | db
  if (int(s.grad.size()) < groups) s.grad.resize(groups);
  // One chunk (a micro-shard's call) writes dU with its GEMMs (beta 0), so
  // only db needs zeros; dU is N^2 x K x C, 16 MiB at 512 channels.
  const bool one_chunk = chunks == 1;
  for (int k = 0; k < groups; ++k) {
    if (one_chunk) {
      s.grad[k].resize(grad_size);
      std::fill(s.grad[k].end() - K, s.grad[k].end(), T(0));
    } else {
      s.grad[k].assign(grad_size, T(0));
    }
  }
  const int64_t in_img = int64_t(C) * t.h * t.w, out_img = int64_t(K) * t.h * t.w;
  SerialBlas serial;
  auto run_chunk = [&](int64_t c, int group, int th) {
    const int n0 = int(c * chunk), nb = std::min(chunk, batch - n0);
    const auto [v, m, tmp] = buffers(s, t, th, C, K, max_ld);
    T* du = s.grad[group].data();
    const int64_t n = nb * per, ld = aligned_stride<T>(n);
    transform_input<M>(t, C, x + n0 * in_img, nb, in_img, ld, v, tmp);
    transform_output_grad<M>(t, K, dy + n0 * out_img, nb, out_img, ld, m, tmp);
    for (int xi = 0; xi < N2; ++xi)
      gemm(false, true, K, C, int(n), T(1), m + int64_t(xi) * K * ld, int(ld), v + int64_t(xi) * C * ld, int(ld),
           one_chunk ? T(0) : T(1), du + int64_t(xi) * K * C, C);
    if (db)
      for (int i = 0; i < nb; ++i)
        for (int k = 0; k < K; ++k)
          du[size_t(N2) * K * C + k] += row_sum(dy + (n0 + i) * out_img + int64_t(k) * t.h * t.w, t.h * t.w);
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
  transform_weights_grad<M>(K, C, s.grad[0].data(), dw);
  if (db)
    for (int k = 0; k < K; ++k) db[k] += s.grad[0][size_t(N2) * K * C + k];
}

// u = w's kernels transformed (Flip: turned, for the input gradient), the
// rows of U split over the pool's threads.
template <int M, bool Flip, typename T>
void transform_all_weights(const ConvGeom& g, const T* w, std::vector<T>& u, ThreadPool* pool) {
  constexpr int N2 = (M + 2) * (M + 2);
  u.resize(size_t(N2) * g.out_c * g.in_c);
  const int K = Flip ? g.in_c : g.out_c, parts = std::min(conv_threads(pool), K);
  if (parts <= 1) return transform_weights<M, Flip>(g.out_c, g.in_c, w, u.data(), 0, K);
  pool->parallel_for(parts, [&](int64_t part, int) {
    transform_weights<M, Flip>(g.out_c, g.in_c, w, u.data(), int(part * K / parts), int((part + 1) * K / parts));
  });
}

// pre: w already transformed (winograd_transform_weights), or nullptr;
// packed: its planes packed, or nullptr.
template <int M, typename T>
void forward_tiles(const ConvGeom& g, const T* x, const T* w, const T* b, T* y, ConvScratch<T>& s, ThreadPool* pool,
                   const T* pre, const PackedMatrix* packed) {
  if (!pre && !packed) {
    transform_all_weights<M, /*Flip=*/false>(g, w, s.winograd_weights, pool);
    pre = s.winograd_weights.data();
  }
  winograd_run<M>(g.batch, g.in_c, g.out_c, tiles_of(M, g.in_h, g.in_w), x, pre, packed, b, y, s, pool);
}

// pre: w already transformed and turned (winograd_transform_weights), or
// nullptr; packed: its planes packed, or nullptr.
template <int M, typename T>
void backward_tiles(const ConvGeom& g, const T* x, const T* w, const T* dy, T* dw, T* db, T* dx, ConvScratch<T>& s,
                    ThreadPool* pool, const T* pre, const PackedMatrix* packed) {
  const Tiles t = tiles_of(M, g.in_h, g.in_w);
  if (dw) winograd_weight_grad<M>(g.batch, g.in_c, g.out_c, t, x, dy, dw, db, s, pool);
  if (!dx) return;
  if (!pre && !packed) {
    transform_all_weights<M, /*Flip=*/true>(g, w, s.winograd_weights, pool);
    pre = s.winograd_weights.data();
  }
  winograd_run<M>(g.batch, g.out_c, g.in_c, t, dy, pre, packed, static_cast<const T*>(nullptr), dx, s, pool);
}

// The batch's 2x2 output blocks, by which winograd_applies,
// winograd_applies_to_shards and winograd_tile choose.
int64_t output_blocks(const ConvGeom& g) { return int64_t(g.batch) * tiles_of(2, g.in_h, g.in_w).per_image(); }

}  // namespace

bool winograd_fits(const ConvGeom& g) {
  // A handful of input channels gives GEMMs too thin to gain (the stem: 1).
  return g.k == 3 && g.stride == 1 && g.pad == 1 && g.in_c >= 16 && g.out_c >= 16;
}

bool winograd_applies(const ConvGeom& g) { return winograd_fits(g) && output_blocks(g) >= kWinogradMinCallColumns; }

bool winograd_applies_to_shards(const ConvGeom& g) {
  return winograd_fits(g) && output_blocks(g) >= kWinogradMinShardColumns;
}

int winograd_tile(const ConvGeom& g) { return output_blocks(g) >= kWinogradTile4Columns ? 4 : 2; }

bool shard_weight_grad_by_im2col(const ConvGeom& g) {
  return output_blocks(g) < kWinogradMinShardWeightGradColumns;
}

namespace {

int checked_tile(const ConvGeom& g, int tile) {
  check_conv_geom(g);
  if (tile == 0) tile = winograd_tile(g);
  DDP_CHECK(tile == 2 || tile == 4, "winograd: tiles of ", tile, " outputs a side (2 or 4)");
  return tile;
}

}  // namespace

template <typename T>
void winograd_conv3x3_forward(const ConvGeom& g, const T* x, const T* w, const T* b, T* y, ConvScratch<T>& s,
                              ThreadPool* pool, int tile, const T* u, const PackedMatrix* packed) {
  tile = checked_tile(g, tile);
  if (g.batch == 0) return;
  if (tile == 2) return forward_tiles<2>(g, x, w, b, y, s, pool, u, packed);
  forward_tiles<4>(g, x, w, b, y, s, pool, u, packed);
}

template <typename T>
void winograd_conv3x3_backward(const ConvGeom& g, const T* x, const T* w, const T* dy, T* dw, T* db, T* dx,
                               ConvScratch<T>& s, ThreadPool* pool, int tile, const T* u,
                               const PackedMatrix* packed) {
  tile = checked_tile(g, tile);
  if (g.batch == 0) return;
  if (tile == 2) return backward_tiles<2>(g, x, w, dy, dw, db, dx, s, pool, u, packed);
  backward_tiles<4>(g, x, w, dy, dw, db, dx, s, pool, u, packed);
}

template <typename T>
void winograd_transform_weights(const ConvGeom& g, const T* w, bool turned, int tile, std::vector<T>& u,
                                ThreadPool* pool) {
  tile = checked_tile(g, tile);
  if (tile == 2)
    return turned ? transform_all_weights<2, true>(g, w, u, pool) : transform_all_weights<2, false>(g, w, u, pool);
  turned ? transform_all_weights<4, true>(g, w, u, pool) : transform_all_weights<4, false>(g, w, u, pool);
}

void pack_winograd_planes(const ConvGeom& g, bool turned, int tile, const std::vector<float>& u,
                          std::vector<PackedMatrix>& planes, ThreadPool* pool) {
  tile = checked_tile(g, tile);
  const int n2 = (tile + 2) * (tile + 2), K = turned ? g.in_c : g.out_c, C = turned ? g.out_c : g.in_c;
  DDP_CHECK(u.size() == size_t(n2) * K * C, "winograd: ", u.size(), " transformed weights for ", n2, " planes of ",
            K, "x", C);
  planes.resize(size_t(n2));
  auto one = [&](int64_t xi, int) { planes[size_t(xi)].pack(false, K, C, u.data() + xi * K * C, C); };
  if (pool && pool->size() > 1)
    pool->parallel_for(n2, one);
  else
    for (int xi = 0; xi < n2; ++xi) one(xi, 0);
}

#define DDP_WINOGRAD(T)                                                                                           \
  template void winograd_conv3x3_forward<T>(const ConvGeom&, const T*, const T*, const T*, T*, ConvScratch<T>&,  \
                                            ThreadPool*, int, const T*, const PackedMatrix*);                     \
  template void winograd_conv3x3_backward<T>(const ConvGeom&, const T*, const T*, const T*, T*, T*, T*,         \
                                             ConvScratch<T>&, ThreadPool*, int, const T*, const PackedMatrix*);   \
  template void winograd_transform_weights<T>(const ConvGeom&, const T*, bool, int, std::vector<T>&, ThreadPool*);
DDP_WINOGRAD(float)
DDP_WINOGRAD(double)
#undef DDP_WINOGRAD

}  // namespace ddp::nn::cpu
