// conv2d -> ReLU -> 2x2 average pooling, fused on the CPU.
//
// Why fuse: unfused, LeNet's conv1 output (20x26x26 per image) is written by
// the conv, read and written by ReLU, read by the pool, and the same again
// backward: ~250 KB of memory traffic per image, more time than conv1's
// arithmetic. Fused, the conv output is consumed from the GEMM's chunk buffer
// while still in cache, and backward needs only one bit per element (Note
// [relu mask]) to rebuild d(conv output) from the pooled gradient.
//
// Note [relu mask]: for each image, output channel and conv output row
// oh < 2*PH (rows and columns past 2*PH x 2*PW feed no pooled output), bit j
// of byte b of the row's conv_relu_mask_row_bytes is (conv + bias > 0) at
// column 8b + j; bits at columns >= 2*PW are zero.
#include <algorithm>
#include <cstring>

#include "ddp/core/error.hpp"
#include "ddp/nn/cpu/conv_engine.hpp"
#include "ddp/nn/cpu/ops.hpp"
#include "ddp/core/simd.hpp"

namespace ddp::nn::cpu {

namespace {

void check_poolable(const ConvGeom& g) {
  check_conv_geom(g);
  DDP_CHECK(g.out_h() >= 2 && g.out_w() >= 2, "conv2d+avgpool2: conv output ", g.out_h(), "x",
            g.out_w(), " too small to pool 2x2");
}

// Relu + 2x2 mean of one conv output plane (src, OH x OW, before bias) into
// dst (PH x PW), recording the relu mask rows. Whole-vector rows (Note
// [whole-vector rows] in core/simd.hpp): the run dst is part of ends at end.
template <typename T>
void relu_pool_plane(const T* src, T bias, int OW, int PH, int PW, int64_t rb, T* dst,
                     uint8_t* mask, const T* end) {
#if DDP_NN_SIMD
  using S = simd::Vec<T>;
  using V = typename S::V;
  using M = typename S::M;
  constexpr int L = S::kLanes;
  const V bv = S::set1(bias), quarter = S::set1(T(0.25));
  for (int ph = 0; ph < PH; ++ph) {
    const T* r0 = src + int64_t(2 * ph) * OW;
    const T* r1 = r0 + OW;
    uint8_t* m0 = mask + int64_t(2 * ph) * rb;
    uint8_t* m1 = m0 + rb;
    for (int c0 = 0; c0 < 2 * PW; c0 += 2 * L) {
      const M lo = simd::lanes<T>(0, 2 * PW - c0), hi = simd::lanes<T>(0, 2 * PW - c0 - L);
      V a0 = S::add(S::loadz(lo, r0 + c0), bv), a1 = S::add(S::loadz(hi, r0 + c0 + L), bv);
      V b0 = S::add(S::loadz(lo, r1 + c0), bv), b1 = S::add(S::loadz(hi, r1 + c0 + L), bv);
      const M ka0 = S::positive(a0) & lo, ka1 = S::positive(a1) & hi;
      const M kb0 = S::positive(b0) & lo, kb1 = S::positive(b1) & hi;
      // One mask word covers L columns: L / 8 == sizeof(M) bytes.
      std::memcpy(m0 + c0 / 8, &ka0, sizeof(M));
      std::memcpy(m0 + c0 / 8 + sizeof(M), &ka1, sizeof(M));
      std::memcpy(m1 + c0 / 8, &kb0, sizeof(M));
      std::memcpy(m1 + c0 / 8 + sizeof(M), &kb1, sizeof(M));
      a0 = S::keep(ka0, a0);
      a1 = S::keep(ka1, a1);
      b0 = S::keep(kb0, b0);
      b1 = S::keep(kb1, b1);
      const V p = S::mul(S::pair_sum(S::add(a0, b0), S::add(a1, b1)), quarter);
      simd::store_within(dst + int64_t(ph) * PW + c0 / 2, end, simd::lanes<T>(0, PW - c0 / 2), p);
    }
  }
#else
  (void)end;
  for (int ph = 0; ph < PH; ++ph) {
    for (int r = 0; r < 2; ++r) std::fill(mask + (2 * ph + r) * rb, mask + (2 * ph + r + 1) * rb, 0);
    for (int pw = 0; pw < PW; ++pw) {
      T sum = T(0);
      for (int r = 0; r < 2; ++r)
        for (int c = 0; c < 2; ++c) {
          const int oh = 2 * ph + r, ow = 2 * pw + c;
          const T v = src[int64_t(oh) * OW + ow] + bias;
          if (v > T(0)) {
            sum += v;
            mask[oh * rb + ow / 8] |= uint8_t(1u << (ow % 8));
          }
        }
      dst[int64_t(ph) * PW + pw] = T(0.25) * sum;
    }
  }
#endif
}

// d(conv output) of one plane (OH x OW) from the pooled gradient g (PH x PW);
// whole-vector rows as relu_pool_plane's.
template <typename T>
void unpool_plane(const T* g, const uint8_t* mask, int OH, int OW, int PH, int PW, int64_t rb,
                  T* dst, const T* end) {
#if DDP_NN_SIMD
  using S = simd::Vec<T>;
  using V = typename S::V;
  using M = typename S::M;
  constexpr int L = S::kLanes;
  const V quarter = S::set1(T(0.25));
  for (int oh = 0; oh < OH; ++oh) {
    T* row = dst + int64_t(oh) * OW;
    if (oh >= 2 * PH) {
      for (int c0 = 0; c0 < OW; c0 += L) simd::store_within(row + c0, end, simd::lanes<T>(0, OW - c0), S::zero());
      continue;
    }
    const T* gr = g + int64_t(oh / 2) * PW;
    const uint8_t* mr = mask + oh * rb;
    for (int c0 = 0; c0 < OW; c0 += L) {
      M bits = 0;
      if (c0 < 2 * PW) {
        std::memcpy(&bits, mr + c0 / 8, sizeof(M));
        bits &= simd::lanes<T>(0, 2 * PW - c0);
      }
      const V gv = S::loadz(simd::lanes<T>(0, std::min(L / 2, PW - c0 / 2)), gr + c0 / 2);
      simd::store_within(row + c0, end, simd::lanes<T>(0, OW - c0),
                         S::keep(bits, S::mul(S::dup_pairs(gv), quarter)));
    }
  }
#else
  (void)end;
  for (int oh = 0; oh < OH; ++oh)
    for (int ow = 0; ow < OW; ++ow) {
      const bool on = oh < 2 * PH && ow < 2 * PW && (mask[oh * rb + ow / 8] >> (ow % 8) & 1u);
      dst[int64_t(oh) * OW + ow] = on ? T(0.25) * g[int64_t(oh / 2) * PW + ow / 2] : T(0);
    }
#endif
}

#if DDP_NN_SIMD
// Note [flat convolution]: LeNet's conv1 (one input channel, 3x3, no
// padding) has 9 taps. Through im2col its GEMM has depth 9 and spends its
// time packing, while im2col's columns, the GEMM's output and, backward, dy's
// matrix each stream through memory: the layer ran at a fifth of the speed
// of conv2's arithmetic (bench/RESULTS.md, "LeNet on AVX2"). Without padding
// and at stride 1, tap (c, kh, kw) of output pixel (oh, ow) reads
// x[c][oh + kh][ow + kw]. Lay the output out with the input's row stride W,
// q = oh*W + ow: the tap reads x_c[q + kh*W + kw], one shifted run of the
// flat input. A channel's plane is then nt multiply-adds of contiguous
// vectors, with no masks; a row's columns [OW, W) hold values nothing reads
// (forward) and zero gradients (backward). One plane at a time, in L1:
// forward, the plane and then its ReLU and pooling (relu_pool_plane, which
// reads rows W apart); backward, the unpooled gradient (unpool_plane, rows W
// apart) and then its bias sum and tap sums. Each sum runs in a fixed order
// (images in chunks, chunk c in group c % groups as Note [deterministic
// sums] in conv_engine.hpp), so a run repeats bit for bit.
constexpr int kFlatMaxTaps = 16;
constexpr int kFlatChunkImages = 8;
constexpr int kFlatVectors = 8;  // a pass of the forward: 8 chains of multiply-adds

bool flat_conv_fits(const ConvGeom& g) { return g.stride == 1 && g.pad == 0 && g.in_c * g.k * g.k <= kFlatMaxTaps; }

// The flat layout's offsets and sizes, and a thread's buffers in it: the
// image copied with zeros after it (the last runs read past it), and a plane.
template <typename T>
struct Flat {
  static constexpr int L = simd::Vec<T>::kLanes;
  int nt = 0;
  int64_t off[kFlatMaxTaps] = {};
  int64_t img = 0, nq = 0, nq_round = 0, x_size = 0;

  explicit Flat(const ConvGeom& g) : nt(g.in_c * g.k * g.k) {
    const int64_t plane = int64_t(g.in_h) * g.in_w;
    img = g.in_c * plane;
    nq = int64_t(g.out_h()) * g.in_w;
    nq_round = (nq + kFlatVectors * L - 1) / (kFlatVectors * L) * (kFlatVectors * L);
    for (int t = 0; t < nt; ++t) {
      const int kw = t % g.k, kh = t / g.k % g.k, c = t / (g.k * g.k);
      off[t] = c * plane + int64_t(kh) * g.in_w + kw;
      x_size = std::max(x_size, off[t] + nq_round);
    }
    x_size = std::max(x_size, img);
  }
  size_t scratch() const { return size_t(x_size + nq_round); }
  // Image x into xp, zeros after it.
  void load(const T* x, T* xp) const {
    std::copy(x, x + img, xp);
    std::fill(xp + img, xp + x_size, T(0));
  }
};

// P[q] = sum over taps t of w[t] * xp[off[t] + q], q < f.nq_round.
template <typename T>
void flat_conv_plane(const Flat<T>& f, const T* xp, const T* w, T* P) {
  using S = simd::Vec<T>;
  using V = typename S::V;
  constexpr int L = S::kLanes, B = kFlatVectors;
  for (int64_t q = 0; q < f.nq_round; q += B * L) {
    V acc[B];
    for (int j = 0; j < B; ++j) acc[j] = S::zero();
    for (int t = 0; t < f.nt; ++t) {
      const V wv = S::set1(w[t]);
      const T* src = xp + f.off[t] + q;
      for (int j = 0; j < B; ++j) acc[j] = S::fma(wv, S::load(src + j * L), acc[j]);
    }
    for (int j = 0; j < B; ++j) S::store(P + q + j * L, acc[j]);
  }
}

// dw[t] += sum over q of P[q] * xp[off[t] + q]: taps in blocks of 8, 4, 2, 1,
// each a compile-time count, so that the sums stay in registers.
template <typename T, int B>
void flat_tap_sums(const Flat<T>& f, const T* xp, const T* P, int t0, T* dw) {
  using S = simd::Vec<T>;
  using V = typename S::V;
  constexpr int L = S::kLanes;
  V acc[B];
  for (int j = 0; j < B; ++j) acc[j] = S::zero();
  for (int64_t q = 0; q < f.nq_round; q += L) {
    const V p = S::load(P + q);
    for (int j = 0; j < B; ++j) acc[j] = S::fma(p, S::load(xp + f.off[t0 + j] + q), acc[j]);
  }
  for (int j = 0; j < B; ++j) dw[t0 + j] += S::sum(acc[j]);
}

template <typename T>
void flat_weight_grad(const Flat<T>& f, const T* xp, const T* P, T* dw) {
  int t = 0;
  for (; t + 8 <= f.nt; t += 8) flat_tap_sums<T, 8>(f, xp, P, t, dw);
  if (t + 4 <= f.nt) flat_tap_sums<T, 4>(f, xp, P, t, dw), t += 4;
  if (t + 2 <= f.nt) flat_tap_sums<T, 2>(f, xp, P, t, dw), t += 2;
  if (t < f.nt) flat_tap_sums<T, 1>(f, xp, P, t, dw);
}

template <typename T>
void flat_forward(const ConvGeom& g, const T* x, const T* w, const T* b, T* y, uint8_t* mask, ConvScratch<T>& s,
                  ThreadPool* pool) {
  const Flat<T> f(g);
  const int PH = g.out_h() / 2, PW = g.out_w() / 2, threads = conv_threads(pool);
  const int64_t rb = conv_relu_mask_row_bytes(g), plane_mask = 2 * PH * rb, out_img = int64_t(g.out_c) * PH * PW;
  if (int(s.thread.size()) < threads) s.thread.resize(threads);
  for (int t = 0; t < threads; ++t) reserve_aligned(s.thread[t], f.scratch());
  for_each_chunk(pool, threads, g.batch, kFlatChunkImages, [&](int n0, int nb, int t) {
    T* xp = align_up(s.thread[t].data());
    T* P = xp + f.x_size;
    for (int i = n0; i < n0 + nb; ++i) {
      f.load(x + i * f.img, xp);
      for (int o = 0; o < g.out_c; ++o) {
        flat_conv_plane(f, xp, w + int64_t(o) * f.nt, P);
        // The image's planes of y, in address order.
        const int64_t plane = int64_t(i) * g.out_c + o;
        relu_pool_plane(P, b ? b[o] : T(0), g.in_w, PH, PW, rb, y + plane * PH * PW, mask + plane * plane_mask,
                        y + (i + 1) * out_img);
      }
    }
  });
}

// Adds the weight and bias gradients (db may be nullptr); no input gradient.
template <typename T>
void flat_backward(const ConvGeom& g, const T* x, const uint8_t* mask, const T* dy, T* dw, T* db, ConvScratch<T>& s,
                   ThreadPool* pool) {
  const Flat<T> f(g);
  const int OH = g.out_h(), PH = OH / 2, PW = g.out_w() / 2, threads = conv_threads(pool);
  const int64_t rb = conv_relu_mask_row_bytes(g), plane_mask = 2 * PH * rb;
  if (int(s.thread.size()) < threads) s.thread.resize(threads);
  for (int t = 0; t < threads; ++t) reserve_aligned(s.thread[t], f.scratch());
  const int64_t chunks = (g.batch + kFlatChunkImages - 1) / kFlatChunkImages;
  for_each_chunk_grouped(pool, threads, chunks, size_t(g.out_c) * f.nt, size_t(g.out_c), dw, db, s,
                         [&](int64_t c, T* dw_t, T* db_t, int t) {
    T* xp = align_up(s.thread[t].data());
    T* P = xp + f.x_size;
    const int n0 = int(c * kFlatChunkImages), n1 = std::min(g.batch, n0 + kFlatChunkImages);
    for (int i = n0; i < n1; ++i) {
      f.load(x + i * f.img, xp);
      for (int o = 0; o < g.out_c; ++o) {
        const int64_t plane = int64_t(i) * g.out_c + o;
        unpool_plane(dy + plane * PH * PW, mask + plane * plane_mask, OH, g.in_w, PH, PW, rb, P, P + f.nq);
        std::fill(P + f.nq, P + f.nq_round, T(0));
        if (db_t) db_t[o] += row_sum(P, int(f.nq));
        flat_weight_grad(f, xp, P, dw_t + int64_t(o) * f.nt);
      }
    }
  });
}
#endif

}  // namespace

int64_t conv_relu_mask_row_bytes(const ConvGeom& g) {
  // Whole 32-column words, so a vector's mask word never straddles rows.
  return 4 * ((g.out_w() / 2 + 15) / 16);
}

int64_t conv_relu_mask_bytes(const ConvGeom& g) {
  return int64_t(g.batch) * g.out_c * 2 * (g.out_h() / 2) * conv_relu_mask_row_bytes(g);
}

template <typename T>
void conv2d_relu_avgpool2_forward(const ConvGeom& g, const T* x, const T* w, const T* b, T* y,
                                  uint8_t* mask, ConvScratch<T>& s, ThreadPool* pool) {
  check_poolable(g);
#if DDP_NN_SIMD
  if (flat_conv_fits(g)) return flat_forward(g, x, w, b, y, mask, s, pool);
#endif
  const int OW = g.out_w(), OHW = g.out_h() * OW, PH = g.out_h() / 2, PW = OW / 2;
  const int64_t rb = conv_relu_mask_row_bytes(g), plane_mask = 2 * PH * rb;
  conv_forward_chunks(g, x, w, s, pool, nullptr, [&](int n0, int nb, const T* out, int64_t ld) {
    for (int i = 0; i < nb; ++i)
      for (int oc = 0; oc < g.out_c; ++oc) {
        const int64_t plane = int64_t(n0 + i) * g.out_c + oc;
        // The chunk's planes of y, written in address order.
        relu_pool_plane(out + int64_t(oc) * ld + int64_t(i) * OHW, b ? b[oc] : T(0), OW, PH, PW,
                        rb, y + plane * PH * PW, mask + plane * plane_mask,
                        y + int64_t(n0 + nb) * g.out_c * PH * PW);
      }
  });
}

template <typename T>
void conv2d_relu_avgpool2_backward(const ConvGeom& g, const T* x, const T* w, const uint8_t* mask,
                                   const T* dy, T* dw, T* db, T* dx, ConvScratch<T>& s, ThreadPool* pool) {
  check_poolable(g);
#if DDP_NN_SIMD
  // The flat path has no input gradient (LeNet's conv1 needs none); with one
  // wanted, im2col's path below, from the same ReLU mask.
  if (flat_conv_fits(g) && !dx) {
    if (dw) flat_backward(g, x, mask, dy, dw, db, s, pool);
    return;
  }
#endif
  const int OH = g.out_h(), OW = g.out_w(), OHW = OH * OW, PH = OH / 2, PW = OW / 2;
  const int64_t rb = conv_relu_mask_row_bytes(g), plane_mask = 2 * PH * rb;
  conv_backward_chunks(g, x, w, dw, db, dx, s, pool, nullptr, [&](int n0, int nb, T* dyc, int64_t ld) {
    for (int i = 0; i < nb; ++i)
      for (int oc = 0; oc < g.out_c; ++oc) {
        const int64_t plane = int64_t(n0 + i) * g.out_c + oc;
        // Row oc of dyc: the chunk's planes, written in address order.
        unpool_plane(dy + plane * PH * PW, mask + plane * plane_mask, OH, OW, PH, PW, rb,
                     dyc + int64_t(oc) * ld + int64_t(i) * OHW, dyc + int64_t(oc) * ld + int64_t(nb) * OHW);
      }
  });
}

template void conv2d_relu_avgpool2_forward<float>(const ConvGeom&, const float*, const float*, const float*,
                                                  float*, uint8_t*, ConvScratch<float>&, ThreadPool*);
template void conv2d_relu_avgpool2_forward<double>(const ConvGeom&, const double*, const double*, const double*,
                                                   double*, uint8_t*, ConvScratch<double>&, ThreadPool*);
template void conv2d_relu_avgpool2_backward<float>(const ConvGeom&, const float*, const float*, const uint8_t*,
                                                   const float*, float*, float*, float*, ConvScratch<float>&,
                                                   ThreadPool*);
template void conv2d_relu_avgpool2_backward<double>(const ConvGeom&, const double*, const double*,
                                                    const uint8_t*, const double*, double*, double*, double*,
                                                    ConvScratch<double>&, ThreadPool*);

}  // namespace ddp::nn::cpu
