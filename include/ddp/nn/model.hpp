// ddp::nn::Model: a Graph (nn/graph.hpp) run on a Device (nn/device.hpp):
// its flat regions of parameters, gradients and buffers in the device's
// memory (Note [flat layout], Note [buffers] in graph.hpp), one Kernel per op,
// and the forward and backward that call them in order. The same code for
// every device; only the kernels differ.
//
// Note [claimed runs]: a device may run several consecutive ops as one
// kernel (the GPU's BatchNorm with the ReLU or residual add after it: one
// pass over memory instead of two or three). Device::kernel(g, i) returns a
// kernel whose ops() says how many ops from i it runs; the executor then
// makes no kernel for the others, calls it once forward (OpArgs: the run's
// outside inputs, run_inputs(), as x; its last value as y; the parameters,
// buffers and counter of all its ops, in op order) and once backward (dx:
// the outside inputs' gradients), and reports the run's gradients ready
// after it. Only a run whose inner values nobody else reads may be claimed
// (claimable_run), so nothing else needs them: the executor keeps no array
// for them, and the kernel keeps them as it likes (in 16 bits: Note [16-bit
// handoff], src/nn/cuda/conv_bn.cu). A convolution or linear layer may only
// head a run, whose kernel then computes in the precision itself (Note
// [mixed precision]: Model rounds only around an op that runs alone).
// One thing a run's backward must allow: the output's gradient array may be
// the one an outside input's gradient is written to (Note [gradient slots]
// in graph.cpp shares an array between gradients whose ops do not overlap,
// and inside a run they no longer interleave), so it reads each element of
// dy before it writes that element of any dx. The CPU device never claims:
// its path is op by op.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/core/trace.hpp"  // Trace: --trace's per-op spans
#include "ddp/nn/device.hpp"
#include "ddp/nn/graph.hpp"
#include "ddp/nn/precision.hpp"

namespace ddp::nn {

// A model's state on the host: what checkpoints and output files hold, and
// what start-up and resume set.
struct ModelState {
  std::vector<float> params;    // Graph::num_params, flat order
  std::vector<float> buffers;   // Graph::num_buffers
  std::vector<int64_t> counters;  // one per Graph::counters
};

// A fresh state: parameters as their specs say (d2l's N(0, 0.01), zeros,
// ones, or PyTorch's U(-bound, bound)), each tensor from its own stream of
// the seed keyed by its name, so adding an op leaves the other tensors'
// values unchanged; buffers as their specs say; counters zero.
ModelState init_state(const Graph& g, uint64_t seed);

class Model {
 public:
  // stats: what synchronised ops (SyncBatchNorm) reduce their statistics
  // with; nullptr: each rank normalises over its own batch.
  Model(Graph graph, Device& device, StatsReducer* stats = nullptr);
  virtual ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const Graph& graph() const { return graph_; }
  const std::string& name() const { return graph_.model; }
  Device& device() { return device_; }
  Shape output_shape() const { return graph_.output_shape(); }
  size_t num_params() const { return graph_.num_params; }
  const std::vector<TensorInfo>& param_info() const { return graph_.params; }

  // Device memory.
  float* params() { return params_->data(); }
  float* grads() { return grads_->data(); }
  float* buffers() { return buffers_ ? buffers_->data() : nullptr; }
  // Host (Note [buffers]).
  std::vector<int64_t>& counters() { return counters_; }

  // Host copies (both return when the copy is done).
  void set_state(const ModelState& s);
  void get_state(ModelState& s);
  void set_buffers(const ModelState& s);  // buffers and counters only
  void get_buffers(ModelState& s);

  void zero_grads();

  // Note [mixed precision] (precision.hpp): what convolutions and linear
  // layers compute in from the next forward on; fp32 until set.
  void set_precision(Precision p);
  Precision precision() const { return precision_; }

  // Logits of a batch (device memory: batch * output_shape().numel() floats,
  // owned by the model, valid until the next forward). x is read again by
  // backward: the caller keeps it until then. Eval mode uses BatchNorm's
  // running statistics and updates nothing.
  const float* forward(const float* x, int batch, Mode mode = Mode::Train);

  // Backward from d(loss)/d(logits) of the last (training) forward. After
  // each op's backward, on_ready(n) says the first n elements of grads() are
  // final (Note [flat layout]); n never decreases within one backward. On a
  // device that queues work, "final" means issued before anything issued
  // after the call.
  void backward(const float* dlogits, int batch, const std::function<void(size_t)>& on_ready = {});

  // Each op's forward and backward as spans of the trace while it records
  // (nullptr: none). On a device that queues work they cover the launch.
  void set_trace(Trace* trace) { trace_ = trace; }

 protected:
  // Op i's forward and backward, as forward and backward call them: here
  // its kernel on the whole batch (backward with its parameter gradients
  // rounded where Model rounds around the op). The deterministic mode's
  // executor (deterministic/sharded_model.hpp) runs them in micro-shards.
  virtual void op_forward(size_t i, const OpArgs& a);
  virtual void op_backward(size_t i, const float* dy, const std::vector<float*>& dx, int batch);
  // Note [mixed precision]: whether Model rounds around op i, which computes
  // in precision_ (not fp32) on fp32 kernels (not on kernels of its own:
  // Kernel::set_precision), and its parameters' span in flat order.
  bool half_op(size_t i) const { return is_half(precision_) && half_op_[i] && !native_[i]; }
  std::pair<size_t, size_t> param_span(size_t i) const;  // offset, count: its parameters' slots
  Kernel& kernel(size_t i) { return *kernels_[i]; }
  const OpArgs& args(size_t i) const { return args_[i]; }
  // The batch of the last training forward; -1: none.
  int last_batch() const { return last_batch_; }
  // Note [claimed runs]: the ops op i's kernel runs (0: op i is inside
  // another op's run).
  size_t run_length(size_t i) const { return run_[i]; }

 private:
  float* value(int v);  // an op's output (v >= 1)
  std::string run_label(size_t i) const;  // "bn1+relu1 (BatchNorm2d+ReLU)", for the trace
  void reserve(int batch);
  bool any_half_op() const;
  // Op i's backward with its parameter gradients rounded (half_dp_ in
  // between) before they are added to grads().
  void rounded_backward(size_t i, const float* dy, const std::vector<float*>& dx);
  Graph graph_;
  Device& device_;
  std::vector<std::unique_ptr<Kernel>> kernels_;  // per run, at its first op (Note [claimed runs])
  std::vector<OpArgs> args_;  // per run: the pointers that do not change between calls
  // Per op: the ops of the run it heads (0: it is inside one), and the run's
  // first op; per run: the values it reads (run_inputs).
  std::vector<size_t> run_, run_first_;
  std::vector<std::vector<int>> run_in_;
  std::unique_ptr<Array> params_, grads_, buffers_;
  std::vector<int64_t> counters_;
  // acts_[v]: value v (v >= 1); dacts_[v]: d(loss)/d(value v), in the
  // arrays of grad_slots_ (Note [gradient slots] in graph.cpp); scratch_: an
  // input gradient that must be added to one already written (a value read
  // by several ops). Sized for the largest batch seen: steps after the first
  // allocate nothing.
  std::vector<std::unique_ptr<Array>> acts_, grad_slots_;
  std::vector<float*> dacts_;
  std::unique_ptr<Array> scratch_;
  // Note [mixed precision]: the half ops' weights rounded (at each forward),
  // per half op its input rounded, d(output) rounded, and one op's parameter
  // gradients before they are rounded (zero between uses).
  Precision precision_ = Precision::F32;
  std::vector<bool> half_op_;  // per op: a Conv2d, ConvReluPool or Linear
  std::vector<bool> native_;   // per op: its kernel computes in precision_ itself
  std::unique_ptr<Array> half_params_, half_dy_, half_dp_;
  std::vector<std::unique_ptr<Array>> half_in_;
  const float* input_ = nullptr;  // x of the last forward
  int capacity_ = 0;              // batch the arrays hold
  int last_batch_ = -1;           // batch of the last training forward; -1: none
  Trace* trace_ = nullptr;
};

// Mean softmax cross-entropy over the batch (host memory); writes
// d(mean loss)/d(logits) when dlogits is not nullptr, the mean over
// grad_batch samples where it is > 0 (the CPU's kernel, nn/cpu/loss.cpp).
float softmax_cross_entropy(const float* logits, const int32_t* labels, int batch, int classes, float* dlogits,
                            int grad_batch = 0);
// Rows whose arg-max (the first maximum, as torch.argmax) equals the label.
int64_t count_correct(const float* logits, const int32_t* labels, int batch, int classes);

}  // namespace ddp::nn
