// ddp::optim::Optimizer: torch.optim.SGD or torch.optim.AdamW over a model's
// flat parameter buffer (Note [flat layout] in nn/graph.hpp), the one owner
// of the optimizer's state: its buffers on the parameters' device, under
// PyTorch's state names, and its step count. Clipping
// (torch.nn.utils.clip_grad_norm_ over every gradient) is part of its step,
// so the factor multiplies the gradient inside the same pass.
//
// Parameter groups: with no_decay_norm_bias, parameters of one dimension
// (biases, BatchNorm's weight and bias) take no weight decay, the common
// recipe (p.ndim <= 1). Elements of one group that sit next to each other in
// the flat buffer are updated by one kernel call.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/nn/device.hpp"          // Device, Array
#include "ddp/nn/graph.hpp"           // TensorInfo
#include "ddp/optim/kernels.hpp"      // Kernels
#include "ddp/optim/update_math.hpp"  // Kind

namespace ddp::optim {

struct Options {
  Kind kind = Kind::Sgd;
  double momentum = 0, dampening = 0;  // SGD
  bool nesterov = false;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // AdamW
  double weight_decay = 0;
  bool no_decay_norm_bias = false;
  double max_grad_norm = 0;  // > 0: clip the global gradient norm to this
};

const char* kind_name(Kind k);  // "sgd", "adamw"
// "adamw (betas 0.9, 0.999, eps 1e-08, weight decay 0.01 except biases and norms)"
std::string describe(const Options& o);

// The state on the host, as checkpoints hold it: the step count and, once a
// step is taken, each buffer by its PyTorch name ("momentum_buffer";
// "exp_avg", "exp_avg_sq"), flat like the parameters.
struct State {
  int64_t step = 0;
  std::vector<std::pair<std::string, std::vector<float>>> buffers;
};

// The buffer names a kind of optimizer keeps (none for SGD without momentum).
std::vector<std::string> buffer_names(const Options& o);

class Optimizer {
 public:
  // params: the model's parameters (flat order, Note [flat layout]);
  // buffers are allocated on dev, kernels run there.
  Optimizer(const Options& o, const std::vector<nn::TensorInfo>& params, nn::Device& dev, Kernels& kernels);

  const Options& options() const { return opt_; }
  int64_t steps() const { return step_; }

  // One step at learning rate lr: p -= update(unscale * g), every element
  // (unscale: the inverse of the loss scale, optim/grad_scaler.hpp).
  void step(double lr, float* p, const float* g, float unscale = 1.0f);
  // Note [loss scale on the device] (train/device_loss_scale.hpp): the same,
  // unscale read from loss_scale where the step runs, and every element left
  // as it was where *skip is nonzero; counted as a step until unstep() says
  // it was skipped.
  void step(double lr, float* p, const float* g, const LossScaleState* loss_scale, const unsigned* skip);
  // The last step was skipped on the device: it is not counted.
  void unstep();
  // Note [step graphs] (train/step_graphs.hpp): the scalars of the next
  // step at lr (its learning rate, step count, bias corrections) written to
  // the kernels' memory, where the next step() at lr reads them instead of
  // taking them as arguments: a step captured in a CUDA graph, and each
  // replay of it, then takes its own. replayed(): a replay of a captured
  // step, counted as step() counts one.
  void stage_scalars(double lr);
  void replayed();
  // The gradient norms (before clipping) summed over the steps since the
  // last call; 0 without clipping.
  double take_norm_sum() { return opt_.max_grad_norm > 0 ? kernels_.take_norm_sum() : 0.0; }

  // Host copies; set_state throws ddp::Error for a state of another shape.
  void get_state(State& s);
  void set_state(const State& s);

 private:
  struct Run {
    size_t begin, end;
    bool decay;
  };
  // A step with a's unscale, loss scale and skip.
  void run(double lr, float* p, const float* g, StepArgs a);
  // The scalars of step t at lr.
  StepScalars scalars(double lr, int64_t t) const;
  Options opt_;
  nn::Device& dev_;
  Kernels& kernels_;
  size_t n_ = 0;
  std::vector<Run> runs_;  // the flat buffer cut where weight decay changes
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<nn::Array>> buffers_;  // as names_
  int64_t step_ = 0;
  // stage_scalars': where, and for which step and learning rate.
  const StepScalars* staged_ = nullptr;
  int64_t staged_step_ = -1;
  double staged_lr_ = 0;
};

}  // namespace ddp::optim
