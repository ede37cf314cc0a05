// Fuzz target "idx": the bytes are an IDX file as it lies on disk, raw or
// gzip (load_idx decides by content), read through load_idx's streaming
// reader (Note [bounded reads], data/idx.cpp). Seeds: small cuts of the
// Fashion-MNIST subset's files, raw and gzipped (scripts/fuzz.sh).
#include <cstddef>
#include <cstdint>

#include "idx_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& files = ddp::fuzz::idx_files();
  ddp::fuzz::write_file(files.fuzzed, data, size);
  ddp::fuzz::check_idx_file(files);
  return 0;
}
