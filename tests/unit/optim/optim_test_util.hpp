// An Optimizer over a few host tensors on the CPU device, for the unit tests.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ddp/nn/device.hpp"
#include "ddp/optim/kernels.hpp"
#include "ddp/optim/optimizer.hpp"

namespace ddp::optim::test {

// Tensors of the given shapes, flat one after another.
inline std::vector<nn::TensorInfo> tensors(const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<nn::TensorInfo> out;
  size_t offset = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    nn::TensorInfo t;
    t.name = "t" + std::to_string(i);
    t.shape = shapes[i];
    t.numel = 1;
    for (int64_t d : shapes[i]) t.numel *= size_t(d);
    t.offset = offset;
    offset += t.numel;
    out.push_back(t);
  }
  return out;
}

struct Rig {
  std::unique_ptr<nn::Device> device = nn::make_cpu_device(1);
  std::unique_ptr<Kernels> kernels = make_cpu_kernels();
  std::unique_ptr<Optimizer> opt;
  Rig(const Options& o, const std::vector<nn::TensorInfo>& t) : opt(std::make_unique<Optimizer>(o, t, *device, *kernels)) {}
};

// Gradients of step `step`, element i: smooth, of both signs, not small.
inline float grad_at(int step, size_t i) { return 0.1f * float(step + 1) * float(i % 5 + 1) - 0.35f + 0.01f * float(i); }

}  // namespace ddp::optim::test
