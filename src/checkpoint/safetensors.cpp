#include "ddp/checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
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

const char* to_string(Dtype d) { return d == Dtype::I64 ? "I64" : "F32"; }
size_t element_size(Dtype d) { return d == Dtype::I64 ? sizeof(int64_t) : sizeof(float); }

const char* Tensor::bytes() const {
  return dtype == Dtype::I64 ? reinterpret_cast<const char*>(ints.data()) : reinterpret_cast<const char*>(data.data());
}
size_t Tensor::byte_size() const {
  return dtype == Dtype::I64 ? ints.size() * sizeof(int64_t) : data.size() * sizeof(float);
}

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
    const size_t bytes = static_cast<size_t>(numel(t.shape)) * element_size(t.dtype());
    header[t.name] = {{"dtype", to_string(t.dtype())}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
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
  for (const auto& t : tensors) {
    const char* p = t.ints ? reinterpret_cast<const char*>(t.ints) : reinterpret_cast<const char*>(t.data);
    out.append(p, static_cast<size_t>(numel(t.shape)) * element_size(t.dtype()));
  }
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

namespace {

// One tensor entry of the header, checked against the safetensors rules.
struct Entry {
  std::string name;
  std::vector<int64_t> shape;
  Dtype dtype = Dtype::F32;
  uint64_t begin = 0, end = 0;
};

// A shape for messages, one level deep: json::dump() recurses into nested
// arrays, and a hostile header can nest them deep enough to overflow the
// stack. Its first sizes only, so a long one makes no long message either.
std::string shape_text(const json& shape) {
  if (!shape.is_array()) return shape.type_name();
  std::string s = "[";
  for (size_t i = 0; i < shape.size() && i < 8; ++i)
    s += (i ? "," : "") + (shape[i].is_number() ? shape[i].dump() : std::string(shape[i].type_name()));
  return s + (shape.size() > 8 ? ",...]" : "]");
}

Entry parse_entry(const std::string& path, const std::string& name, const json& e, uint64_t data_size) {
  auto bad = [&](const std::string& what) { DDP_FAIL(path, ": tensor '", name, "': ", what); };
  if (!e.is_object()) bad("entry is not a JSON object");
  const auto dtype = e.find("dtype");
  const auto shape = e.find("shape");
  const auto offsets = e.find("data_offsets");
  if (dtype == e.end() || shape == e.end() || offsets == e.end()) bad("entry lacks dtype, shape or data_offsets");
  if (!dtype->is_string()) bad("dtype is not a string");
  Entry t;
  t.name = name;
  const std::string type = dtype->get<std::string>();
  if (type == "I64") {
    t.dtype = Dtype::I64;
  } else if (type != "F32") {
    bad("dtype " + type + ", expected F32 (or I64 for a counter)");
  }
  const uint64_t elem = element_size(t.dtype);
  // numel = product of the shape, checked against what the buffer can hold
  // before any multiplication can overflow.
  const uint64_t max_numel = data_size / elem;
  uint64_t numel = 1;
  // The product of the sizes in order, as int64 (what every user of a shape
  // computes): one that overflows is refused even when a later 0 makes the
  // tensor empty, as Python's safetensors refuses it.
  int64_t product = 1;
  bool overflow = false;
  if (!shape->is_array()) bad("shape is not an array");
  for (const json& d : *shape) {
    if (!d.is_number_unsigned()) bad("shape " + shape_text(*shape) + " holds something other than sizes >= 0");
    const uint64_t v = d.get<uint64_t>();
    if (v > uint64_t(INT64_MAX)) bad("shape " + shape_text(*shape) + " has a dimension beyond 2^63");
    overflow = overflow || __builtin_mul_overflow(product, int64_t(v), &product);
    t.shape.push_back(int64_t(v));
    if (numel != 0 && v > max_numel / numel) numel = max_numel + 1;  // more than the file holds
    else numel *= v;
  }
  if (!offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned())
    bad("data_offsets is not a pair of offsets");
  t.begin = (*offsets)[0].get<uint64_t>();
  t.end = (*offsets)[1].get<uint64_t>();
  if (t.begin > t.end || t.end > data_size)
    bad("data offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + ") are outside the " +
        std::to_string(data_size) + " data bytes (truncated?)");
  if (numel > max_numel || t.end - t.begin != numel * elem)
    bad("shape " + shape_text(*shape) + " does not match its " + std::to_string(t.end - t.begin) + " bytes");
  if (overflow) bad("shape " + shape_text(*shape) + ": the product of its sizes passes 2^63");
  return t;
}

}  // namespace

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
  const uint64_t data_size = bytes.size() - 8 - len;
  const char* data = bytes.data() + 8 + len;
  std::vector<Entry> entries;
  try {
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        DDP_CHECK(it->is_object(), path, ": __metadata__ is not a JSON object");
        for (auto m = it->begin(); m != it->end(); ++m) {
          DDP_CHECK(m->is_string(), path, ": metadata '", m.key(), "' is not a string");
          f.metadata[m.key()] = m->get<std::string>();
        }
        continue;
      }
      entries.push_back(parse_entry(path, it.key(), *it, data_size));
    }
    // The byte buffer is the tensors, one after another: in offset order each
    // begins where the previous ended, from 0 to its very end.
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t at = 0;
    for (const Entry& e : entries) {
      DDP_CHECK(e.begin == at, path, ": tensor '", e.name, "' starts at byte ", e.begin, " of the data, where ",
                at, " was expected (", e.begin < at ? "it overlaps the tensor before it" : "a gap before it",
                ")");
      at = e.end;
    }
    DDP_CHECK(at == data_size, path, ": the tensors cover ", at, " of the ", data_size,
              " data bytes; the rest belongs to no tensor");
    for (Entry& e : entries) {
      Tensor t;
      t.name = std::move(e.name);
      t.shape = std::move(e.shape);
      t.dtype = e.dtype;
      if (t.dtype == Dtype::I64) {
        t.ints.resize((e.end - e.begin) / sizeof(int64_t));
        if (!t.ints.empty()) std::memcpy(t.ints.data(), data + e.begin, e.end - e.begin);
      } else {
        t.data.resize((e.end - e.begin) / sizeof(float));
        if (!t.data.empty()) std::memcpy(t.data.data(), data + e.begin, e.end - e.begin);
      }
      f.tensors.push_back(std::move(t));
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // json type errors, allocation failures: still this file's fault
    DDP_FAIL(path, ": malformed safetensors file (", e.what(), ")");
  }
  return f;
}

}  // namespace ddp::checkpoint
