// load_idx_dir: the four files of a Fashion-MNIST/MNIST download, found by the
// names they ship under, compressed or already unpacked.
#include "ddp/data/dataset.hpp"

#include <filesystem>
#include <system_error>

#include "ddp/core/error.hpp"

namespace ddp::data {
namespace {

namespace fs = std::filesystem;

// dir/base.gz if it is there, else dir/base: users often gunzip in place, and
// load_idx detects the format by content either way.
std::string find_idx(const std::string& dir, const std::string& base) {
  for (const char* suffix : {".gz", ""}) {
    const fs::path p = fs::path(dir) / (base + suffix);
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  DDP_FAIL("no ", base, "[.gz] in ", dir);
}

}  // namespace

Split load_idx_dir(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) DDP_FAIL("data directory ", dir, " does not exist");
  if (!fs::is_directory(st)) DDP_FAIL("data directory ", dir, " is not a directory");
  // Look for all four before reading any, so a missing file is reported at once.
  const std::string train_x = find_idx(dir, "train-images-idx3-ubyte");
  const std::string train_y = find_idx(dir, "train-labels-idx1-ubyte");
  const std::string test_x = find_idx(dir, "t10k-images-idx3-ubyte");
  const std::string test_y = find_idx(dir, "t10k-labels-idx1-ubyte");
  Split s;
  s.train = load_idx(train_x, train_y);
  s.test = load_idx(test_x, test_y);
  if (s.test.h != s.train.h || s.test.w != s.train.w) {
    DDP_FAIL(test_x, ": images are ", s.test.h, "x", s.test.w, " but ", train_x, " has ", s.train.h,
             "x", s.train.w);
  }
  return s;
}

}  // namespace ddp::data
