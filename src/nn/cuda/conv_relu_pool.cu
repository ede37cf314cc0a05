// ConvReluPool on the GPU: cuDNN convolution + bias into a kept buffer, then
// one kernel that applies relu and pools 2x2. Backward rebuilds d(conv
// output) from the pooled gradient and that buffer (relu passes where conv +
// bias > 0, the same mask nn/cpu/conv_relu_pool.cpp keeps as bits), then runs
// the convolution's backward. Unlike the CPU twin the pooling is not fused
// into the convolution (that would take a convolution kernel of our own):
// correctness first, one extra pass over the conv output.
#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/core/error.hpp"  // DDP_CHECK

namespace ddp::nn {

namespace {

// The convolution's output before pooling (the graph checked the geometry).
Shape conv_output(const Op& op) {
  return Shape{op.out_c, (op.in.h + 2 * op.pad - op.k) / op.stride + 1, (op.in.w + 2 * op.pad - op.k) / op.stride + 1};
}

}  // namespace

CudaConvReluPool::CudaConvReluPool(const Op& op, cuda::Context& ctx)
    : op_(op), ctx_(ctx), conv_(conv_output(op)), conv_op_(op.name, op.in, op.out_c, op.k, op.stride, op.pad, conv_) {
  DDP_CHECK(op.out == (Shape{conv_.c, conv_.h / 2, conv_.w / 2}), "output ", to_string(op.out),
            " is not the pooled conv output ", to_string(conv_));
}

void CudaConvReluPool::reserve(int batch) { pre_.reserve(ctx_, size_t(batch) * size_t(conv_.numel())); }

float* CudaConvReluPool::pre(int64_t first) { return pre_.data() + size_t(first) * size_t(conv_.numel()); }

void CudaConvReluPool::forward(const OpArgs& a) {
  reserve(a.batch);
  forward_at(a, 0);
}

void CudaConvReluPool::backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) {
  backward_at(a, 0, dy, dx);
}

void CudaConvReluPool::forward_at(const OpArgs& a, int64_t first) {
  DDP_CHECK(size_t(first) + size_t(a.batch) <= pre_.size() / size_t(conv_.numel()), "op ", op_.name, ": images ",
            first, " .. ", first + a.batch, " beyond the batch reserved for");
  conv_op_.forward(ctx_, a.batch, a.x[0], a.p[0], a.p[1], pre(first));
  avgpool2_forward_cuda(int64_t(a.batch) * conv_.c, conv_.h, conv_.w, pre(first), /*relu=*/true, a.y,
                        ctx_.compute());
  // Note [half kernels]: the op's output is 16-bit, as every rounding is the
  // kernel's own (the convolution rounded its output already).
  round_cuda(a.y, a.y, int64_t(a.batch) * op_.out.numel(), conv_op_.precision(), ctx_.compute());
  fwd_batch_ = a.batch;
}

void CudaConvReluPool::backward_at(const OpArgs& a, int64_t first, const float* dy, const std::vector<float*>& dx) {
  DDP_CHECK(fwd_batch_ == a.batch, "backward for batch ", a.batch, " after forward of batch ", fwd_batch_);
  const Precision prec = conv_op_.precision();
  if (is_half(prec)) {  // d(output) in 16 bits (Note [half kernels])
    const int64_t n = int64_t(a.batch) * op_.out.numel();
    dy_rounded_.reserve(ctx_, size_t(n));
    round_cuda(dy_rounded_.data(), dy, n, prec, ctx_.compute());
    dy = dy_rounded_.data();
  }
  dpre_.reserve(ctx_, size_t(a.batch) * size_t(conv_.numel()));
  avgpool2_backward_cuda(int64_t(a.batch) * conv_.c, conv_.h, conv_.w, dy, /*mask=*/pre(first), dpre_.data(),
                         ctx_.compute());
  conv_op_.backward(ctx_, a.batch, a.x[0], a.p[0], dpre_.data(), a.dp[0], a.dp[1], dx[0]);
}

bool CudaConvReluPool::set_precision(Precision p) {
  conv_op_.set_precision(p);
  return true;
}

}  // namespace ddp::nn
