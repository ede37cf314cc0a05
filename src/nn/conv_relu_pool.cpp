// ConvReluPool layer: conv -> relu -> 2x2 average pooling in one pass.
#include "ddp/core/error.hpp"
#include "ddp/nn/layers.hpp"

namespace ddp::nn {

ConvReluPool::ConvReluPool(std::string name, Shape in, int out_c, int k, int stride, int pad)
    : ConvBase(std::move(name), in, out_c, k, stride, pad) {
  const cpu::ConvGeom g = geom(1);
  DDP_CHECK(g.out_h() >= 2 && g.out_w() >= 2, "layer ", name_, ": conv output ", g.out_h(), "x",
            g.out_w(), " too small to pool 2x2");
  out_ = Shape{out_c_, g.out_h() / 2, g.out_w() / 2};
}

void ConvReluPool::forward(const float* x, int batch, float* y) {
  DDP_CHECK(p_.w, "layer ", name_, ": forward before bind");
  cpu::conv2d_relu_avgpool2_forward(geom(batch), x, p_.w, p_.b, y, relu_mask_, scratch_, pool_);
  mask_batch_ = batch;
}

void ConvReluPool::backward(const float* x, const float* /*y*/, const float* dy, int batch,
                            float* dx) {
  DDP_CHECK(p_.dw, "layer ", name_, ": backward before bind");
  DDP_CHECK(mask_batch_ == batch, "layer ", name_, ": backward for batch ", batch,
            " after forward of batch ", mask_batch_);
  cpu::conv2d_relu_avgpool2_backward(geom(batch), x, p_.w, relu_mask_, dy, p_.dw, p_.db, dx, scratch_,
                                     pool_);
}

}  // namespace ddp::nn
