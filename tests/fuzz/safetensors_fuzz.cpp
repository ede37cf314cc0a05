// Fuzz target "safetensors": the bytes are a safetensors file, decoded by
// decode_safetensors (what read_safetensors does with a file's bytes). A file
// it accepts must say what it holds: each tensor's elements match its shape,
// and writing the result again gives the same data section, byte for byte
// (the tensors lie end to end over it), and the same names, shapes and
// metadata when read back. Seeds: model files written by ddp_train, cut
// short and with their tensors shrunk (scripts/fuzz.sh).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/checkpoint/safetensors.hpp"
#include "fuzz_support.hpp"

namespace {

using ddp::checkpoint::Dtype;
using ddp::checkpoint::SafetensorsFile;
using ddp::fuzz::finding;

// The data section: what follows the 8-byte length and the header.
std::string data_section(const std::string& bytes) {
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return bytes.substr(8 + len);
}

void check_accepted(const SafetensorsFile& f, const std::string& bytes) {
  std::vector<ddp::checkpoint::TensorView> views;
  for (const auto& t : f.tensors) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) finding("tensor '" + t.name + "' accepted with a negative dimension");
      if (__builtin_mul_overflow(numel, uint64_t(d), &numel))
        finding("tensor '" + t.name + "' accepted with a shape whose size overflows 64 bits");
    }
    const size_t held = t.dtype == Dtype::I64 ? t.ints.size() : t.data.size();
    if ((t.dtype == Dtype::I64 ? !t.data.empty() : !t.ints.empty()) || held != numel)
      finding("tensor '" + t.name + "' holds " + std::to_string(held) + " elements, its shape says " +
              std::to_string(numel));
    // TensorView tells I64 by a non-null pointer, also for no elements.
    static const int64_t no_ints = 0;
    const int64_t* ints = t.ints.empty() ? &no_ints : t.ints.data();
    views.push_back({t.name, t.shape, t.dtype == Dtype::F32 ? t.data.data() : nullptr,
                     t.dtype == Dtype::I64 ? ints : nullptr});
  }
  const std::string again = ddp::checkpoint::encode_safetensors(views, f.metadata);
  if (data_section(again) != data_section(bytes)) finding("the tensors read are not the file's data bytes");
  SafetensorsFile g;
  try {
    g = ddp::checkpoint::decode_safetensors("again.safetensors", again);
  } catch (const ddp::Error& e) {
    finding(std::string("the file written from what was read is refused: ") + e.what());
  }
  if (g.metadata != f.metadata || g.tensors.size() != f.tensors.size())
    finding("the file written from what was read reads back differently");
  for (size_t i = 0; i < f.tensors.size(); ++i)
    if (g.tensors[i].name != f.tensors[i].name || g.tensors[i].shape != f.tensors[i].shape ||
        g.tensors[i].dtype != f.tensors[i].dtype)
      finding("tensor '" + f.tensors[i].name + "' reads back differently");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = "fuzzed.safetensors";
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  SafetensorsFile f;
  if (ddp::fuzz::read_or_error({path}, [&] { f = ddp::checkpoint::decode_safetensors(path, bytes); }))
    check_accepted(f, bytes);
  return 0;
}
