// load_idx: one IDX images/labels pair, gzip or raw, checked byte for byte.
//
// Note [bounded reads]: a file is read as a stream, header first. Nothing is
// allocated before the header is checked, and then at most what the header
// declares: the body is read up to its declared size and no further, so a
// gzip bomb (a small file that inflates to gigabytes) costs what its header
// declares plus a small constant, never what it inflates to. A raw file's
// size is compared with the header before its body is read; a gzip file
// cannot inflate to more than kMaxInflate times its size (deflate's limit),
// so a header that declares more is refused before any allocation too.
#include "ddp/data/dataset.hpp"

#include <sys/stat.h>
#include <zlib.h>  // inflate: gzip members, one after another, as gzip -d reads them

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>

#include "ddp/core/error.hpp"

namespace ddp::data {
namespace {

constexpr uint32_t kImagesMagic = 2051;  // 0x00000803: unsigned bytes, 3 dims
constexpr uint32_t kLabelsMagic = 2049;  // 0x00000801: unsigned bytes, 1 dim
constexpr uint32_t kMaxSide = 1024;
constexpr int kClasses = 10;
// Deflate codes at most 258 bytes in 2 bits (about 1032:1).
constexpr uint64_t kMaxInflate = 1032;
// Extra data after the body is counted up to this much, then the read stops.
constexpr uint64_t kMaxExtraCounted = uint64_t(16) << 20;
constexpr size_t kChunk = size_t(1) << 16;

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};

// A file's content: gzip inflated as it is read (several members are read one
// after another, as gzip -d does; anything after the last member that is not
// another member is an error, never ignored), other files passed through.
// Decided by content (the magic 1f 8b), not by name.
class IdxStream {
 public:
  explicit IdxStream(const std::string& path) : path_(path), in_(kChunk) {
    errno = 0;
    file_.reset(std::fopen(path.c_str(), "rb"));
    if (!file_) DDP_FAIL(path, ": cannot open: ", errno ? std::strerror(errno) : "unknown error");
    struct stat st {};
    if (::fstat(::fileno(file_.get()), &st) != 0) DDP_FAIL(path, ": cannot stat: ", std::strerror(errno));
    file_size_ = static_cast<uint64_t>(st.st_size);
    want_input(2);
    gzip_ = avail_ >= 2 && in_[pos_] == 0x1f && in_[pos_ + 1] == 0x8b;
    if (gzip_) {
      if (inflateInit2(&z_, 15 + 16) != Z_OK) DDP_FAIL(path, ": cannot start zlib");
      z_ready_ = true;
    }
  }
  ~IdxStream() {
    if (z_ready_) inflateEnd(&z_);
  }
  IdxStream(const IdxStream&) = delete;
  IdxStream& operator=(const IdxStream&) = delete;

  bool gzip() const { return gzip_; }
  uint64_t file_size() const { return file_size_; }

  // Up to n bytes of content into dst; fewer only at its end.
  size_t read(uint8_t* dst, size_t n) { return gzip_ ? inflate_into(dst, n) : copy_into(dst, n); }

 private:
  // At least k unread input bytes in in_[pos_, pos_ + avail_), unless the
  // file ends first.
  void want_input(size_t k) {
    if (avail_ >= k || eof_) return;
    std::memmove(in_.data(), in_.data() + pos_, avail_);
    pos_ = 0;
    while (avail_ < k && !eof_) {
      const size_t got = std::fread(in_.data() + avail_, 1, in_.size() - avail_, file_.get());
      if (got == 0) {
        if (std::ferror(file_.get())) DDP_FAIL(path_, ": read error: ", std::strerror(errno));
        eof_ = true;
      }
      avail_ += got;
      read_ += got;
    }
  }

  size_t copy_into(uint8_t* dst, size_t n) {
    size_t got = 0;
    while (got < n) {
      want_input(1);
      if (avail_ == 0) break;
      const size_t k = std::min(n - got, avail_);
      std::memcpy(dst + got, in_.data() + pos_, k);
      pos_ += k;
      avail_ -= k;
      got += k;
    }
    return got;
  }

  size_t inflate_into(uint8_t* dst, size_t n) {
    size_t got = 0;
    while (got < n) {
      if (member_done_) {
        // Another member, or the end of the file; anything else is refused.
        want_input(2);
        if (avail_ == 0) break;
        if (avail_ < 2 || in_[pos_] != 0x1f || in_[pos_ + 1] != 0x8b) {
          const uint64_t trailing = file_size_ - (read_ - avail_);
          DDP_FAIL(path_, ": ", trailing, " bytes after the end of the gzip data are not gzip data");
        }
        inflateReset(&z_);
        member_done_ = false;
      }
      want_input(1);
      if (avail_ == 0) DDP_FAIL(path_, ": gzip stream is truncated or corrupt (zlib: unexpected end of file)");
      z_.next_in = in_.data() + pos_;
      z_.avail_in = static_cast<uInt>(avail_);
      const size_t before = got;
      z_.next_out = dst + got;
      z_.avail_out = static_cast<uInt>(std::min<size_t>(n - got, UINT_MAX));
      const int rc = inflate(&z_, Z_NO_FLUSH);
      const size_t used = avail_ - z_.avail_in;
      pos_ += used;
      avail_ -= used;
      got = static_cast<size_t>(z_.next_out - dst);
      if (rc == Z_STREAM_END) {
        member_done_ = true;
      } else if (rc == Z_BUF_ERROR && used == 0 && got == before) {
        // No progress with input and room for output: zlib cannot go on.
        DDP_FAIL(path_, ": gzip stream is truncated or corrupt (zlib: no progress)");
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        DDP_FAIL(path_, ": gzip stream is truncated or corrupt (zlib: ", z_.msg ? z_.msg : zError(rc), ")");
      }
    }
    return got;
  }

  std::string path_;
  std::unique_ptr<FILE, FileCloser> file_;
  uint64_t file_size_ = 0;
  std::vector<uint8_t> in_;
  size_t pos_ = 0, avail_ = 0;  // unread input: in_[pos_, pos_ + avail_)
  uint64_t read_ = 0;           // bytes read from the file so far
  bool eof_ = false;
  bool gzip_ = false;
  z_stream z_{};
  bool z_ready_ = false;
  bool member_done_ = false;  // the last inflate ended a member
};

uint32_t be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

std::string hex32(uint32_t v) {
  char s[11];
  std::snprintf(s, sizeof s, "0x%08x", v);
  return s;
}

struct IdxFile {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> body;  // exactly the product of dims
};

// Reads an IDX file of the given magic (Note [bounded reads]): the header,
// checked; exactly the body its dimensions announce; and nothing after it.
IdxFile read_idx(const std::string& path, uint32_t magic, const char* kind, const char* body) {
  IdxStream s(path);
  const size_t ndims = magic & 0xff;
  const size_t header = 4 + 4 * ndims;
  std::array<uint8_t, 4 + 4 * 255> head{};
  const size_t got_magic = s.read(head.data(), 4);
  if (got_magic < 4) {
    DDP_FAIL(path, ": truncated: file ends inside the IDX header (", got_magic, " of ", header, " bytes)");
  }
  const uint32_t found = be32(head.data());
  if (found != magic) {
    const char* hint = found == kImagesMagic   ? "; this is an IDX images file"
                       : found == kLabelsMagic ? "; this is an IDX labels file"
                                               : "";
    DDP_FAIL(path, ": bad magic ", hex32(found), ", expected ", magic, " (IDX ", kind, ")", hint);
  }
  const size_t got_dims = s.read(head.data() + 4, header - 4);
  if (got_dims < header - 4) {
    DDP_FAIL(path, ": truncated: file ends inside the IDX header (", 4 + got_dims, " of ", header, " bytes)");
  }
  IdxFile f;
  f.dims.resize(ndims);
  uint64_t expected = 1;  // at most 2^32 * kMaxSide^(ndims - 1): no overflow for ndims <= 3
  for (size_t i = 0; i < ndims; ++i) {
    f.dims[i] = be32(head.data() + 4 + 4 * i);
    if (f.dims[i] == 0) DDP_FAIL(path, ": dimension ", i, " is 0 (an empty IDX ", kind, " file)");
    if (i > 0 && f.dims[i] > kMaxSide) {
      DDP_FAIL(path, ": dimension ", i, " is ", f.dims[i], ", more than the ", kMaxSide,
               " we accept for an image side");
    }
    expected *= f.dims[i];
  }
  // Refuse what the file cannot hold before allocating for it.
  if (!s.gzip()) {
    const uint64_t have = s.file_size() - std::min<uint64_t>(s.file_size(), header);
    if (have < expected) {
      DDP_FAIL(path, ": truncated: expected ", expected, " bytes of ", body, " data, found ", have);
    }
    if (have > expected) {
      DDP_FAIL(path, ": ", have - expected, " extra bytes after the ", expected, " bytes of ", body,
               " data the header announces");
    }
  } else if (expected > kMaxInflate * s.file_size()) {
    DDP_FAIL(path, ": truncated: expected ", expected, " bytes of ", body, " data, but a gzip file of ",
             s.file_size(), " bytes inflates to at most ", kMaxInflate * s.file_size());
  }
  // Grown as data arrives, so a body that ends early costs what it held.
  uint64_t have = 0;
  std::vector<uint8_t> chunk(kChunk);
  while (have < expected) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(expected - have, kChunk));
    const size_t n = s.read(chunk.data(), want);
    f.body.insert(f.body.end(), chunk.begin(), chunk.begin() + static_cast<long>(n));
    have += n;
    if (n < want) break;
  }
  if (have < expected) {
    DDP_FAIL(path, ": truncated: expected ", expected, " bytes of ", body, " data, found ", have);
  }
  // Nothing may follow: count what does, up to a bound.
  uint64_t extra = 0;
  for (size_t n; extra <= kMaxExtraCounted && (n = s.read(chunk.data(), chunk.size())) > 0;) extra += n;
  if (extra > kMaxExtraCounted) {
    DDP_FAIL(path, ": more than ", kMaxExtraCounted, " extra bytes after the ", expected, " bytes of ", body,
             " data the header announces (stopped reading there)");
  }
  if (extra > 0) {
    DDP_FAIL(path, ": ", extra, " extra bytes after the ", expected, " bytes of ", body,
             " data the header announces");
  }
  return f;
}

}  // namespace

Dataset load_idx(const std::string& images_path, const std::string& labels_path) {
  Dataset d;
  d.source = images_path;
  {
    const IdxFile f = read_idx(images_path, kImagesMagic, "images", "pixel");
    d.n = f.dims[0];
    d.c = 1;
    d.h = static_cast<int>(f.dims[1]);
    d.w = static_cast<int>(f.dims[2]);
    std::array<float, 256> scale;  // ToTensor's x / 255, as d2l trains on
    for (int v = 0; v < 256; ++v) scale[v] = static_cast<float>(v) / 255.0f;
    d.images.resize(f.body.size());
    for (size_t i = 0; i < d.images.size(); ++i) d.images[i] = scale[f.body[i]];
  }
  {
    const IdxFile f = read_idx(labels_path, kLabelsMagic, "labels", "label");
    if (int64_t(f.dims[0]) != d.n) {
      DDP_FAIL(labels_path, ": holds ", f.dims[0], " labels but ", images_path, " holds ", d.n, " images");
    }
    d.labels.resize(f.dims[0]);
    for (size_t i = 0; i < d.labels.size(); ++i) {
      const uint8_t v = f.body[i];
      if (v >= kClasses) {
        DDP_FAIL(labels_path, ": label ", int(v), " at index ", i, " is outside [0, ", kClasses, ")");
      }
      d.labels[i] = v;
    }
  }
  d.classes = kClasses;
  return d;
}

}  // namespace ddp::data
