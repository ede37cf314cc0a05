// ddp::deterministic::ShardedModel: the executor (nn::Model) running a
// batch's micro-shards op by op, on the device's lanes (Note [micro-shards],
// Note [lanes], Note [shard runs] in deterministic/shards.hpp), each
// micro-shard's parameter gradients handed over on their own.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "ddp/core/fixed_point.hpp"     // Sink
#include "ddp/deterministic/shards.hpp"  // Lanes, LaneKernel, ShardedBatchKernel
#include "ddp/nn/model.hpp"              // Model

namespace ddp::deterministic {

// What ShardedModel::backward_shards hands each micro-shard's parameter
// gradients to.
class ShardGradients {
 public:
  virtual ~ShardGradients() = default;
  // One micro-shard's gradients of params [first, first + count) (adjacent
  // in flat order), g[0] being param first's element 0. Lanes call at once,
  // each with its own lane (Note [lanes]); g is the lane's until it returns.
  virtual void take(int lane, const float* g, size_t first, size_t count) = 0;
  // Note [shard gradients together] (deterministic/shards.hpp): `shards`
  // consecutive micro-shards' gradients of params [first, first + count) at
  // once, micro-shard k's at g + k * stride (each laid out as take's g), in
  // place of as many takes; here those takes, in order.
  virtual void take_shards(int lane, const float* g, size_t stride, int shards, size_t first, size_t count) {
    for (int k = 0; k < shards; ++k) take(lane, g + size_t(k) * stride, first, count);
  }
  // Note [fixed-point epilogue] (nn/cpu/packed_gemm.hpp): where lane `lane`'s
  // gradients of params [first, first + count) go when they are fixed-point
  // sums in host memory (one Sink a param, into out), for a kernel that
  // converts and adds each micro-shard's gradients itself; false (nothing
  // written) where they are not. Called on the lane, as take is, and in
  // its place: what a kernel adds into the sinks counts as taken.
  virtual bool sinks(int lane, size_t first, size_t count, fixed_point::Sink* out) {
    (void)lane, (void)first, (void)count, (void)out;
    return false;
  }
  // Every micro-shard of params [first, first + count) has been taken, and
  // no lane is running.
  virtual void taken(size_t first, size_t count) = 0;
};

class ShardedModel : public nn::Model {
 public:
  // device: one whose kernels take part (deterministic/devices.hpp); its
  // lanes where it has them.
  ShardedModel(nn::Graph graph, nn::Device& device, nn::StatsReducer* stats = nullptr);

  int lanes() const { return lanes_ ? lanes_->lanes() : 1; }

  // Model::forward of a batch of micro-shards of `shard` samples: in
  // training for backward_shards, the batch a multiple of shard; in
  // evaluation the last micro-shard may be shorter.
  const float* forward_shards(const float* x, int batch, nn::Mode mode, int shard);

  // Backward of forward_shards' training batch: op by op, last first; each
  // op's parameter gradients are handed to `to` one micro-shard at a time,
  // on the lanes, and then the op's `taken` is called. Only BatchNorm's pass
  // through grads() (off the lanes), which must be zero before and are zero
  // after.
  void backward_shards(const float* dlogits, int batch, ShardGradients& to);

 private:
  void op_forward(size_t i, const nn::OpArgs& a) override;
  void op_backward(size_t i, const float* dy, const std::vector<float*>& dx, int batch) override;
  // Op i's lane and sharded-batch kernels, or nullptr.
  LaneKernel* lane_kernel(size_t i) { return dynamic_cast<LaneKernel*>(&kernel(i)); }
  // Runs body(i, lane) for i in [0, n) on the lanes (one after another
  // where the device has none).
  void for_lanes(int64_t n, const std::function<void(int64_t, int)>& body);
  // Op i's arguments for micro-shards k .. k + count - 1 of a's batch (the
  // last one shorter where the batch ends first).
  nn::OpArgs shard_args(size_t i, const nn::OpArgs& a, int64_t k, int64_t count = 1) const;
  // The input gradients within dx of a part whose first sample is `first`.
  std::vector<float*> dx_of(size_t i, const std::vector<float*>& dx, int64_t first) const;
  // Op i's forward of a part (a micro-shard or a run) whose first sample is
  // `first`, on `lane`.
  void call_forward(size_t i, LaneKernel* k, const nn::OpArgs& part, int lane, int64_t first);
  // Micro-shard `shard`'s parameter gradients (and its input gradient
  // unless `runs` took it): into `into` where given (Note [shard gradients
  // together]: the caller takes them; `no_bias`: all but the last
  // parameter's, which the caller has), else into the lane's buffer, taken.
  void backward_one_shard(size_t i, LaneKernel* k, int64_t shard, int lane, const float* dy,
                          const std::vector<float*>& dx, bool runs, float* into = nullptr, bool no_bias = false);
  // Whether the device asks for Note [shard gradients together].
  bool together();
  // Note [shard gradients together]: op i's micro-shards one after another
  // (or at once: Note [shard streams]), their parameter gradients into
  // buffers of their own, taken at once.
  void backward_shards_together(size_t i, LaneKernel* k, int64_t shards, const float* dy,
                                const std::vector<float*>& dx, bool runs);
  void backward_lanes(size_t i, const float* dy, const std::vector<float*>& dx, int batch);
  // Hands op i's parameter gradients in g (laid out from its first
  // parameter's offset) to to_ from lane `lane`, and zeroes them.
  void take_grads(size_t i, float* g, int lane);
  Lanes* lanes_;             // the device's, or nullptr
  int shard_ = 0;            // the micro-shards of the forward running or last run (0: none)
  int last_shard_ = 0;       // the last training forward's
  ShardGradients* to_ = nullptr;  // during backward_shards
  // Note [lanes]: each lane's parameter gradients of one op (as many floats
  // as the op with the most parameters has), made at the first backward_shards.
  std::vector<std::unique_ptr<nn::Array>> lane_grads_;
  std::unique_ptr<nn::Array> shard_grads_;  // Note [shard gradients together], grown to fit
  std::vector<bool> backed_;                // Note [shard streams]: ops past their first backward_shards_together
};

}  // namespace ddp::deterministic
