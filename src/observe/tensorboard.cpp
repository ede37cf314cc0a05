#include "ddp/observe/tensorboard.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <system_error>

#include "ddp/core/error.hpp"
#include "ddp/observe/tfrecord.hpp"
#include "src/observe/proto/event.pb.h"    // tensorflow::Event
#include "src/observe/proto/summary.pb.h"  // tensorflow::Summary

namespace ddp::observe {

namespace {

// Scalars reach the file in writes of about this size (or at flush()): a step's
// handful of records costs no system call.
constexpr size_t kWriteBytes = 64 * 1024;

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// RFC 3629's well-formed UTF-8 (no overlong forms, surrogates or code points
// past U+10FFFF). Protobuf's string fields must hold it: TensorBoard's reader
// raises on the first event that does not, and shows nothing of the run.
bool is_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (c < 0x80) {
      len = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (n - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      const unsigned b = p[i + k];
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return false;
    }
    i += len;
  }
  return true;
}

std::string framed(const tensorflow::Event& event, const std::string& path) {
  std::string data;
  DDP_CHECK(event.SerializeToString(&data), path, ": cannot serialise a TensorBoard event");
  std::string record;
  append_tfrecord(record, data);
  return record;
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  DDP_CHECK(!ec, dir, ": cannot create the TensorBoard directory: ", ec.message());
  DDP_CHECK(std::filesystem::is_directory(dir, ec), dir, ": not a directory");

  const std::string base = dir + "/events.out.tfevents." + std::to_string(std::time(nullptr)) + "." +
                           host_name() + "." + std::to_string(::getpid());
  // O_EXCL: two writers in one process (or a reused pid) within one second
  // must not interleave their records in one file.
  for (int n = 0; fd_ < 0; ++n) {
    path_ = n == 0 ? base : base + "." + std::to_string(n);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    DDP_CHECK(fd_ >= 0 || (errno == EEXIST && n < 1000), path_, ": cannot create the TensorBoard events file: ",
              std::strerror(errno));
  }

  tensorflow::Event version;
  version.set_wall_time(now_seconds());
  version.set_file_version("brain.Event:2");
  buffer_ = framed(version, path_);
  try {
    flush();  // an unwritable file system shows now, not an epoch later
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  try {
    write_buffer();
  } catch (...) {
  }
  ::close(fd_);
}

void TensorBoardWriter::scalar(const std::string& tag, int64_t step, double value) {
  scalar(tag, step, value, now_seconds());
}

void TensorBoardWriter::scalar(const std::string& tag, int64_t step, double value, double wall_time) {
  DDP_CHECK(!tag.empty(), path_, ": a TensorBoard scalar needs a tag");
  DDP_CHECK(is_utf8(tag), path_, ": TensorBoard tag \"", tag, "\" is not UTF-8");
  tensorflow::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  tensorflow::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  buffer_ += framed(event, path_);
  if (buffer_.size() >= kWriteBytes) write_buffer();
}

void TensorBoardWriter::flush() {
  write_buffer();
  DDP_CHECK(::fdatasync(fd_) == 0, path_, ": cannot sync the TensorBoard events file: ", std::strerror(errno));
}

void TensorBoardWriter::write_buffer() {
  size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t w = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int e = errno;
      // The file now ends in a torn record, which readers stop at: nothing
      // written after it would be seen, so the rest is dropped, not retried.
      buffer_.clear();
      DDP_FAIL(path_, ": cannot write the TensorBoard events file: ", std::strerror(e));
    }
    done += static_cast<size_t>(w);
  }
  buffer_.clear();
}

}  // namespace ddp::observe
