// Conv2d on the GPU: the cuDNN convolution of nn/cuda/cudnn_conv.cu, bias included,
// in fp32 or in 16 bits (Note [half kernels]), NCHW or NHWC (Note [channels
// last], nn/layout.hpp).
#include "ddp/nn/cuda/kernels.hpp"

namespace ddp::nn {

CudaConv::CudaConv(const Op& op, cuda::Context& ctx, Layout layout)
    : ctx_(ctx), conv_(op.name, op.in, op.out_c, op.k, op.stride, op.pad, op.out, layout) {}

void CudaConv::forward(const OpArgs& a) { conv_.forward(ctx_, a.batch, a.x[0], a.p[0], a.p[1], a.y); }

void CudaConv::backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) {
  conv_.backward(ctx_, a.batch, a.x[0], a.p[0], dy, a.dp[0], a.dp[1], dx[0]);
}

// Note [half kernels]: the convolution makes every rounding itself.
bool CudaConv::set_precision(Precision p) {
  conv_.set_precision(p);
  return true;
}

}  // namespace ddp::nn
