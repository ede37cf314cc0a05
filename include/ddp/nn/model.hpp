// ddp::nn::Model: a Graph (nn/graph.hpp) run on a Device (nn/device.hpp):
// its flat regions of parameters, gradients and buffers in the device's
// memory (Note [flat layout], Note [buffers] in graph.hpp), one Kernel per op,
// and the forward and backward that call them in order. The same code for
// every device; only the kernels differ.
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

// Note [micro-shards] (device.hpp): what Model::backward_shards hands each
// micro-shard's parameter gradients to.
class ShardGradients {
 public:
  virtual ~ShardGradients() = default;
  // One micro-shard's gradients of params [first, first + count) (adjacent
  // in flat order), g[0] being param first's element 0. Lanes call at once,
  // each with its own lane (Note [lanes]); g is the lane's until it returns.
  virtual void take(int lane, const float* g, size_t first, size_t count) = 0;
  // Note [fixed-point epilogue] (nn/cpu/packed_gemm.hpp): where lane `lane`'s
  // gradients of params [first, first + count) go when they are fixed-point
  // sums in host memory (one Sink a param, into out), for a kernel that
  // converts and adds each micro-shard's gradients itself; false (nothing
  // written) where they are not. Called on the lane, as take is, and in
  // its place: what a kernel adds into the sinks counts as taken.
  virtual bool sinks(int lane, size_t first, size_t count, fixed_point::Sink* out) {
    (void)lane, (void)first, (void)count, (void)out;
    return false;
  }
  // Every micro-shard of params [first, first + count) has been taken, and
  // no lane is running.
  virtual void taken(size_t first, size_t count) = 0;
};

class Model {
 public:
  // stats: what synchronised ops (SyncBatchNorm) reduce their statistics
  // with; nullptr: each rank normalises over its own batch.
  Model(Graph graph, Device& device, StatsReducer* stats = nullptr);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const Graph& graph() const { return graph_; }
  const std::string& name() const { return graph_.model; }
  Device& device() { return device_; }
  Shape input_shape() const { return graph_.input; }
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
  // running statistics and updates nothing. shard > 0: the batch is
  // micro-shards of that many samples, run on the device's lanes as Note
  // [micro-shards] and Note [lanes] (device.hpp) say; in training for
  // backward_shards, and the batch a multiple of shard; in evaluation the
  // last micro-shard may be shorter.
  const float* forward(const float* x, int batch, Mode mode = Mode::Train, int shard = 0);

  // Backward from d(loss)/d(logits) of the last (training) forward. After
  // each op's backward, on_ready(n) says the first n elements of grads() are
  // final (Note [flat layout]); n never decreases within one backward. On a
  // device that queues work, "final" means issued before anything issued
  // after the call.
  void backward(const float* dlogits, int batch, const std::function<void(size_t)>& on_ready = {});

  // Backward of a training forward with micro-shards: op by op, last first;
  // each op's parameter gradients are handed to `to` one micro-shard at a
  // time, on the lanes, and then the op's `taken` is called. Only
  // BatchNorm's pass through grads() (off the lanes), which must be zero
  // before and are zero after.
  void backward_shards(const float* dlogits, int batch, ShardGradients& to);

  // Each op's forward and backward as spans of the trace while it records
  // (nullptr: none). On a device that queues work they cover the launch.
  void set_trace(Trace* trace) { trace_ = trace; }

 private:
  float* value(int v);  // an op's output (v >= 1)
  void run_backward(const float* dlogits, int batch, const std::function<void(size_t)>& on_ready,
                    ShardGradients* to);
  // Op i's arguments for micro-shards k .. k + count - 1 of `shard` samples
  // of a's batch (the last one shorter where the batch ends first), on lane
  // `lane`.
  OpArgs shard_args(size_t i, const OpArgs& a, int64_t k, int shard, int lane, int64_t count = 1) const;
  // Hands op i's parameter gradients in g (laid out from its first
  // parameter's offset) to `to` from lane `lane`, and zeroes them.
  void take_grads(size_t i, float* g, int lane, ShardGradients& to);
  void reserve(int batch);
  // Note [mixed precision]: whether Model rounds around op i, which computes
  // in precision_ (not fp32) on fp32 kernels (not on kernels of its own:
  // Kernel::set_precision), and its parameters' span in flat order.
  bool half_op(size_t i) const { return precision_ != Precision::F32 && half_op_[i] && !native_[i]; }
  bool any_half_op() const;
  std::pair<size_t, size_t> param_span(size_t i) const;  // offset, count
  // Op i's backward with its parameter gradients rounded (half_dp_ in
  // between) before they are added to grads().
  void rounded_backward(size_t i, const float* dy, const std::vector<float*>& dx);
  Graph graph_;
  Device& device_;
  std::vector<std::unique_ptr<Kernel>> kernels_;
  std::vector<OpArgs> args_;  // per op: the pointers that do not change between calls
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
  // Note [lanes]: each lane's parameter gradients of one op (as many floats
  // as the op with the most parameters has), made at the first backward_shards.
  std::vector<std::unique_ptr<Array>> lane_grads_;
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
  int last_shard_ = 0;            // its micro-shard size (0: none)
  Trace* trace_ = nullptr;
};

// Mean softmax cross-entropy over the batch (host memory); writes
// d(mean loss)/d(logits) when dlogits is not nullptr, the mean over
// grad_batch samples where it is > 0 (nn/cpu/ops.hpp).
float softmax_cross_entropy(const float* logits, const int32_t* labels, int batch, int classes, float* dlogits,
                            int grad_batch = 0);
// Rows whose arg-max (the first maximum, as torch.argmax) equals the label.
int64_t count_correct(const float* logits, const int32_t* labels, int batch, int classes);

}  // namespace ddp::nn
