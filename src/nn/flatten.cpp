// Flatten layer: NCHW is already flat per sample, so both directions are copies.
#include <algorithm>

#include "ddp/nn/layers.hpp"

namespace ddp::nn {

Flatten::Flatten(std::string name, Shape in)
    : ShapedLayer(std::move(name), in, Shape{int(in.numel()), 1, 1}) {}

void Flatten::forward(const float* x, int batch, float* y) {
  std::copy(x, x + int64_t(batch) * in_.numel(), y);
}

void Flatten::backward(const float* /*x*/, const float* /*y*/, const float* dy, int batch,
                       float* dx) {
  if (dx) std::copy(dy, dy + int64_t(batch) * in_.numel(), dx);
}

}  // namespace ddp::nn
