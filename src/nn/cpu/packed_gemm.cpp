// gemm_packed (Note [packed weights] in nn/cpu/packed_gemm.hpp): an 8 x 32
// register tile, 16 AVX-512 accumulators, over A's packed panels and a
// 32-column strip of B copied into an aligned block.
#include "ddp/nn/cpu/packed_gemm.hpp"

#include <algorithm>

#include "ddp/core/error.hpp"
#include "ddp/nn/cpu/thread_pool.hpp"

namespace ddp::nn::cpu {

namespace {

#if DDP_NN_AVX512
// Rows a[0 .. 7] (lda apart), columns 0 .. 7, into out as 8 groups of 8 (ldo
// apart): the 8 values of column 0, then of column 1, ... (an 8 x 8
// transpose).
inline void transpose8(const float* a, size_t lda, float* out, size_t ldo = 8) {
  __m256 r[8], t[8], s[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(a + i * lda);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    s[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(out + i * ldo, _mm256_permute2f128_ps(s[i], s[i + 4], 0x20));
    _mm256_storeu_ps(out + (i + 4) * ldo, _mm256_permute2f128_ps(s[i], s[i + 4], 0x31));
  }
}
#endif

}  // namespace

void PackedMatrix::pack(bool trans, int m, int k, const float* a, int lda, ThreadPool* pool) {
  DDP_CHECK(m >= 0 && k >= 0, "packed gemm: bad shape ", m, "x", k);
  m_ = m;
  k_ = k;
  const int panels = (m + kRows - 1) / kRows;
  data_.resize(size_t(panels) * size_t(k) * kRows);
  auto one = [&](int64_t p, int) {
    float* out = data_.data() + size_t(p) * size_t(k) * kRows;
    const int i0 = int(p) * kRows, rows = std::min(kRows, m - i0);
    int j = 0;
#if DDP_NN_AVX512
    // A full panel of a row-major a: 8 x 8 blocks, each a vector transpose.
    static_assert(kRows == 8, "transpose8 packs panels of 8 rows");
    if (!trans && rows == kRows)
      for (; j + 8 <= k; j += 8, out += 8 * kRows) transpose8(a + size_t(i0) * lda + j, size_t(lda), out);
#endif
    for (; j < k; ++j, out += kRows) {
      for (int r = 0; r < rows; ++r) out[r] = trans ? a[size_t(j) * lda + i0 + r] : a[size_t(i0 + r) * lda + j];
      for (int r = rows; r < kRows; ++r) out[r] = 0.0f;
    }
  };
  if (pool && pool->size() > 1 && panels > 1)
    pool->parallel_for(panels, one);
  else
    for (int p = 0; p < panels; ++p) one(p, 0);
}

#if DDP_NN_AVX512
namespace {

constexpr int kCols = 32;  // a strip: two vectors

// One row of the tile: the first block stores, later ones add (in order).
template <bool First>
inline void put(float* c, __mmask16 m0, __mmask16 m1, __m512 v0, __m512 v1) {
  if (!First) {
    v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, c), v0);
    v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, c + 16), v1);
  }
  _mm512_mask_storeu_ps(c, m0, v0);
  _mm512_mask_storeu_ps(c + 16, m1, v1);
}

// The panel's block times b's block (kc x kCols, contiguous), handed to
// epilogue as out[row][half]: an 8 x 32 tile, each element one register's
// chain of fused multiply-adds from zero. The accumulators are named one by
// one so that they stay in registers.
using Tile = __m512[PackedMatrix::kRows][2];
template <typename Epilogue>
__attribute__((always_inline)) inline void product(int kc, const float* a, const float* b, Epilogue&& epilogue) {
  constexpr int R = PackedMatrix::kRows;
  static_assert(R == 8, "the tile below spells out 8 rows");
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
         c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
  for (int k = 0; k < kc; ++k, a += R, b += kCols) {
    const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#define DDP_ROW(r)                                  \
  {                                                 \
    const __m512 av = _mm512_set1_ps(a[r]);         \
    c##r##0 = _mm512_fmadd_ps(av, b0, c##r##0);     \
    c##r##1 = _mm512_fmadd_ps(av, b1, c##r##1);     \
  }
    DDP_ROW(0) DDP_ROW(1) DDP_ROW(2) DDP_ROW(3) DDP_ROW(4) DDP_ROW(5) DDP_ROW(6) DDP_ROW(7)
#undef DDP_ROW
  }
  const Tile out = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31},
                    {c40, c41}, {c50, c51}, {c60, c61}, {c70, c71}};
  epilogue(out);
}

// c's rows [0, rows) x the strip's columns (masks m0, m1) = (or +=) the
// panel's block times b's block.
template <bool First>
void tile(int kc, const float* a, const float* b, float* c, int ldc, int rows, __mmask16 m0, __mmask16 m1) {
  product(kc, a, b, [&](const Tile& out) {
    for (int r = 0; r < rows; ++r) put<First>(c + size_t(r) * ldc, m0, m1, out[r][0], out[r][1]);
  });
}

// B's block for the strip at column j: rows [k0, k0 + kc) of b (b_trans: of
// its transpose), kCols columns, zero past n, into strip (kc x kCols).
void load_strip(const float* b, int ldb, bool b_trans, int n, int j, int k0, int kc, float* strip) {
  const __mmask16 m0 = simd::lanes<float>(0, n - j), m1 = simd::lanes<float>(0, n - j - 16);
  if (!b_trans) {
    for (int k = 0; k < kc; ++k) {
      const float* row = b + size_t(k0 + k) * ldb + j;
      _mm512_store_ps(strip + k * kCols, _mm512_maskz_loadu_ps(m0, row));
      _mm512_store_ps(strip + k * kCols + 16, _mm512_maskz_loadu_ps(m1, row + 16));
    }
    return;
  }
  const int cols = std::min(kCols, n - j);
  for (int g = 0; g < kCols; g += 8) {
    const float* src = b + size_t(j + g) * ldb + k0;  // b^T's row j + g, from column k0
    int k = 0;
    if (cols - g >= 8)
      for (; k + 8 <= kc; k += 8) transpose8(src + k, size_t(ldb), strip + k * kCols + g, kCols);
    for (; k < kc; ++k)
      for (int r = 0; r < 8; ++r) strip[k * kCols + g + r] = g + r < cols ? src[size_t(r) * ldb + k] : 0.0f;
  }
}

}  // namespace

void gemm_packed(const PackedMatrix& a, int n, const float* b, int ldb, float* c, int ldc) {
  constexpr int R = PackedMatrix::kRows, D = PackedMatrix::kDepth;
  const int m = a.rows(), depth = a.depth(), panels = (m + R - 1) / R;
  DDP_CHECK(n >= 0 && ldb >= n && ldc >= n, "packed gemm: n=", n, " ldb=", ldb, " ldc=", ldc);
  if (m == 0 || n == 0) return;
  if (depth == 0) {
    for (int i = 0; i < m; ++i) std::fill(c + size_t(i) * ldc, c + size_t(i) * ldc + n, 0.0f);
    return;
  }
  alignas(64) float strip[D * kCols];
  for (int k0 = 0; k0 < depth; k0 += D) {
    const int kc = std::min(D, depth - k0);
    for (int j = 0; j < n; j += kCols) {
      const __mmask16 m0 = simd::lanes<float>(0, n - j), m1 = simd::lanes<float>(0, n - j - 16);
      // B's block, zero past n: the kernel's loads never depend on n.
      load_strip(b, ldb, /*b_trans=*/false, n, j, k0, kc, strip);
      for (int p = 0; p < panels; ++p) {
        const float* ap = a.panel(p) + size_t(k0) * R;
        float* cp = c + size_t(p) * R * ldc + j;
        const int rows = std::min(R, m - p * R);
        if (k0 == 0)
          tile<true>(kc, ap, strip, cp, ldc, rows, m0, m1);
        else
          tile<false>(kc, ap, strip, cp, ldc, rows, m0, m1);
      }
    }
  }
}

#if DDP_FIXED_POINT_SIMD
namespace {

enum class Out { Store, Add, AddConvert, Convert };

// Row r of a tile into the integers: 32 columns, four groups of eight.
inline void convert_row(fixed_point::Quantizer8& q, int64_t* acc, __mmask16 m0, __mmask16 m1, __m512 v0,
                        __m512 v1) {
  q.add(_mm512_castps512_ps256(v0), acc, __mmask8(m0));
  q.add(_mm512_extractf32x8_ps(v0, 1), acc + 8, __mmask8(m0 >> 8));
  q.add(_mm512_castps512_ps256(v1), acc + 16, __mmask8(m1));
  q.add(_mm512_extractf32x8_ps(v1, 1), acc + 24, __mmask8(m1 >> 8));
}

// The product of one block (kc deep), then by O: stored into part (rows x
// kCols), added to it, added to it and converted, or converted alone.
template <Out O>
void tile_fixed(int kc, const float* a, const float* b, float* part, int64_t* acc, int64_t ldacc, int rows,
                __mmask16 m0, __mmask16 m1, fixed_point::Quantizer8& q) {
  product(kc, a, b, [&](const Tile& out) {
    for (int r = 0; r < rows; ++r) {
      __m512 v0 = out[r][0], v1 = out[r][1];
      float* pr = part + r * kCols;
      if (O != Out::Convert && O != Out::Store) {
        v0 = _mm512_add_ps(_mm512_loadu_ps(pr), v0);
        v1 = _mm512_add_ps(_mm512_loadu_ps(pr + 16), v1);
      }
      if (O == Out::Store || O == Out::Add) {
        _mm512_storeu_ps(pr, v0);
        _mm512_storeu_ps(pr + 16, v1);
      } else {
        convert_row(q, acc + r * ldacc, m0, m1, v0, v1);
      }
    }
  });
}

}  // namespace

void gemm_packed_fixed(const PackedMatrix& a, int segments, int n, const float* b, int ldb, bool b_trans,
                       const fixed_point::Sink& out, int64_t ldacc) {
  constexpr int R = PackedMatrix::kRows, D = PackedMatrix::kDepth;
  const int m = a.rows(), depth = a.depth(), panels = (m + R - 1) / R;
  DDP_CHECK(segments > 0 && depth % segments == 0 && n >= 0 && ldacc >= n &&
                (b_trans ? ldb >= depth : ldb >= n),
            "fixed-point gemm: depth ", depth, " in ", segments, " segments, n=", n, " ldb=", ldb, " ldacc=", ldacc);
  if (m == 0 || n == 0) return;
  const int seg = depth / segments;
  fixed_point::Quantizer8 q(out.exponent, out.limit_bits);
  alignas(64) float strip[D * kCols];
  // Strips kStrips at a time, each segment's block of a (m x kDepth, L2)
  // read once for all of them: a 512-row a holds 2 MB for 8 segments, once
  // a strip would stream it 144 times over a 4608-column gradient.
  constexpr int kStrips = 4;
  // A segment deeper than one block keeps its partial products here.
  std::vector<float> part(seg > D ? size_t(kStrips) * panels * R * kCols : 0);
  for (int jb = 0; jb < n; jb += kStrips * kCols) {
    const int je = std::min(n, jb + kStrips * kCols);
    for (int s = 0; s < segments; ++s) {
      for (int k0 = 0; k0 < seg; k0 += D) {
        const int kc = std::min(D, seg - k0), ks = s * seg + k0;
        const bool first = k0 == 0, last = k0 + kc == seg;
        for (int j = jb; j < je; j += kCols) {
          const __mmask16 m0 = simd::lanes<float>(0, n - j), m1 = simd::lanes<float>(0, n - j - 16);
          load_strip(b, ldb, b_trans, n, j, ks, kc, strip);
          float* strip_part = part.data() + size_t((j - jb) / kCols) * panels * R * kCols;
          for (int p = 0; p < panels; ++p) {
            const float* ap = a.panel(p) + size_t(ks) * R;
            int64_t* acc = out.acc + int64_t(p) * R * ldacc + j;
            float* pp = strip_part + size_t(p) * R * kCols;
            const int rows = std::min(R, m - p * R);
            if (first && last)
              tile_fixed<Out::Convert>(kc, ap, strip, pp, acc, ldacc, rows, m0, m1, q);
            else if (first)
              tile_fixed<Out::Store>(kc, ap, strip, pp, acc, ldacc, rows, m0, m1, q);
            else if (last)
              tile_fixed<Out::AddConvert>(kc, ap, strip, pp, acc, ldacc, rows, m0, m1, q);
            else
              tile_fixed<Out::Add>(kc, ap, strip, pp, acc, ldacc, rows, m0, m1, q);
          }
        }
      }
    }
  }
  *out.max = std::max(*out.max, q.max());
}
#else
void gemm_packed_fixed(const PackedMatrix&, int, int, const float*, int, bool, const fixed_point::Sink&, int64_t) {
  DDP_FAIL("fixed-point gemm: this build has no AVX-512 DQ/VL kernel (kFixedPointGemm is false)");
}
#endif
#else
void gemm_packed(const PackedMatrix&, int, const float*, int, float*, int) {
  DDP_FAIL("packed gemm: this build has no AVX-512 kernel (kPackedGemm is false)");
}
void gemm_packed_fixed(const PackedMatrix&, int, int, const float*, int, bool, const fixed_point::Sink&, int64_t) {
  DDP_FAIL("fixed-point gemm: this build has no AVX-512 kernel (kFixedPointGemm is false)");
}
#endif

}  // namespace ddp::nn::cpu
