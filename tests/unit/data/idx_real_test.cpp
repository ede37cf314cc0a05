// The real Fashion-MNIST subset: what load_idx_dir reads must match what the
// README promises, gzip or unpacked.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "ddp/data/dataset.hpp"
#include "test_util.hpp"

namespace ddp::data {
namespace {

using testing::TempDir;

const char* const kFiles[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                              "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

class RealData : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { split_ = new Split(load_idx_dir(DDP_DATA_DIR)); }
  static void TearDownTestSuite() {
    delete split_;
    split_ = nullptr;
  }
  static Split* split_;
};
Split* RealData::split_ = nullptr;

void expect_well_formed(const Dataset& d, int64_t n) {
  EXPECT_EQ(d.n, n);
  EXPECT_EQ(d.c, 1);
  EXPECT_EQ(d.h, 28);
  EXPECT_EQ(d.w, 28);
  EXPECT_EQ(d.classes, 10);
  ASSERT_EQ(d.images.size(), size_t(n) * 784);
  ASSERT_EQ(d.labels.size(), size_t(n));
  for (int32_t y : d.labels) ASSERT_TRUE(y >= 0 && y < 10) << y;
  for (float v : d.images) ASSERT_TRUE(v >= 0.0f && v <= 1.0f) << v;
}

TEST_F(RealData, ShapesAndRanges) {
  expect_well_formed(split_->train, 3000);
  expect_well_formed(split_->test, 594);
  EXPECT_NE(split_->train.source.find("train-images-idx3-ubyte"), std::string::npos);
}

TEST_F(RealData, MeanPixelIsTheReadmes) {
  // ToTensor scaling only (x / 255): the README's mean pixel is 72.6 of 255.
  const auto& im = split_->train.images;
  const double mean = std::accumulate(im.begin(), im.end(), 0.0) / double(im.size());
  EXPECT_NEAR(mean, 72.6 / 255.0, 0.01);
}

TEST_F(RealData, PixelsAreBytesOver255) {
  const std::vector<uint8_t> raw =
      testing::gunzip_file(std::string(DDP_DATA_DIR) + "/train-images-idx3-ubyte.gz");
  ASSERT_EQ(raw.size(), 16u + 3000u * 784u);
  const auto& im = split_->train.images;
  for (size_t i = 0; i < im.size(); i += 97) ASSERT_EQ(im[i], float(raw[16 + i]) / 255.0f) << i;
}

TEST_F(RealData, ClassesAreBalanced) {
  std::vector<int> train(10), test(10);
  for (int32_t y : split_->train.labels) ++train[y];
  for (int32_t y : split_->test.labels) ++test[y];
  for (int c = 0; c < 10; ++c) {
    EXPECT_GE(train[c], 282) << "class " << c;  // README: 282-321 per class
    EXPECT_LE(train[c], 321) << "class " << c;
    EXPECT_GE(test[c], 30) << "class " << c;
    EXPECT_LE(test[c], 90) << "class " << c;
  }
}

TEST_F(RealData, UnpackedFilesReadIdentically) {
  TempDir dir;
  for (const char* f : kFiles) {
    testing::write_raw(dir / f, testing::gunzip_file(std::string(DDP_DATA_DIR) + "/" + f + ".gz"));
  }
  const Split raw = load_idx_dir(dir.path());
  EXPECT_EQ(raw.train.images, split_->train.images);
  EXPECT_EQ(raw.train.labels, split_->train.labels);
  EXPECT_EQ(raw.test.images, split_->test.images);
  EXPECT_EQ(raw.test.labels, split_->test.labels);
  EXPECT_EQ(raw.train.source, dir / "train-images-idx3-ubyte");
}

TEST_F(RealData, FormatIsDetectedByContentNotName) {
  // A gzip file without .gz and a raw file named .gz both read.
  TempDir dir;
  const std::string src = std::string(DDP_DATA_DIR) + "/";
  std::vector<uint8_t> gz_bytes;
  {
    FILE* f = std::fopen((src + "train-labels-idx1-ubyte.gz").c_str(), "rb");
    ASSERT_NE(f, nullptr);
    int ch;
    while ((ch = std::fgetc(f)) != EOF) gz_bytes.push_back(uint8_t(ch));
    std::fclose(f);
  }
  testing::write_raw(dir / "labels", gz_bytes);
  testing::write_raw(dir / "images.gz", testing::gunzip_file(src + "train-images-idx3-ubyte.gz"));
  const Dataset d = load_idx(dir / "images.gz", dir / "labels");
  EXPECT_EQ(d.images, split_->train.images);
  EXPECT_EQ(d.labels, split_->train.labels);
}

}  // namespace
}  // namespace ddp::data
