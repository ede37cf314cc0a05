// ddp::optim::Sgd: PyTorch's torch.optim.SGD over the flat parameter buffer,
// one pass per step (Note [flat layout] in nn/model.hpp).
#pragma once

#include <cstddef>
#include <vector>

namespace ddp::optim {

struct SgdOptions {
  double lr = 0.1;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

class Sgd {
 public:
  Sgd(size_t numel, SgdOptions opt);
  // p -= lr * update(g), with PyTorch's order: weight decay, momentum
  // (the first step's buffer is g itself), nesterov.
  void step(float* params, const float* grads);
  void set_lr(double lr) { opt_.lr = lr; }
  const SgdOptions& options() const { return opt_; }
  // Momentum buffer (empty without momentum), for checkpoints.
  std::vector<float>& momentum_buffer() { return buf_; }
  bool has_momentum_state() const { return started_; }
  void set_started(bool s) { started_ = s; }

 private:
  size_t n_;
  SgdOptions opt_;
  std::vector<float> buf_;
  bool started_ = false;
};

}  // namespace ddp::optim
