// Replica (replica.hpp): the step, the same on every device.
#include "ddp/train/replica.hpp"

#include <cmath>
#include <utility>

#include "ddp/core/error.hpp"

namespace ddp::train {

// SyncBatchNorm's sums, over the backend's communicator (host memory,
// blocking, bounded by its timeout).
class Replica::Stats final : public nn::StatsReducer {
 public:
  explicit Stats(Backend& backend) : backend_(backend) {}
  void sum(double* data, size_t n, const std::string& what) override {
    backend_.comm().allreduce_doubles(data, n, /*max=*/false, "sync batch norm: " + what);
  }
  int ranks() const override { return backend_.comm().size(); }
  void sync_device(const std::string& what) override { backend_.sync("sync batch norm: " + what); }

 private:
  Backend& backend_;
};

Replica::Replica(const Config& cfg, std::unique_ptr<Backend> backend, nn::Graph graph)
    : backend_(std::move(backend)) {
  if (cfg.sync_bn) stats_ = std::make_unique<Stats>(*backend_);
  nn::Device& dev = backend_->device();
  model_ = std::make_unique<nn::Model>(std::move(graph), dev, stats_.get());
  const nn::Graph& g = model_->graph();
  std::vector<size_t> numels;
  for (const auto& p : g.params) numels.push_back(p.numel);
  reducer_ = std::make_unique<Reducer>(backend_->comm(), model_->grads(), numels, cfg.bucket_cap_mb, cfg.overlap);
  sgd_ = optim::SgdOptions{cfg.lr, cfg.momentum, 0.0, cfg.weight_decay, cfg.nesterov};
  if (sgd_.momentum != 0) momentum_ = dev.alloc(g.num_params);
  classes_ = static_cast<int>(g.output_shape().numel());
  dlogits_ = dev.alloc(size_t(cfg.batch_size) * size_t(classes_));
}

Replica::~Replica() = default;

void Replica::push(const TrainState& s) {
  model_->set_state(s.model);
  momentum_started_ = momentum_ && !s.momentum.empty();
  if (momentum_started_) {
    DDP_CHECK(s.momentum.size() == model_->num_params(), "momentum of ", s.momentum.size(), " values for ",
              model_->num_params(), " parameters");
    backend_->device().from_host(momentum_->data(), s.momentum.data(), s.momentum.size());
  }
}

void Replica::pull(TrainState& s) {
  backend_->sync("reading the model back");
  model_->get_state(s.model);
  s.momentum.clear();
  if (momentum_started_) {
    s.momentum.resize(model_->num_params());
    backend_->device().to_host(s.momentum.data(), momentum_->data(), s.momentum.size());
  }
}

void Replica::push_buffers(const nn::ModelState& s) { model_->set_buffers(s); }

void Replica::pull_buffers(nn::ModelState& s) {
  backend_->sync("reading the buffers back");
  model_->get_buffers(s);
}

StepHealth Replica::train_step(const data::Batch& b) {
  DDP_CHECK(size_t(b.size) * size_t(classes_) <= dlogits_->size(), "a batch of ", b.size,
            " is larger than the global batch");
  const auto [x, y] = backend_->stage(b);
  model_->zero_grads();
  const float* logits = model_->forward(x, b.size, nn::Mode::Train);
  StepHealth health;
  if (const auto loss = backend_->loss(logits, y, b.size, classes_, dlogits_->data())) {
    health.loss = *loss;
    health.loss_finite = std::isfinite(*loss);
  }
  reducer_->begin_backward();
  model_->backward(dlogits_->data(), b.size, [this](size_t n) { reducer_->grads_ready(n); });
  comm_wait_ += reducer_->finish().wait_sec;
  if (backend_->checks_every_step())
    health.grads_finite = backend_->all_finite(model_->grads(), model_->num_params());
  if (health.grads_finite) {
    backend_->sgd_step(sgd_, !momentum_started_, model_->num_params(), model_->params(), model_->grads(),
                       momentum_ ? momentum_->data() : nullptr);
    if (momentum_) momentum_started_ = true;
  }
  backend_->batch_done();
  return health;
}

StepSums Replica::take_sums() {
  const std::vector<double> h = backend_->take_sums();
  StepSums out;
  out.loss = std::exchange(loss_, 0.0) + h[0];
  out.correct = std::exchange(correct_, 0.0) + h[1];
  eval_correct_ += h[2];
  out.comm_wait = std::exchange(comm_wait_, 0.0);
  return out;
}

void Replica::eval_batch(const data::Batch& b) {
  const auto [x, y] = backend_->stage(b);
  const float* logits = model_->forward(x, b.size, nn::Mode::Eval);
  backend_->count_correct(logits, y, b.size, classes_);
  backend_->batch_done();
}

double Replica::take_correct() {
  const std::vector<double> h = backend_->take_sums();
  loss_ += h[0];
  correct_ += h[1];
  return std::exchange(eval_correct_, 0.0) + h[2];
}

}  // namespace ddp::train
