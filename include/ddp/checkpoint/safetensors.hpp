// Safetensors files: an 8-byte little-endian header length, a JSON header
// (name -> dtype, shape, data_offsets; "__metadata__" -> string map), then the
// raw little-endian tensor bytes. Files written here open unchanged in
// Python's safetensors and in PyTorch.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ddp::checkpoint {

// F32 for parameters, optimizer state and float buffers; I64 for counters
// (BatchNorm's num_batches_tracked, as PyTorch stores it).
enum class Dtype { F32, I64 };
const char* to_string(Dtype d);  // "F32", "I64": the safetensors names
size_t element_size(Dtype d);

struct TensorView {
  std::string name;
  std::vector<int64_t> shape;   // [] for a scalar
  const float* data = nullptr;  // F32: numel(shape) elements
  const int64_t* ints = nullptr;  // I64 instead (data nullptr)
  Dtype dtype() const { return ints ? Dtype::I64 : Dtype::F32; }
};

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  Dtype dtype = Dtype::F32;
  std::vector<float> data;    // F32
  std::vector<int64_t> ints;  // I64
  // The stored little-endian bytes.
  const char* bytes() const;
  size_t byte_size() const;
};

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;
  std::vector<Tensor> tensors;  // in file order
  const Tensor* find(const std::string& name) const;
};

// Writes atomically: a temporary file in the same directory, fsync, rename over
// `path`, fsync the directory. A crash at any point leaves either the old file
// or the new one, never a torn one. Throws ddp::Error naming the path.
void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata);

// Reads and validates (header length, JSON, dtype F32 or I64, offsets in
// bounds and contiguous, file size). Throws ddp::Error naming the path and
// the problem.
SafetensorsFile read_safetensors(const std::string& path);

// The same, in memory: the file's bytes, and a parse of bytes read from path
// (path only names the source in errors).
std::string encode_safetensors(const std::vector<TensorView>& tensors,
                               const std::map<std::string, std::string>& metadata);
SafetensorsFile decode_safetensors(const std::string& path, const std::string& bytes);

// Bytes of a file, fsynced, as one atomic replace of `path` (used above).
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace ddp::checkpoint
