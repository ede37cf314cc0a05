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

struct TensorView {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // F32, numel(shape) elements
};

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
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

// Reads and validates (header length, JSON, dtype F32, offsets in bounds and
// contiguous, file size). Throws ddp::Error naming the path and the problem.
SafetensorsFile read_safetensors(const std::string& path);

// The same, in memory: the file's bytes, and a parse of bytes read from path
// (path only names the source in errors).
std::string encode_safetensors(const std::vector<TensorView>& tensors,
                               const std::map<std::string, std::string>& metadata);
SafetensorsFile decode_safetensors(const std::string& path, const std::string& bytes);

// Bytes of a file, fsynced, as one atomic replace of `path` (used above).
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace ddp::checkpoint
