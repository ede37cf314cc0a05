// A convolution and the BatchNorm after it as one kernel (--gpu-kernels
// next: conv-bn; Note [claimed runs] in nn/model.hpp), with that
// BatchNorm's ReLU or residual add where bn-act claims them too
// (conv_bn_run, nn/cuda/bn_runs.hpp).
//
// Note [16-bit handoff]: in bf16 and fp16 a convolution's output is a
// 16-bit value (Note [half kernels]: cuDNN's 16-bit result, its rounded bias
// added and rounded again), and so is the gradient its backward takes (dy
// rounded first). Op by op, the first goes to the BatchNorm as fp32 and the
// second comes back from it as fp32, each through a conversion pass and in
// twice the bytes. Here they stay in the format: the BatchNorm reads the
// 16-bit output (every read: the sums, the variance, the normalisation,
// backward's two passes), adding the bias as it reads it just as op by op
// it was added to make the output (plane_from_half_at; no pass of its own),
// and its backward writes the input gradient rounded, as the convolution
// would have rounded it. The values are the ones op by op, bit for bit:
// only their width changes. The convolution's input, rounded to 16 bits
// for the forward, is kept for the weight gradient, where op by op
// backward rounds it again. In fp32 and TF32 the two run in turn, the
// output between them in floats, as op by op.
//
// Note [bias in backward] (bias-in-bn): where the convolution sums its
// bias's gradient in runs (CudnnConv::bias_by_sums: conv-bias-sums, or
// NHWC), it sums the gradient the BatchNorm's backward has just written,
// reading it all again. With bias-in-bn the BatchNorm's backward pass sums
// it as it writes it: each element by the thread and block that the
// convolution's sums would read it with (the same plan of runs, the same
// order and tree), so the channels' sums are those bits, and the
// convolution adds them (add_bias_sums) as it would have. One pass over
// the output's gradient and one launch fewer a run; the same bits.
#include "ddp/nn/cuda/kernels.hpp"

#include <utility>

#include "ddp/core/error.hpp"       // DDP_CHECK
#include "ddp/nn/cuda/bn_runs.hpp"  // conv_bn_run

namespace ddp::nn {

CudaConvBn::CudaConvBn(const Graph& g, size_t i, size_t ops, cuda::Context& ctx, StatsReducer* stats, Layout layout,
                       std::shared_ptr<cuda::DeviceBuffer> grads)
    : CudaBatchNorm(g.ops[i + 1], ctx, stats, layout),
      ops_(ops),
      conv_params_(g.op_params[i].size()),
      add_(ops == 3 && g.ops[i + 2].kind == OpKind::Add),
      relu_(ops == 3 && (g.ops[i + 2].kind == OpKind::ReLU || g.ops[i + 2].relu)),
      mid_numel_(g.ops[i].out.numel()),
      in_numel_(g.ops[i].in.numel()),
      conv_(g.ops[i].name, g.ops[i].in, g.ops[i].out_c, g.ops[i].k, g.ops[i].stride, g.ops[i].pad, g.ops[i].out,
            layout),
      conv_name_(g.ops[i].name),
      dmid_(std::move(grads)) {
  DDP_CHECK(ops >= 2 && conv_bn_run(g, i, true) >= ops && conv_params_ >= 1 && g.op_params[i + 1].size() == 2 &&
                dmid_,
            "op ", g.ops[i].name, ": no convolution run of ", ops, " ops to claim");
}

// Note [half kernels]: the convolution makes every rounding itself.
bool CudaConvBn::set_precision(Precision p) {
  conv_.set_precision(p);
  return true;
}

// a's parameters are the convolution's, then the BatchNorm's; its buffers
// and counter the BatchNorm's.
const OpArgs& CudaConvBn::bn_args(const OpArgs& a) {
  bn_.batch = a.batch;
  bn_.mode = a.mode;
  bn_.y = a.y;
  bn_.p.assign(a.p.begin() + long(conv_params_), a.p.end());
  bn_.dp.assign(a.dp.begin() + long(conv_params_), a.dp.end());
  bn_.buf = a.buf;
  bn_.counter = a.counter;
  return bn_;
}

// The convolution's output (and in training its gradient, and in 16 bits
// its input's copy) for a batch: floats, or 16-bit values two a float.
void CudaConvBn::reserve(const OpArgs& a) {
  const bool half = is_half(conv_.precision());
  const size_t elem = half ? sizeof(uint16_t) : sizeof(float);
  const size_t floats = cuda::DeviceBuffer::floats_for(size_t(a.batch) * size_t(mid_numel_) * elem);
  mid_.reserve(ctx_, floats);
  if (a.mode == Mode::Train) dmid_->reserve(ctx_, floats);
  if (half) in_half_.reserve(ctx_, cuda::DeviceBuffer::floats_for(size_t(a.batch) * size_t(in_numel_) * elem));
  if (a.mode == Mode::Train && bias_in_bn())
    bias_sums_.reserve(ctx_, cuda::DeviceBuffer::floats_for(sizeof(double) * size_t(c_)));
}

bool CudaConvBn::bias_in_bn() const {
  return conv_params_ > 1 && ctx_.next(NextKernel::BiasInBn) && conv_.bias_by_sums(ctx_);
}
double* CudaConvBn::bias_sums() { return bias_in_bn() ? reinterpret_cast<double*>(bias_sums_.data()) : nullptr; }

// The convolution's output as the BatchNorm reads it (in 16 bits with the
// bias added as read), and where its gradient goes.
BnValues CudaConvBn::mid(const OpArgs& a) const {
  if (!is_half(conv_.precision())) return BnValues{mid_.data()};
  return BnValues{nullptr, reinterpret_cast<const uint16_t*>(mid_.data()), conv_.precision(), bias(a)};
}
BnGrad CudaConvBn::dmid() const {
  if (!is_half(conv_.precision())) return BnGrad{dmid_->data()};
  return BnGrad{nullptr, reinterpret_cast<uint16_t*>(dmid_->data()), conv_.precision()};
}

void CudaConvBn::forward(const OpArgs& a) {
  reserve(a);
  const BnValues x = mid(a);
  train_batch_ = a.mode == Mode::Train ? a.batch : -1;
  // In 16 bits the BatchNorm adds the bias (x.bias).
  if (x.h)
    conv_.forward_to_half(ctx_, a.batch, a.x[0], a.p[0], reinterpret_cast<uint16_t*>(mid_.data()),
                          reinterpret_cast<uint16_t*>(in_half_.data()));
  else
    conv_.forward(ctx_, a.batch, a.x[0], a.p[0], bias(a), mid_.data());
  const OpArgs& b = bn_args(a);
  forward_stats(b, x);
  apply(b, x, add_ ? a.x[1] : nullptr, relu_);
}

// The BatchNorm's backward first (its ReLU's mask from the run's output),
// then the convolution's from the gradient it wrote: the order op by op.
// dy may be the array of an outside input's gradient (Note [claimed runs]):
// the BatchNorm has read all of it before the convolution writes dx[0].
void CudaConvBn::backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) {
  DDP_CHECK(train_batch_ == a.batch, "op ", conv_name_, ": backward without a training forward of ", a.batch,
            " samples");
  const BnGrad d = dmid();
  double* db_sums = bias_sums();  // Note [bias in backward]
  backward_from(bn_args(a), mid(a), dy, relu_ ? a.y : nullptr, d, add_ ? dx[1] : nullptr, db_sums);
  float* db = conv_params_ > 1 ? a.dp[1] : nullptr;
  if (db_sums) {
    conv_.add_bias_sums(ctx_, db_sums, db);
    db = nullptr;  // added
  }
  if (d.h)
    conv_.backward_from_half(ctx_, a.batch, a.x[0], reinterpret_cast<const uint16_t*>(in_half_.data()), a.p[0], d.h,
                             a.dp[0], db, dx[0]);
  else
    conv_.backward(ctx_, a.batch, a.x[0], a.p[0], d.f, a.dp[0], db, dx[0]);
}

}  // namespace ddp::nn
