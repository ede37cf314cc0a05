// Seed maker for the safetensors and checkpoint fuzz targets (scripts/fuzz.sh):
// a model or checkpoint file that ddp_train wrote, with every tensor cut to
// its first few elements (shape [k], scalars kept), so the seed keeps the
// real header, metadata and run state at a size the fuzzer can work on.
// A checkpoint is written again with its CRC made right for the new tensors.
//   fuzz_shrink_tensors IN OUT [k]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ddp/checkpoint/checkpoint.hpp"
#include "ddp/core/error.hpp"

int main(int argc, char** argv) {
  using namespace ddp::checkpoint;
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s IN OUT [elements per tensor, default 2]\n", argv[0]);
    return 2;
  }
  const size_t keep = argc == 4 ? std::strtoul(argv[3], nullptr, 10) : 2;
  try {
    const std::string bytes = read_file_bytes(argv[1]);
    SafetensorsFile f = decode_safetensors(argv[1], bytes);
    std::vector<TensorView> views;
    for (auto& t : f.tensors) {
      if (!t.shape.empty()) {
        t.data.resize(std::min(t.data.size(), keep));
        t.ints.resize(std::min(t.ints.size(), keep));
        t.shape = {int64_t(std::max(t.data.size(), t.ints.size()))};
      }
      views.push_back({t.name, t.shape, t.dtype == Dtype::F32 ? t.data.data() : nullptr,
                       t.dtype == Dtype::I64 ? t.ints.data() : nullptr});
    }
    const auto format = f.metadata.find("format");
    std::string out;
    if (format != f.metadata.end() && format->second == "ddp-checkpoint")
      out = encode_checkpoint(decode_checkpoint(argv[1], bytes).state, views);
    else
      out = encode_safetensors(views, f.metadata);
    write_file_atomic(argv[2], out);
  } catch (const ddp::Error& e) {
    std::fprintf(stderr, "fuzz_shrink_tensors: %s\n", e.what());
    return 1;
  }
  return 0;
}
