// Linear layer: binds its slices of the flat buffers and runs the CPU kernel.
#include "ddp/core/error.hpp"
#include "ddp/nn/layers.hpp"

namespace ddp::nn {

Linear::Linear(std::string name, int in_features, int out_features)
    : name_(std::move(name)), in_(in_features), out_(out_features) {
  DDP_CHECK(in_ > 0 && out_ > 0, "layer ", name_, ": bad size ", in_, " -> ", out_);
}

Shape Linear::output_shape(const Shape& in) const {
  DDP_CHECK(in.numel() == in_, "layer ", name_, ": expects ", in_, " input features, fed ",
            to_string(in), " (", in.numel(), ")");
  return Shape{out_, 1, 1};
}

std::vector<ParamSpec> Linear::param_specs() const {
  return {{"weight", {out_, in_}, Init::Normal001}, {"bias", {out_}, Init::Zero}};
}

void Linear::bind(const std::vector<float*>& params, const std::vector<float*>& grads) {
  p_.bind(name_, params, grads);
}

void Linear::forward(const float* x, int batch, float* y) {
  DDP_CHECK(p_.w, "layer ", name_, ": forward before bind");
  cpu::linear_forward(batch, in_, out_, x, p_.w, p_.b, y, pool_);
}

void Linear::backward(const float* x, const float* /*y*/, const float* dy, int batch, float* dx) {
  DDP_CHECK(p_.dw, "layer ", name_, ": backward before bind");
  cpu::linear_backward(batch, in_, out_, x, p_.w, dy, p_.dw, p_.db, dx, pool_);
}

}  // namespace ddp::nn
