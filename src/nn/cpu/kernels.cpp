// The CPU device's kernels (nn/cpu/kernels.hpp): each op kind over the free
// functions of nn/cpu/ops.hpp, on the device's thread pool.
#include "ddp/nn/cpu/kernels.hpp"

#include <algorithm>

#include "ddp/core/error.hpp"
#include "ddp/nn/kernel_math.hpp"  // BatchNorm's per-channel constants, shared with the GPU

namespace ddp::nn::cpu {

ConvGeom conv_geom(const Op& op, int batch) {
  ConvGeom g;
  g.batch = batch;
  g.in_c = op.in.c;
  g.in_h = op.in.h;
  g.in_w = op.in.w;
  g.out_c = op.out_c;
  g.k = op.k;
  g.stride = op.stride;
  g.pad = op.pad;
  return g;
}

void Conv::forward(const OpArgs& a) {
  conv2d_forward(conv_geom(op_, a.batch), a.x[0], a.p[0], a.p[1], a.y, scratch_, pool_);
}

void Conv::backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) {
  conv2d_backward(conv_geom(op_, a.batch), a.x[0], a.p[0], dy, a.dp[0], a.dp[1], dx[0], scratch_, pool_);
}

ConvReluPool::ConvReluPool(const Op& op, ThreadPool* pool)
    : op_(op), pool_(pool), image_mask_(size_t(conv_relu_mask_bytes(conv_geom(op, 1)))) {}

void ConvReluPool::forward(const OpArgs& a) {
  size_mask(a.batch);
  forward_at(a, 0, scratch_, pool_);
}

void ConvReluPool::backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) {
  DDP_CHECK(a.batch == mask_batch_, "backward for batch ", a.batch, " after forward of batch ", mask_batch_);
  backward_at(a, 0, dy, dx, scratch_, pool_);
}

void ConvReluPool::size_mask(int batch) {
  if (mask_.size() < size_t(batch) * image_mask_) mask_.resize(size_t(batch) * image_mask_);
  mask_batch_ = batch;
}

void ConvReluPool::forward_at(const OpArgs& a, int64_t first, ConvScratch<float>& s, ThreadPool* threads) {
  DDP_CHECK(first + a.batch <= mask_batch_, "forward of images ", first, " .. ", first + a.batch,
            " beyond the batch of ", mask_batch_, " the masks were sized for");
  conv2d_relu_avgpool2_forward(conv_geom(op_, a.batch), a.x[0], a.p[0], a.p[1], a.y,
                               mask_.data() + size_t(first) * image_mask_, s, threads);
}

void ConvReluPool::backward_at(const OpArgs& a, int64_t first, const float* dy, const std::vector<float*>& dx,
                               ConvScratch<float>& s, ThreadPool* threads) {
  DDP_CHECK(first + a.batch <= mask_batch_, "backward for images ", first, " .. ", first + a.batch,
            " after forward of batch ", mask_batch_);
  conv2d_relu_avgpool2_backward(conv_geom(op_, a.batch), a.x[0], a.p[0], mask_.data() + size_t(first) * image_mask_,
                                dy, a.dp[0], a.dp[1], dx[0], s, threads);
}

BatchNorm::BatchNorm(const Op& op, ThreadPool* pool, StatsReducer* stats)
    : op_(op), pool_(pool), stats_(stats), c_(op.in.c), hw_(op.in.h * op.in.w), mean_(c_), invstd_(c_),
      scale_(c_), shift_(c_), s1_(c_), s2_(c_), sums_(2 * size_t(c_)) {}

void BatchNorm::forward(const OpArgs& a) {
  const float *w = a.p[0], *b = a.p[1];
  float *running_mean = a.buf[0], *running_var = a.buf[1];
  if (a.mode == Mode::Eval) {
    for (int c = 0; c < c_; ++c)
      kernel::bn_eval_channel(w[c], b[c], running_mean[c], running_var[c], op_.eps, &scale_[c], &shift_[c]);
    bn_apply(a.batch, c_, hw_, a.x[0], scale_.data(), shift_.data(), a.y, pool_);
    return;
  }
  const double count = double(a.batch) * hw_ * (stats_ ? stats_->ranks() : 1);
  DDP_CHECK(count > 1, "BatchNorm2d ", op_.name, ": training needs more than one value per channel, got ", count);
  const int64_t image = int64_t(c_) * hw_;
  channel_sums(
      a, size_t(c_), [&](int64_t first, int n, double* out) { bn_sum(n, c_, hw_, a.x[0] + first * image, out, pool_); },
      s1_.data(), "batch mean", /*backward=*/false);
  for (int c = 0; c < c_; ++c) mean_[c] = kernel::bn_mean(s1_[c], count);
  channel_sums(
      a, size_t(c_),
      [&](int64_t first, int n, double* out) {
        bn_sum_sq_dev(n, c_, hw_, a.x[0] + first * image, mean_.data(), out, pool_);
      },
      s2_.data(), "batch variance", /*backward=*/false);
  for (int c = 0; c < c_; ++c)
    kernel::bn_train_channel(s2_[c], count, op_.eps, op_.momentum, mean_[c], w[c], b[c], &invstd_[c], &scale_[c],
                             &shift_[c], &running_mean[c], &running_var[c]);
  if (a.counter) ++*a.counter;
  bn_apply(a.batch, c_, hw_, a.x[0], scale_.data(), shift_.data(), a.y, pool_);
}

void BatchNorm::backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) {
  const int64_t image = int64_t(c_) * hw_;
  // sum(dy) and then sum(dy (x - mean)): 2c values. This rank's sums make
  // its weight and bias gradients (averaged over ranks by the reducer, as
  // DDP does); the input gradient needs them over every rank the statistics
  // came from.
  channel_sums(
      a, 2 * size_t(c_),
      [&](int64_t first, int n, double* g) {
        bn_grad_sums(n, c_, hw_, a.x[0] + first * image, mean_.data(), dy + first * image, g, g + c_, pool_);
        for (int c = 0; c < c_; ++c) {
          a.dp[0][c] += float(g[c_ + c] * double(invstd_[c]));
          a.dp[1][c] += float(g[c]);
        }
      },
      sums_.data(), "gradient sums", /*backward=*/true);
  if (!dx[0]) return;
  const double count = double(a.batch) * hw_ * (stats_ ? stats_->ranks() : 1);
  bn_backward_apply(a.batch, c_, hw_, a.x[0], mean_.data(), invstd_.data(), a.p[0], dy, sums_.data(),
                    sums_.data() + c_, count, dx[0], pool_);
}

void BatchNorm::channel_sums(const OpArgs& a, size_t width, const RunSum& sum, double* out, const std::string& what,
                             bool) {
  sum(0, a.batch, out);
  if (stats_) stats_->sum(out, width, op_.name + ": " + what);
}

void Linear::forward(const OpArgs& a) { forward_on(a, pool_); }

void Linear::backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) {
  backward_on(a, dy, dx, pool_);
}

void Linear::forward_on(const OpArgs& a, ThreadPool* threads) {
  linear_forward(a.batch, in_, out_, a.x[0], a.p[0], a.p[1], a.y, threads);
}

void Linear::backward_on(const OpArgs& a, const float* dy, const std::vector<float*>& dx, ThreadPool* threads) {
  linear_backward(a.batch, in_, out_, a.x[0], a.p[0], dy, a.dp[0], a.dp[1], dx[0], threads);
}

namespace {

class Relu final : public Kernel {
 public:
  explicit Relu(const Op& op) : n_(op.in.numel()) {}
  void forward(const OpArgs& a) override { relu_forward(a.batch * n_, a.x[0], a.y); }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override {
    if (dx[0]) relu_backward(a.batch * n_, a.y, dy, dx[0]);
  }

 private:
  int64_t n_;
};

class Add final : public Kernel {
 public:
  explicit Add(const Op& op) : n_(op.in.numel()), relu_(op.relu) {}
  void forward(const OpArgs& a) override { add_forward(a.batch * n_, a.x[0], a.x[1], relu_, a.y); }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override {
    add_backward(a.batch * n_, a.y, relu_, dy, dx[0], dx[1]);
  }

 private:
  int64_t n_;
  bool relu_;
};

class AvgPool final : public Kernel {
 public:
  explicit AvgPool(const Op& op) : in_(op.in) {}
  void forward(const OpArgs& a) override { avgpool2_forward(a.batch * in_.c, in_.h, in_.w, a.x[0], a.y); }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override {
    if (dx[0]) avgpool2_backward(a.batch * in_.c, in_.h, in_.w, dy, dx[0]);
  }

 private:
  Shape in_;
};

class GlobalAvgPool final : public Kernel {
 public:
  explicit GlobalAvgPool(const Op& op) : in_(op.in) {}
  void forward(const OpArgs& a) override {
    global_avgpool_forward(int64_t(a.batch) * in_.c, in_.h * in_.w, a.x[0], a.y);
  }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override {
    if (dx[0]) global_avgpool_backward(int64_t(a.batch) * in_.c, in_.h * in_.w, dy, dx[0]);
  }

 private:
  Shape in_;
};

// NCHW is already flat per sample: both directions are copies.
class Flatten final : public Kernel {
 public:
  explicit Flatten(const Op& op) : n_(op.in.numel()) {}
  void forward(const OpArgs& a) override { std::copy(a.x[0], a.x[0] + a.batch * n_, a.y); }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override {
    if (dx[0]) std::copy(dy, dy + a.batch * n_, dx[0]);
  }

 private:
  int64_t n_;
};

}  // namespace

std::unique_ptr<Kernel> CpuDevice::kernel(const Graph& g, size_t i, StatsReducer* stats) {
  const Op& op = g.ops[i];
  switch (op.kind) {
    case OpKind::Conv2d: return std::make_unique<Conv>(op, &pool_);
    case OpKind::ConvReluPool: return std::make_unique<ConvReluPool>(op, &pool_);
    case OpKind::BatchNorm2d: return std::make_unique<BatchNorm>(op, &pool_, stats);
    case OpKind::ReLU: return std::make_unique<Relu>(op);
    case OpKind::Add: return std::make_unique<Add>(op);
    case OpKind::AvgPool2d: return std::make_unique<AvgPool>(op);
    case OpKind::GlobalAvgPool: return std::make_unique<GlobalAvgPool>(op);
    case OpKind::Flatten: return std::make_unique<Flatten>(op);
    case OpKind::Linear: return std::make_unique<Linear>(op, &pool_);
  }
  DDP_FAIL("no CPU kernel for ", to_string(op.kind));
}

}  // namespace ddp::nn::cpu
