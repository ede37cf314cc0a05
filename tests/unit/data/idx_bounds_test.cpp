// What reading an IDX file may cost and what may follow its data (Note
// [bounded reads] in src/data/idx.cpp): a gzip bomb costs what its header
// declares, concatenated gzip members read as gzip -d reads them, and bytes
// after the gzip data are an error, never ignored.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "ddp/data/dataset.hpp"
#include "test_util.hpp"

namespace ddp::data {
namespace {

using testing::expect_error;
using testing::idx_images;
using testing::idx_labels;
using testing::TempDir;
using testing::write_raw;

const std::vector<uint8_t> kTen = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};

std::vector<uint8_t> concat(std::vector<uint8_t> a, const std::vector<uint8_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// load_idx(images, labels) in a child process: the error it gave ("" when
// none) and the child's peak resident memory in bytes.
struct ChildRead {
  std::string error;
  long peak_rss = 0;
};

ChildRead read_in_child(const std::string& images, const std::string& labels) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string msg;
    try {
      load_idx(images, labels);
    } catch (const std::exception& e) {
      msg = e.what();
    }
    if (!msg.empty()) (void)!::write(fds[1], msg.data(), msg.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  ChildRead r;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) r.error.append(buf, size_t(n));
  ::close(fds[0]);
  int status = 0;
  struct rusage use {};
  EXPECT_EQ(::wait4(pid, &status, 0, &use), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the reading process crashed";
  r.peak_rss = use.ru_maxrss * 1024L;  // Linux: kilobytes
  return r;
}

TEST(IdxBounds, GzipBombCostsWhatItsHeaderDeclares) {
  TempDir dir;
  const std::string bomb = dir / "train-images-idx3-ubyte.gz", labels = dir / "labels";
  // A header declaring 10 images of 28x28 (7840 bytes), then 1 GiB of zeros.
  std::vector<uint8_t> header = idx_images(10, 28, 28);
  header.resize(16);
  testing::write_gzip_with_zeros(bomb, header, uint64_t(1) << 30);
  write_raw(labels, idx_labels(kTen));
  const ChildRead r = read_in_child(bomb, labels);
  EXPECT_NE(r.error.find(bomb + ": more than "), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("extra bytes after the 7840 bytes of pixel data the header announces"), std::string::npos)
      << r.error;
  EXPECT_LT(r.peak_rss, 200L << 20) << "peak RSS " << (r.peak_rss >> 20) << " MiB reading a 1 GiB gzip bomb";
}

TEST(IdxBounds, ConcatenatedGzipMembersReadAsOneStream) {
  TempDir dir;
  const std::string x = dir / "x.gz", y = dir / "y";
  const std::vector<uint8_t> whole = idx_images(10, 28, 28);
  // Split inside the header and again inside the pixels, as `cat a.gz b.gz` makes.
  const std::vector<uint8_t> a(whole.begin(), whole.begin() + 9), b(whole.begin() + 9, whole.begin() + 2000),
      c(whole.begin() + 2000, whole.end());
  write_raw(x, concat(concat(testing::gzip(a), testing::gzip(b)), testing::gzip(c)));
  write_raw(y, idx_labels(kTen));
  const Dataset d = load_idx(x, y);
  EXPECT_EQ(d.n, 10);
  write_raw(dir / "raw", whole);
  EXPECT_EQ(d.images, load_idx(dir / "raw", y).images);
}

TEST(IdxBounds, MoreDataInAFurtherMemberThanDeclared) {
  TempDir dir;
  const std::string x = dir / "x.gz", y = dir / "y";
  write_raw(x, concat(testing::gzip(idx_images(10, 28, 28)), testing::gzip({1, 2, 3, 4, 5})));
  write_raw(y, idx_labels(kTen));
  expect_error([&] { load_idx(x, y); }, {x + ": 5 extra bytes after the 7840 bytes of pixel data"});
}

TEST(IdxBounds, BytesAfterTheGzipDataAreRefused) {
  TempDir dir;
  const std::string x = dir / "x.gz", y = dir / "y.gz";
  write_raw(x, concat(testing::gzip(idx_images(10, 28, 28)), {'j', 'u', 'n', 'k', 0, 0, 0}));
  write_raw(y, testing::gzip(idx_labels(kTen)));
  expect_error([&] { load_idx(x, y); }, {x + ": 7 bytes after the end of the gzip data are not gzip data"});
  // One stray byte, and zero padding, are refused as well.
  write_raw(x, testing::gzip(idx_images(10, 28, 28)));
  write_raw(y, concat(testing::gzip(idx_labels(kTen)), {0}));
  expect_error([&] { load_idx(x, y); }, {y + ": 1 bytes after the end of the gzip data are not gzip data"});
}

TEST(IdxBounds, AHeaderDeclaringMoreThanTheGzipCanHoldIsRefusedBeforeReading) {
  TempDir dir;
  const std::string x = dir / "x.gz", y = dir / "y";
  std::vector<uint8_t> b = idx_images(10, 28, 28);
  b[4] = 0x7f;  // 0x7f00000a images of 28x28: 1.7 TB declared
  write_raw(x, testing::gzip(b));
  write_raw(y, idx_labels(kTen));
  const ChildRead r = read_in_child(x, y);
  EXPECT_NE(r.error.find(x + ": truncated: expected 1670473850528 bytes"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("inflates to at most"), std::string::npos) << r.error;
  EXPECT_LT(r.peak_rss, 200L << 20);
}

}  // namespace
}  // namespace ddp::data
