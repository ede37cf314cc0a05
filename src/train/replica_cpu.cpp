// The CPU replica (train/replica.hpp): the model's own buffers are the
// device's, so push and pull have nothing to copy.
#include <cmath>
#include <utility>
#include <vector>

#include "ddp/core/finite.hpp"
#include "ddp/train/replica.hpp"

namespace ddp::train {

namespace {

class CpuReplica final : public Replica {
 public:
  CpuReplica(const Config& cfg, std::unique_ptr<comm::Communicator> comm, std::unique_ptr<nn::Model> model,
             std::unique_ptr<optim::Sgd> sgd)
      : comm_(std::move(comm)) {
    model_ = std::move(model);
    sgd_ = std::move(sgd);
    std::vector<size_t> numels;
    for (const auto& p : model_->param_info()) numels.push_back(p.numel);
    reducer_ = std::make_unique<Reducer>(*comm_, model_->grads(), numels, cfg.bucket_cap_mb, cfg.overlap);
    classes_ = static_cast<int>(model_->output_shape().numel());
  }

  std::string device() const override { return "cpu"; }
  comm::Communicator& comm() override { return *comm_; }
  const Reducer& reducer() const override { return *reducer_; }
  void push() override {}
  void pull() override {}

  StepHealth train_step(const data::Batch& b) override {
    dlogits_.resize(static_cast<size_t>(b.size) * classes_);
    model_->zero_grads();
    const float* logits = model_->forward(b.x.data(), b.size);
    const float loss = nn::softmax_cross_entropy(logits, b.y.data(), b.size, classes_, dlogits_.data());
    sums_.correct += static_cast<double>(nn::count_correct(logits, b.y.data(), b.size, classes_));
    reducer_->begin_backward();
    model_->backward(dlogits_.data(), b.size, [this](size_t n) { reducer_->grads_ready(n); });
    sums_.comm_wait += reducer_->finish().wait_sec;
    StepHealth health;
    health.loss = loss;
    health.loss_finite = std::isfinite(loss);
    health.grads_finite = first_non_finite(model_->grads(), model_->num_params()) == model_->num_params();
    if (!health.grads_finite) return health;  // the parameters stay as they were
    sgd_->step(model_->params(), model_->grads());
    sums_.loss += static_cast<double>(loss) * b.size;
    return health;
  }

  StepSums take_sums() override { return std::exchange(sums_, StepSums{}); }

  void eval_batch(const data::Batch& b) override {
    const float* logits = model_->forward(b.x.data(), b.size);
    correct_ += static_cast<double>(nn::count_correct(logits, b.y.data(), b.size, classes_));
  }
  double take_correct() override { return std::exchange(correct_, 0.0); }

 private:
  std::unique_ptr<comm::Communicator> comm_;
  std::unique_ptr<Reducer> reducer_;
  int classes_ = 0;
  std::vector<float> dlogits_;
  StepSums sums_;
  double correct_ = 0;
};

}  // namespace

std::unique_ptr<Replica> make_cpu_replica(const Config& cfg, std::unique_ptr<comm::Communicator> comm,
                                          std::unique_ptr<nn::Model> model, std::unique_ptr<optim::Sgd> sgd) {
  return std::make_unique<CpuReplica>(cfg, std::move(comm), std::move(model), std::move(sgd));
}

}  // namespace ddp::train
