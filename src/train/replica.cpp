// Replica (replica.hpp): the step, the same on every device.
#include "ddp/train/replica.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <optional>
#include <utility>

#include "ddp/core/abandon.hpp"  // abandon: buffers an in-flight collective may write
#include "ddp/core/error.hpp"
#include "device_loss_scale.hpp"  // DeviceLossScale: Note [loss scale on the device]
#include "replica_parts.hpp"        // Stats, Exact

namespace ddp::train {

using Clock = std::chrono::steady_clock;

Replica::Replica(const Config& cfg, const optim::Options& opt, std::unique_ptr<Backend> backend, nn::Graph graph)
    : backend_(std::move(backend)), accumulate_(cfg.accumulate) {
  if (cfg.sync_bn) stats_ = std::make_unique<Stats>(*backend_);
  model_ = cfg.deterministic_shards > 0 ? make_exact(cfg, std::move(graph))
                                        : std::make_unique<nn::Model>(std::move(graph), backend_->device(),
                                                                      stats_.get());
  nn::Device& dev = backend_->device();
  const nn::Precision precision = nn::parse_precision(cfg.precision);
  model_->set_precision(precision);
  if (precision == nn::Precision::F16) {
    optim::ScalerOptions so;
    so.init_scale = cfg.init_scale;
    so.growth_interval = cfg.growth_interval;
    scaler_ = std::make_unique<optim::GradScaler>(so);
  }
  const nn::Graph& g = model_->graph();
  const comm::Wire wire = cfg.grad_compression == "fp16"   ? comm::Wire::F16
                          : cfg.grad_compression == "bf16" ? comm::Wire::BF16
                                                           : comm::Wire::F32;
  reducer_ = std::make_unique<Reducer>(backend_->comm(), model_->grads(), nn::param_slots(g), cfg.bucket_cap_mb,
                                       cfg.overlap, wire);
  std::vector<std::string> names;
  for (const auto& p : g.params) names.push_back(p.name);
  reducer_->set_param_names(std::move(names));
  optimizer_ = std::make_unique<optim::Optimizer>(opt, g.params, dev, backend_->optim_kernels());
  if (scaler_ && backend_->loss_scale_on_device() && !exact_)
    device_scale_ = std::make_unique<DeviceLossScale>(*backend_, *scaler_, *optimizer_);
  // Note [step graphs]: asked for, and what the step holds allows it.
  if (backend_->step_graphs_asked()) {
    const std::string why =
        exact_                       ? "--deterministic's steps are not captured"
        : scaler_ && !device_scale_ ? "--precision fp16's loss scaler looks at the gradients on the host "
                                      "(loss-scale-on-device left out)"
                                    : backend_->step_graphs_refusal(stats_ != nullptr);
    step_graphs_ = why.empty();
    if (!step_graphs_ && backend_->comm().rank() == 0)
      std::fprintf(stderr, "ddp_train: note: --gpu-kernels next (step-graphs): each step runs as issued: %s\n",
                   why.c_str());
  }
  classes_ = static_cast<int>(g.output_shape().numel());
  dlogits_ = dev.alloc(size_t(cfg.batch_size) * size_t(classes_));
}

namespace {

// Key's second graph: its optimizer (StepKey).
StepKey optimizer_part(StepKey key) {
  key.part = 1;
  return key;
}

// What the watchdog calls a replayed step's collectives.
std::string replay_label(int64_t launches) {
  return detail::concat("the all-reduces of a replayed training step (a CUDA graph; ", launches,
                        " gradient buckets)");
}

}  // namespace

Replica::~Replica() {
  // While an error unwinds, buckets may still be all-reduced in place in the
  // model's gradients: by the communication thread until the backend's
  // communicator (destroyed after the model) stops it, and by MPI after that
  // (Note [abandoned requests], comm/mpi_communicator.cpp). The model's
  // memory stays for the little that is left of the job.
  if (std::uncaught_exceptions() > 0) abandon(std::move(model_));
}

void Replica::push(const TrainState& s) {
  // A step's outcome still on its way belongs to the state being replaced
  // (Note [loss scale on the device]): taken first, then overwritten.
  if (device_scale_) device_scale_->catch_up();
  model_->set_state(s.model);
  optimizer_->set_state(s.optimizer);
  if (exact_ && !s.grad_exponents.empty()) exact_->sum->set_exponents(s.grad_exponents);
  if (scaler_ && s.loss_scale > 0) scaler_->set_state(s.loss_scale, s.scaler_growth_tracker);
  if (device_scale_) device_scale_->push();
}

void Replica::pull(TrainState& s) {
  if (device_scale_) device_scale_->catch_up();
  backend_->sync("reading the model back");
  model_->get_state(s.model);
  optimizer_->get_state(s.optimizer);
  s.grad_exponents = exact_ ? exact_->sum->exponents() : std::vector<int64_t>{};
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
  // Note [step graphs]: as issued, captured, or replayed.
  const StepKey key{x, y, b.size};
  StepRun run = StepRun::kIssue;
  uint64_t generation = 0;
  const bool graphed = graphs_for_step();  // never under --deterministic
  if (graphed) {
    generation = backend_->memory_generation();
    bool drop = false;
    run = plan_.decide(key, generation, &drop);
    if (drop) {
      // Note [step graphs]: the ranks drop their graphs together, at an
      // epoch's start.
      DDP_CHECK(backend_->comm().size() == 1, "rank ", backend_->comm().rank(),
                ": device memory was freed or moved in the middle of an epoch while the training step was "
                "replayed as a CUDA graph (--gpu-kernels next: step-graphs), where the ranks' steps could fall out "
                "of step; --gpu-kernels next,-step-graphs runs each step as issued");
      drop_graphs(key);
    }
  }
  if (exact_) {
    exact_passes(x, y, b.size, health, lap);
    sums_.allreduces += 2;
    sums_.allreduce_bytes += double(exact_->sum->bytes_per_step());
  } else if (run == StepRun::kCapture) {
    capture_step(key, x, y, b.size, sample, lr, health, lap);
  } else if (run == StepRun::kReplay) {
    replay_step(key, lr, health);
    lap(times_.forward);  // the replays' launches, and the host's turn between them
  } else {
    reduced_passes(x, y, b.size, sample, health, lap);
  }
  {
    TraceScope span(trace_, Trace::kStep, "optimizer", "optimizer");
    if (run == StepRun::kIssue) {  // else the captured step holds it
      if (device_scale_)
        device_scale_->step(lr, model_->params(), model_->grads(), model_->num_params(), health);
      else
        checked_step(lr, health);
    }
    backend_->batch_done();
  }
  lap(times_.optimizer);
  if (graphed) plan_.done(key, run, generation, backend_->memory_generation());
  sums_.samples += b.size;
  return health;
}

void Replica::begin_epoch() {
  if (!step_graphs_) return;
  backend_->restart_slots();
  // Note [step graphs]: every rank keeps its graphs, or none does.
  double stale = plan_.stale(backend_->memory_generation()) ? 1 : 0;
  backend_->comm().allreduce_doubles(&stale, 1, /*max=*/true, "step graphs: whether a rank's are stale");
  if (stale == 0) return;
  while (!captured_.empty()) drop_graphs(StepKey(captured_.begin()->first));  // a copy: erased there
  plan_ = StepGraphPlan();
}

void Replica::drop_graphs(const StepKey& key) {
  captured_.erase(key);
  backend_->drop_graph(key);
  backend_->drop_graph(optimizer_part(key));
}

bool Replica::graphs_for_step() {
  if (!step_graphs_) return false;
  if (trace_ && trace_->active()) {
    if (!trace_said_ && backend_->comm().rank() == 0)
      std::fprintf(stderr, "ddp_train: note: --gpu-kernels next (step-graphs): the steps in --trace's window run "
                           "as issued, their spans being the host's launches\n");
    trace_said_ = true;
    return false;
  }
  return true;
}

Replica::HostCounts Replica::host_counts() {
  return {model_->counters(), reducer_->launches(), reducer_->launched_bytes()};
}

void Replica::capture(const StepKey& key, const std::function<void()>& issue) {
  backend_->begin_capture();
  try {
    issue();
  } catch (const std::exception& e) {
    backend_->end_capture(key, false);
    DDP_FAIL("capturing the training step as a CUDA graph (--gpu-kernels next: step-graphs) failed: ", e.what(),
             "; --gpu-kernels next,-step-graphs runs each step as issued");
  }
  backend_->end_capture(key, true);
}

void Replica::before_optimizer(double lr, StepHealth& health) {
  if (device_scale_) device_scale_->before_step(health);  // may take the last step back
  optimizer_->stage_scalars(lr);
}

void Replica::capture_step(const StepKey& key, const float* x, const int32_t* y, int batch, size_t sample, double lr,
                           StepHealth& health, const std::function<void(double&)>& lap) {
  const HostCounts before = host_counts();
  const uint64_t generation = backend_->memory_generation();
  const auto unmoved = [&] {
    DDP_CHECK(backend_->memory_generation() == generation,
              "device memory was freed or moved while the training step was captured as a CUDA graph "
              "(--gpu-kernels next: step-graphs); --gpu-kernels next,-step-graphs runs each step as issued");
  };
  capture(key, [&] { reduced_passes(x, y, batch, sample, health, lap); });
  unmoved();
  HostCounts d = host_counts();
  for (size_t i = 0; i < d.counters.size(); ++i) d.counters[i] -= before.counters[i];
  d.launches -= before.launches;
  d.bytes -= before.bytes;
  // Captured, not run: the passes run now, then the host's turn, then the
  // optimizer's part, captured and run the same way.
  backend_->replay(key, replay_label(d.launches), comm::format_bytes(size_t(d.bytes)));
  captured_[key] = std::move(d);
  before_optimizer(lr, health);
  const StepKey optimizer = optimizer_part(key);
  capture(optimizer, [&] {
    if (device_scale_)
      device_scale_->issue(lr, model_->params(), model_->grads(), model_->num_params());
    else
      checked_step(lr, health);
  });
  unmoved();
  backend_->replay(optimizer, "", "");
  if (!capture_said_ && backend_->comm().rank() == 0)
    std::fprintf(stderr, "ddp_train: note: --gpu-kernels next (step-graphs): the step of %d samples captured as a "
                         "CUDA graph once its first steps ran as issued, and replayed from here on (a step of another "
                         "shape, or after memory moved, is captured again)\n",
                 batch);
  capture_said_ = true;
}

void Replica::replay_step(const StepKey& key, double lr, StepHealth& health) {
  const HostCounts& d = captured_.at(key);
  backend_->replay(key, replay_label(d.launches), comm::format_bytes(size_t(d.bytes)));
  before_optimizer(lr, health);
  backend_->replay(optimizer_part(key), "", "");
  optimizer_->replayed();
  if (device_scale_) device_scale_->replayed();
  std::vector<int64_t>& counters = model_->counters();
  for (size_t i = 0; i < counters.size(); ++i) counters[i] += d.counters[i];
  reducer_->replayed(d.launches, d.bytes);
  sums_.allreduces += double(d.launches);
  sums_.allreduce_bytes += double(d.bytes);
}

// The optimizer's step where the host looks at the gradients first (where
// it does: replica.hpp, train_step).
void Replica::checked_step(double lr, StepHealth& health) {
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
              backend_->loss(logits, y + size_t(k) * micro, micro, classes_, dlogits_->data(), batch))
        health.add_loss(*loss, accumulate_);
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

void Replica::scale_dlogits(int batch) {
  const size_t n = size_t(batch) * size_t(classes_);
  if (device_scale_)
    device_scale_->scale(dlogits_->data(), n);
  else if (scaler_)
    backend_->device().scale(dlogits_->data(), n, scaler_->scale());
}

StepHealth Replica::settle() { return device_scale_ ? device_scale_->settle() : StepHealth{}; }

void Replica::eval_batch(const data::Batch& b) {
  const auto [x, y] = backend_->stage(b);
  const float* logits = exact_ ? exact_eval_forward(x, b.size) : model_->forward(x, b.size, nn::Mode::Eval);
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
