// Malformed IDX files: each is refused with one line naming the file and what
// is wrong with it.
#include <gtest/gtest.h>

#include "ddp/data/dataset.hpp"
#include "test_util.hpp"

namespace ddp::data {
namespace {

using testing::expect_error;
using testing::idx_images;
using testing::idx_labels;
using testing::TempDir;
using testing::write_raw;

const std::vector<uint8_t> kFive = {0, 1, 2, 3, 9};

// A valid pair of 5 images of 28x28 as dir/x and dir/y, raw.
struct Pair {
  TempDir dir;
  std::string x = dir / "x", y = dir / "y";
  Pair() {
    write_raw(x, idx_images(5, 28, 28));
    write_raw(y, idx_labels(kFive));
  }
};

std::vector<uint8_t> cut(std::vector<uint8_t> b, size_t n) {
  b.resize(b.size() - n);
  return b;
}

TEST(IdxErrors, ValidPairReads) {
  Pair p;
  const Dataset d = load_idx(p.x, p.y);
  EXPECT_EQ(d.n, 5);
  EXPECT_EQ(d.labels, std::vector<int32_t>({0, 1, 2, 3, 9}));
  EXPECT_EQ(d.images[3], float(3 * 7) / 255.0f);
}

TEST(IdxErrors, BadMagicImages) {
  Pair p;
  write_raw(p.x, idx_images(5, 28, 28, 0x12345678));
  expect_error([&] { load_idx(p.x, p.y); },
               {p.x + ": bad magic 0x12345678, expected 2051 (IDX images)"});
}

TEST(IdxErrors, SwappedFilesSayWhatTheyAre) {
  Pair p;
  expect_error([&] { load_idx(p.y, p.x); },
               {p.y + ": bad magic 0x00000801, expected 2051 (IDX images)", "IDX labels file"});
}

TEST(IdxErrors, BadMagicLabels) {
  Pair p;
  write_raw(p.y, idx_labels(kFive, 2051));
  expect_error([&] { load_idx(p.x, p.y); },
               {p.y + ": bad magic 0x00000803, expected 2049 (IDX labels)"});
}

TEST(IdxErrors, TruncatedPixels) {
  Pair p;
  write_raw(p.x, cut(idx_images(5, 28, 28), 100));
  expect_error([&] { load_idx(p.x, p.y); },
               {p.x + ": truncated: expected 3920 bytes of pixel data, found 3820"});
}

TEST(IdxErrors, TruncatedPixelsInsideAGoodGzip) {
  Pair p;
  const std::string gz = p.dir / "x.gz";
  write_raw(gz, testing::gzip(cut(idx_images(5, 28, 28), 1)));
  expect_error([&] { load_idx(gz, p.y); },
               {gz + ": truncated: expected 3920 bytes of pixel data, found 3919"});
}

TEST(IdxErrors, TruncatedLabels) {
  Pair p;
  write_raw(p.y, cut(idx_labels(kFive), 2));
  expect_error([&] { load_idx(p.x, p.y); },
               {p.y + ": truncated: expected 5 bytes of label data, found 3"});
}

TEST(IdxErrors, TruncatedHeader) {
  Pair p;
  const std::vector<uint8_t> whole = idx_images(5, 28, 28);
  write_raw(p.x, std::vector<uint8_t>(whole.begin(), whole.begin() + 10));
  expect_error([&] { load_idx(p.x, p.y); }, {p.x + ": truncated", "header"});
  write_raw(p.x, {});
  expect_error([&] { load_idx(p.x, p.y); }, {p.x + ": truncated", "header"});
}

TEST(IdxErrors, TruncatedGzipStream) {
  Pair p;
  const std::string gz = p.dir / "x.gz";
  const std::vector<uint8_t> whole = testing::gzip(idx_images(5, 28, 28));
  write_raw(gz, cut(whole, whole.size() / 2));
  expect_error([&] { load_idx(gz, p.y); }, {gz + ": gzip stream is truncated or corrupt"});
  // Only the 8-byte trailer (CRC, length) missing: every pixel is there, but
  // the file is still damaged and must not pass.
  write_raw(gz, cut(whole, 8));
  expect_error([&] { load_idx(gz, p.y); }, {gz + ": gzip stream is truncated or corrupt"});
}

TEST(IdxErrors, CorruptGzipStream) {
  Pair p;
  const std::string gz = p.dir / "x.gz";
  std::vector<uint8_t> bytes = testing::gzip(idx_images(5, 28, 28));
  bytes[bytes.size() - 6] ^= 0xff;  // inside the CRC-32 of the trailer
  write_raw(gz, bytes);
  expect_error([&] { load_idx(gz, p.y); }, {gz + ": gzip stream is truncated or corrupt"});
}

TEST(IdxErrors, ExtraBytes) {
  Pair p;
  std::vector<uint8_t> b = idx_images(5, 28, 28);
  b.insert(b.end(), {1, 2, 3});
  write_raw(p.x, b);
  expect_error([&] { load_idx(p.x, p.y); }, {p.x + ": 3 extra bytes after the 3920 bytes"});
  std::vector<uint8_t> l = idx_labels(kFive);
  l.push_back(0);
  write_raw(p.y, l);
  write_raw(p.x, idx_images(5, 28, 28));
  expect_error([&] { load_idx(p.x, p.y); }, {p.y + ": 1 extra bytes"});
}

TEST(IdxErrors, CountMismatch) {
  Pair p;
  write_raw(p.y, idx_labels({0, 1, 2, 3}));
  expect_error([&] { load_idx(p.x, p.y); }, {p.y + ": holds 4 labels but " + p.x + " holds 5"});
}

TEST(IdxErrors, LabelOutOfRange) {
  Pair p;
  write_raw(p.y, idx_labels({0, 1, 2, 10, 4}));
  expect_error([&] { load_idx(p.x, p.y); }, {p.y + ": label 10 at index 3"});
  write_raw(p.y, idx_labels({0, 1, 2, 3, 255}));
  expect_error([&] { load_idx(p.x, p.y); }, {p.y + ": label 255 at index 4"});
}

TEST(IdxErrors, InsaneDimensions) {
  Pair p;
  write_raw(p.x, idx_images(0, 28, 28));
  expect_error([&] { load_idx(p.x, p.y); }, {p.x + ": dimension 0 is 0"});
  write_raw(p.x, idx_images(5, 0, 28));
  expect_error([&] { load_idx(p.x, p.y); }, {p.x + ": dimension 1 is 0"});
  // A side over 1024 is refused before any pixel is looked at.
  std::vector<uint8_t> big;
  testing::put_be32(big, 2051);
  testing::put_be32(big, 1);
  testing::put_be32(big, 28);
  testing::put_be32(big, 5000);
  write_raw(p.x, big);
  expect_error([&] { load_idx(p.x, p.y); }, {p.x + ": dimension 2 is 5000"});
}

TEST(IdxErrors, HugeCountInAShortFileIsTruncatedNotAnAllocation) {
  Pair p;
  std::vector<uint8_t> b = idx_images(5, 28, 28);
  b[4] = 0xff;  // n = 0xff000005 images of 28x28: ~3 TB announced
  write_raw(p.x, b);
  expect_error([&] { load_idx(p.x, p.y); }, {p.x + ": truncated: expected", "found 3920"});
}

TEST(IdxErrors, MissingFile) {
  Pair p;
  const std::string nope = p.dir / "nope";
  expect_error([&] { load_idx(nope, p.y); }, {nope + ": cannot open"});
  expect_error([&] { load_idx(p.x, nope); }, {nope + ": cannot open"});
}

TEST(IdxErrors, DirMissingAFile) {
  TempDir dir;
  write_raw(dir / "train-images-idx3-ubyte.gz", testing::gzip(idx_images(5, 28, 28)));
  write_raw(dir / "train-labels-idx1-ubyte", idx_labels(kFive));
  write_raw(dir / "t10k-images-idx3-ubyte", idx_images(5, 28, 28));
  expect_error([&] { load_idx_dir(dir.path()); },
               {"no t10k-labels-idx1-ubyte[.gz] in " + dir.path()});
  // With the last file in place the mixed directory reads.
  write_raw(dir / "t10k-labels-idx1-ubyte.gz", testing::gzip(idx_labels(kFive)));
  const Split s = load_idx_dir(dir.path());
  EXPECT_EQ(s.train.n, 5);
  EXPECT_EQ(s.test.images, s.train.images);
}

TEST(IdxErrors, DirPrefersGzipWhenBothExist) {
  TempDir dir;
  for (const char* suffix : {"", ".gz"}) {
    write_raw(dir / (std::string("train-images-idx3-ubyte") + suffix), idx_images(5, 28, 28));
    write_raw(dir / (std::string("t10k-images-idx3-ubyte") + suffix), idx_images(5, 28, 28));
    write_raw(dir / (std::string("t10k-labels-idx1-ubyte") + suffix), idx_labels(kFive));
  }
  write_raw(dir / "train-labels-idx1-ubyte.gz", idx_labels(kFive));
  write_raw(dir / "train-labels-idx1-ubyte", idx_labels({1, 1, 1, 1, 1}));
  const Split s = load_idx_dir(dir.path());
  EXPECT_EQ(s.train.labels, std::vector<int32_t>({0, 1, 2, 3, 9}));
}

TEST(IdxErrors, DirDoesNotExist) {
  TempDir dir;
  const std::string nope = dir / "nope";
  expect_error([&] { load_idx_dir(nope); }, {"data directory " + nope + " does not exist"});
  write_raw(dir / "file", {1});
  expect_error([&] { load_idx_dir(dir / "file"); }, {dir / "file", "is not a directory"});
}

}  // namespace
}  // namespace ddp::data
