// ConvReluPool on the GPU: cuDNN convolution + bias into a kept buffer, then
// one kernel that applies relu and pools 2x2. Backward rebuilds d(conv
// output) from the pooled gradient and that buffer (relu passes where conv +
// bias > 0, the same mask conv_relu_pool_cpu.cpp keeps as bits), then runs
// the convolution's backward. Unlike the CPU twin the pooling is not fused
// into the convolution (that would take a convolution kernel of our own):
// correctness first, one extra pass over the conv output.
#include "cuda_layers.hpp"
#include "ddp/core/error.hpp"  // DDP_CHECK

namespace ddp::nn {

namespace {

// The convolution's output before pooling; the CPU twin has checked the
// geometry and that it is at least 2x2.
Shape conv_output(const LayerSpec& s) {
  return Shape{s.out, (s.in.h + 2 * s.pad - s.k) / s.stride + 1, (s.in.w + 2 * s.pad - s.k) / s.stride + 1};
}

}  // namespace

CudaConvReluPool::CudaConvReluPool(const LayerSpec& spec, cuda::Context& ctx)
    : CudaLayer(spec, ctx),
      conv_(conv_output(spec)),
      conv_op_(spec.name, spec.in, spec.out, spec.k, spec.stride, spec.pad, conv_) {
  DDP_CHECK(out_ == (Shape{conv_.c, conv_.h / 2, conv_.w / 2}), "layer ", name(), ": output ", to_string(out_),
            " is not the pooled conv output ", to_string(conv_));
}

void CudaConvReluPool::bind(const std::vector<float*>& params, const std::vector<float*>& grads) {
  p_.bind(name(), params, grads);
}

void CudaConvReluPool::forward(const float* x, int batch, float* y) {
  DDP_CHECK(p_.w, "layer ", name(), ": forward before bind");
  DDP_CHECK(batch > 0, "layer ", name(), ": forward with batch ", batch);
  pre_.reserve(ctx_, size_t(batch) * size_t(conv_.numel()));
  conv_op_.forward(ctx_, batch, x, p_.w, p_.b, pre_.data());
  avgpool2_forward_cuda(int64_t(batch) * conv_.c, conv_.h, conv_.w, pre_.data(), /*relu=*/true, y, ctx_.compute());
  fwd_batch_ = batch;
}

void CudaConvReluPool::backward(const float* x, const float* /*y*/, const float* dy, int batch, float* dx) {
  DDP_CHECK(p_.dw, "layer ", name(), ": backward before bind");
  DDP_CHECK(fwd_batch_ == batch, "layer ", name(), ": backward for batch ", batch, " after forward of batch ",
            fwd_batch_);
  dpre_.reserve(ctx_, size_t(batch) * size_t(conv_.numel()));
  avgpool2_backward_cuda(int64_t(batch) * conv_.c, conv_.h, conv_.w, dy, /*mask=*/pre_.data(), dpre_.data(),
                         ctx_.compute());
  conv_op_.backward(ctx_, batch, x, p_.w, dpre_.data(), p_.dw, p_.db, dx);
}

}  // namespace ddp::nn
