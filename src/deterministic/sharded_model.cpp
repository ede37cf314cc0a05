// ShardedModel (deterministic/sharded_model.hpp): Model's ops in
// micro-shards on the device's lanes.
#include "ddp/deterministic/sharded_model.hpp"

#include <algorithm>

#include "ddp/core/error.hpp"
#include "ddp/core/scoped.hpp"  // Scoped

namespace ddp::deterministic {

using nn::Mode;
using nn::OpArgs;
using nn::OpKind;

ShardedModel::ShardedModel(nn::Graph graph, nn::Device& device, nn::StatsReducer* stats)
    : Model(std::move(graph), device, stats), lanes_(dynamic_cast<Lanes*>(&device)) {
  for (size_t i = 0; i < this->graph().ops.size(); ++i) {
    // Micro-shards are cut op by op (shard_args): no claimed runs.
    DDP_CHECK(run_length(i) == 1, "model ", name(), ": op ", this->graph().ops[i].name, ": device ", device.name(),
              " runs it with its neighbours as one kernel, which --deterministic's micro-shards cannot cut");
    DDP_CHECK(this->graph().ops[i].kind != OpKind::BatchNorm2d || dynamic_cast<ShardedBatchKernel*>(&kernel(i)),
              "model ", name(), ": op ", this->graph().ops[i].name, ": device ", device.name(),
              " has no BatchNorm that sums micro-shards (--deterministic)");
  }
}

void ShardedModel::for_lanes(int64_t n, const std::function<void(int64_t, int)>& body) {
  if (lanes_) return lanes_->for_lanes(n, body);
  for (int64_t i = 0; i < n; ++i) body(i, 0);
}

const float* ShardedModel::forward_shards(const float* x, int batch, Mode mode, int shard) {
  DDP_CHECK(shard > 0 && (mode == Mode::Eval || batch % shard == 0), "model ", name(), ": a ",
            mode == Mode::Train ? "training" : "evaluation", " forward of batch ", batch, " in micro-shards of ",
            shard);
  Scoped<int> running(shard_, shard);
  const float* logits = forward(x, batch, mode);
  last_shard_ = mode == Mode::Train ? shard : 0;
  return logits;
}

OpArgs ShardedModel::shard_args(size_t i, const OpArgs& a, int64_t k, int64_t count) const {
  const nn::Op& op = graph().ops[i];
  const int64_t first = k * shard_;
  OpArgs part = a;
  part.batch = int(std::min<int64_t>(count * shard_, a.batch - first));
  for (size_t j = 0; j < op.inputs.size(); ++j)
    part.x[j] = a.x[j] + first * graph().values[size_t(op.inputs[j])].numel();
  part.y = a.y + first * graph().values[i + 1].numel();
  return part;
}

void ShardedModel::call_forward(size_t i, LaneKernel* k, const OpArgs& part, int lane, int64_t first) {
  if (k)
    k->forward(part, Lane{lane, first});
  else
    kernel(i).forward(part);
}

void ShardedModel::op_forward(size_t i, const OpArgs& a) {
  if (shard_ == 0) return Model::op_forward(i, a);
  // Note [micro-shards]: BatchNorm takes the whole batch, every other op one
  // micro-shard at a time, on the lanes.
  if (graph().ops[i].kind == OpKind::BatchNorm2d) {
    if (a.mode == Mode::Eval) return Model::op_forward(i, a);
    return dynamic_cast<ShardedBatchKernel&>(kernel(i)).forward_shards(a, shard_);
  }
  LaneKernel* k = lane_kernel(i);
  if (k) {
    k->begin_lanes(a.batch);
    k->begin_shards(a, shard_, /*backward=*/false);
  }
  if (k && k->shards_in_one_call()) {  // Note [shard runs]
    const std::vector<ShardRun> runs = shard_runs_on_lanes(a.batch, shard_, lanes());
    for_lanes(int64_t(runs.size()), [&](int64_t r, int lane) {
      const ShardRun run = runs[size_t(r)];
      call_forward(i, k, shard_args(i, a, run.first, run.count), lane, run.first * shard_);
    });
    return;
  }
  const int64_t shards = (a.batch + shard_ - 1) / shard_;
  for_lanes(shards, [&](int64_t s, int lane) { call_forward(i, k, shard_args(i, a, s), lane, s * shard_); });
}

void ShardedModel::backward_shards(const float* dlogits, int batch, ShardGradients& to) {
  DDP_CHECK(last_batch() < 0 || last_shard_ > 0, "model ", name(), ": backward_shards after a forward of one batch");
  if (lane_grads_.empty()) {
    size_t most = 0;
    for (size_t i = 0; i < graph().ops.size(); ++i) most = std::max(most, param_span(i).second);
    for (int l = 0; l < lanes(); ++l) lane_grads_.push_back(device().alloc(std::max<size_t>(most, 1)));
  }
  Scoped<ShardGradients*> taking(to_, &to);
  Scoped<int> shards(shard_, last_shard_);
  backward(dlogits, batch);
}

void ShardedModel::take_grads(size_t i, float* g, int lane) {
  const std::vector<size_t>& ps = graph().op_params[i];
  to_->take(lane, g, ps.front(), ps.size());
  device().fill(g, param_span(i).second, 0.0f);
}

std::vector<float*> ShardedModel::dx_of(size_t i, const std::vector<float*>& dx, int64_t first) const {
  const nn::Op& op = graph().ops[i];
  std::vector<float*> d = dx;
  for (size_t j = 0; j < op.inputs.size(); ++j)
    if (d[j]) d[j] += first * graph().values[size_t(op.inputs[j])].numel();
  return d;
}

void ShardedModel::op_backward(size_t i, const float* dy, const std::vector<float*>& dx, int batch) {
  if (last_shard_ == 0) return Model::op_backward(i, dy, dx, batch);
  DDP_CHECK(to_, "model ", name(), ": a training forward in micro-shards needs backward_shards");
  const std::vector<size_t>& ps = graph().op_params[i];
  if (graph().ops[i].kind == OpKind::BatchNorm2d) {
    // Note [micro-shards]: the kernel hands over its shards' gradients, in
    // grads(), off the lanes.
    const OpArgs& a = args(i);
    const ShardedBatchKernel::TakeShards all = [&](const float* g, size_t stride, int shards) {
      to_->take_shards(0, g, stride, shards, ps.front(), ps.size());
    };
    dynamic_cast<ShardedBatchKernel&>(kernel(i)).backward_shards(
        a, dy, dx, last_shard_, [&] { take_grads(i, a.dp[0], 0); }, !lanes_ && together() ? &all : nullptr);
  } else {
    backward_lanes(i, dy, dx, batch);
  }
  if (!ps.empty()) to_->taken(ps.front(), ps.size());
}

// Micro-shard s's parameter gradients (and its input gradient unless a
// run's call took it, `runs`) in a call of its own, handed to to_ (or left
// in `into` for the caller to hand over).
void ShardedModel::backward_one_shard(size_t i, LaneKernel* k, int64_t s, int lane, const float* dy,
                                      const std::vector<float*>& dx, bool runs, float* into, bool no_bias) {
  const std::vector<size_t>& ps = graph().op_params[i];
  OpArgs part = shard_args(i, args(i), s);
  float* g = into ? into : lane_grads_[size_t(lane)]->data();
  const size_t base = ps.empty() ? 0 : graph().params[ps.front()].offset;
  for (size_t j = 0; j < ps.size(); ++j) part.dp[j] = g + (graph().params[ps[j]].offset - base);
  if (no_bias) part.dp.back() = nullptr;  // the caller took every micro-shard's at once
  const std::vector<float*> dx_part = runs ? std::vector<float*>(dx.size(), nullptr) : dx_of(i, dx, s * shard_);
  const float* dy_part = dy + s * shard_ * graph().values[i + 1].numel();
  if (k)
    k->backward(part, dy_part, dx_part, Lane{lane, s * shard_});
  else
    kernel(i).backward(part, dy_part, dx_part);
  if (half_op(i) && !ps.empty()) device().round(g, g, param_span(i).second, precision());
  if (!ps.empty() && !into) take_grads(i, g, lane);
}

bool ShardedModel::together() {
  const auto* t = dynamic_cast<const ShardsTogether*>(&device());
  return t && t->shard_gradients_together();
}

// Note [shard gradients together] (deterministic/shards.hpp).
void ShardedModel::backward_shards_together(size_t i, LaneKernel* k, int64_t shards, const float* dy,
                                            const std::vector<float*>& dx, bool runs) {
  const std::vector<size_t>& ps = graph().op_params[i];
  // Each micro-shard's gradients 256 bytes from the last's, so that every
  // one is as aligned as the first (a library may choose its path by a
  // pointer's alignment: Note [graph engines] in nn/cuda/conv_algo.hpp).
  const size_t span = param_span(i).second, stride = (span + 63) / 64 * 64, n = size_t(shards) * stride;
  if (!shard_grads_ || shard_grads_->size() < n) shard_grads_ = device().alloc(n);  // zero-filled
  float* all = shard_grads_->data();
  // The bias's gradients (the last parameter's) in one pass where the kernel can.
  auto* bias = dynamic_cast<ShardBias*>(&kernel(i));
  const size_t bias_at = graph().params[ps.back()].offset - graph().params[ps.front()].offset;
  const bool biased = ps.size() > 1 && bias && !half_op(i) &&
                      bias->bias_grads_of_shards(args(i), dy, shard_, int(shards), all + bias_at, stride);
  const auto one = [&](int64_t s) { backward_one_shard(i, k, s, 0, dy, dx, runs, all + size_t(s) * stride, biased); };
  // Note [shard streams]: at once where the device and kernel can, after
  // the op's first backward.
  auto* streams = dynamic_cast<ShardStreams*>(&device());
  const auto* apart = dynamic_cast<const ConcurrentShards*>(&kernel(i));
  if (backed_.size() <= i) backed_.resize(graph().ops.size(), false);
  if (streams && apart && backed_[i] && apart->concurrent_shard_calls(ps.size() > 1 && !biased))
    streams->on_streams(shards, one);
  else
    for (int64_t s = 0; s < shards; ++s) one(s);
  backed_[i] = true;
  to_->take_shards(0, all, stride, int(shards), ps.front(), ps.size());
  device().fill(all, n, 0.0f);
}

// Note [lanes]: each lane's parameter gradients in its own buffer. Note
// [shard runs]: the input gradients a run of micro-shards at a time, then
// the parameter gradients one micro-shard at a time; or, where the kernel
// converts them itself (Note [fixed-point epilogue] in
// nn/cpu/packed_gemm.hpp), in the runs' calls too.
void ShardedModel::backward_lanes(size_t i, const float* dy, const std::vector<float*>& dx, int batch) {
  const std::vector<size_t>& ps = graph().op_params[i];
  LaneKernel* k = lane_kernel(i);
  if (k) k->begin_shards(args(i), shard_, /*backward=*/true);
  const bool in_runs = k && k->shards_in_one_call();
  const bool fixed = in_runs && k->grads_to_sinks() && !ps.empty() && !half_op(i);
  const bool runs = in_runs && (fixed || std::any_of(dx.begin(), dx.end(), [](const float* d) { return d; }));
  if (runs) {
    const std::vector<ShardRun> r = shard_runs_on_lanes(batch, shard_, lanes());
    for_lanes(int64_t(r.size()), [&](int64_t n, int lane) {
      const ShardRun run = r[size_t(n)];
      OpArgs part = shard_args(i, args(i), run.first, run.count);
      std::fill(part.dp.begin(), part.dp.end(), nullptr);
      const float* dy_part = dy + run.first * shard_ * graph().values[i + 1].numel();
      const Lane at{lane, run.first * shard_};
      std::vector<fixed_point::Sink> sinks(fixed ? ps.size() : 0);
      if (fixed && to_->sinks(lane, ps.front(), ps.size(), sinks.data()))
        return k->backward_to_sinks(part, dy_part, dx_of(i, dx, at.first), at, shard_, sinks);
      k->backward(part, dy_part, dx_of(i, dx, at.first), at);
      // Sums that are not the host's: this run's micro-shards one by one.
      if (fixed)
        for (int64_t m = run.first; m < run.first + run.count; ++m) backward_one_shard(i, k, m, lane, dy, dx, true);
    });
  }
  // An op without parameters has nothing left once its runs took dx.
  if (fixed || (runs && ps.empty())) return;
  if (!lanes_ && !ps.empty() && together()) return backward_shards_together(i, k, batch / shard_, dy, dx, runs);
  for_lanes(batch / shard_, [&](int64_t s, int lane) { backward_one_shard(i, k, s, lane, dy, dx, runs); });
}

}  // namespace ddp::deterministic
