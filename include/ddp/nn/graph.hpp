// ddp::nn::Graph: a model described once, as data, for every device.
//
// A model is a list of ops in topological order over numbered values: value 0
// is the model's input, op i writes value i + 1, and an op may read any
// earlier value (a residual block's input feeds its first convolution, its
// projection and its add). Ops carry PyTorch's module paths as names
// ("conv1", "resnet_block2.0.conv3", "0"), so tensor names are state-dict
// names ("resnet_block2.0.conv3.weight", "1.running_mean"). Each device
// supplies kernels for the op kinds (nn/device.hpp); the executor that runs a
// graph on a device is written once (nn/model.hpp).
//
// Note [flat layout]: parameters live in one flat buffer and their gradients
// in another, laid out in BACKWARD order: the last op's tensors first, the
// first op's last (within an op, weight then bias). Backward visits ops last
// to first, and a parameter belongs to one op, so after each op's backward
// the gradients that are final form a growing PREFIX of the gradient buffer
// (ready_after). The reducer relies on this: a bucket is a contiguous slice,
// complete as soon as the ready prefix covers it. This holds for any static
// graph whose parameters are laid out in reverse topological order.
//
// Each tensor starts on a multiple of kParamAlignment floats (256 bytes),
// where cudaMalloc would start it, as each of PyTorch's tensors does:
// cuDNN's graph engines take only 16-byte aligned operands (Note [graph
// engines]), and vector loads want it. Packed densely, ResNet-18's fc.bias
// (10 floats) would leave every convolution weight after it 8 bytes off.
// A tensor's SLOT runs from its start to the next one's (the last: to its
// end), so the gaps are zeros at the ends of slots, and stay zeros (nothing
// writes them; zero gradients all-reduce, decay and step to zero): the
// buckets, the optimizer and the exact sums partition the buffer by slots
// (param_slots) with nothing to skip, and a gap is final, for ready_after,
// with the tensor before it.
//
// Note [buffers]: state that is not trained (BatchNorm's running mean and
// variance) lives in a third flat region of floats, and its int64 counters
// (num_batches_tracked) in a small host array. Buffers have no gradients,
// are never all-reduced, decayed or given momentum; rank 0's are broadcast at
// the start, before each evaluation and before each checkpoint (train/), and
// they are saved and exported under their PyTorch names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::nn {

// Per-sample activation shape (channels, height, width); a vector is (n, 1, 1).
struct Shape {
  int c = 1, h = 1, w = 1;
  int64_t numel() const { return int64_t(c) * h * w; }
  bool operator==(const Shape& o) const { return c == o.c && h == o.h && w == o.w; }
  bool operator!=(const Shape& o) const { return !(*this == o); }
};
std::string to_string(const Shape& s);  // "CxHxW"

// How a tensor starts: Normal001 is d2l's N(0, 0.01); Uniform is U(-bound,
// bound), PyTorch's default for convolutions and linear layers (bound =
// 1/sqrt(fan_in) for weights and biases alike).
enum class Init { Normal001, Zero, One, Uniform };

struct TensorSpec {
  std::string name;            // within the op: "weight", "running_mean"
  std::vector<int64_t> shape;  // PyTorch's shape
  Init init = Init::Zero;
  double bound = 0;            // Init::Uniform
  int64_t numel() const;
};

enum class OpKind {
  Conv2d,        // square kernel, stride, zero padding, bias
  ConvReluPool,  // Conv2d -> ReLU -> AvgPool2d(2), one op (LeNet's blocks); a Conv2d's tensors
  BatchNorm2d,   // torch.nn.BatchNorm2d: affine, running statistics
  ReLU,
  Add,           // sum of two values of one shape, optionally followed by ReLU
  AvgPool2d,     // 2x2, stride 2, floor
  GlobalAvgPool, // AdaptiveAvgPool2d(1): (c, h, w) -> (c, 1, 1)
  Flatten,       // (c, h, w) -> (c*h*w, 1, 1), NCHW order
  Linear,        // y = x W^T + b, W [out, in]
};
const char* to_string(OpKind k);

struct Op {
  OpKind kind = OpKind::ReLU;
  std::string name;         // module path; tensors are name + "." + tensor
  std::vector<int> inputs;  // value ids
  Shape in, out;            // in: shape of inputs[0] (all inputs of an Add share it)
  int out_c = 0;            // convolutions: output channels; Linear: output features
  int k = 0, stride = 1, pad = 0;
  bool relu = false;        // Add: ReLU after the sum
  double eps = 1e-5, momentum = 0.1;  // BatchNorm2d (torch's defaults)
  std::vector<TensorSpec> params;     // weight then bias
  std::vector<TensorSpec> buffers;    // float buffers (Note [buffers])
  bool counter = false;               // has an int64 num_batches_tracked
};

// Note [flat layout]: each parameter starts on this many floats (256 bytes).
constexpr size_t kParamAlignment = 64;

// A tensor's place in its flat region.
struct TensorInfo {
  std::string name;  // full: "resnet_block1.0.bn1.running_var"
  std::vector<int64_t> shape;
  size_t offset = 0, numel = 0;  // elements
  Init init = Init::Zero;
  double bound = 0;
};

struct Graph {
  std::string model;
  Shape input;
  std::vector<Op> ops;
  std::vector<Shape> values;                     // values[0] = input, values[i + 1] = ops[i].out
  std::vector<int> last_reader;                  // per value: the last op that reads it, -1: none
  int output = 0;                                // the value that holds the logits
  // Note [gradient slots]: per value, the array its gradient lives in during
  // backward (-1: none, the input and the logits); grad_slots arrays in all.
  std::vector<int> grad_slot;
  int grad_slots = 0;

  // Note [flat layout]
  std::vector<TensorInfo> params;                // in flat order
  std::vector<std::vector<size_t>> op_params;    // per op: indices into params, spec order
  std::vector<size_t> ready_after;               // per op: gradient prefix final after its backward
  size_t num_params = 0;                         // the flat buffers' length: the slots, gaps and all
  size_t parameter_count = 0;                    // the tensors' elements alone (PyTorch's count)
  // Note [buffers]
  std::vector<TensorInfo> buffers;               // in flat order (forward order)
  std::vector<std::vector<size_t>> op_buffers;   // per op: indices into buffers
  size_t num_buffers = 0;
  std::vector<std::string> counters;             // "1.num_batches_tracked", forward order
  std::vector<int> op_counter;                   // per op: index into counters, or -1

  Shape output_shape() const { return values[size_t(output)]; }
};

// The first element at or after n where a tensor may start (Note [flat
// layout]).
inline size_t param_start(size_t n) { return (n + kParamAlignment - 1) / kParamAlignment * kParamAlignment; }

// Where parameter k of params (in flat order) has its slot end: where the
// next one starts, or, for the last, where it ends (a Graph's num_params).
size_t param_slot_end(const std::vector<TensorInfo>& params, size_t k);

// Per parameter, in flat order, its slot's elements: they partition
// 0 .. num_params.
std::vector<size_t> param_slots(const Graph& g);

// Whether some op of g is a BatchNorm2d.
bool has_batch_norm(const Graph& g);

// Note [claimed runs] (nn/model.hpp): whether ops first .. first + count - 1
// may run as one kernel: each value they make but the last is read by the
// next op of the run and by nothing else (so nobody else sees it), and none
// is the logits.
bool claimable_run(const Graph& g, size_t first, size_t count);
// The values such a run reads from outside it, in order: the first op's
// inputs, then each later op's inputs but the value the run made for it.
std::vector<int> run_inputs(const Graph& g, size_t first, size_t count);

// Builds a graph op by op; each call checks its op (errors name the model and
// op) and returns the value it writes.
class GraphBuilder {
 public:
  // pytorch_init: weights and biases as PyTorch initialises them (Uniform),
  // else d2l's N(0, 0.01) weights and zero biases.
  GraphBuilder(std::string model, Shape input, bool pytorch_init);
  int input() const { return 0; }
  Shape shape(int value) const;

  int conv(const std::string& name, int x, int out_c, int k, int stride = 1, int pad = 0);
  int conv_relu_pool(const std::string& name, int x, int out_c, int k);
  int batch_norm(const std::string& name, int x);
  int relu(const std::string& name, int x);
  int add(const std::string& name, int a, int b, bool relu);
  int avg_pool2(const std::string& name, int x);
  int global_avg_pool(const std::string& name, int x);
  int flatten(const std::string& name, int x);
  int linear(const std::string& name, int x, int out);

  // The graph with `output` as the logits: lays the tensors out (Note [flat
  // layout], Note [buffers]).
  Graph finish(int output);

 private:
  int push(Op op);
  // An op of this kind reading `inputs`, shaped like its first input until
  // the caller says otherwise.
  Op op_on(OpKind kind, const std::string& name, std::vector<int> inputs) const;
  Op conv_op(const std::string& name, int x, int out_c, int k, int stride, int pad) const;
  Graph g_;
  bool pytorch_init_;
};

// A known model for this input and number of classes: "lenet" (d2l's
// variant), "mlp" (784-256-10), "resnet18" (d2l's resnet18 for 28x28 inputs,
// with the state-dict names of its PyTorch definition). Throws ddp::Error
// naming an unknown model and the known ones.
Graph model_graph(const std::string& name, Shape input, int classes);
std::vector<std::string> known_models();

}  // namespace ddp::nn
