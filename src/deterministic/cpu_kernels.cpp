// The CPU's kernels for --deterministic (deterministic/devices.hpp): the
// convolutions, the fused LeNet layer and the linear layers on lanes, and
// BatchNorm's sums micro-shard by micro-shard, built on nn/cpu's kernels.
#include <algorithm>
#include <memory>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/deterministic/devices.hpp"
#include "ddp/deterministic/shards.hpp"
#include "ddp/nn/cpu/kernels.hpp"      // Conv, ConvReluPool, BatchNorm, Linear, CpuDevice
#include "ddp/nn/cpu/packed_gemm.hpp"  // PackedMatrix, kPackedGemm, kFixedPointGemm
#include "sharded_batch.hpp"

namespace ddp::deterministic {

using nn::Op;
using nn::OpArgs;
using nn::ThreadPool;
namespace cpu = nn::cpu;

namespace {

// Micro-shards share what they would each make of the weights: made by
// begin_shards, on the pool, the same values each shard would make itself.
// On Winograd's path that is the kernels' transform (turned for backward's
// input gradient), which lets the path repay from fewer tiles
// (winograd_applies_to_shards); and, with the packed GEMM, the packing of
// the GEMMs' weight operands, Winograd's planes or im2col's w (w^T for
// backward) (Note [packed weights] in nn/cpu/packed_gemm.hpp). A call on a
// lane takes them where its own micro-shard's size gives the same path and
// tile size (evaluation's last micro-shard may be smaller); a call that
// does not, conv2d's path for its size. With the packed GEMM a call may hold
// a run of whole micro-shards (Note [shard runs]): it takes the
// micro-shard's path and tile size whatever its own size.
class LaneConv final : public cpu::Conv, public LaneKernel {
 public:
  LaneConv(const Op& op, ThreadPool* pool)
      : Conv(op, pool), scratch_(size_t(pool->size())), packed_dy_(size_t(pool->size())) {}
  using Conv::backward;
  using Conv::forward;
  void begin_shards(const OpArgs& whole, int shard, bool backward) override {
    const cpu::ConvGeom g = cpu::conv_geom(op_, shard);
    phase_ = backward ? Phase::Backward : Phase::Forward;
    shard_ = shard;
    winograd_ = cpu::winograd_applies_to_shards(g);
    weight_grad_im2col_ = winograd_ && cpu::shard_weight_grad_by_im2col(g);
    if (winograd_) {
      tile_ = cpu::winograd_tile(g);
      cpu::winograd_transform_weights(g, whole.p[0], backward, tile_, kernels_, pool_);
      if (cpu::kPackedGemm) cpu::pack_winograd_planes(g, backward, tile_, kernels_, packed_, pool_);
    } else if (cpu::kPackedGemm) {
      const int ckk = g.in_c * g.k * g.k;
      packed_.resize(1);
      if (backward)
        packed_[0].pack(true, ckk, g.out_c, whole.p[0], ckk, pool_);
      else
        packed_[0].pack(false, g.out_c, ckk, whole.p[0], ckk, pool_);
    }
  }
  bool shards_in_one_call() const override { return cpu::kPackedGemm; }
  // Note [fixed-point epilogue]: only the Winograd layers whose micro-shards
  // take their weight gradients by im2col's GEMM (ResNet-18's 512 channels
  // on 4x4), where writing and reading back 2.4M-element float gradients
  // costs more than the epilogue; the other layers on im2col's path gain
  // nothing or lose, so they stay a micro-shard a call (measurements:
  // bench/RESULTS.md, "Fixed-point epilogue").
  bool grads_to_sinks() const override {
    return cpu::kFixedPointGemm && phase_ == Phase::Backward && winograd_ && weight_grad_im2col_;
  }
  void forward(const OpArgs& a, const Lane& lane) override {
    const cpu::ConvGeom g = cpu::conv_geom(op_, a.batch);
    cpu::ConvScratch<float>& s = scratch_[size_t(lane.index)];
    switch (shared(a, g, Phase::Forward)) {
      case Path::Winograd:
        return cpu::winograd_conv3x3_forward(g, a.x[0], a.p[0], a.p[1], a.y, s, nullptr, tile_, kernels_.data(),
                                             packed());
      case Path::Im2col:
        return cpu::conv2d_forward(g, a.x[0], a.p[0], a.p[1], a.y, s, nullptr, packed());
      case Path::Own:
        return cpu::conv2d_forward(g, a.x[0], a.p[0], a.p[1], a.y, s, nullptr);
    }
  }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx, const Lane& lane) override {
    on_path(a, cpu::conv_geom(op_, a.batch), dy, dx, scratch_[size_t(lane.index)]);
  }
  void backward_to_sinks(const OpArgs& a, const float* dy, const std::vector<float*>& dx, const Lane& lane, int shard,
                         const std::vector<fixed_point::Sink>& sinks) override {
    DDP_CHECK(grads_to_sinks() && shard == shard_ && a.batch % shard_ == 0 && sinks.size() == a.p.size(), "conv ",
              op_.name, ": fixed-point weight gradients of ", a.batch, " samples in micro-shards of ", shard,
              " on lane ", lane.index);
    const cpu::ConvGeom g = cpu::conv_geom(op_, a.batch);
    cpu::ConvScratch<float>& s = scratch_[size_t(lane.index)];
    if (dx[0]) on_path(a, g, dy, dx, s);
    cpu::conv2d_weight_grad_fixed(g, a.x[0], dy, shard_, sinks[0], sinks.size() > 1 ? &sinks[1] : nullptr, s,
                                  packed_dy_[size_t(lane.index)]);
  }

 private:
  enum class Phase { None, Forward, Backward };
  // What a call runs on: the shared transform (and packing) of Winograd's
  // path, the shared packing of im2col's, or nothing shared.
  enum class Path { Winograd, Im2col, Own };
  // backward on the path shared() picks: the input gradient where dx[0] is
  // wanted, the weight and bias gradients where a.dp has them.
  void on_path(const OpArgs& a, const cpu::ConvGeom& g, const float* dy, const std::vector<float*>& dx,
               cpu::ConvScratch<float>& s) {
    switch (shared(a, g, Phase::Backward)) {
      case Path::Winograd:
        // A micro-shard's weight gradient, where Winograd's would be too
        // shallow, by im2col's path (shard_weight_grad_by_im2col).
        if (weight_grad_im2col_ && a.dp[0] && a.batch == shard_) {
          cpu::conv2d_weight_grad_im2col(g, a.x[0], dy, a.dp[0], a.dp[1], s);
          if (!dx[0]) return;
          return cpu::winograd_conv3x3_backward<float>(g, a.x[0], a.p[0], dy, nullptr, nullptr, dx[0], s, nullptr,
                                                       tile_, kernels_.data(), packed());
        }
        return cpu::winograd_conv3x3_backward(g, a.x[0], a.p[0], dy, a.dp[0], a.dp[1], dx[0], s, nullptr, tile_,
                                              kernels_.data(), packed());
      case Path::Im2col:
        return cpu::conv2d_backward(g, a.x[0], a.p[0], dy, a.dp[0], a.dp[1], dx[0], s, nullptr, packed());
      case Path::Own:
        return cpu::conv2d_backward(g, a.x[0], a.p[0], dy, a.dp[0], a.dp[1], dx[0], s, nullptr);
    }
  }
  Path shared(const OpArgs& a, const cpu::ConvGeom& g, Phase phase) const {
    if (phase_ != phase) return Path::Own;
    if (winograd_ && cpu::kPackedGemm && a.batch % shard_ == 0) return Path::Winograd;  // whole micro-shards
    if (winograd_)
      return cpu::winograd_applies_to_shards(g) && cpu::winograd_tile(g) == tile_ ? Path::Winograd : Path::Own;
    // Fewer images than the shard's never reach Winograd's path.
    return cpu::kPackedGemm ? Path::Im2col : Path::Own;
  }
  const cpu::PackedMatrix* packed() const { return cpu::kPackedGemm ? packed_.data() : nullptr; }
  std::vector<cpu::ConvScratch<float>> scratch_;  // per lane
  Phase phase_ = Phase::None;  // what the members below hold, for the lanes after the last begin_shards
  int shard_ = 0;
  bool winograd_ = false, weight_grad_im2col_ = false;
  int tile_ = 0;
  std::vector<float> kernels_;
  std::vector<cpu::PackedMatrix> packed_;     // kernels_'s planes, or w (w^T backward), packed
  std::vector<cpu::PackedMatrix> packed_dy_;  // per lane: a run's output gradients (fixed-point epilogue)
};

// The relu masks of the whole batch, each micro-shard's at its images'
// place, written side by side by the lanes.
class LaneConvReluPool final : public cpu::ConvReluPool, public LaneKernel {
 public:
  LaneConvReluPool(const Op& op, ThreadPool* pool) : ConvReluPool(op, pool), scratch_(size_t(pool->size())) {}
  using ConvReluPool::backward;
  using ConvReluPool::forward;
  void begin_lanes(int batch) override { size_mask(batch); }
  void forward(const OpArgs& a, const Lane& lane) override {
    forward_at(a, lane.first, scratch_[size_t(lane.index)], nullptr);
  }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx, const Lane& lane) override {
    backward_at(a, lane.first, dy, dx, scratch_[size_t(lane.index)], nullptr);
  }

 private:
  std::vector<cpu::ConvScratch<float>> scratch_;  // per lane
};

class LaneLinear final : public cpu::Linear, public LaneKernel {
 public:
  using Linear::Linear;
  using Linear::backward;
  using Linear::forward;
  void forward(const OpArgs& a, const Lane&) override { forward_on(a, nullptr); }
  void backward(const OpArgs& a, const float* dy, const std::vector<float*>& dx, const Lane&) override {
    backward_on(a, dy, dx, nullptr);
  }
};

// Every sum taken shard by shard and the shards' sums added in shard order
// (over every rank with ShardStats).
class ShardBatchNorm final : public ShardedBatch<cpu::BatchNorm> {
 public:
  ShardBatchNorm(const Op& op, ThreadPool* pool, nn::StatsReducer* stats)
      : ShardedBatch(op, pool, stats), shard_stats_(shard_stats(stats, op.name)) {}

 private:
  void channel_sums(const OpArgs& a, size_t width, const RunSum& sum, double* out, const std::string& what,
                    bool backward) override {
    if (shard_ == 0) return BatchNorm::channel_sums(a, width, sum, out, what, backward);
    const int n = shards_of(a.batch, shard_, op_.name);
    if (per_shard_.size() < size_t(n) * width) per_shard_.resize(size_t(n) * width);
    for (int k = 0; k < n; ++k) {
      sum(int64_t(k) * shard_, shard_, per_shard_.data() + size_t(k) * width);
      if (backward) (*take_)();
    }
    if (shard_stats_) return shard_stats_->sum_shards(per_shard_.data(), n, width, out, op_.name + ": " + what);
    if (n == 1)
      std::copy(per_shard_.begin(), per_shard_.begin() + std::ptrdiff_t(width), out);
    else
      sum_in_shard_order(per_shard_.data(), size_t(n), width, out);
  }
  ShardStats* shard_stats_;
  std::vector<double> per_shard_;  // each micro-shard's sums
};

class CpuShardDevice final : public cpu::CpuDevice, public Lanes {
 public:
  using CpuDevice::CpuDevice;
  std::unique_ptr<nn::Kernel> kernel(const nn::Graph& g, size_t i, nn::StatsReducer* stats) override {
    const Op& op = g.ops[i];
    switch (op.kind) {
      case nn::OpKind::Conv2d: return std::make_unique<LaneConv>(op, &pool());
      case nn::OpKind::ConvReluPool: return std::make_unique<LaneConvReluPool>(op, &pool());
      case nn::OpKind::Linear: return std::make_unique<LaneLinear>(op, &pool());
      case nn::OpKind::BatchNorm2d: return std::make_unique<ShardBatchNorm>(op, &pool(), stats);
      default: return CpuDevice::kernel(g, i, stats);
    }
  }
  // Note [lanes]: one per thread.
  int lanes() const override { return threads(); }
  void for_lanes(int64_t n, const std::function<void(int64_t, int)>& body) override { pool().parallel_for(n, body); }
};

}  // namespace

ShardStats* shard_stats(nn::StatsReducer* stats, const std::string& op) {
  if (!stats) return nullptr;
  auto* s = dynamic_cast<ShardStats*>(stats);
  DDP_CHECK(s, "BatchNorm2d ", op, ": its statistics are synchronised by a reducer that cannot sum micro-shards in "
            "order (--deterministic)");
  return s;
}

std::unique_ptr<nn::Device> make_cpu_device(int threads) { return std::make_unique<CpuShardDevice>(threads); }

}  // namespace ddp::deterministic
