// The CPU device (nn/device.hpp): host memory, and per op kind a Kernel over
// the free functions of nn/cpu/ops.hpp, on the device's thread pool.
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/nn/cpu/ops.hpp"
#include "ddp/nn/device.hpp"
#include "ddp/nn/kernel_math.hpp"  // BatchNorm's per-channel constants, shared with the GPU
#include "ddp/nn/cpu/packed_gemm.hpp"
#include "ddp/nn/cpu/thread_pool.hpp"

namespace ddp::nn {

namespace {

// Zeroed host memory. Large arrays (activations: ResNet-18 at batch 256
// holds 1.4 GB of them) are mapped on their own with transparent huge pages
// asked for, so that the first step faults them in 2 MiB at a time rather
// than 4 KiB, and the GEMMs and im2col that stream through them miss the TLB
// less.
class CpuArray final : public Array {
 public:
  explicit CpuArray(size_t n) : n_(n) {
    const size_t bytes = n * sizeof(float);
    if (bytes < kMapBytes) {
      small_.assign(n, 0.0f);
      p_ = small_.data();
      return;
    }
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    madvise(m, bytes, MADV_HUGEPAGE);  // advice: where refused, 4 KiB pages still work
    p_ = static_cast<float*>(m);
    mapped_ = true;
  }
  ~CpuArray() override {
    if (mapped_) munmap(p_, n_ * sizeof(float));
  }
  CpuArray(const CpuArray&) = delete;
  CpuArray& operator=(const CpuArray&) = delete;
  float* data() override { return p_; }
  size_t size() const override { return n_; }

 private:
  static constexpr size_t kMapBytes = size_t(4) << 20;
  size_t n_;
  float* p_ = nullptr;
  bool mapped_ = false;
  std::vector<float> small_;
};

cpu::ConvGeom conv_geom(const Op& op, int batch) {
  cpu::ConvGeom g;
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

// Note [lanes] (device.hpp): a call on a lane runs single-threaded; a call
// off the lanes runs on the pool.
ThreadPool* threads_for(const OpArgs& a, ThreadPool* pool) { return a.lane >= 0 ? nullptr : pool; }

// A conv's scratch per lane; a call off the lanes (never at the same time as
// lanes) uses lane 0's.
struct LaneScratch {
  explicit LaneScratch(ThreadPool* pool) : pool(pool), scratch(size_t(pool->size())) {}
  ThreadPool* threads(const OpArgs& a) const { return threads_for(a, pool); }
  cpu::ConvScratch<float>& of(const OpArgs& a) { return scratch[size_t(std::max(a.lane, 0))]; }
  ThreadPool* pool;
  std::vector<cpu::ConvScratch<float>> scratch;
};

class Conv final : public Kernel {
 public:
  Conv(const Op& op, ThreadPool* pool) : op_(op), lanes_(pool), packed_dy_(lanes_.scratch.size()) {}
  // Micro-shards share what they would each make of the weights: made here,
  // on the pool, the same values each shard would make itself. On
  // Winograd's path that is the kernels' transform (turned for backward's
  // input gradient), which lets the path repay from fewer tiles
  // (winograd_applies_to_shards); and, with the packed GEMM, the packing of
  // the GEMMs' weight operands, Winograd's planes or im2col's w (w^T for
  // backward) (Note [packed weights] in nn/cpu/packed_gemm.hpp). A call on a lane
  // takes them where its own micro-shard's size gives the same path and
  // tile size (evaluation's last micro-shard may be smaller); a call that
  // does not, conv2d's path for its size. With the packed GEMM a call may
  // hold a run of whole micro-shards (Note [shard runs] in device.hpp): it
  // takes the micro-shard's path and tile size whatever its own size.
  void begin_shards(const OpArgs& whole, int shard, bool backward) override {
    const cpu::ConvGeom g = conv_geom(op_, shard);
    phase_ = backward ? Phase::Backward : Phase::Forward;
    shard_ = shard;
    winograd_ = cpu::winograd_applies_to_shards(g);
    weight_grad_im2col_ = winograd_ && cpu::shard_weight_grad_by_im2col(g);
    if (winograd_) {
      tile_ = cpu::winograd_tile(g);
      cpu::winograd_transform_weights(g, whole.p[0], backward, tile_, kernels_, lanes_.pool);
      if (cpu::kPackedGemm) cpu::pack_winograd_planes(g, backward, tile_, kernels_, packed_, lanes_.pool);
    } else if (cpu::kPackedGemm) {
      const int ckk = g.in_c * g.k * g.k;
      packed_.resize(1);
      if (backward)
        packed_[0].pack(true, ckk, g.out_c, whole.p[0], ckk, lanes_.pool);
      else
        packed_[0].pack(false, g.out_c, ckk, whole.p[0], ckk, lanes_.pool);
    }
  }
  bool shards_in_one_call() const override { return cpu::kPackedGemm; }
  // Note [fixed-point epilogue]: only the Winograd layers whose micro-shards
  // take their weight gradients by im2col's GEMM (ResNet-18's 512 channels
  // on 4x4), where writing and reading back 2.4M-element float gradients
  // costs more than the epilogue; the other layers on im2col's path gain
  // nothing or lose, so they stay a micro-shard a call (measurements:
  // bench/RESULTS.md, "Fixed-point epilogue").
  bool shard_grads_to_sinks() const override {
    return cpu::kFixedPointGemm && phase_ == Phase::Backward && winograd_ && weight_grad_im2col_;
  }
  void forward(const OpArgs& a) override {
    const cpu::ConvGeom g = conv_geom(op_, a.batch);
    switch (shared(a, g, Phase::Forward)) {
      case Path::Winograd:
        return cpu::winograd_conv3x3_forward(g, a.x[0], a.p[0], a.p[1], a.y, lanes_.of(a), nullptr, tile_,
                                             kernels_.data(), packed());
      case Path::Im2col:
        return cpu::conv2d_forward(g, a.x[0], a.p[0], a.p[1], a.y, lanes_.of(a), nullptr, packed());
      case Path::Own:
        return cpu::conv2d_forward(g, a.x[0], a.p[0], a.p[1], a.y, lanes_.of(a), lanes_.threads(a));
    }
  }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override {
    const cpu::ConvGeom g = conv_geom(op_, a.batch);
    if (!a.sinks.empty()) {  // Note [fixed-point epilogue]
      DDP_CHECK(shard_grads_to_sinks() && a.lane >= 0 && a.batch % shard_ == 0 && a.sinks.size() == a.p.size(),
                "conv ", op_.name, ": fixed-point weight gradients of ", a.batch, " samples in micro-shards of ",
                shard_, " on lane ", a.lane);
      if (dx[0]) on_path(a, g, dy, dx);
      return cpu::conv2d_weight_grad_fixed(g, a.x[0], dy, shard_, a.sinks[0],
                                           a.sinks.size() > 1 ? &a.sinks[1] : nullptr, lanes_.of(a),
                                           packed_dy_[size_t(a.lane)]);
    }
    on_path(a, g, dy, dx);
  }

 private:
  // backward on the path shared() picks: the input gradient where dx[0] is
  // wanted, the weight and bias gradients where a.dp has them.
  void on_path(const OpArgs& a, const cpu::ConvGeom& g, const float* dy, const std::vector<float*>& dx) {
    switch (shared(a, g, Phase::Backward)) {
      case Path::Winograd:
        // A micro-shard's weight gradient, where Winograd's would be too
        // shallow, by im2col's path (shard_weight_grad_by_im2col).
        if (weight_grad_im2col_ && a.dp[0] && a.batch == shard_) {
          cpu::conv2d_weight_grad_im2col(g, a.x[0], dy, a.dp[0], a.dp[1], lanes_.of(a));
          if (!dx[0]) return;
          return cpu::winograd_conv3x3_backward<float>(g, a.x[0], a.p[0], dy, nullptr, nullptr, dx[0], lanes_.of(a),
                                                       nullptr, tile_, kernels_.data(), packed());
        }
        return cpu::winograd_conv3x3_backward(g, a.x[0], a.p[0], dy, a.dp[0], a.dp[1], dx[0], lanes_.of(a), nullptr,
                                              tile_, kernels_.data(), packed());
      case Path::Im2col:
        return cpu::conv2d_backward(g, a.x[0], a.p[0], dy, a.dp[0], a.dp[1], dx[0], lanes_.of(a), nullptr,
                                    packed());
      case Path::Own:
        return cpu::conv2d_backward(g, a.x[0], a.p[0], dy, a.dp[0], a.dp[1], dx[0], lanes_.of(a),
                                    lanes_.threads(a));
    }
  }
  enum class Phase { None, Forward, Backward };
  // What a call runs on: the shared transform (and packing) of Winograd's
  // path, the shared packing of im2col's, or nothing shared.
  enum class Path { Winograd, Im2col, Own };
  Path shared(const OpArgs& a, const cpu::ConvGeom& g, Phase phase) const {
    if (a.lane < 0 || phase_ != phase) return Path::Own;
    if (winograd_ && cpu::kPackedGemm && a.batch % shard_ == 0) return Path::Winograd;  // whole micro-shards
    if (winograd_)
      return cpu::winograd_applies_to_shards(g) && cpu::winograd_tile(g) == tile_ ? Path::Winograd : Path::Own;
    // Fewer images than the shard's never reach Winograd's path.
    return cpu::kPackedGemm ? Path::Im2col : Path::Own;
  }
  const cpu::PackedMatrix* packed() const { return cpu::kPackedGemm ? packed_.data() : nullptr; }
  const Op& op_;
  LaneScratch lanes_;
  Phase phase_ = Phase::None;  // what the members below hold, for the lanes after the last begin_shards
  int shard_ = 0;
  bool winograd_ = false, weight_grad_im2col_ = false;
  int tile_ = 0;
  std::vector<float> kernels_;
  std::vector<cpu::PackedMatrix> packed_;  // kernels_'s planes, or w (w^T backward), packed
  std::vector<cpu::PackedMatrix> packed_dy_;  // per lane: a run's output gradients (fixed-point epilogue)
};

// conv -> relu -> avgpool2 in one pass (nn/cpu/conv_relu_pool.cpp); backward
// needs the relu mask of the same batch's forward, kept image by image so
// that lanes write their micro-shards' masks side by side.
class ConvReluPool final : public Kernel {
 public:
  ConvReluPool(const Op& op, ThreadPool* pool)
      : op_(op), lanes_(pool), image_mask_(size_t(cpu::conv_relu_mask_bytes(conv_geom(op, 1)))) {}
  void begin_lanes(int batch) override { size_mask(batch); }
  void forward(const OpArgs& a) override {
    if (a.lane < 0) size_mask(a.batch);
    cpu::conv2d_relu_avgpool2_forward(conv_geom(op_, a.batch), a.x[0], a.p[0], a.p[1], a.y, mask(a), lanes_.of(a),
                                      lanes_.threads(a));
  }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override {
    DDP_CHECK(a.first + a.batch <= mask_batch_ && (a.lane >= 0 || a.batch == mask_batch_), "backward for images ",
              a.first, " .. ", a.first + a.batch, " after forward of batch ", mask_batch_);
    cpu::conv2d_relu_avgpool2_backward(conv_geom(op_, a.batch), a.x[0], a.p[0], mask(a), dy, a.dp[0], a.dp[1],
                                       dx[0], lanes_.of(a), lanes_.threads(a));
  }

 private:
  void size_mask(int batch) {
    if (mask_.size() < size_t(batch) * image_mask_) mask_.resize(size_t(batch) * image_mask_);
    mask_batch_ = batch;
  }
  uint8_t* mask(const OpArgs& a) { return mask_.data() + size_t(first_sample(a)) * image_mask_; }
  const Op& op_;
  LaneScratch lanes_;
  size_t image_mask_;  // bytes of relu mask per image
  std::vector<uint8_t> mask_;
  int mask_batch_ = -1;
};

// torch.nn.BatchNorm2d (nn/cpu/ops.hpp's steps); with a StatsReducer the batch
// statistics and the backward's sums are summed over ranks (SyncBatchNorm).
// With OpArgs::shard, every sum is taken shard by shard and the shards' sums
// added in shard order (Note [micro-shards] in device.hpp).
class BatchNorm final : public Kernel {
 public:
  BatchNorm(const Op& op, ThreadPool* pool, StatsReducer* stats)
      : op_(op), pool_(pool), stats_(stats), c_(op.in.c), hw_(op.in.h * op.in.w), mean_(c_), invstd_(c_),
        scale_(c_), shift_(c_), s1_(c_), s2_(c_), sums_(2 * size_t(c_)) {}

  void forward(const OpArgs& a) override {
    const float *w = a.p[0], *b = a.p[1];
    float *running_mean = a.buf[0], *running_var = a.buf[1];
    if (a.mode == Mode::Eval) {
      for (int c = 0; c < c_; ++c)
        kernel::bn_eval_channel(w[c], b[c], running_mean[c], running_var[c], op_.eps, &scale_[c], &shift_[c]);
      cpu::bn_apply(a.batch, c_, hw_, a.x[0], scale_.data(), shift_.data(), a.y, pool_);
      return;
    }
    const double count = double(a.batch) * hw_ * (stats_ ? stats_->ranks() : 1);
    DDP_CHECK(count > 1, "BatchNorm2d ", op_.name, ": training needs more than one value per channel, got ", count);
    const ShardRuns sh = shards(a, c_);
    for (int k = 0; k < sh.n; ++k) cpu::bn_sum(sh.size, c_, hw_, a.x[0] + k * sh.stride, sh.sums(k), pool_);
    reduce(a, sh, s1_.data(), "batch mean");
    for (int c = 0; c < c_; ++c) mean_[c] = kernel::bn_mean(s1_[c], count);
    for (int k = 0; k < sh.n; ++k)
      cpu::bn_sum_sq_dev(sh.size, c_, hw_, a.x[0] + k * sh.stride, mean_.data(), sh.sums(k), pool_);
    reduce(a, sh, s2_.data(), "batch variance");
    for (int c = 0; c < c_; ++c)
      kernel::bn_train_channel(s2_[c], count, op_.eps, op_.momentum, mean_[c], w[c], b[c], &invstd_[c], &scale_[c],
                               &shift_[c], &running_mean[c], &running_var[c]);
    if (a.counter) ++*a.counter;
    cpu::bn_apply(a.batch, c_, hw_, a.x[0], scale_.data(), shift_.data(), a.y, pool_);
  }

  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override {
    // Per shard, sum(dy) and then sum(dy (x - mean)): 2c values.
    const ShardRuns sh = shards(a, 2 * c_);
    for (int k = 0; k < sh.n; ++k) {
      double* g = sh.sums(k);
      cpu::bn_grad_sums(sh.size, c_, hw_, a.x[0] + k * sh.stride, mean_.data(), dy + k * sh.stride, g, g + c_,
                        pool_);
      // This rank's sums make its weight and bias gradients (averaged over
      // ranks by the reducer, as DDP does); the input gradient needs them
      // over every rank the statistics came from.
      for (int c = 0; c < c_; ++c) {
        a.dp[0][c] += float(g[c_ + c] * double(invstd_[c]));
        a.dp[1][c] += float(g[c]);
      }
      if (a.shard) a.shard_grads();
    }
    if (!dx[0]) return;
    reduce(a, sh, sums_.data(), "gradient sums");
    const double count = double(a.batch) * hw_ * (stats_ ? stats_->ranks() : 1);
    cpu::bn_backward_apply(a.batch, c_, hw_, a.x[0], mean_.data(), invstd_.data(), a.p[0], dy, sums_.data(),
                           sums_.data() + c_, count, dx[0], pool_);
  }

 private:
  // A call's runs (Note [micro-shards]), their sums in per_shard_.
  ShardRuns shards(const OpArgs& a, size_t width) {
    ShardRuns s = shard_runs(a, int64_t(c_) * hw_, width, op_.name);
    if (per_shard_.size() < size_t(s.n) * width) per_shard_.resize(size_t(s.n) * width);
    s.base = per_shard_.data();
    return s;
  }
  // out[0 .. width) = the runs' sums added up, over every rank with a
  // StatsReducer: shard by shard in global order with OpArgs::shard.
  void reduce(const OpArgs& a, const ShardRuns& sh, double* out, const char* what) {
    if (stats_ && a.shard) return stats_->sum_shards(sh.base, sh.n, sh.width, out, op_.name + ": " + what);
    if (sh.n == 1)
      std::copy(sh.base, sh.base + sh.width, out);
    else
      sum_in_shard_order(sh.base, size_t(sh.n), sh.width, out);
    if (stats_) stats_->sum(out, sh.width, op_.name + ": " + what);
  }
  const Op& op_;
  ThreadPool* pool_;
  StatsReducer* stats_;
  int c_, hw_;
  std::vector<float> mean_, invstd_, scale_, shift_;  // of the last training forward (and its scale)
  std::vector<double> s1_, s2_, sums_;              // the batch's (over ranks): forward's, backward's
  std::vector<double> per_shard_;                   // each run's
};

class Relu final : public Kernel {
 public:
  explicit Relu(const Op& op) : n_(op.in.numel()) {}
  void forward(const OpArgs& a) override { cpu::relu_forward(a.batch * n_, a.x[0], a.y); }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override {
    if (dx[0]) cpu::relu_backward(a.batch * n_, a.y, dy, dx[0]);
  }

 private:
  int64_t n_;
};

class Add final : public Kernel {
 public:
  explicit Add(const Op& op) : n_(op.in.numel()), relu_(op.relu) {}
  void forward(const OpArgs& a) override { cpu::add_forward(a.batch * n_, a.x[0], a.x[1], relu_, a.y); }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override {
    cpu::add_backward(a.batch * n_, a.y, relu_, dy, dx[0], dx[1]);
  }

 private:
  int64_t n_;
  bool relu_;
};

class AvgPool final : public Kernel {
 public:
  explicit AvgPool(const Op& op) : in_(op.in) {}
  void forward(const OpArgs& a) override { cpu::avgpool2_forward(a.batch * in_.c, in_.h, in_.w, a.x[0], a.y); }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override {
    if (dx[0]) cpu::avgpool2_backward(a.batch * in_.c, in_.h, in_.w, dy, dx[0]);
  }

 private:
  Shape in_;
};

class GlobalAvgPool final : public Kernel {
 public:
  explicit GlobalAvgPool(const Op& op) : in_(op.in) {}
  void forward(const OpArgs& a) override {
    cpu::global_avgpool_forward(int64_t(a.batch) * in_.c, in_.h * in_.w, a.x[0], a.y);
  }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override {
    if (dx[0]) cpu::global_avgpool_backward(int64_t(a.batch) * in_.c, in_.h * in_.w, dy, dx[0]);
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

class Linear final : public Kernel {
 public:
  Linear(const Op& op, ThreadPool* pool) : in_(int(op.in.numel())), out_(op.out_c), pool_(pool) {}
  void forward(const OpArgs& a) override {
    cpu::linear_forward(a.batch, in_, out_, a.x[0], a.p[0], a.p[1], a.y, threads_for(a, pool_));
  }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx) override {
    cpu::linear_backward(a.batch, in_, out_, a.x[0], a.p[0], dy, a.dp[0], a.dp[1], dx[0], threads_for(a, pool_));
  }

 private:
  int in_, out_;
  ThreadPool* pool_;
};

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int threads) : pool_(std::max(1, threads)) {}
  std::string name() const override { return "cpu"; }

  std::unique_ptr<Kernel> kernel(const Graph& g, size_t i, StatsReducer* stats) override {
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

  std::unique_ptr<Array> alloc(size_t n) override { return std::make_unique<CpuArray>(n); }
  void fill(float* p, size_t n, float value) override { std::fill(p, p + n, value); }
  void add(float* dst, const float* src, size_t n) override {
    for (size_t i = 0; i < n; ++i) dst[i] += src[i];
  }
  void scale(float* p, size_t n, float s) override {
    for (size_t i = 0; i < n; ++i) p[i] *= s;
  }
  void round(float* dst, const float* src, size_t n, Precision prec) override {
    if (prec == Precision::BF16)
      for (size_t i = 0; i < n; ++i) dst[i] = round_to(Precision::BF16, src[i]);
    else if (prec == Precision::F16)
      for (size_t i = 0; i < n; ++i) dst[i] = round_to(Precision::F16, src[i]);
    else if (dst != src && n)
      std::memcpy(dst, src, n * sizeof(float));
  }
  void to_host(float* host, const float* dev, size_t n) override {
    if (n) std::memcpy(host, dev, n * sizeof(float));
  }
  void from_host(float* dev, const float* host, size_t n) override {
    if (n) std::memcpy(dev, host, n * sizeof(float));
  }
  void sync() override {}
  // Note [lanes]: one per thread.
  int lanes() const override { return pool_.size(); }
  void for_lanes(int64_t n, const std::function<void(int64_t, int)>& body) override { pool_.parallel_for(n, body); }

 private:
  ThreadPool pool_;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(int threads) { return std::make_unique<CpuDevice>(threads); }

}  // namespace ddp::nn
