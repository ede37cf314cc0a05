// Replica's --deterministic part (replica.hpp): the model runs in
// micro-shards on its device's lanes (deterministic/sharded_model.hpp), each
// micro-shard's gradients go into the fixed-point sum and start across the
// ranks as each op is done (deterministic/exact_sum.hpp), and a step whose
// gradients outgrew their exponents is computed again.
#include <cmath>

#include "ddp/core/error.hpp"
#include "ddp/deterministic/exact_sum.hpp"      // ExactGradientSum, sum_shards_in_order
#include "ddp/deterministic/sharded_model.hpp"  // ShardedModel, ShardGradients
#include "ddp/deterministic/shards.hpp"         // ShardStats
#include "ddp/train/exact_backend.hpp"
#include "replica_parts.hpp"

namespace ddp::train {

namespace {

// SyncBatchNorm's sums, and its micro-shards' sums added in global shard
// order (Note [micro-shards] in deterministic/shards.hpp).
class ShardSyncStats : public deterministic::ShardStats {
 public:
  explicit ShardSyncStats(Backend& backend) : backend_(backend) {}
  void sum_shards(const double* per_shard, int shards, size_t n, double* out, const std::string& what) override {
    sum_shards_in_order(backend_.comm(), per_shard, shards, n, out, "sync batch norm: " + what);
  }

 private:
  Backend& backend_;
};

// Note [lanes] (deterministic/shards.hpp): the model's micro-shards'
// gradients into the fixed-point sums, lane by lane; an op's sums, once
// final, start across the ranks while backward goes on (Note [overlapped
// sums], deterministic/exact_sum.hpp).
class ToExactSum final : public deterministic::ShardGradients {
 public:
  ToExactSum(ExactGradientSum& sum, comm::Communicator& comm) : sum_(sum), comm_(comm) {}
  void take(int lane, const float* g, size_t first, size_t count) override { sum_.add(lane, g, first, count); }
  void take_shards(int lane, const float* g, size_t stride, int shards, size_t first, size_t count) override {
    sum_.add_shards(lane, g, stride, shards, first, count);
  }
  bool sinks(int lane, size_t first, size_t count, fixed_point::Sink* out) override {
    return sum_.sinks(lane, first, count, out);
  }
  void taken(size_t first, size_t count) override {
    sum_.fold(first, count);
    sum_.ready(comm_, first, count);
  }

 private:
  ExactGradientSum& sum_;
  comm::Communicator& comm_;
};

}  // namespace

// The synchronised BatchNorm's reducer of the mode: Stats that also sums
// micro-shards in shard order.
class Replica::ExactStats final : public Replica::Stats, public ShardSyncStats {
 public:
  explicit ExactStats(Backend& backend) : Replica::Stats(backend), ShardSyncStats(backend) {}
};

std::unique_ptr<nn::Model> Replica::make_exact(const Config& cfg, nn::Graph graph) {
  auto* backend = dynamic_cast<ExactBackend*>(backend_.get());
  DDP_CHECK(backend, "--deterministic: device ", backend_->device_name(), " does not support it");
  backend->use_shard_device();
  backend->set_exact_loss();
  if (stats_) stats_ = std::make_unique<ExactStats>(*backend_);
  auto model = std::make_unique<deterministic::ShardedModel>(std::move(graph), backend_->device(), stats_.get());
  exact_ = std::make_unique<Exact>();
  exact_->backend = backend;
  exact_->model = model.get();
  exact_->sum = backend->make_exact_sum(nn::param_slots(model->graph()), cfg.deterministic_shards);
  exact_->sum->set_lanes(model->lanes());
  exact_->shard = cfg.batch_size / cfg.deterministic_shards;
  exact_->global_batch = cfg.batch_size;
  return model;
}

void Replica::exact_passes(const float* x, const int32_t* y, int batch, StepHealth& health,
                           const std::function<void(double&)>& lap) {
  const int shard = exact_->shard;
  ExactGradientSum& sum = *exact_->sum;
  DDP_CHECK(batch % shard == 0, "a batch of ", batch, " does not split into micro-shards of ", shard,
            " (--deterministic-shards)");
  const int shards = batch / shard;
  // What earlier steps left in the backend's sums is set aside, so that a
  // redone step counts its loss once.
  sums_ += backend_->take_sums();
  // Nor may a redone step move BatchNorm's running statistics twice.
  nn::ModelState before;
  model_->get_buffers(before);
  ToExactSum to(sum, backend_->comm());
  for (;;) {
    sum.begin_step();
    health = StepHealth{};
    // Note [micro-shards] (deterministic/shards.hpp): the whole batch op by
    // op, every op but BatchNorm micro-shard by micro-shard on the device's
    // lanes, so that BatchNorm's statistics cover every rank's micro-shards.
    model_->zero_grads();
    {
      TraceScope span(trace_, Trace::kStep, "forward", "forward");
      const float* logits = exact_->model->forward_shards(x, batch, nn::Mode::Train, shard);
      // Micro-shard k's loss, and d(loss)/d(logits) over the global batch:
      // the micro-shards' sum over every rank is then the step's mean
      // gradient.
      if (!exact_->backend->shard_losses(logits, y, batch, shard, classes_, dlogits_->data(), exact_->global_batch))
        for (int k = 0; k < shards; ++k) {
          const size_t at = size_t(k) * shard * classes_;
          if (const auto loss = backend_->loss(logits + at, y + size_t(k) * shard, shard, classes_,
                                               dlogits_->data() + at, exact_->global_batch))
            health.add_loss(*loss, shards);
        }
      scale_dlogits(batch);
    }
    lap(times_.forward);
    {
      TraceScope span(trace_, Trace::kStep, "backward", "backward");
      exact_->model->backward_shards(dlogits_->data(), batch, to);
    }
    lap(times_.backward);
    TraceScope span(trace_, Trace::kStep, "comm", "fixed-point all-reduce");
    const ExactGradientSum::Result r = sum.finish(backend_->comm(), model_->grads());
    lap(times_.comm);
    // Every rank knows it alike, without looking at the gradients.
    health.grads_finite = r != ExactGradientSum::Result::NonFinite;
    if (r != ExactGradientSum::Result::Redo) return;
    backend_->take_sums();  // the attempt that outgrew its exponents
    model_->set_buffers(before);
    sums_.redone_steps += 1;
  }
}

// Under --deterministic in micro-shards on the lanes, as training's: each
// sample's logits are then one thread's at any world size.
const float* Replica::exact_eval_forward(const float* x, int batch) {
  return exact_->model->forward_shards(x, batch, nn::Mode::Eval, exact_->shard);
}

}  // namespace ddp::train
