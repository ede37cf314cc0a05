// What the model tests share: batches of random or learnable images, and
// small networks that have what the real models have.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/core/rng.hpp"
#include "ddp/nn/graph.hpp"

namespace ddp::nn::test {

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
};

inline Batch random_batch(int n, uint64_t seed, int numel = 784, int classes = 10) {
  Rng rng(seed, 3);
  Batch b;
  b.x.resize(size_t(n) * numel);
  for (float& v : b.x) v = rng.uniform();
  for (int i = 0; i < n; ++i) b.y.push_back(int32_t(rng.below(uint64_t(classes))));
  return b;
}

// A small network with everything ResNet-18 has: a stem with BatchNorm, one
// residual block whose shortcut is a strided 1x1 projection, one whose
// shortcut is its input (read by two ops: the fan-out), global pooling, fc.
// relu: ResNet's ReLUs; without them the network is smooth, and finite
// differences of its loss are exact enough to check gradients against.
inline Graph tiny_resnet(int classes = 5, bool relu = true) {
  GraphBuilder b("tiny", {2, 8, 8}, /*pytorch_init=*/true);
  auto act = [&](const std::string& name, int v) { return relu ? b.relu(name, v) : v; };
  int x = act("stem.relu", b.batch_norm("stem.bn", b.conv("stem.conv", b.input(), 4, 3, 1, 1)));
  for (int blk = 0; blk < 2; ++blk) {
    const std::string p = "block" + std::to_string(blk);
    const int c = 6, stride = blk == 0 ? 2 : 1;
    int y = act(p + ".relu1", b.batch_norm(p + ".bn1", b.conv(p + ".conv1", x, c, 3, stride, 1)));
    y = b.batch_norm(p + ".bn2", b.conv(p + ".conv2", y, c, 3, 1, 1));
    const int s = blk == 0 ? b.conv(p + ".conv3", x, c, 1, stride, 0) : x;
    x = b.add(p + ".add", y, s, relu);
  }
  x = b.flatten("flat", b.global_avg_pool("gap", x));
  return b.finish(b.linear("fc", x, classes));
}

// A convolution, ReLU, global pooling and a linear layer, on 2x5x5 inputs.
inline Graph small_net(int classes = 10) {
  GraphBuilder b("small", {2, 5, 5}, /*pytorch_init=*/true);
  // The pool divides by 25: a rounding skipped before it would show.
  const int c = b.relu("relu", b.conv("conv", b.input(), 3, 3, 1, 1));
  return b.finish(b.linear("fc", b.flatten("flat", b.global_avg_pool("gap", c)), classes));
}

// n values from N(0, scale^2), stream `stream` of a fixed seed.
inline std::vector<float> normal_values(size_t n, uint64_t stream, double scale = 1.0) {
  Rng rng(17, stream);
  std::vector<float> v(n);
  for (float& x : v) x = float(scale * rng.normal());
  return v;
}

}  // namespace ddp::nn::test
