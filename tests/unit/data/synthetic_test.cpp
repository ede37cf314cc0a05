// make_synthetic: deterministic, balanced, fast, and not given away by a pixel.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "ddp/data/dataset.hpp"
#include "test_util.hpp"

namespace ddp::data {
namespace {

TEST(Synthetic, ShapesAndRanges) {
  for (int64_t n : {1, 4, 5, 2000}) {
    const Split s = make_synthetic(n, 1);
    EXPECT_EQ(s.train.n, n);
    EXPECT_EQ(s.test.n, std::max<int64_t>(1, n / 5));
    for (const Dataset* d : {&s.train, &s.test}) {
      EXPECT_EQ(d->c, 1);
      EXPECT_EQ(d->h, 28);
      EXPECT_EQ(d->w, 28);
      EXPECT_EQ(d->classes, 10);
      ASSERT_EQ(d->images.size(), size_t(d->n) * 784);
      ASSERT_EQ(d->labels.size(), size_t(d->n));
      for (int32_t y : d->labels) ASSERT_TRUE(y >= 0 && y < 10);
      for (float v : d->images) ASSERT_TRUE(v >= 0.0f && v <= 1.0f);
      EXPECT_FALSE(d->source.empty());
    }
  }
  testing::expect_error([] { make_synthetic(0, 1); }, {"size 0"});
}

TEST(Synthetic, DeterministicInSizeAndSeed) {
  const Split a = make_synthetic(500, 7), b = make_synthetic(500, 7), c = make_synthetic(500, 8);
  EXPECT_EQ(a.train.images, b.train.images);
  EXPECT_EQ(a.train.labels, b.train.labels);
  EXPECT_EQ(a.test.images, b.test.images);
  EXPECT_EQ(a.test.labels, b.test.labels);
  EXPECT_NE(a.train.images, c.train.images);
  EXPECT_NE(a.train.labels, c.train.labels);
  // The test set is its own draw, not a copy of the first training images.
  EXPECT_FALSE(std::equal(a.test.images.begin(), a.test.images.end(), a.train.images.begin()));
}

TEST(Synthetic, ClassesAreBalanced) {
  for (int64_t n : {10, 1003, 2000}) {
    const Split s = make_synthetic(n, 3);
    for (const Dataset* d : {&s.train, &s.test}) {
      std::vector<int64_t> count(10);
      for (int32_t y : d->labels) ++count[y];
      const auto [lo, hi] = std::minmax_element(count.begin(), count.end());
      EXPECT_LE(*hi - *lo, 1) << d->source;
    }
    // ... in a shuffled order, not 0, 1, ..., 9, 0, 1, ...
    int in_cycle = 0;
    for (int64_t i = 0; i < n; ++i) in_cycle += s.train.labels[i] == i % 10;
    EXPECT_LT(in_cycle, n / 2);
  }
}

TEST(Synthetic, NoSinglePixelGivesTheClassAway) {
  // The best classifier that looks at one pixel (its value in 8 bins, the
  // majority class of each bin) must stay far from what a LeNet reaches.
  const Dataset d = make_synthetic(3000, 5).train;
  double best = 0;
  for (int p = 0; p < 784; ++p) {
    int count[8][10] = {};
    for (int64_t i = 0; i < d.n; ++i) {
      const int bin = std::min(7, int(d.images[i * 784 + p] * 8));
      ++count[bin][d.labels[i]];
    }
    int correct = 0;
    for (auto& bin : count) correct += *std::max_element(bin, bin + 10);
    best = std::max(best, double(correct) / double(d.n));
  }
  EXPECT_LT(best, 0.4) << "one pixel predicts the class " << best * 100 << "% of the time";
  EXPECT_GT(best, 0.1);  // but pixels do carry signal
}

TEST(Synthetic, ClassesDifferInTheirAverageImage) {
  // A sanity floor for learnability: nearest class mean on the test set beats
  // chance by far, since each class is one distinct shape.
  const Split s = make_synthetic(2000, 9);
  std::vector<double> mean(10 * 784);
  std::vector<int> count(10);
  for (int64_t i = 0; i < s.train.n; ++i) {
    ++count[s.train.labels[i]];
    for (int p = 0; p < 784; ++p) mean[s.train.labels[i] * 784 + p] += s.train.images[i * 784 + p];
  }
  for (int c = 0; c < 10; ++c)
    for (int p = 0; p < 784; ++p) mean[c * 784 + p] /= count[c];
  int correct = 0;
  for (int64_t i = 0; i < s.test.n; ++i) {
    int arg = 0;
    double best = 1e300;
    for (int c = 0; c < 10; ++c) {
      double dist = 0;
      for (int p = 0; p < 784; ++p) {
        const double e = s.test.images[i * 784 + p] - mean[c * 784 + p];
        dist += e * e;
      }
      if (dist < best) best = dist, arg = c;
    }
    correct += arg == s.test.labels[i];
  }
  EXPECT_GT(double(correct) / double(s.test.n), 0.3);
}

// Note [same bytes everywhere] (synthetic.cpp): a resumed run recognises its
// dataset by CRC, so the generator must give these very bytes in Debug and
// Release builds and on every CPU. The CRC covers the training labels (int32)
// and images (float), as the resume check hashes them.
TEST(Synthetic, SameBytesInEveryBuildAndOnEveryCpu) {
  const Split s = make_synthetic(1000, 1);
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(s.train.labels.data()), uInt(s.train.labels.size() * 4));
  crc = crc32(crc, reinterpret_cast<const Bytef*>(s.train.images.data()), uInt(s.train.images.size() * 4));
  EXPECT_EQ(crc, 0x76dcb507ul) << std::hex << "crc32 " << crc;
}

TEST(Synthetic, SixtyThousandImagesAreQuick) {
  const auto t0 = std::chrono::steady_clock::now();
  const Split s = make_synthetic(60000, 1);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("make_synthetic(60000): %.3f s\n", sec);
  EXPECT_EQ(s.train.n, 60000);
  EXPECT_LT(sec, 5.0);  // about 0.5 s on one core; slack for a busy machine and debug builds
}

}  // namespace
}  // namespace ddp::data
