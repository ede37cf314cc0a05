// ReLU layer.
#include "ddp/core/error.hpp"
#include "ddp/nn/layers.hpp"

namespace ddp::nn {

ReLU::ReLU(std::string name, Shape in) : name_(std::move(name)), in_(in) {}

Shape ReLU::output_shape(const Shape& in) const {
  DDP_CHECK(in == in_, "layer ", name_, ": built for input ", to_string(in_), ", fed ",
            to_string(in));
  return in_;
}

void ReLU::forward(const float* x, int batch, float* y) {
  cpu::relu_forward(int64_t(batch) * in_.numel(), x, y);
}

void ReLU::backward(const float* /*x*/, const float* y, const float* dy, int batch, float* dx) {
  if (dx) cpu::relu_backward(int64_t(batch) * in_.numel(), y, dy, dx);
}

}  // namespace ddp::nn
