// The CPU backend (train/replica.hpp): the model's memory is the host's, so a
// batch is used where the loader put it and the sums are plain doubles.
#include <cmath>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"                // DDP_CHECK
#include "ddp/core/fixed_point.hpp"          // round_loss_sum
#include "ddp/deterministic/devices.hpp"     // make_cpu_device: --deterministic's
#include "ddp/deterministic/exact_sum.hpp"   // HostExactGradientSum
#include "ddp/nn/cpu/thread_pool.hpp"        // default_threads
#include "ddp/train/exact_backend.hpp"       // ExactBackend
#include "ddp/train/replica.hpp"

namespace ddp::train {

namespace {

class CpuBackend final : public Backend, public ExactBackend {
 public:
  CpuBackend(std::unique_ptr<comm::Communicator> comm, int threads, bool loss_scale_on_device)
      : comm_(std::move(comm)), threads_(threads > 0 ? threads : nn::default_threads()),
        loss_scale_on_device_(loss_scale_on_device) {}

  std::string device_name() const override { return "cpu"; }
  int threads() const override { return threads_; }
  // Made at its first use, so that it is the mode's where the mode asks first.
  nn::Device& device() override {
    if (!device_) device_ = nn::make_cpu_device(threads_);
    return *device_;
  }
  comm::Communicator& comm() override { return *comm_; }
  void sync(const std::string&) override {}

  std::pair<const float*, const int32_t*> stage(const data::Batch& b) override { return {b.x.data(), b.y.data()}; }
  void batch_done() override {}

  std::optional<double> loss(const float* logits, const int32_t* labels, int batch, int classes,
                             float* dlogits, int grad_batch) override {
    const float loss = nn::softmax_cross_entropy(logits, labels, batch, classes, dlogits, grad_batch);
    const double sum = double(loss) * batch;
    sums_.loss += exact_loss_ ? fixed_point::round_loss_sum(sum) : sum;
    sums_.correct += double(nn::count_correct(logits, labels, batch, classes));
    return loss;
  }
  void count_correct(const float* logits, const int32_t* labels, int batch, int classes) override {
    sums_.eval_correct += double(nn::count_correct(logits, labels, batch, classes));
  }
  Sums take_sums() override { return std::exchange(sums_, Sums{}); }

  void use_shard_device() override {
    DDP_CHECK(!device_, "--deterministic: the CPU device is in use already");
    device_ = deterministic::make_cpu_device(threads_);
  }
  std::unique_ptr<ExactGradientSum> make_exact_sum(std::vector<size_t> param_numels, int shards) override {
    return std::make_unique<HostExactGradientSum>(std::move(param_numels), shards);
  }
  void set_exact_loss() override { exact_loss_ = true; }

  bool checks_every_step() const override { return true; }
  bool all_finite(const float* p, size_t n) override { return *kernels_->non_finite(p, n) == 0; }
  optim::Kernels& optim_kernels() override { return *kernels_; }
  bool loss_scale_on_device() const override { return loss_scale_on_device_; }
  void flag_to_host(const unsigned* flag) override { flag_ = *flag; }
  bool flag_on_host(const std::string&) override { return flag_ != 0; }

 private:
  std::unique_ptr<comm::Communicator> comm_;
  int threads_;
  std::unique_ptr<nn::Device> device_;
  std::unique_ptr<optim::Kernels> kernels_ = optim::make_cpu_kernels();
  Sums sums_;  // loss, correct, eval_correct
  bool exact_loss_ = false;
  bool loss_scale_on_device_;
  unsigned flag_ = 0;  // flag_to_host's
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(std::unique_ptr<comm::Communicator> comm, int threads,
                                          bool loss_scale_on_device) {
  return std::make_unique<CpuBackend>(std::move(comm), threads, loss_scale_on_device);
}

}  // namespace ddp::train
