// Model: the executor of a Graph on a Device (model.hpp), and init_state.
#include "ddp/nn/model.hpp"

#include <algorithm>
#include <cmath>

#include "ddp/core/error.hpp"
#include "ddp/core/rng.hpp"

namespace ddp::nn {

namespace {

// FNV-1a: each tensor's init stream is keyed by its name, so adding an op to
// a model leaves the other tensors' initial values unchanged.
uint64_t name_key(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

void init_tensor(const TensorInfo& t, uint64_t seed, float* p) {
  switch (t.init) {
    case Init::Zero:
      std::fill(p, p + t.numel, 0.0f);
      return;
    case Init::One:
      std::fill(p, p + t.numel, 1.0f);
      return;
    case Init::Normal001: {
      Rng rng(seed, name_key(t.name));
      for (size_t j = 0; j < t.numel; ++j) p[j] = static_cast<float>(0.01 * rng.normal());
      return;
    }
    case Init::Uniform: {
      Rng rng(seed, name_key(t.name));
      for (size_t j = 0; j < t.numel; ++j) {
        const double u = double(rng.next_u64() >> 11) * 0x1.0p-53;  // [0, 1)
        p[j] = static_cast<float>(t.bound * (2.0 * u - 1.0));
      }
      return;
    }
  }
}

}  // namespace

ModelState init_state(const Graph& g, uint64_t seed) {
  ModelState s;
  s.params.assign(g.num_params, 0.0f);
  s.buffers.assign(g.num_buffers, 0.0f);
  s.counters.assign(g.counters.size(), 0);
  for (const TensorInfo& t : g.params) init_tensor(t, seed, s.params.data() + t.offset);
  for (const TensorInfo& t : g.buffers) init_tensor(t, seed, s.buffers.data() + t.offset);
  return s;
}

Model::Model(Graph graph, Device& device, StatsReducer* stats)
    : graph_(std::move(graph)), device_(device), counters_(graph_.counters.size(), 0) {
  const Graph& g = graph_;
  params_ = device_.alloc(g.num_params);
  grads_ = device_.alloc(g.num_params);
  if (g.num_buffers) buffers_ = device_.alloc(g.num_buffers);
  const ModelState fresh = init_state(g, 0);  // buffers start as their specs say
  if (g.num_buffers) device_.from_host(buffers(), fresh.buffers.data(), g.num_buffers);
  const size_t n_ops = g.ops.size();
  for (const Op& op : g.ops)
    half_op_.push_back(op.kind == OpKind::Conv2d || op.kind == OpKind::ConvReluPool || op.kind == OpKind::Linear);
  kernels_.resize(n_ops);
  args_.resize(n_ops);
  run_.assign(n_ops, 0);
  run_first_.assign(n_ops, 0);
  run_in_.resize(n_ops);
  for (size_t i = 0; i < n_ops; i += run_[i]) {
    try {
      kernels_[i] = device_.kernel(g, i, stats);
    } catch (const Error& e) {
      DDP_FAIL("model ", g.model, ": op ", g.ops[i].name, ": ", e.what());
    }
    // Note [claimed runs]
    const size_t n = kernels_[i]->ops();
    DDP_CHECK(n >= 1 && claimable_run(g, i, n), "model ", g.model, ": op ", g.ops[i].name, ": device ",
              device_.name(), " runs ", n, " ops from it as one, which the graph does not allow");
    run_[i] = n;
    run_in_[i] = run_inputs(g, i, n);
    OpArgs& a = args_[i];
    int counters = 0;
    for (size_t k = i; k < i + n; ++k) {
      DDP_CHECK(k == i || !half_op_[k], "model ", g.model, ": op ", g.ops[k].name,
                ": a convolution or linear layer heads the run of ops it is in (Note [mixed precision])");
      run_first_[k] = i;
      for (size_t q : g.op_params[k]) {
        a.p.push_back(params() + g.params[q].offset);
        a.dp.push_back(grads() + g.params[q].offset);
      }
      for (size_t q : g.op_buffers[k]) a.buf.push_back(buffers() + g.buffers[q].offset);
      counters += g.op_counter[k] >= 0;
    }
    DDP_CHECK(counters <= 1, "model ", g.model, ": op ", g.ops[i].name, ": a run of ops with ", counters,
              " batch counters");
    a.x.resize(run_in_[i].size());
  }
  acts_.resize(g.values.size());
  dacts_.resize(g.values.size());
  half_in_.resize(n_ops);
  native_.assign(n_ops, false);
}

Model::~Model() = default;

void Model::set_state(const ModelState& s) {
  DDP_CHECK(s.params.size() == graph_.num_params, "model ", name(), ": a state of ", s.params.size(),
            " parameters, the model has ", graph_.num_params);
  device_.from_host(params(), s.params.data(), graph_.num_params);
  set_buffers(s);
}

void Model::get_state(ModelState& s) {
  s.params.resize(graph_.num_params);
  device_.to_host(s.params.data(), params(), graph_.num_params);
  get_buffers(s);
}

void Model::set_buffers(const ModelState& s) {
  DDP_CHECK(s.buffers.size() == graph_.num_buffers && s.counters.size() == counters_.size(), "model ", name(),
            ": a state of ", s.buffers.size(), " buffer values and ", s.counters.size(), " counters, the model has ",
            graph_.num_buffers, " and ", counters_.size());
  if (graph_.num_buffers) device_.from_host(buffers(), s.buffers.data(), graph_.num_buffers);
  counters_ = s.counters;
}

void Model::get_buffers(ModelState& s) {
  s.buffers.resize(graph_.num_buffers);
  if (graph_.num_buffers) device_.to_host(s.buffers.data(), buffers(), graph_.num_buffers);
  s.counters = counters_;
}

void Model::zero_grads() { device_.fill(grads(), graph_.num_params, 0.0f); }

std::pair<size_t, size_t> Model::param_span(size_t i) const {
  const std::vector<size_t>& ps = graph_.op_params[i];
  if (ps.empty()) return {0, 0};
  // An op's tensors' slots are adjacent in flat order (Note [flat layout]):
  // the span runs to the end of the last one's, as the exact sums take it.
  const size_t first = graph_.params[ps.front()].offset;
  return {first, param_slot_end(graph_.params, ps.back()) - first};
}

bool Model::any_half_op() const {
  for (size_t i = 0; i < graph_.ops.size(); ++i)
    if (half_op(i)) return true;
  return false;
}

void Model::set_precision(Precision p) {
  // A half op heads its run (Note [claimed runs]): the kernel is its run's.
  std::vector<bool> native(graph_.ops.size(), false);
  for (size_t i = 0; i < graph_.ops.size(); ++i) {
    native[i] = half_op_[i] && kernels_[i]->set_precision(p);
    // Model rounds only around an op that runs alone; refused, the kernels
    // told so far compute as before.
    if (!is_half(p) || !half_op_[i] || native[i] || run_[i] == 1) continue;
    for (size_t k = 0; k <= i; ++k)
      if (half_op_[k]) kernels_[k]->set_precision(precision_);
    DDP_FAIL("model ", name(), ": op ", graph_.ops[i].name, ": the run of ", run_[i],
             " ops from it does not compute in ", to_string(p), " itself");
  }
  precision_ = p;
  native_ = native;
  const bool half = any_half_op();
  size_t most = 1;
  for (size_t i = 0; i < graph_.ops.size(); ++i)
    if (half_op(i)) most = std::max(most, param_span(i).second);
  half_params_ = half ? device_.alloc(graph_.num_params) : nullptr;
  half_dp_ = half ? device_.alloc(most) : nullptr;
  // The half ops read their weights from the rounded copy.
  for (size_t i = 0; i < graph_.ops.size(); ++i) {
    if (run_[i] != 1) continue;  // inside a run, or heading one: no half op (checked above)
    float* base = half_op(i) ? half_params_->data() : params();
    for (size_t j = 0; j < graph_.op_params[i].size(); ++j)
      args_[i].p[j] = base + graph_.params[graph_.op_params[i][j]].offset;
  }
  capacity_ = 0;  // the next forward sizes the rounded inputs
  last_batch_ = -1;
}

float* Model::value(int v) { return acts_[size_t(v)]->data(); }

void Model::reserve(int batch) {
  if (batch <= capacity_) return;
  grad_slots_.clear();
  size_t largest = 0;
  std::vector<size_t> slot_size(size_t(graph_.grad_slots), 0);
  // A value inside a claimed run is nobody's to read, and its gradient
  // nobody's to write (Note [claimed runs]): no arrays for them.
  const auto inner = [&](size_t v) { return v < run_first_[v - 1] + run_[run_first_[v - 1]]; };
  for (size_t v = 1; v < graph_.values.size(); ++v) {
    const size_t n = size_t(batch) * size_t(graph_.values[v].numel());
    if (inner(v)) {
      acts_[v] = nullptr;
      continue;
    }
    largest = std::max(largest, n);
    acts_[v] = device_.alloc(n);
    // No gradient is kept for the logits (the caller's) or for a value no
    // op reads.
    if (const int s = graph_.grad_slot[v]; s >= 0) slot_size[size_t(s)] = std::max(slot_size[size_t(s)], n);
  }
  for (size_t n : slot_size) grad_slots_.push_back(device_.alloc(n));
  for (size_t v = 1; v < graph_.values.size(); ++v) {
    const int s = graph_.grad_slot[v];
    dacts_[v] = s >= 0 && !inner(v) ? grad_slots_[size_t(s)]->data() : nullptr;
  }
  scratch_ = device_.alloc(largest);
  // Note [mixed precision]: the half ops' rounded inputs and d(output).
  const bool half = any_half_op();
  half_dy_ = half ? device_.alloc(largest) : nullptr;
  for (size_t i = 0; i < graph_.ops.size(); ++i)
    half_in_[i] = half_op(i) ? device_.alloc(size_t(batch) * size_t(graph_.ops[i].in.numel())) : nullptr;
  capacity_ = batch;
}

const float* Model::forward(const float* x, int batch, Mode mode) {
  DDP_CHECK(batch > 0, "model ", name(), ": forward with batch ", batch);
  DDP_CHECK(x, "model ", name(), ": forward with null input");
  reserve(batch);
  input_ = x;
  // Note [mixed precision]: the weights as the half ops compute with them.
  for (size_t i = 0; i < graph_.ops.size(); ++i)
    if (const auto [at, n] = param_span(i); half_op(i) && n)
      device_.round(half_params_->data() + at, params() + at, n, precision_);
  for (size_t i = 0; i < graph_.ops.size(); i += run_[i]) {
    OpArgs& a = args_[i];
    a.batch = batch;
    a.mode = mode;
    const Op& op = graph_.ops[i];
    const std::vector<int>& in = run_in_[i];
    for (size_t j = 0; j < in.size(); ++j) a.x[j] = in[j] == 0 ? x : value(in[j]);
    a.y = value(int(i + run_[i]));
    a.counter = nullptr;
    for (size_t k = i; k < i + run_[i]; ++k)
      if (graph_.op_counter[k] >= 0) a.counter = &counters_[size_t(graph_.op_counter[k])];
    if (half_op(i)) {  // one input (GraphBuilder)
      device_.round(half_in_[i]->data(), a.x[0], size_t(batch) * size_t(op.in.numel()), precision_);
      a.x[0] = half_in_[i]->data();
    }
    {
      TraceScope span(mode == Mode::Train ? trace_ : nullptr, Trace::kStep, "forward",
                      trace_ && trace_->active() ? run_label(i) : "");
      op_forward(i, a);
    }
    if (half_op(i)) device_.round(a.y, a.y, size_t(batch) * size_t(op.out.numel()), precision_);
  }
  last_batch_ = mode == Mode::Train ? batch : -1;
  return value(graph_.output);
}

void Model::op_forward(size_t i, const OpArgs& a) { kernels_[i]->forward(a); }

std::string Model::run_label(size_t i) const {
  std::string names, kinds;
  for (size_t k = i; k < i + run_[i]; ++k) {
    names += (k > i ? "+" : "") + graph_.ops[k].name;
    kinds += std::string(k > i ? "+" : "") + to_string(graph_.ops[k].kind);
  }
  return names + " (" + kinds + ")";
}

void Model::op_backward(size_t i, const float* dy, const std::vector<float*>& dx, int) {
  if (half_op(i) && !graph_.op_params[i].empty())
    rounded_backward(i, dy, dx);
  else
    kernels_[i]->backward(args_[i], dy, dx);
}

void Model::rounded_backward(size_t i, const float* dy, const std::vector<float*>& dx) {
  const auto [base, n] = param_span(i);
  OpArgs a = args_[i];
  const std::vector<size_t>& ps = graph_.op_params[i];
  for (size_t j = 0; j < ps.size(); ++j) a.dp[j] = half_dp_->data() + (graph_.params[ps[j]].offset - base);
  kernels_[i]->backward(a, dy, dx);
  device_.round(half_dp_->data(), half_dp_->data(), n, precision_);
  device_.add(grads() + base, half_dp_->data(), n);
  device_.fill(half_dp_->data(), n, 0.0f);
}

void Model::backward(const float* dlogits, int batch, const std::function<void(size_t)>& on_ready) {
  DDP_CHECK(last_batch_ == batch, "model ", name(), ": backward for batch ", batch,
            last_batch_ < 0 ? std::string(" without a training forward") : " after forward of batch " +
                                                                              std::to_string(last_batch_));
  DDP_CHECK(dlogits, "model ", name(), ": backward with null dlogits");
  // A value read by several ops gets their gradients added: the first op to
  // run backward (the last reader) writes, the others write into scratch_,
  // which is then added (Note [gradient accumulation] in device.hpp).
  std::vector<bool> written(graph_.values.size(), false);
  std::vector<float*> dx;
  for (size_t end = graph_.ops.size(); end > 0;) {
    // The run that ends at op end - 1 (Note [claimed runs]).
    const size_t i = run_first_[end - 1];
    end = i;
    const Op& op = graph_.ops[i];
    const std::vector<int>& in = run_in_[i];
    const int out = int(i + run_[i]);
    const float* dy = out == graph_.output ? dlogits : dacts_[size_t(out)];
    if (half_op(i)) {  // Note [mixed precision]
      device_.round(half_dy_->data(), dy, size_t(batch) * size_t(op.out.numel()), precision_);
      dy = half_dy_->data();
    }
    dx.assign(in.size(), nullptr);
    std::vector<size_t> add_later;
    for (size_t j = 0; j < in.size(); ++j) {
      const int v = in[j];
      if (v == 0) continue;  // nothing needs the input's gradient
      if (!written[size_t(v)]) {
        dx[j] = dacts_[size_t(v)];
        written[size_t(v)] = true;
      } else {
        dx[j] = scratch_->data();
        add_later.push_back(j);
      }
    }
    DDP_CHECK(add_later.size() <= 1, "model ", name(), ": op ", op.name, " reads one value more than twice");
    {
      TraceScope span(trace_, Trace::kStep, "backward", trace_ && trace_->active() ? run_label(i) : "");
      op_backward(i, dy, dx, batch);
    }
    if (half_op(i))
      for (size_t j = 0; j < in.size(); ++j)
        if (dx[j])
          device_.round(dx[j], dx[j], size_t(batch) * size_t(graph_.values[size_t(in[j])].numel()), precision_);
    for (size_t j : add_later) {
      const int v = in[j];
      device_.add(dacts_[size_t(v)], scratch_->data(), size_t(batch) * size_t(graph_.values[size_t(v)].numel()));
    }
    if (on_ready) on_ready(graph_.ready_after[i]);
  }
}

}  // namespace ddp::nn
