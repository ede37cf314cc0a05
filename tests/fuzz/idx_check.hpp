// The IDX harnesses' common part: one file of fuzzed bytes, read by load_idx
// as the images file (beside a valid labels file) and as the labels file
// (beside valid images). The partners hold 2 items, as the seed corpus's
// files do, so a fuzzed file of 2 items gets past the count comparison to
// the label checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/data/dataset.hpp"
#include "fuzz_support.hpp"

namespace ddp::fuzz {

struct IdxFiles {
  std::string fuzzed, images, labels;
};

inline std::vector<uint8_t> be32(uint32_t v) {
  return {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
}

inline const IdxFiles& idx_files() {
  static const IdxFiles f = [] {
    IdxFiles files{scratch_dir() + "/fuzzed-idx-ubyte", scratch_dir() + "/partner-images-idx3-ubyte",
                   scratch_dir() + "/partner-labels-idx1-ubyte"};
    std::vector<uint8_t> images;
    for (uint32_t v : {2051u, 2u, 28u, 28u})
      for (uint8_t b : be32(v)) images.push_back(b);
    for (int i = 0; i < 2 * 28 * 28; ++i) images.push_back(uint8_t(i * 7));
    std::vector<uint8_t> labels;
    for (uint32_t v : {2049u, 2u})
      for (uint8_t b : be32(v)) labels.push_back(b);
    labels.push_back(3);
    labels.push_back(7);
    write_file(files.images, images.data(), images.size());
    write_file(files.labels, labels.data(), labels.size());
    return files;
  }();
  return f;
}

// What a dataset load_idx returned must be: sizes that agree with its
// dimensions, pixels in [0, 1], labels in [0, classes).
inline void check_dataset(const data::Dataset& d) {
  if (d.n <= 0 || d.h <= 0 || d.w <= 0 || d.c != 1) finding("load_idx returned dimensions that make no dataset");
  if (d.images.size() != uint64_t(d.n) * uint64_t(d.sample_numel()) || d.labels.size() != uint64_t(d.n))
    finding("load_idx returned sizes that disagree with its dimensions");
  for (float v : d.images)
    if (!(v >= 0.0f && v <= 1.0f)) finding("load_idx returned a pixel outside [0, 1]");
  for (int32_t l : d.labels)
    if (l < 0 || l >= d.classes) finding("load_idx returned a label outside [0, classes)");
}

// The file at files.fuzzed (already written) as images, then as labels.
inline void check_idx_file(const IdxFiles& f) {
  read_or_error({f.fuzzed}, [&] { check_dataset(data::load_idx(f.fuzzed, f.labels)); });
  read_or_error({f.fuzzed}, [&] { check_dataset(data::load_idx(f.images, f.fuzzed)); });
}

}  // namespace ddp::fuzz
