// load_idx: one IDX images/labels pair, gzip or raw, checked byte for byte.
//
// A whole file is read before it is parsed: the byte count we report in
// "truncated" and "extra bytes" messages is then exact, and a header that lies
// about its size can never make us allocate what the file does not hold.
#include "ddp/data/dataset.hpp"

#include <zlib.h>  // gzopen/gzread: inflates gzip, passes raw files through

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <type_traits>

#include "ddp/core/error.hpp"

namespace ddp::data {
namespace {

constexpr uint32_t kImagesMagic = 2051;  // 0x00000803: unsigned bytes, 3 dims
constexpr uint32_t kLabelsMagic = 2049;  // 0x00000801: unsigned bytes, 1 dim
constexpr uint32_t kMaxSide = 1024;
constexpr int kClasses = 10;

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzHandle = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

// The decompressed content of path (or its raw bytes when it is not gzip:
// zlib decides by the magic 1f 8b, not by the name).
std::vector<uint8_t> read_all(const std::string& path) {
  errno = 0;
  GzHandle f(gzopen(path.c_str(), "rb"));
  if (!f) DDP_FAIL(path, ": cannot open: ", errno ? std::strerror(errno) : "out of memory");
  gzbuffer(f.get(), 1 << 17);

  std::vector<uint8_t> bytes;
  size_t got = 0;
  for (;;) {
    if (bytes.size() - got < (1u << 16)) bytes.resize(std::max<size_t>(bytes.size() * 2, 1u << 20));
    const unsigned want = static_cast<unsigned>(std::min<size_t>(bytes.size() - got, 1u << 30));
    const int n = gzread(f.get(), bytes.data() + got, want);
    // gzread hands back what it inflated before a truncated or corrupt stream
    // and reports the damage only through gzerror, so ask after every read.
    int err = Z_OK;
    const char* msg = gzerror(f.get(), &err);
    if (err == Z_ERRNO) DDP_FAIL(path, ": read error: ", std::strerror(errno));
    if (err != Z_OK) {
      DDP_FAIL(path, ": gzip stream is truncated or corrupt (zlib: ", msg, ")");
    }
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  bytes.resize(got);
  return bytes;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

std::string hex32(uint32_t v) {
  char s[11];
  std::snprintf(s, sizeof s, "0x%08x", v);
  return s;
}

// Checks the header of an IDX file of `ndims` dimensions and that the body
// holds exactly the bytes the dimensions announce; returns the dimensions.
std::vector<uint32_t> parse_header(const std::string& path, const std::vector<uint8_t>& bytes,
                                   uint32_t magic, const char* kind, const char* body) {
  const size_t ndims = magic & 0xff;
  const size_t header = 4 + 4 * ndims;
  if (bytes.size() < 4) {
    DDP_FAIL(path, ": truncated: file ends inside the IDX header (", bytes.size(), " of ", header,
             " bytes)");
  }
  const uint32_t found = be32(bytes.data());
  if (found != magic) {
    const char* hint = found == kImagesMagic   ? "; this is an IDX images file"
                       : found == kLabelsMagic ? "; this is an IDX labels file"
                                               : "";
    DDP_FAIL(path, ": bad magic ", hex32(found), ", expected ", magic, " (IDX ", kind, ")", hint);
  }
  if (bytes.size() < header) {
    DDP_FAIL(path, ": truncated: file ends inside the IDX header (", bytes.size(), " of ", header,
             " bytes)");
  }
  std::vector<uint32_t> dims(ndims);
  uint64_t expected = 1;
  for (size_t i = 0; i < ndims; ++i) {
    dims[i] = be32(bytes.data() + 4 + 4 * i);
    if (dims[i] == 0) DDP_FAIL(path, ": dimension ", i, " is 0 (an empty IDX ", kind, " file)");
    if (i > 0 && dims[i] > kMaxSide) {
      DDP_FAIL(path, ": dimension ", i, " is ", dims[i], ", more than the ", kMaxSide,
               " we accept for an image side");
    }
    expected *= dims[i];
  }
  const uint64_t have = bytes.size() - header;
  if (have < expected) {
    DDP_FAIL(path, ": truncated: expected ", expected, " bytes of ", body, " data, found ", have);
  }
  if (have > expected) {
    DDP_FAIL(path, ": ", have - expected, " extra bytes after the ", expected, " bytes of ", body,
             " data the header announces");
  }
  return dims;
}

}  // namespace

Dataset load_idx(const std::string& images_path, const std::string& labels_path) {
  Dataset d;
  d.source = images_path;
  {
    const std::vector<uint8_t> bytes = read_all(images_path);
    const auto dims = parse_header(images_path, bytes, kImagesMagic, "images", "pixel");
    d.n = dims[0];
    d.c = 1;
    d.h = static_cast<int>(dims[1]);
    d.w = static_cast<int>(dims[2]);
    std::array<float, 256> scale;  // ToTensor's x / 255, as d2l trains on
    for (int v = 0; v < 256; ++v) scale[v] = static_cast<float>(v) / 255.0f;
    const uint8_t* px = bytes.data() + 16;
    d.images.resize(static_cast<size_t>(d.n * d.sample_numel()));
    for (size_t i = 0; i < d.images.size(); ++i) d.images[i] = scale[px[i]];
  }
  {
    const std::vector<uint8_t> bytes = read_all(labels_path);
    const auto dims = parse_header(labels_path, bytes, kLabelsMagic, "labels", "label");
    if (int64_t(dims[0]) != d.n) {
      DDP_FAIL(labels_path, ": holds ", dims[0], " labels but ", images_path, " holds ", d.n,
               " images");
    }
    d.labels.resize(dims[0]);
    for (size_t i = 0; i < d.labels.size(); ++i) {
      const uint8_t v = bytes[8 + i];
      if (v >= kClasses) {
        DDP_FAIL(labels_path, ": label ", int(v), " at index ", i, " is outside [0, ", kClasses,
                 ")");
      }
      d.labels[i] = v;
    }
  }
  d.classes = kClasses;
  return d;
}

}  // namespace ddp::data
