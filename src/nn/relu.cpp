// ReLU layer.
#include "ddp/nn/layers.hpp"

namespace ddp::nn {

ReLU::ReLU(std::string name, Shape in) : ShapedLayer(std::move(name), in, in) {}

void ReLU::forward(const float* x, int batch, float* y) {
  cpu::relu_forward(int64_t(batch) * in_.numel(), x, y);
}

void ReLU::backward(const float* /*x*/, const float* y, const float* dy, int batch, float* dx) {
  if (dx) cpu::relu_backward(int64_t(batch) * in_.numel(), y, dy, dx);
}

}  // namespace ddp::nn
