// im2col / col2im for a chunk of images. Stride-1 rows are moved with masked
// vector loads (simd.hpp) and whole-vector stores: LeNet's rows are 10 to 28 wide.
#include "ddp/nn/cpu/im2col.hpp"

#include <algorithm>

#include "ddp/core/simd.hpp"

namespace ddp::nn::cpu {

namespace {

// Output columns [lo, hi) read an in-range input column for kernel column kw;
// the others read padding. Stride 1 only.
inline void valid_cols(const ConvGeom& g, int kw, int& lo, int& hi) {
  lo = std::max(0, g.pad - kw);
  hi = std::min(g.out_w(), g.in_w + g.pad - kw);
  if (hi < lo) hi = lo;
}

#if DDP_NN_SIMD
constexpr int kMaxRowVectors = 4;

// Stride 1, output rows of at most kMaxRowVectors vectors (LeNet: 28 and 10
// wide): masked loads with the masks hoisted out of the loops, whole-vector
// stores (Note [whole-vector rows] in core/simd.hpp).
template <typename T>
void im2col_rows(const ConvGeom& g, const T* x, int nb, int64_t ld, T* col) {
  using S = simd::Vec<T>;
  using M = typename S::M;
  constexpr int L = S::kLanes;
  const int OH = g.out_h(), OW = g.out_w(), W = g.in_w;
  const int nv = (OW + L - 1) / L;
  const int64_t plane = int64_t(g.in_h) * W, img = int64_t(g.in_c) * plane;
  const M full = simd::lanes<T>(0, L);
  M ldm[kMaxRowVectors], st[kMaxRowVectors];
  for (int v = 0; v < nv; ++v) st[v] = simd::lanes<T>(0, OW - v * L);
  for (int c = 0; c < g.in_c; ++c) {
    for (int kh = 0; kh < g.k; ++kh) {
      // Output rows [oh_lo, oh_hi) read input rows; the others are padding.
      const int oh_lo = std::max(0, g.pad - kh), oh_hi = std::min(OH, g.in_h + g.pad - kh);
      for (int kw = 0; kw < g.k; ++kw) {
        int lo, hi;
        valid_cols(g, kw, lo, hi);
        for (int v = 0; v < nv; ++v) ldm[v] = simd::lanes<T>(lo - v * L, hi - v * L);
        T* dst = col + (int64_t(c * g.k + kh) * g.k + kw) * ld;
        const T* end = dst + int64_t(nb) * OH * OW;
        // Row oh of image i starts at base + i*img + oh*W; only lanes in ldm
        // are read, and those lie inside the row.
        const T* base = x + c * plane + (kh - g.pad) * int64_t(W) + (kw - g.pad);
        // Lanes [v*L, v*L + L) of every row of the run, rows in address
        // order, with the mask fixed (hoisted) for the loop.
        auto lanes_of_rows = [&](int v, auto load) {
          T* d = dst + v * L;
          const T* b = base + v * L;
          for (int i = 0; i < nb; ++i, b += img) {
            int oh = 0;
            for (; oh < oh_lo; ++oh, d += OW) simd::store_within(d, end, st[v], S::zero());
            for (; oh < oh_hi; ++oh, d += OW) simd::store_within(d, end, st[v], load(b + oh * W));
            for (; oh < OH; ++oh, d += OW) simd::store_within(d, end, st[v], S::zero());
          }
        };
        // The last vectors first: a row's last vector reaches past the row
        // only into the next rows' earlier vectors, which come after it
        // (Note [whole-vector rows] in core/simd.hpp).
        for (int v = nv - 1; v >= 0; --v) {
          const M m = ldm[v];
          if (m == full)
            lanes_of_rows(v, [](const T* p) { return S::load(p); });
          else
            lanes_of_rows(v, [m](const T* p) { return S::loadz(m, p); });
        }
      }
    }
  }
}
#endif

}  // namespace

template <typename T>
void im2col(const ConvGeom& g, const T* x, int nb, int64_t ld, T* col) {
  const int OH = g.out_h(), OW = g.out_w(), OHW = OH * OW;
  const int64_t plane = int64_t(g.in_h) * g.in_w;
#if DDP_NN_SIMD
  if (g.stride == 1 && OW <= kMaxRowVectors * simd::Vec<T>::kLanes) {
    im2col_rows(g, x, nb, ld, col);
    return;
  }
#endif
  for (int c = 0; c < g.in_c; ++c) {
    for (int kh = 0; kh < g.k; ++kh) {
      for (int kw = 0; kw < g.k; ++kw) {
        T* row = col + (int64_t(c * g.k + kh) * g.k + kw) * ld;
        int lo = 0, hi = OW;
        if (g.stride == 1) valid_cols(g, kw, lo, hi);
        for (int i = 0; i < nb; ++i) {
          const T* xc = x + (int64_t(i) * g.in_c + c) * plane;
          T* dst = row + int64_t(i) * OHW;
          for (int oh = 0; oh < OH; ++oh, dst += OW) {
            const int ih = oh * g.stride - g.pad + kh;
            const bool inside = ih >= 0 && ih < g.in_h;
            const T* src = xc + int64_t(ih) * g.in_w;
            if (g.stride != 1) {
              for (int ow = 0; ow < OW; ++ow) {
                const int iw = ow * g.stride - g.pad + kw;
                dst[ow] = (inside && iw >= 0 && iw < g.in_w) ? src[iw] : T(0);
              }
              continue;
            }
#if DDP_NN_SIMD
            // Lanes outside [lo, hi) load nothing and store zero (padding).
            using S = simd::Vec<T>;
            for (int ow0 = 0; ow0 < OW; ow0 += S::kLanes) {
              const auto st = simd::lanes<T>(0, OW - ow0);
              const auto ldm = inside ? simd::lanes<T>(lo - ow0, hi - ow0) : 0;
              S::store(dst + ow0, st, S::loadz(ldm & st, src + (kw - g.pad) + ow0));
            }
#else
            if (!inside) {
              std::fill(dst, dst + OW, T(0));
              continue;
            }
            const T* s = src + (kw - g.pad);
            for (int ow = 0; ow < lo; ++ow) dst[ow] = T(0);
            for (int ow = lo; ow < hi; ++ow) dst[ow] = s[ow];
            for (int ow = hi; ow < OW; ++ow) dst[ow] = T(0);
#endif
          }
        }
      }
    }
  }
}

namespace {

#if DDP_NN_SIMD
constexpr int kMaxTaps = 16;

// Stride 1 in gather form: each input row segment is summed in registers over
// the k*k taps that read it and stored once. (The scatter form, dx += col per
// tap, chains partially overlapping stores to the same row, which stalls store
// forwarding.) The masks depend only on kw and the segment: hoisted.
template <typename T>
void col2im_rows(const ConvGeom& g, const T* col, int nb, int64_t ld, T* dx) {
  using S = simd::Vec<T>;
  using V = typename S::V;
  using M = typename S::M;
  using MW = typename S::MW;
  constexpr int L = S::kLanes;
  const int OH = g.out_h(), OW = g.out_w(), OHW = OH * OW, W = g.in_w, k = g.k;
  const int nv = (W + L - 1) / L;
  const int64_t plane = int64_t(g.in_h) * W;
  const T* end = dx + nb * g.in_c * plane;  // the chunk's dx, written in address order
  // Lane j of segment v is input column v*L + j, output column v*L + j + pad - kw.
  M st[kMaxRowVectors];
  MW tap[kMaxRowVectors][kMaxTaps];
  for (int v = 0; v < nv; ++v) {
    st[v] = simd::lanes<T>(0, W - v * L);
    for (int kw = 0; kw < k; ++kw)
      tap[v][kw] = S::wide(M(simd::lanes<T>(kw - g.pad - v * L, kw - g.pad - v * L + OW) & st[v]));
  }
  for (int i = 0; i < nb; ++i) {
    for (int c = 0; c < g.in_c; ++c) {
      T* dc = dx + (int64_t(i) * g.in_c + c) * plane;
      const T* ci = col + int64_t(c) * k * k * ld + int64_t(i) * OHW + g.pad;
      for (int ih = 0; ih < g.in_h; ++ih) {
        const int kh_lo = std::max(0, ih + g.pad - OH + 1), kh_hi = std::min(k, ih + g.pad + 1);
        for (int v = 0; v < nv; ++v) {
          V acc0 = S::zero(), acc1 = S::zero();
          for (int kh = kh_lo; kh < kh_hi; ++kh) {
            // Tap (kh, kw) of this segment starts at r + kw*(ld - 1).
            const T* r = ci + int64_t(kh) * k * ld + int64_t(ih + g.pad - kh) * OW + v * L;
            int kw = 0;
            for (; kw + 1 < k; kw += 2, r += 2 * (ld - 1)) {
              acc0 = S::add(acc0, S::loadw(tap[v][kw], r));
              acc1 = S::add(acc1, S::loadw(tap[v][kw + 1], r + (ld - 1)));
            }
            if (kw < k) acc0 = S::add(acc0, S::loadw(tap[v][kw], r));
          }
          simd::store_within(dc + int64_t(ih) * W + v * L, end, st[v], S::add(acc0, acc1));
        }
      }
    }
  }
}
#endif

}  // namespace

template <typename T>
void col2im(const ConvGeom& g, const T* col, int nb, int64_t ld, T* dx) {
  const int OH = g.out_h(), OW = g.out_w(), OHW = OH * OW;
  const int64_t plane = int64_t(g.in_h) * g.in_w;
#if DDP_NN_SIMD
  if (g.stride == 1 && g.in_w <= kMaxRowVectors * simd::Vec<T>::kLanes && g.k <= kMaxTaps) {
    col2im_rows(g, col, nb, ld, dx);
    return;
  }
#endif
  std::fill(dx, dx + int64_t(nb) * g.in_c * plane, T(0));
  for (int c = 0; c < g.in_c; ++c) {
    for (int kh = 0; kh < g.k; ++kh) {
      for (int kw = 0; kw < g.k; ++kw) {
        const T* row = col + (int64_t(c * g.k + kh) * g.k + kw) * ld;
        int lo = 0, hi = OW;
        if (g.stride == 1) valid_cols(g, kw, lo, hi);
        for (int i = 0; i < nb; ++i) {
          T* dc = dx + (int64_t(i) * g.in_c + c) * plane;
          const T* src = row + int64_t(i) * OHW;
          for (int oh = 0; oh < OH; ++oh, src += OW) {
            const int ih = oh * g.stride - g.pad + kh;
            if (ih < 0 || ih >= g.in_h) continue;
            T* d = dc + int64_t(ih) * g.in_w;
            if (g.stride == 1) {
              T* dd = d + (kw - g.pad);
              for (int ow = lo; ow < hi; ++ow) dd[ow] += src[ow];
            } else {
              for (int ow = 0; ow < OW; ++ow) {
                const int iw = ow * g.stride - g.pad + kw;
                if (iw >= 0 && iw < g.in_w) d[iw] += src[ow];
              }
            }
          }
        }
      }
    }
  }
}

template void im2col<float>(const ConvGeom&, const float*, int, int64_t, float*);
template void im2col<double>(const ConvGeom&, const double*, int, int64_t, double*);
template void col2im<float>(const ConvGeom&, const float*, int, int64_t, float*);
template void col2im<double>(const ConvGeom&, const double*, int, int64_t, double*);

}  // namespace ddp::nn::cpu
