// AvgPool2d layer (kernel 2, stride 2, floor).
#include "ddp/core/error.hpp"
#include "ddp/nn/layers.hpp"

namespace ddp::nn {

AvgPool2d::AvgPool2d(std::string name, Shape in)
    : ShapedLayer(std::move(name), in, Shape{in.c, in.h / 2, in.w / 2}) {
  DDP_CHECK(in_.c > 0 && in_.h >= 2 && in_.w >= 2, "layer ", name_, ": input ", to_string(in_),
            " too small for 2x2 pooling");
}

void AvgPool2d::forward(const float* x, int batch, float* y) {
  cpu::avgpool2_forward(batch * in_.c, in_.h, in_.w, x, y);
}

void AvgPool2d::backward(const float* /*x*/, const float* /*y*/, const float* dy, int batch,
                         float* dx) {
  if (dx) cpu::avgpool2_backward(batch * in_.c, in_.h, in_.w, dy, dx);
}

}  // namespace ddp::nn
