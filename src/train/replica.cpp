// Replica (replica.hpp): the step, the same on every device.
#include "ddp/train/replica.hpp"

#include <chrono>
#include <cmath>
#include <exception>
#include <optional>
#include <utility>

#include "ddp/core/abandon.hpp"  // abandon: buffers an in-flight collective may write
#include "ddp/core/error.hpp"

namespace ddp::train {

using Clock = std::chrono::steady_clock;

// SyncBatchNorm's sums, over the backend's communicator (host memory,
// blocking, bounded by its timeout).
class Replica::Stats final : public nn::StatsReducer {
 public:
  explicit Stats(Backend& backend) : backend_(backend) {}
  void sum(double* data, size_t n, const std::string& what) override {
    backend_.comm().allreduce_doubles(data, n, /*max=*/false, "sync batch norm: " + what);
  }
  void sum_shards(const double* per_shard, int shards, size_t n, double* out, const std::string& what) override {
    sum_shards_in_order(backend_.comm(), per_shard, shards, n, out, "sync batch norm: " + what);
  }
  int ranks() const override { return backend_.comm().size(); }
  void sync_device(const std::string& what) override { backend_.sync("sync batch norm: " + what); }

 private:
  Backend& backend_;
};

Replica::Replica(const Config& cfg, const optim::Options& opt, std::unique_ptr<Backend> backend, nn::Graph graph)
    : backend_(std::move(backend)), accumulate_(cfg.accumulate) {
  if (cfg.sync_bn) stats_ = std::make_unique<Stats>(*backend_);
  nn::Device& dev = backend_->device();
  model_ = std::make_unique<nn::Model>(std::move(graph), dev, stats_.get());
  const nn::Precision precision = nn::parse_precision(cfg.precision);
  model_->set_precision(precision);
  if (precision == nn::Precision::F16) {
    optim::ScalerOptions so;
    so.init_scale = cfg.init_scale;
    so.growth_interval = cfg.growth_interval;
    scaler_ = std::make_unique<optim::GradScaler>(so);
  }
  const nn::Graph& g = model_->graph();
  std::vector<size_t> numels;
  for (const auto& p : g.params) numels.push_back(p.numel);
  const comm::Wire wire = cfg.grad_compression == "fp16"   ? comm::Wire::F16
                          : cfg.grad_compression == "bf16" ? comm::Wire::BF16
                                                           : comm::Wire::F32;
  reducer_ = std::make_unique<Reducer>(backend_->comm(), model_->grads(), numels, cfg.bucket_cap_mb, cfg.overlap,
                                       wire);
  std::vector<std::string> names;
  for (const auto& p : g.params) names.push_back(p.name);
  reducer_->set_param_names(std::move(names));
  if (cfg.deterministic_shards > 0) {
    exact_ = backend_->make_exact_sum(numels, cfg.deterministic_shards);
    shard_ = cfg.batch_size / cfg.deterministic_shards;
    global_batch_ = cfg.batch_size;
    exact_->set_lanes(dev.lanes());
    backend_->set_exact_loss();
  }
  optimizer_ = std::make_unique<optim::Optimizer>(opt, g.params, dev, backend_->optim_kernels());
  classes_ = static_cast<int>(g.output_shape().numel());
  dlogits_ = dev.alloc(size_t(cfg.batch_size) * size_t(classes_));
}

Replica::~Replica() {
  // While an error unwinds, buckets may still be all-reduced in place in the
  // model's gradients: by the communication thread until the backend's
  // communicator (destroyed after the model) stops it, and by MPI after that
  // (Note [abandoned requests], comm/mpi_communicator.cpp). The model's
  // memory stays for the little that is left of the job.
  if (std::uncaught_exceptions() > 0) abandon(std::move(model_));
}

void Replica::push(const TrainState& s) {
  model_->set_state(s.model);
  optimizer_->set_state(s.optimizer);
  if (exact_ && !s.grad_exponents.empty()) exact_->set_exponents(s.grad_exponents);
  if (scaler_ && s.loss_scale > 0) scaler_->set_state(s.loss_scale, s.scaler_growth_tracker);
}

void Replica::pull(TrainState& s) {
  backend_->sync("reading the model back");
  model_->get_state(s.model);
  optimizer_->get_state(s.optimizer);
  s.grad_exponents = exact_ ? exact_->exponents() : std::vector<int64_t>{};
  s.loss_scale = scaler_ ? scaler_->scale() : 0.0f;
  s.scaler_growth_tracker = scaler_ ? scaler_->growth_tracker() : 0;
}

void Replica::push_buffers(const nn::ModelState& s) { model_->set_buffers(s); }

void Replica::pull_buffers(nn::ModelState& s) {
  backend_->sync("reading the buffers back");
  model_->get_buffers(s);
}

void Replica::set_trace(Trace* trace) {
  trace_ = trace;
  model_->set_trace(trace);
  reducer_->set_trace(trace);
}

StepHealth Replica::train_step(const data::Batch& b, double lr) {
  DDP_CHECK(size_t(b.size) * size_t(classes_) <= dlogits_->size(), "a batch of ", b.size,
            " is larger than the global batch");
  DDP_CHECK(b.size % accumulate_ == 0, "a batch of ", b.size, " does not split into ", accumulate_,
            " micro-batches (--accumulate)");
  times_ = StepTimes{};
  // Each part's clock runs from the previous part's end, so the parts add up
  // to the step.
  auto mark = Clock::now();
  auto lap = [&mark](double& part) {
    const auto now = Clock::now();
    part += std::chrono::duration<double>(now - mark).count();
    mark = now;
  };
  std::optional<TraceScope> stage_span(std::in_place, trace_, Trace::kStep, "data", "stage batch");
  const auto [x, y] = backend_->stage(b);
  stage_span.reset();
  lap(times_.data);
  const size_t sample = b.x.size() / size_t(b.size);
  StepHealth health;
  if (exact_) {
    exact_passes(x, y, b.size, health, lap);
    sums_.allreduces += 2;
    sums_.allreduce_bytes += double(exact_->bytes_per_step());
  } else {
    reduced_passes(x, y, b.size, sample, health, lap);
  }
  {
    TraceScope span(trace_, Trace::kStep, "optimizer", "optimizer");
    // fp16's scaler looks at every step's gradients on every device, as
    // GradScaler.step does (it reads found_inf on the host).
    if (health.grads_finite && (backend_->checks_every_step() || scaler_))
      health.grads_finite = backend_->all_finite(model_->grads(), model_->num_params());
    if (health.grads_finite)
      optimizer_->step(lr, model_->params(), model_->grads(), scaler_ ? 1.0f / scaler_->scale() : 1.0f);
    if (scaler_) {
      health.skipped = !health.grads_finite;
      scaler_->update(health.skipped);
    }
    backend_->batch_done();
  }
  lap(times_.optimizer);
  sums_.samples += b.size;
  return health;
}

void Replica::reduced_passes(const float* x, const int32_t* y, int batch, size_t sample, StepHealth& health,
                             const std::function<void(double&)>& lap) {
  const int micro = batch / accumulate_;
  model_->zero_grads();
  const int64_t launched = reducer_->launches(), bytes = reducer_->launched_bytes();
  // Note [gradient accumulation] (nn/device.hpp): backward adds into the
  // gradient buffer, so micro-batches sum there; each one's d(loss) is taken
  // over the whole step's samples, so the sum is the step's mean gradient.
  // Only the last backward communicates (no_sync before it).
  for (int k = 0; k < accumulate_; ++k) {
    const bool last = k == accumulate_ - 1;
    {
      TraceScope span(trace_, Trace::kStep, "forward", "forward");
      const float* logits = model_->forward(x + size_t(k) * micro * sample, micro, nn::Mode::Train);
      TraceScope loss_span(trace_, Trace::kStep, "forward", "loss");
      if (const auto loss =
              backend_->loss(logits, y + size_t(k) * micro, micro, classes_, dlogits_->data(), batch)) {
        health.loss += *loss / accumulate_;
        health.loss_finite = health.loss_finite && std::isfinite(*loss);
        health.loss_known = true;
      }
      scale_dlogits(micro);
    }
    lap(times_.forward);
    {
      TraceScope span(trace_, Trace::kStep, "backward", "backward");
      reducer_->set_sync(last);
      reducer_->begin_backward();
      model_->backward(dlogits_->data(), micro, [this](size_t n) { reducer_->grads_ready(n); });
      if (!last) reducer_->finish();  // communicates nothing
    }
    lap(times_.backward);
  }
  {
    TraceScope span(trace_, Trace::kStep, "comm", "wait for all-reduces");
    const ReducerStats r = reducer_->finish();
    sums_.comm_wait += r.wait_sec;
    times_.comm_busy = r.comm_sec;
    times_.hidden = r.hidden_sec;
  }
  lap(times_.comm);
  sums_.allreduces += double(reducer_->launches() - launched);
  sums_.allreduce_bytes += double(reducer_->launched_bytes() - bytes);
}

// Note [lanes] (nn/device.hpp): the model's micro-shards' gradients into the
// fixed-point sums, lane by lane; an op's sums, once final, start across the
// ranks while backward goes on (Note [overlapped sums], ddp/exact_sum.hpp).
class Replica::ToExactSum final : public nn::ShardGradients {
 public:
  ToExactSum(ExactGradientSum& sum, comm::Communicator& comm) : sum_(sum), comm_(comm) {}
  void take(int lane, const float* g, size_t first, size_t count) override { sum_.add(lane, g, first, count); }
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

void Replica::exact_passes(const float* x, const int32_t* y, int batch, StepHealth& health,
                           const std::function<void(double&)>& lap) {
  DDP_CHECK(batch % shard_ == 0, "a batch of ", batch, " does not split into micro-shards of ", shard_,
            " (--deterministic-shards)");
  const int shards = batch / shard_;
  // What earlier steps left in the backend's sums is set aside, so that a
  // redone step counts its loss once.
  sums_ += backend_->take_sums();
  // Nor may a redone step move BatchNorm's running statistics twice.
  nn::ModelState before;
  model_->get_buffers(before);
  ToExactSum to(*exact_, backend_->comm());
  for (;;) {
    exact_->begin_step();
    health = StepHealth{};
    // Note [micro-shards] (nn/device.hpp): the whole batch op by op, every
    // op but BatchNorm micro-shard by micro-shard on the device's lanes, so
    // that BatchNorm's statistics cover every rank's micro-shards.
    model_->zero_grads();
    {
      TraceScope span(trace_, Trace::kStep, "forward", "forward");
      const float* logits = model_->forward(x, batch, nn::Mode::Train, shard_);
      // Micro-shard k's loss, and d(loss)/d(logits) over the global batch:
      // the micro-shards' sum over every rank is then the step's mean
      // gradient.
      for (int k = 0; k < shards; ++k) {
        const size_t at = size_t(k) * shard_ * classes_;
        if (const auto loss = backend_->loss(logits + at, y + size_t(k) * shard_, shard_, classes_,
                                             dlogits_->data() + at, global_batch_)) {
          health.loss += *loss / shards;
          health.loss_finite = health.loss_finite && std::isfinite(*loss);
          health.loss_known = true;
        }
      }
      scale_dlogits(batch);
    }
    lap(times_.forward);
    {
      TraceScope span(trace_, Trace::kStep, "backward", "backward");
      model_->backward_shards(dlogits_->data(), batch, to);
    }
    lap(times_.backward);
    TraceScope span(trace_, Trace::kStep, "comm", "fixed-point all-reduce");
    const ExactGradientSum::Result r = exact_->finish(backend_->comm(), model_->grads());
    lap(times_.comm);
    // Every rank knows it alike, without looking at the gradients.
    health.grads_finite = r != ExactGradientSum::Result::NonFinite;
    if (r != ExactGradientSum::Result::Redo) return;
    backend_->take_sums();  // the attempt that outgrew its exponents
    model_->set_buffers(before);
  }
}

void Replica::scale_dlogits(int batch) {
  if (scaler_) backend_->device().scale(dlogits_->data(), size_t(batch) * size_t(classes_), scaler_->scale());
}

void Replica::eval_batch(const data::Batch& b) {
  const auto [x, y] = backend_->stage(b);
  // Under --deterministic in micro-shards on the lanes, as training's: each
  // sample's logits are then one thread's at any world size.
  const float* logits = model_->forward(x, b.size, nn::Mode::Eval, exact_ ? shard_ : 0);
  backend_->count_correct(logits, y, b.size, classes_);
  backend_->batch_done();
  sums_.eval_samples += b.size;
}

Sums Replica::take_sums() {
  sums_ += backend_->take_sums();
  sums_.grad_norm += optimizer_->take_norm_sum();  // after the backend's wait above
  return std::exchange(sums_, Sums{});
}

}  // namespace ddp::train
