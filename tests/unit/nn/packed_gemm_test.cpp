// gemm_packed (Note [packed weights]): the product within float rounding of
// a double reference, over every edge of the tile and of k's blocks; each
// element the same float whatever columns and rows sit beside it (what
// --deterministic's micro-shards rely on); and nothing outside c touched.
// gemm_packed_fixed (Note [fixed-point epilogue]): a run of segments adds
// exactly what each segment's gemm_packed product, converted by
// quantize_add, would.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ddp/core/fixed_point.hpp"
#include "ddp/nn/cpu/packed_gemm.hpp"
#include "grad_check.hpp"

namespace ddp::nn {
namespace {

using cpu::PackedMatrix;

#define SKIP_WITHOUT_KERNEL() \
  if (!cpu::kPackedGemm) GTEST_SKIP() << "this build has no AVX-512 (kPackedGemm): the layers keep OpenBLAS"

struct Case {
  int m, n, k;
  bool trans;
};

// Shapes across the tile (8 rows, 32 columns), k's blocks (128) and their
// edges, and ResNet-18's shard shapes (512 x 32 x 512, 512 x 128 x 2304).
const Case kCases[] = {{1, 1, 1, false},     {7, 15, 3, true},     {8, 16, 128, false}, {9, 17, 129, true},
                       {16, 32, 256, false}, {23, 33, 300, true},  {64, 392, 64, false}, {100, 37, 77, true},
                       {512, 32, 512, false}, {512, 128, 2304, true}};

// op(a) for a Case: m x k (row stride k + 3), or k x m (row stride m + 5).
std::vector<float> matrix_a(const Case& c, int lda) { return test::to_float(test::random_vec(size_t(c.trans ? c.k : c.m) * lda, 11 + c.m)); }
int lda_of(const Case& c) { return c.trans ? c.m + 5 : c.k + 3; }
float a_at(const Case& c, const std::vector<float>& a, int i, int j) {
  return c.trans ? a[size_t(j) * lda_of(c) + i] : a[size_t(i) * lda_of(c) + j];
}

TEST(PackedGemm, IsTheProductWithinFloatRounding) {
  SKIP_WITHOUT_KERNEL();
  for (const Case& c : kCases) {
    const int lda = lda_of(c), ldb = c.n + 7, ldc = c.n + 2;
    const std::vector<float> a = matrix_a(c, lda);
    const std::vector<float> b = test::to_float(test::random_vec(size_t(c.k) * ldb, 23 + c.n));
    PackedMatrix p;
    p.pack(c.trans, c.m, c.k, a.data(), lda);
    ASSERT_EQ(p.rows(), c.m);
    ASSERT_EQ(p.depth(), c.k);
    std::vector<float> out(size_t(c.m) * ldc, std::numeric_limits<float>::quiet_NaN());
    cpu::gemm_packed(p, c.n, b.data(), ldb, out.data(), ldc);
    for (int i = 0; i < c.m; ++i)
      for (int j = 0; j < c.n; ++j) {
        double want = 0, scale = 0;
        for (int q = 0; q < c.k; ++q) {
          const double t = double(a_at(c, a, i, q)) * double(b[size_t(q) * ldb + j]);
          want += t;
          scale += std::abs(t);
        }
        // Float sums of k terms: within k ulps of the terms' magnitude.
        ASSERT_NEAR(out[size_t(i) * ldc + j], want, 1e-7 * c.k * scale + 1e-30)
            << c.m << "x" << c.n << "x" << c.k << (c.trans ? " trans" : "") << " at (" << i << ", " << j << ")";
      }
    // Past column n of each row: untouched.
    for (int i = 0; i < c.m; ++i)
      for (int j = c.n; j < ldc; ++j) ASSERT_TRUE(std::isnan(out[size_t(i) * ldc + j])) << "row " << i << " col " << j;
  }
}

// A block of columns multiplied on its own, and a block of rows packed on
// its own, give those elements of the whole product bit for bit.
TEST(PackedGemm, AnElementIsTheSameFloatWhateverSitsBesideIt) {
  SKIP_WITHOUT_KERNEL();
  const Case c{45, 300, 333, false};
  const int lda = lda_of(c), ldb = c.n;
  const std::vector<float> a = matrix_a(c, lda);
  const std::vector<float> b = test::to_float(test::random_vec(size_t(c.k) * ldb, 5));
  PackedMatrix whole;
  whole.pack(false, c.m, c.k, a.data(), lda);
  std::vector<float> all(size_t(c.m) * c.n);
  cpu::gemm_packed(whole, c.n, b.data(), ldb, all.data(), c.n);

  // Columns [j0, j0 + w): strips that start mid-tile, shorter than a vector, wider than a strip.
  const int blocks[][2] = {{0, 1}, {3, 13}, {17, 40}, {100, 64}, {299, 1}, {8, 200}};
  for (const auto& [j0, w] : blocks) {
    std::vector<float> part(size_t(c.m) * w);
    cpu::gemm_packed(whole, w, b.data() + j0, ldb, part.data(), w);
    for (int i = 0; i < c.m; ++i)
      for (int j = 0; j < w; ++j)
        ASSERT_EQ(part[size_t(i) * w + j], all[size_t(i) * c.n + j0 + j]) << "columns from " << j0 << ", (" << i << ", " << j << ")";
  }
  // Rows [i0, i0 + h): a panel's rows in other places of the tile.
  const int rows[][2] = {{0, 1}, {5, 3}, {11, 20}, {44, 1}};
  for (const auto& [i0, h] : rows) {
    PackedMatrix some;
    some.pack(false, h, c.k, a.data() + size_t(i0) * lda, lda);
    std::vector<float> part(size_t(h) * c.n);
    cpu::gemm_packed(some, c.n, b.data(), ldb, part.data(), c.n);
    for (int i = 0; i < h; ++i)
      for (int j = 0; j < c.n; ++j)
        ASSERT_EQ(part[size_t(i) * c.n + j], all[size_t(i0 + i) * c.n + j]) << "rows from " << i0 << ", (" << i << ", " << j << ")";
  }
}

TEST(PackedGemm, TransposedPackingIsThePackingOfTheTranspose) {
  SKIP_WITHOUT_KERNEL();
  const int m = 19, k = 140, n = 50;
  const std::vector<float> at = test::to_float(test::random_vec(size_t(k) * m, 8));  // k x m
  std::vector<float> a(size_t(m) * k);
  for (int i = 0; i < m; ++i)
    for (int q = 0; q < k; ++q) a[size_t(i) * k + q] = at[size_t(q) * m + i];
  const std::vector<float> b = test::to_float(test::random_vec(size_t(k) * n, 9));
  PackedMatrix p, pt;
  p.pack(false, m, k, a.data(), k);
  pt.pack(true, m, k, at.data(), m);
  std::vector<float> c1(size_t(m) * n), c2(size_t(m) * n);
  cpu::gemm_packed(p, n, b.data(), n, c1.data(), n);
  cpu::gemm_packed(pt, n, b.data(), n, c2.data(), n);
  EXPECT_EQ(c1, c2);
}

TEST(PackedGemm, EmptyDepthGivesZeros) {
  SKIP_WITHOUT_KERNEL();
  PackedMatrix p;
  p.pack(false, 3, 0, nullptr, 1);
  std::vector<float> c(3 * 4, 1.0f);
  cpu::gemm_packed(p, 4, nullptr, 4, c.data(), 4);
  EXPECT_EQ(c, std::vector<float>(12, 0.0f));
}

// A run of segments through gemm_packed_fixed against each segment's
// gemm_packed product converted by quantize_add: the same integers, nothing
// past n in a row of the sums touched, the same largest |element|.
struct FixedCase {
  int m, n, seg, segments;
  bool b_trans;
};

void expect_fixed_run_is_per_segment(const FixedCase& c, int exponent, int limit_bits, float poison = 0.0f) {
  const int depth = c.seg * c.segments, lda = depth + 3, ldbt = depth + 5, ldacc = c.n + 7;
  std::vector<float> a = test::to_float(test::random_vec(size_t(c.m) * lda, 31 + c.m));
  const std::vector<float> bt = test::to_float(test::random_vec(size_t(c.n) * ldbt, 41 + c.n));  // n x depth
  std::vector<float> b(size_t(depth) * c.n);  // its transpose, depth x n
  for (int j = 0; j < c.n; ++j)
    for (int k = 0; k < depth; ++k) b[size_t(k) * c.n + j] = bt[size_t(j) * ldbt + k];
  if (poison != 0.0f) a[size_t(c.m / 2) * lda + depth - 1] = poison;
  std::vector<int64_t> want(size_t(c.m) * ldacc, 0), got(want.size(), 0);
  double want_max = 0, got_max = 0;
  std::vector<float> prod(size_t(c.m) * c.n);
  for (int s = 0; s < c.segments; ++s) {
    PackedMatrix one;
    one.pack(false, c.m, c.seg, a.data() + size_t(s) * c.seg, lda);
    cpu::gemm_packed(one, c.n, b.data() + size_t(s) * c.seg * c.n, c.n, prod.data(), c.n);
    for (int i = 0; i < c.m; ++i)
      fixed_point::quantize_add(prod.data() + size_t(i) * c.n, size_t(c.n),
                                {want.data() + size_t(i) * ldacc, exponent, limit_bits, &want_max});
  }
  PackedMatrix run;
  run.pack(false, c.m, depth, a.data(), lda);
  const fixed_point::Sink sink{got.data(), exponent, limit_bits, &got_max};
  if (c.b_trans)
    cpu::gemm_packed_fixed(run, c.segments, c.n, bt.data(), ldbt, true, sink, ldacc);
  else
    cpu::gemm_packed_fixed(run, c.segments, c.n, b.data(), c.n, false, sink, ldacc);
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_max, want_max);
}

// Shapes across the tile's rows and columns, segments of one block (128),
// of less, and of several with a short last one (300 = 128 + 128 + 44),
// ResNet-18's 512-channel weight gradient's shape cut down (512 rows,
// segments 128 deep), b either way round.
const FixedCase kFixedCases[] = {{1, 1, 1, 1, false},   {13, 45, 300, 3, true}, {8, 32, 128, 4, false},
                                 {20, 70, 40, 2, true}, {9, 200, 17, 5, true}, {512, 72, 128, 3, true}};

TEST(PackedGemm, FixedPointRunAddsEachSegmentConvertedAlone) {
  if (!cpu::kFixedPointGemm) GTEST_SKIP() << "this build has no AVX-512 DQ/VL (kFixedPointGemm): micro-shards' "
                                             "gradients are converted one call each";
  for (const FixedCase& c : kFixedCases) {
    SCOPED_TRACE(::testing::Message() << c.m << " x " << c.n << ", " << c.segments << " segments of " << c.seg
                                      << (c.b_trans ? ", b transposed" : ""));
    expect_fixed_run_is_per_segment(c, 20, 50);
    // Elements past 2^3 are left out, as quantize_add leaves them.
    expect_fixed_run_is_per_segment(c, 20, 23);
  }
}

TEST(PackedGemm, FixedPointRunReportsANaNOrAnInfinityAsAnInfiniteMaximum) {
  if (!cpu::kFixedPointGemm) GTEST_SKIP() << "this build has no AVX-512 DQ/VL (kFixedPointGemm)";
  for (const float poison : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(poison);
    expect_fixed_run_is_per_segment({13, 45, 300, 3, true}, 20, 50, poison);
    double max = 0;
    std::vector<int64_t> acc(4 * 4, 0);
    std::vector<float> a(4 * 2, 1.0f), b(2 * 4, 1.0f);
    a[3] = poison;
    PackedMatrix p;
    p.pack(false, 4, 2, a.data(), 2);
    cpu::gemm_packed_fixed(p, 2, 4, b.data(), 4, false, {acc.data(), 0, 50, &max}, 4);
    EXPECT_EQ(max, std::numeric_limits<double>::infinity());
  }
}

}  // namespace
}  // namespace ddp::nn
