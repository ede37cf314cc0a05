// Flatten layer: NCHW is already flat per sample, so both directions are copies.
#include <algorithm>

#include "ddp/core/error.hpp"
#include "ddp/nn/layers.hpp"

namespace ddp::nn {

Flatten::Flatten(std::string name, Shape in) : name_(std::move(name)), in_(in) {}

Shape Flatten::output_shape(const Shape& in) const {
  DDP_CHECK(in == in_, "layer ", name_, ": built for input ", to_string(in_), ", fed ",
            to_string(in));
  return Shape{int(in_.numel()), 1, 1};
}

void Flatten::forward(const float* x, int batch, float* y) {
  std::copy(x, x + int64_t(batch) * in_.numel(), y);
}

void Flatten::backward(const float* /*x*/, const float* /*y*/, const float* dy, int batch,
                       float* dx) {
  if (dx) std::copy(dy, dy + int64_t(batch) * in_.numel(), dx);
}

}  // namespace ddp::nn
