// Fuzz target "idx_gzip": the bytes after the first are an IDX file's
// content, which the harness gzips before load_idx reads it, so that every
// input takes the inflating path with a stream zlib accepts (mutated gzip
// bytes mostly fail its checks at once; the "idx" target covers those). The
// first byte picks the layout around the content, the shapes a download
// can have: bits 0-1: one gzip member (0), two members split at the middle
// (1), one member followed by bytes that are not gzip (2), or one member cut
// short (3) by 1 + bits 2-4 bytes; bit 5: deflate level 1 instead of 9.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "idx_check.hpp"

namespace {

void append_member(std::vector<uint8_t>& out, const uint8_t* p, size_t n, int level) {
  z_stream z{};
  // windowBits 15 + 16: a gzip wrapper, as the Fashion-MNIST files have.
  if (deflateInit2(&z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    ddp::fuzz::finding("deflateInit2 failed");
  const size_t at = out.size();
  out.resize(at + deflateBound(&z, static_cast<uLong>(n)) + 32);
  z.next_in = const_cast<uint8_t*>(p);
  z.avail_in = static_cast<uInt>(n);
  z.next_out = out.data() + at;
  z.avail_out = static_cast<uInt>(out.size() - at);
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) ddp::fuzz::finding("deflate did not finish");
  out.resize(at + z.total_out);
  deflateEnd(&z);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const uint8_t* content = data + 1;
  const size_t n = size - 1;
  const int level = (mode & 0x20) ? 1 : 9;
  std::vector<uint8_t> file;
  switch (mode & 3) {
    case 0:
      append_member(file, content, n, level);
      break;
    case 1:
      append_member(file, content, n / 2, level);
      append_member(file, content + n / 2, n - n / 2, level);
      break;
    case 2:
      append_member(file, content, n, level);
      for (uint8_t b : {0x00, 0x1f, 0x00, 0x0a}) file.push_back(b);
      break;
    default: {
      append_member(file, content, n, level);
      const size_t cut = 1 + ((mode >> 2) & 7);
      file.resize(file.size() > cut ? file.size() - cut : 0);
    }
  }
  const auto& files = ddp::fuzz::idx_files();
  ddp::fuzz::write_file(files.fuzzed, file.data(), file.size());
  ddp::fuzz::check_idx_file(files);
  return 0;
}
