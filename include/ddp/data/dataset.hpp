// ddp::data::Dataset: images as float in [0, 1], NCHW, with int labels.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::data {

struct Dataset {
  int64_t n = 0;
  int c = 1, h = 28, w = 28;
  int classes = 10;
  std::vector<float> images;    // n * c * h * w
  std::vector<int32_t> labels;  // n, each in [0, classes)
  std::string source;           // what it was read from, for messages
  int64_t sample_numel() const { return int64_t(c) * h * w; }
};

struct Split {
  Dataset train;
  Dataset test;
};

// One IDX pair (images idx3, labels idx1), gzip or raw (detected by content).
// Validates magic numbers, dimensions, that both files hold the same number of
// items, and that each file has exactly the bytes its header announces.
// Throws ddp::Error naming the file and what is wrong.
Dataset load_idx(const std::string& images_path, const std::string& labels_path);

// A directory laid out as Fashion-MNIST/MNIST ship: train-images-idx3-ubyte[.gz],
// train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz].
// A missing file is an error naming the path looked for.
Split load_idx_dir(const std::string& dir);

// A generated, learnable dataset of n training images (and n / 5, at least 1,
// test images) of size 28x28 in 10 classes: each class is a distinct pattern
// with noise and random shifts, so a LeNet learns it well above chance.
// Deterministic in (n, seed).
Split make_synthetic(int64_t n, uint64_t seed);

}  // namespace ddp::data
