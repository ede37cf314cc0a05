// GraphBuilder: each op's shape rule and tensors, and the flat layout of a
// finished graph (Note [flat layout], Note [buffers] in graph.hpp).
#include "ddp/nn/graph.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <utility>

#include "ddp/core/error.hpp"

namespace ddp::nn {

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string to_string(const Shape& s) {
  std::ostringstream os;
  os << s.c << "x" << s.h << "x" << s.w;
  return os.str();
}

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::Conv2d: return "Conv2d";
    case OpKind::ConvReluPool: return "ConvReluPool";
    case OpKind::BatchNorm2d: return "BatchNorm2d";
    case OpKind::ReLU: return "ReLU";
    case OpKind::Add: return "Add";
    case OpKind::AvgPool2d: return "AvgPool2d";
    case OpKind::GlobalAvgPool: return "GlobalAvgPool";
    case OpKind::Flatten: return "Flatten";
    case OpKind::Linear: return "Linear";
  }
  return "?";
}

// Note [gradient slots]: backward runs the ops in reverse; the gradient of
// value v is written by the backward of its last reader (the first to run)
// and read for the last time by the backward of its producer, op v - 1. Two
// values whose spans [v - 1, last reader] do not meet can share an array, so
// backward holds a few arrays instead of one per value (ResNet-18: 3 arrays
// for its 56 gradients, 150k floats an image instead of 1.35M; 1.2 GB less
// at batch 256). Every kernel's backward overwrites its input gradient (Note
// [gradient accumulation] in device.hpp), so a slot needs no clearing
// between users. Greedy, in backward order: a free slot at least as large,
// the smallest such; else the largest free one, grown.
namespace {

void assign_grad_slots(Graph& g) {
  const size_t n = g.values.size();
  const std::vector<int>& last_reader = g.last_reader;
  std::vector<int> order;  // values with a gradient, by when backward first writes it
  for (size_t v = 1; v < n; ++v)
    if (int(v) != g.output && last_reader[v] >= 0) order.push_back(int(v));
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return last_reader[size_t(a)] > last_reader[size_t(b)]; });
  g.grad_slot.assign(n, -1);
  std::vector<int64_t> slot_size;
  std::vector<int> slot_free_below;  // a slot is free for a value first written at op i when this > i
  for (int v : order) {
    const int born = last_reader[size_t(v)];
    const int64_t need = g.values[size_t(v)].numel();
    int best = -1;
    for (size_t s = 0; s < slot_size.size(); ++s) {
      if (slot_free_below[s] <= born) continue;
      if (best < 0) { best = int(s); continue; }
      const int64_t have = slot_size[s], cur = slot_size[size_t(best)];
      const bool fits = have >= need, cur_fits = cur >= need;
      if ((fits && (!cur_fits || have < cur)) || (!fits && !cur_fits && have > cur)) best = int(s);
    }
    if (best < 0) {
      best = int(slot_size.size());
      slot_size.push_back(0);
      slot_free_below.push_back(0);
    }
    slot_size[size_t(best)] = std::max(slot_size[size_t(best)], need);
    slot_free_below[size_t(best)] = v - 1;  // its producer's backward reads it last
    g.grad_slot[size_t(v)] = best;
  }
  g.grad_slots = int(slot_size.size());
}

}  // namespace

GraphBuilder::GraphBuilder(std::string model, Shape input, bool pytorch_init) : pytorch_init_(pytorch_init) {
  g_.model = std::move(model);
  DDP_CHECK(input.c > 0 && input.h > 0 && input.w > 0, "model ", g_.model, ": bad input shape ", to_string(input));
  g_.input = input;
  g_.values.push_back(input);
}

Shape GraphBuilder::shape(int value) const {
  DDP_CHECK(value >= 0 && size_t(value) < g_.values.size(), "model ", g_.model, ": no value ", value);
  return g_.values[size_t(value)];
}

int GraphBuilder::push(Op op) {
  for (int v : op.inputs) shape(v);  // checks the ids
  for (const Op& o : g_.ops) DDP_CHECK(o.name != op.name, "model ", g_.model, ": two ops named ", op.name);
  g_.values.push_back(op.out);
  g_.ops.push_back(std::move(op));
  return int(g_.values.size()) - 1;
}

Op GraphBuilder::op_on(OpKind kind, const std::string& name, std::vector<int> inputs) const {
  Op op;
  op.kind = kind;
  op.name = name;
  op.in = op.out = shape(inputs.at(0));
  op.inputs = std::move(inputs);
  return op;
}

Op GraphBuilder::conv_op(const std::string& name, int x, int out_c, int k, int stride, int pad) const {
  Op op = op_on(OpKind::Conv2d, name, {x});
  op.out_c = out_c;
  op.k = k;
  op.stride = stride;
  op.pad = pad;
  DDP_CHECK(out_c > 0 && k > 0 && stride > 0 && pad >= 0, "model ", g_.model, ": op ", name, ": bad convolution (",
            out_c, " channels, kernel ", k, ", stride ", stride, ", padding ", pad, ")");
  DDP_CHECK(op.in.h + 2 * pad >= k && op.in.w + 2 * pad >= k, "model ", g_.model, ": op ", name, ": kernel ", k,
            " larger than its padded input ", to_string(op.in));
  op.out = {out_c, (op.in.h + 2 * pad - k) / stride + 1, (op.in.w + 2 * pad - k) / stride + 1};
  // weight [out_c, in_c, k, k] and bias [out_c]
  const double bound = 1.0 / std::sqrt(double(op.in.c) * k * k);  // 1/sqrt(fan_in)
  const Init w = pytorch_init_ ? Init::Uniform : Init::Normal001, b = pytorch_init_ ? Init::Uniform : Init::Zero;
  op.params = {{"weight", {out_c, op.in.c, k, k}, w, bound}, {"bias", {out_c}, b, bound}};
  return op;
}

int GraphBuilder::conv(const std::string& name, int x, int out_c, int k, int stride, int pad) {
  return push(conv_op(name, x, out_c, k, stride, pad));
}

int GraphBuilder::conv_relu_pool(const std::string& name, int x, int out_c, int k) {
  // The same tensors as the plain Conv2d it replaces: state dicts match.
  Op op = conv_op(name, x, out_c, k, 1, 0);
  op.kind = OpKind::ConvReluPool;
  op.out = {op.out.c, op.out.h / 2, op.out.w / 2};
  DDP_CHECK(op.out.h > 0 && op.out.w > 0, "model ", g_.model, ": op ", name, ": nothing left to pool");
  return push(std::move(op));
}

int GraphBuilder::batch_norm(const std::string& name, int x) {
  Op op = op_on(OpKind::BatchNorm2d, name, {x});
  const int64_t c = op.in.c;
  op.params = {{"weight", {c}, Init::One}, {"bias", {c}, Init::Zero}};
  op.buffers = {{"running_mean", {c}, Init::Zero}, {"running_var", {c}, Init::One}};
  op.counter = true;
  return push(std::move(op));
}

int GraphBuilder::relu(const std::string& name, int x) {
  return push(op_on(OpKind::ReLU, name, {x}));
}

int GraphBuilder::add(const std::string& name, int a, int b, bool relu) {
  Op op = op_on(OpKind::Add, name, {a, b});
  op.relu = relu;
  DDP_CHECK(shape(b) == op.in, "model ", g_.model, ": op ", name, ": adds ", to_string(op.in), " and ",
            to_string(shape(b)));
  return push(std::move(op));
}

int GraphBuilder::avg_pool2(const std::string& name, int x) {
  Op op = op_on(OpKind::AvgPool2d, name, {x});
  op.out = {op.in.c, op.in.h / 2, op.in.w / 2};
  DDP_CHECK(op.out.h > 0 && op.out.w > 0, "model ", g_.model, ": op ", name, ": nothing left to pool in ",
            to_string(op.in));
  return push(std::move(op));
}

int GraphBuilder::global_avg_pool(const std::string& name, int x) {
  Op op = op_on(OpKind::GlobalAvgPool, name, {x});
  op.out = {op.in.c, 1, 1};
  return push(std::move(op));
}

int GraphBuilder::flatten(const std::string& name, int x) {
  Op op = op_on(OpKind::Flatten, name, {x});
  op.out = {int(op.in.numel()), 1, 1};
  return push(std::move(op));
}

int GraphBuilder::linear(const std::string& name, int x, int out) {
  Op op = op_on(OpKind::Linear, name, {x});
  op.out_c = out;
  op.out = {out, 1, 1};
  const int64_t in = op.in.numel();
  DDP_CHECK(out > 0, "model ", g_.model, ": op ", name, ": bad size ", in, " -> ", out);
  const double bound = 1.0 / std::sqrt(double(in));
  op.params = {{"weight", {out, in}, pytorch_init_ ? Init::Uniform : Init::Normal001, bound},
               {"bias", {out}, pytorch_init_ ? Init::Uniform : Init::Zero, bound}};
  return push(std::move(op));
}

Graph GraphBuilder::finish(int output) {
  Graph g = std::move(g_);
  const std::string& model = g.model;
  DDP_CHECK(!g.ops.empty(), "model ", model, ": no ops");
  DDP_CHECK(output > 0 && size_t(output) < g.values.size(), "model ", model, ": output ", output, " is no op's");
  g.output = output;
  g.last_reader.assign(g.values.size(), -1);
  for (size_t i = 0; i < g.ops.size(); ++i)
    for (int v : g.ops[i].inputs) g.last_reader[size_t(v)] = int(i);  // ops are in order
  // Every op's output is read, by a later op or as the logits (and the
  // logits by nothing else), so backward reaches every op.
  for (size_t v = 1; v < g.values.size(); ++v)
    DDP_CHECK((int(v) == output) != (g.last_reader[v] >= 0), "model ", model, ": the output of op ", g.ops[v - 1].name,
              int(v) == output ? " is the logits and is read by another op too" : " is read by nothing");
  assign_grad_slots(g);
  std::set<std::string> names;
  auto full_name = [&](const Op& op, const TensorSpec& t) {
    std::string n = op.name + "." + t.name;
    DDP_CHECK(names.insert(n).second, "model ", model, ": two tensors named ", n);
    DDP_CHECK(t.numel() > 0, "model ", model, ": tensor ", n, " is empty");
    return n;
  };
  // Note [flat layout]: last op first.
  const size_t n_ops = g.ops.size();
  g.op_params.assign(n_ops, {});
  g.ready_after.assign(n_ops, 0);
  // end: where the last tensor ends; the next starts at its slot's end.
  size_t end = 0;
  for (size_t i = n_ops; i-- > 0;) {
    for (const TensorSpec& t : g.ops[i].params) {
      TensorInfo p{full_name(g.ops[i], t), t.shape, param_start(end), size_t(t.numel()), t.init, t.bound};
      end = p.offset + p.numel;
      g.parameter_count += p.numel;
      g.op_params[i].push_back(g.params.size());
      g.params.push_back(std::move(p));
    }
    g.ready_after[i] = end;
  }
  // The last tensor's slot ends with it; a gap is final with the tensor before it.
  g.num_params = end;
  for (size_t& r : g.ready_after) r = std::min(param_start(r), end);
  // Note [buffers]: forward order; nothing waits on them.
  g.op_buffers.assign(n_ops, {});
  g.op_counter.assign(n_ops, -1);
  size_t offset = 0;
  for (size_t i = 0; i < n_ops; ++i) {
    for (const TensorSpec& t : g.ops[i].buffers) {
      TensorInfo b{full_name(g.ops[i], t), t.shape, offset, size_t(t.numel()), t.init, t.bound};
      offset += b.numel;
      g.op_buffers[i].push_back(g.buffers.size());
      g.buffers.push_back(std::move(b));
    }
    if (g.ops[i].counter) {
      g.op_counter[i] = int(g.counters.size());
      g.counters.push_back(full_name(g.ops[i], {"num_batches_tracked", {1}, Init::Zero}));
    }
  }
  g.num_buffers = offset;
  return g;
}

size_t param_slot_end(const std::vector<TensorInfo>& params, size_t k) {
  return k + 1 < params.size() ? params[k + 1].offset : params[k].offset + params[k].numel;
}

std::vector<size_t> param_slots(const Graph& g) {
  std::vector<size_t> slots;
  for (size_t k = 0; k < g.params.size(); ++k) slots.push_back(param_slot_end(g.params, k) - g.params[k].offset);
  return slots;
}

bool has_batch_norm(const Graph& g) {
  for (const Op& op : g.ops)
    if (op.kind == OpKind::BatchNorm2d) return true;
  return false;
}

bool claimable_run(const Graph& g, size_t first, size_t count) {
  if (count == 0 || first + count > g.ops.size()) return false;
  for (size_t k = first; k + 1 < first + count; ++k) {
    const int v = int(k) + 1;  // what op k makes
    if (v == g.output) return false;
    for (size_t r = 0; r < g.ops.size(); ++r)
      for (int in : g.ops[r].inputs)
        if (in == v && r != k + 1) return false;
    int reads = 0;
    for (int in : g.ops[k + 1].inputs) reads += in == v;
    if (reads != 1) return false;
  }
  return true;
}

std::vector<int> run_inputs(const Graph& g, size_t first, size_t count) {
  std::vector<int> in = g.ops[first].inputs;
  for (size_t k = first + 1; k < first + count; ++k)
    for (int v : g.ops[k].inputs)
      if (v != int(k)) in.push_back(v);
  return in;
}

}  // namespace ddp::nn
