// Helpers for the data tests: IDX files built byte by byte (so each test can
// break exactly one thing), a temporary directory, and error checks.
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"

namespace ddp::data::testing {

inline void put_be32(std::vector<uint8_t>& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(uint8_t(v >> s));
}

inline std::vector<uint8_t> idx_images(uint32_t n, uint32_t rows, uint32_t cols,
                                       uint32_t magic = 2051) {
  std::vector<uint8_t> b;
  put_be32(b, magic);
  put_be32(b, n);
  put_be32(b, rows);
  put_be32(b, cols);
  for (uint64_t i = 0; i < uint64_t(n) * rows * cols; ++i) b.push_back(uint8_t(i * 7 % 256));
  return b;
}

inline std::vector<uint8_t> idx_labels(const std::vector<uint8_t>& labels, uint32_t magic = 2049) {
  std::vector<uint8_t> b;
  put_be32(b, magic);
  put_be32(b, uint32_t(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

inline void write_raw(const std::string& path, const std::vector<uint8_t>& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) {
    EXPECT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size()) << path;
  }
  std::fclose(f);
}

inline std::vector<uint8_t> gzip(const std::vector<uint8_t>& bytes) {
  uLongf cap = compressBound(bytes.size()) + 64;
  std::vector<uint8_t> out(cap);
  z_stream z{};
  // windowBits 15 + 16: a gzip wrapper, as the Fashion-MNIST files have.
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  z.next_in = const_cast<uint8_t*>(bytes.data());
  z.avail_in = uInt(bytes.size());
  z.next_out = out.data();
  z.avail_out = uInt(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// A gzip file holding `prefix` and then `zeros` zero bytes, deflated as it is
// written (a gigabyte of zeros takes about a megabyte and a second).
inline void write_gzip_with_zeros(const std::string& path, const std::vector<uint8_t>& prefix, uint64_t zeros) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  z_stream z{};
  ASSERT_EQ(deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY), Z_OK);
  std::vector<uint8_t> zero(size_t(1) << 20, 0), out(size_t(1) << 16);
  auto pump = [&](const uint8_t* p, size_t n, int flush) {
    z.next_in = const_cast<uint8_t*>(p);
    z.avail_in = uInt(n);
    do {
      z.next_out = out.data();
      z.avail_out = uInt(out.size());
      deflate(&z, flush);
      std::fwrite(out.data(), 1, out.size() - z.avail_out, f);
    } while (z.avail_out == 0);
  };
  pump(prefix.data(), prefix.size(), Z_NO_FLUSH);
  for (uint64_t left = zeros; left > 0;) {
    const size_t n = size_t(std::min<uint64_t>(left, zero.size()));
    pump(zero.data(), n, Z_NO_FLUSH);
    left -= n;
  }
  pump(nullptr, 0, Z_FINISH);
  deflateEnd(&z);
  std::fclose(f);
}

// The decompressed bytes of a gzip (or raw) file.
inline std::vector<uint8_t> gunzip_file(const std::string& path) {
  std::vector<uint8_t> out;
  gzFile f = gzopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  if (!f) return out;
  uint8_t buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
  gzclose(f);
  return out;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ddp_data_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) std::abort();
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs fn, which must throw ddp::Error with every one of parts in its message.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no ddp::Error thrown; expected one mentioning \"" << *parts.begin() << "\"";
  } catch (const ddp::Error& e) {
    const std::string what = e.what();
    for (const auto& p : parts) {
      EXPECT_NE(what.find(p), std::string::npos) << "message: " << what << "\nlacks: " << p;
    }
    EXPECT_EQ(what.find('\n'), std::string::npos) << "message is not one line: " << what;
  }
}

}  // namespace ddp::data::testing
