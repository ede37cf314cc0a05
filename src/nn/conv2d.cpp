// Conv2d and what it shares with ConvReluPool: binds its slices of the flat
// buffers and runs the CPU kernel.
#include "ddp/core/error.hpp"
#include "ddp/nn/layers.hpp"

namespace ddp::nn {

ConvBase::ConvBase(std::string name, Shape in, int out_c, int k, int stride, int pad)
    : ShapedLayer(std::move(name), in), out_c_(out_c), k_(k), stride_(stride), pad_(pad) {
  try {
    cpu::check_conv_geom(geom(1));
  } catch (const Error& e) {
    DDP_FAIL("layer ", name_, ": ", e.what());
  }
}

cpu::ConvGeom ConvBase::geom(int batch) const {
  cpu::ConvGeom g;
  g.batch = batch;
  g.in_c = in_.c;
  g.in_h = in_.h;
  g.in_w = in_.w;
  g.out_c = out_c_;
  g.k = k_;
  g.stride = stride_;
  g.pad = pad_;
  return g;
}

std::vector<ParamSpec> ConvBase::param_specs() const {
  return {{"weight", {out_c_, in_.c, k_, k_}, Init::Normal001}, {"bias", {out_c_}, Init::Zero}};
}

void ConvBase::bind(const std::vector<float*>& params, const std::vector<float*>& grads) {
  p_.bind(name_, params, grads);
}

Conv2d::Conv2d(std::string name, Shape in, int out_c, int k, int stride, int pad)
    : ConvBase(std::move(name), in, out_c, k, stride, pad) {
  const cpu::ConvGeom g = geom(1);
  out_ = Shape{out_c_, g.out_h(), g.out_w()};
}

void Conv2d::forward(const float* x, int batch, float* y) {
  DDP_CHECK(p_.w, "layer ", name_, ": forward before bind");
  cpu::conv2d_forward(geom(batch), x, p_.w, p_.b, y, scratch_, pool_);
}

void Conv2d::backward(const float* x, const float* /*y*/, const float* dy, int batch, float* dx) {
  DDP_CHECK(p_.dw, "layer ", name_, ": backward before bind");
  cpu::conv2d_backward(geom(batch), x, p_.w, dy, p_.dw, p_.db, dx, scratch_, pool_);
}

}  // namespace ddp::nn
