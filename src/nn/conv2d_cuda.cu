// Conv2d on the GPU: the cuDNN convolution of cudnn_conv.cu, bias included.
#include "cuda_layers.hpp"
#include "ddp/core/error.hpp"  // DDP_CHECK

namespace ddp::nn {

CudaConv2d::CudaConv2d(const LayerSpec& spec, cuda::Context& ctx)
    : CudaLayer(spec, ctx), conv_(spec.name, spec.in, spec.out, spec.k, spec.stride, spec.pad, out_) {}

void CudaConv2d::bind(const std::vector<float*>& params, const std::vector<float*>& grads) {
  p_.bind(name(), params, grads);
}

void CudaConv2d::forward(const float* x, int batch, float* y) {
  DDP_CHECK(p_.w, "layer ", name(), ": forward before bind");
  conv_.forward(ctx_, batch, x, p_.w, p_.b, y);
}

void CudaConv2d::backward(const float* x, const float* /*y*/, const float* dy, int batch, float* dx) {
  DDP_CHECK(p_.dw, "layer ", name(), ": backward before bind");
  conv_.backward(ctx_, batch, x, p_.w, dy, p_.dw, p_.db, dx);
}

}  // namespace ddp::nn
