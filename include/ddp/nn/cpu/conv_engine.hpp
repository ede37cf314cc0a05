// The chunked conv driver shared by the plain and the fused conv ops: it owns
// the im2col + GEMM skeleton and the threading; callers supply what happens
// to the GEMM output (forward) or where dy comes from (backward).
//
// Note [conv chunks]: a per-image GEMM for LeNet's conv2 is 50x81x500, too
// small to run near peak. So im2col lays a chunk of images side by side,
// col = [C*k*k][chunk*OH*OW], and one GEMM covers the chunk. The chunk is
// sized so col and the GEMM output stay in L2 next to OpenBLAS's packed copy
// of col: im2col writes them and the GEMM reads them straight back. Backward
// rebuilds col rather than keeping it from forward: rebuilding from the
// (small, cached) input is cheaper than streaming a batch-sized col from
// memory. Chunks go to whichever thread is free, each thread with its own
// buffers and its own single-threaded GEMMs (Note [serial OpenBLAS] in
// nn/cpu/gemm.hpp); weight gradients are summed per thread and added up at the end.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/nn/cpu/ops.hpp"
#include "ddp/nn/cpu/gemm.hpp"
#include "ddp/nn/cpu/im2col.hpp"
#include "ddp/nn/cpu/packed_gemm.hpp"
#include "ddp/core/simd.hpp"
#include "ddp/nn/cpu/thread_pool.hpp"

namespace ddp::nn::cpu {

// Bytes of im2col columns + GEMM output one chunk may use: a quarter of a
// 2 MiB L2, as OpenBLAS copies col once more; larger chunks push conv1's
// GEMMs out of OpenBLAS's small-matrix kernels (measurements:
// bench/RESULTS.md, "Convolution chunks").
constexpr int64_t kConvChunkBytes = int64_t(512) << 10;

// Columns (images x output pixels) a chunk's GEMMs get at least, whatever the
// budget above says. Deep layers have many channels on few pixels (ResNet-18's
// last block: 4608 x 16 columns an image, 512 filters): a one-image chunk
// makes OpenBLAS pack the 9 MiB weight matrix for a 16-column product, and
// the weight gradient then takes rank-16 updates (measurements:
// bench/RESULTS.md, "Convolution chunks").
constexpr int64_t kConvMinColumns = 1024;

// Images per chunk: the cache budget, raised to kConvMinColumns, and at most
// an even share of the batch so that every thread gets a chunk.
template <typename T>
int conv_chunk_images(const ConvGeom& g, int threads) {
  const int64_t pixels = int64_t(g.out_h()) * g.out_w();
  const int64_t per_image = int64_t(g.in_c * g.k * g.k + g.out_c) * pixels * int64_t(sizeof(T));
  const int64_t budget = std::max(kConvChunkBytes / per_image, (kConvMinColumns + pixels - 1) / pixels);
  const int64_t share = (int64_t(g.batch) + threads - 1) / threads;
  return int(std::clamp<int64_t>(std::min(budget, share), 1, std::max(1, g.batch)));
}

// Chunk buffers' rows start on 64-byte boundaries: vector loads and stores
// along a row (im2col, the epilogues, OpenBLAS's packing) then never split a
// cache line.
constexpr int64_t kRowAlignBytes = 64;

template <typename T>
int64_t aligned_stride(int64_t n) {
  constexpr int64_t a = kRowAlignBytes / int64_t(sizeof(T));
  return (n + a - 1) / a * a;
}

// The first element of p's buffer on a 64-byte boundary.
template <typename T>
T* align_up(T* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  const uintptr_t a = uintptr_t(kRowAlignBytes);
  return p + ((a - addr % a) % a) / sizeof(T);
}

// Grows buf so that n elements fit from align_up(buf.data()).
template <typename T>
void reserve_aligned(std::vector<T>& buf, size_t n) {
  const size_t need = n + size_t(kRowAlignBytes) / sizeof(T);
  if (buf.size() < need) buf.resize(need);
}

// Sum of n elements; vectorised by hand because without -ffast-math the
// compiler must keep a float sum in order.
template <typename T>
T row_sum(const T* p, int n) {
#if DDP_NN_SIMD
  using S = simd::Vec<T>;
  constexpr int L = S::kLanes;
  typename S::V a0 = S::zero(), a1 = S::zero();
  int i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    a0 = S::add(a0, S::load(p + i));
    a1 = S::add(a1, S::load(p + i + L));
  }
  for (; i < n; i += L) a0 = S::add(a0, S::loadz(simd::lanes<T>(0, n - i), p + i));
  return S::sum(S::add(a0, a1));
#else
  T s = T(0);
  for (int i = 0; i < n; ++i) s += p[i];
  return s;
#endif
}

// c (m x n) = op(w) b, the product of a layer's weights and a chunk's
// columns: gemm_packed where the caller packed op(w) beforehand (Note
// [packed weights]; float only), OpenBLAS otherwise.
template <typename T>
void weights_gemm(const PackedMatrix* packed, bool trans_w, int m, int n, int k, const T* w, int ldw, const T* b,
                  int ldb, T* c, int ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (packed) return gemm_packed(*packed, n, b, ldb, c, ldc);
  }
  DDP_CHECK(!packed, "packed gemm: float only");
  gemm(trans_w, false, m, n, k, T(1), w, ldw, b, ldb, T(0), c, ldc);
}

// Threads that may take chunks (each needs its own buffers).
inline int conv_threads(ThreadPool* pool) { return pool ? pool->size() : 1; }

// Runs chunk(n0, nb, t) over the batch in chunks of `chunk` images, on the
// pool's free threads (Note [late workers] in thread_pool.hpp); t names the
// thread, for its buffers.
template <typename Fn>
void for_each_chunk(ThreadPool* pool, int threads, int batch, int chunk, Fn&& fn) {
  const int64_t chunks = (batch + chunk - 1) / chunk;
  auto one = [&](int64_t c, int t) {
    const int n0 = int(c * chunk);
    fn(n0, std::min(chunk, batch - n0), t);
  };
  if (threads == 1) {
    for (int64_t c = 0; c < chunks; ++c) one(c, 0);
  } else {
    pool->parallel_for(chunks, one);
  }
}

// Forward: epilogue(n0, nb, out, ld) consumes the GEMM output out[oc*ld + i*OHW + q]
// of images [n0, n0 + nb) (ld >= nb*OHW, rows aligned). packed: w packed
// (out_c x C*k*k), or nullptr.
template <typename T, typename Epilogue>
void conv_forward_chunks(const ConvGeom& g, const T* x, const T* w, ConvScratch<T>& s,
                         ThreadPool* pool, const PackedMatrix* packed, Epilogue&& epilogue) {
  check_conv_geom(g);
  if (g.batch == 0) return;
  const int OHW = g.out_h() * g.out_w(), ckk = g.in_c * g.k * g.k;
  const int threads = conv_threads(pool), chunk = conv_chunk_images<T>(g, threads);
  const int64_t in_img = int64_t(g.in_c) * g.in_h * g.in_w;
  const int64_t max_ld = aligned_stride<T>(int64_t(chunk) * OHW);
  if (int(s.thread.size()) < threads) s.thread.resize(threads);
  for (int t = 0; t < threads; ++t)
    reserve_aligned(s.thread[t], size_t(ckk + g.out_c) * size_t(max_ld));

  SerialBlas serial;
  for_each_chunk(pool, threads, g.batch, chunk, [&](int n0, int nb, int t) {
    T* col = align_up(s.thread[t].data());
    T* out = col + int64_t(ckk) * max_ld;
    const int n = nb * OHW;
    const int64_t ld = aligned_stride<T>(n);
    im2col(g, x + n0 * in_img, nb, ld, col);
    weights_gemm(packed, false, g.out_c, n, ckk, w, ckk, col, int(ld), out, int(ld));
    epilogue(n0, nb, out, ld);
  });
}

// Note [deterministic sums]: chunk c belongs to group c % groups; a group's
// partial parameter gradients are summed in chunk order by whichever thread
// takes it, and the groups are added in order at the end. Which thread ran
// what then never changes the result, so a run repeats bit for bit (and a
// resumed run matches an uninterrupted one).
//
// Runs fn(c, dw_t, db_t, t) for the chunks c in [0, chunks) so, t naming the
// thread: dw_t, db_t are where chunk c's gradients go, dw and db themselves
// for one group, the group's own sums (in s.grad) for several, which are then
// added into dw (nw values) and db (nbias) in group order. dw nullptr: none
// (dw_t nullptr); db only with dw.
template <typename T, typename Fn>
void for_each_chunk_grouped(ThreadPool* pool, int threads, int64_t chunks, size_t nw, size_t nbias, T* dw, T* db,
                            ConvScratch<T>& s, Fn&& fn) {
  const int groups = int(std::max<int64_t>(1, std::min<int64_t>(threads, chunks)));
  if (groups > 1 && dw) {
    if (int(s.grad.size()) < groups) s.grad.resize(groups);
    for (int k = 0; k < groups; ++k) s.grad[k].assign(nw + nbias, T(0));
  }
  auto run_group = [&](int64_t group, int t) {
    T* dw_t = !dw ? nullptr : groups == 1 ? dw : s.grad[group].data();
    T* db_t = !dw || !db ? nullptr : groups == 1 ? db : s.grad[group].data() + nw;
    for (int64_t c = group; c < chunks; c += groups) fn(c, dw_t, db_t, t);
  };
  if (groups == 1) return run_group(0, 0);
  pool->parallel_for(groups, run_group);
  for (int k = 0; k < groups && dw; ++k) {
    const T* part = s.grad[k].data();
    for (size_t i = 0; i < nw; ++i) dw[i] += part[i];
    if (db)
      for (size_t o = 0; o < nbias; ++o) db[o] += part[nw + o];
  }
}

// Backward: source(n0, nb, dyc, ld) writes d(loss)/d(conv output) of images
// [n0, n0 + nb) as dyc[oc*ld + i*OHW + q]. Adds into dw, db (nullptr: none;
// db only with dw); overwrites dx (nullptr: not wanted). packed: w^T packed
// (C*k*k x out_c), or nullptr.
template <typename T, typename Source>
void conv_backward_chunks(const ConvGeom& g, const T* x, const T* w, T* dw, T* db, T* dx,
                          ConvScratch<T>& s, ThreadPool* pool, const PackedMatrix* packed, Source&& source) {
  check_conv_geom(g);
  if (g.batch == 0) return;
  const int OHW = g.out_h() * g.out_w(), ckk = g.in_c * g.k * g.k, oc = g.out_c;
  const int threads = conv_threads(pool), chunk = conv_chunk_images<T>(g, threads);
  const int64_t in_img = int64_t(g.in_c) * g.in_h * g.in_w;
  if (int(s.thread.size()) < threads) s.thread.resize(threads);
  const int64_t max_ld = aligned_stride<T>(int64_t(chunk) * OHW);
  for (int t = 0; t < threads; ++t) reserve_aligned(s.thread[t], size_t(ckk + oc) * size_t(max_ld));
  const int64_t chunks = (g.batch + chunk - 1) / chunk;
  SerialBlas serial;
  for_each_chunk_grouped(pool, threads, chunks, size_t(oc) * ckk, size_t(oc), dw, db, s,
                         [&](int64_t c, T* dw_t, T* db_t, int t) {
    const int n0 = int(c * chunk), nb = std::min(chunk, g.batch - n0);
    T* col = align_up(s.thread[t].data());
    T* dyc = col + int64_t(ckk) * max_ld;
    const int n = nb * OHW;
    const int64_t ld = aligned_stride<T>(n);
    source(n0, nb, dyc, ld);
    if (db_t)
      for (int o = 0; o < oc; ++o) db_t[o] += row_sum(dyc + int64_t(o) * ld, n);
    // dW += dy col^T; then col = W^T dy, d(col), for dx.
    if (dw_t) {
      im2col(g, x + n0 * in_img, nb, ld, col);
      gemm(false, true, oc, ckk, n, T(1), dyc, int(ld), col, int(ld), T(1), dw_t, ckk);
    }
    if (dx) {
      weights_gemm(packed, true, ckk, n, oc, w, ckk, dyc, int(ld), col, int(ld));
      col2im(g, col, nb, ld, dx + n0 * in_img);
    }
  });
}

}  // namespace ddp::nn::cpu
