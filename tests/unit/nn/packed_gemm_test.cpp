// gemm_packed (Note [packed weights]): the product within float rounding of
// a double reference, over every edge of the tile and of k's blocks; each
// element the same float whatever columns and rows sit beside it (what
// --deterministic's micro-shards rely on); and nothing outside c touched.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ddp/nn/packed_gemm.hpp"
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

}  // namespace
}  // namespace ddp::nn
