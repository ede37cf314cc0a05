#include "ddp/checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "ddp/core/error.hpp"

namespace ddp::checkpoint {

namespace {

using json = nlohmann::json;

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string dir_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

void write_all(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      DDP_FAIL(path, ": write failed: ", std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

const Tensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DDP_CHECK(fd >= 0, tmp, ": cannot create: ", std::strerror(errno));
  try {
    write_all(fd, bytes.data(), bytes.size(), tmp);
    DDP_CHECK(::fsync(fd) == 0, tmp, ": fsync failed: ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    DDP_FAIL(path, ": cannot rename ", tmp, " into place: ", std::strerror(e));
  }
  // The rename is durable only once the directory entry is on disk.
  const std::string dir = dir_of(path);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::string encode_safetensors(const std::vector<TensorView>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& t : tensors) {
    const size_t bytes = static_cast<size_t>(numel(t.shape)) * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  // Pad with spaces so the data starts 8-byte aligned, as the format recommends.
  h.append((8 - (h.size() % 8)) % 8, ' ');
  std::string out;
  out.reserve(8 + h.size() + offset);
  const uint64_t len = h.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  out += h;
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian");
  for (const auto& t : tensors)
    out.append(reinterpret_cast<const char*>(t.data), static_cast<size_t>(numel(t.shape)) * sizeof(float));
  return out;
}

void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_file_atomic(path, encode_safetensors(tensors, metadata));
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DDP_CHECK(in, path, ": cannot open: ", std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return decode_safetensors(path, bytes);
}

SafetensorsFile decode_safetensors(const std::string& path, const std::string& bytes) {
  DDP_CHECK(bytes.size() >= 8, path, ": truncated: ", bytes.size(), " bytes, no safetensors header");
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  DDP_CHECK(len <= bytes.size() - 8, path, ": not a safetensors file or truncated: header length ", len,
            " exceeds the file size ", bytes.size());
  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(len));
  } catch (const json::exception& e) {
    DDP_FAIL(path, ": safetensors header is not valid JSON (", e.what(), ")");
  }
  DDP_CHECK(header.is_object(), path, ": safetensors header is not a JSON object");
  SafetensorsFile f;
  const size_t data_size = bytes.size() - 8 - len;
  const char* data = bytes.data() + 8 + len;
  std::vector<std::pair<size_t, Tensor>> ordered;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      for (auto m = it->begin(); m != it->end(); ++m) {
        DDP_CHECK(m->is_string(), path, ": metadata '", m.key(), "' is not a string");
        f.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const json& e = *it;
    try {
      const std::string dtype = e.at("dtype").get<std::string>();
      DDP_CHECK(dtype == "F32", path, ": tensor '", it.key(), "' has dtype ", dtype, ", expected F32");
      Tensor t;
      t.name = it.key();
      t.shape = e.at("shape").get<std::vector<int64_t>>();
      const auto off = e.at("data_offsets").get<std::vector<size_t>>();
      DDP_CHECK(off.size() == 2 && off[0] <= off[1] && off[1] <= data_size, path, ": tensor '", t.name,
                "' has data offsets outside the file (truncated?)");
      DDP_CHECK(off[1] - off[0] == static_cast<size_t>(numel(t.shape)) * sizeof(float), path,
                ": tensor '", t.name, "' byte length does not match its shape");
      t.data.resize(static_cast<size_t>(numel(t.shape)));
      std::memcpy(t.data.data(), data + off[0], off[1] - off[0]);
      ordered.emplace_back(off[0], std::move(t));
    } catch (const json::exception& ex) {
      DDP_FAIL(path, ": tensor '", it.key(), "' entry is malformed (", ex.what(), ")");
    }
  }
  std::sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [off, t] : ordered) f.tensors.push_back(std::move(t));
  return f;
}

}  // namespace ddp::checkpoint
