// Note [graph engines] (nn/cuda/conv_algo.hpp): a convolution direction as
// a one-operation graph of cuDNN's backend API, its engines from cuDNN's
// heuristics, filtered by their notes, ranked or timed, and the chosen
// one's execution plan kept for the run.
#include "ddp/nn/cuda/cudnn_graph.hpp"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"          // DDP_FAIL, Error, detail::concat
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUDNN_CHECK, DDP_CUDA_CHECK

namespace ddp::nn {

cudnnDataType_t cudnn_data_type(Precision p) {
  switch (p) {
    case Precision::BF16: return CUDNN_DATA_BFLOAT16;
    case Precision::F16: return CUDNN_DATA_HALF;
    default: return CUDNN_DATA_FLOAT;
  }
}

const char* to_string(ConvDirection d) {
  switch (d) {
    case ConvDirection::kForward: return "forward";
    case ConvDirection::kBackwardData: return "backward-data";
    case ConvDirection::kBackwardFilter: return "backward-filter";
  }
  return "?";
}

namespace {

// The three tensors' ids in every graph and variant pack.
constexpr int64_t kX = 1, kW = 2, kY = 3;
// The heuristics' engines looked at (in practice all of them: their notes
// are read before anything is built, since in strict fp32 the first dozens
// of an sm_90 list are tensor-core engines it may not take), of those
// whose notes allow them the most whose plans are built, and of those the
// most timed.
constexpr int64_t kMaxConfigs = 512;
constexpr int kMaxPlans = 16;
constexpr int kMaxTimed = 8;

// A backend descriptor, destroyed with its owner.
class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptorType_t type) { DDP_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_)); }
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Desc& operator=(Desc&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  cudnnBackendDescriptor_t get() const { return d_; }
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const void* values) {
    DDP_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
  }
  void set(cudnnBackendAttributeName_t name, const Desc& other) {
    const cudnnBackendDescriptor_t o = other.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &o);
  }
  void finalize() { DDP_CUDNN_CHECK(cudnnBackendFinalize(d_)); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

Desc tensor(const GraphTensor& t, int64_t uid, cudnnDataType_t type) {
  Desc d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t align = kGraphAlignment;
  d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, t.dims.data());
  d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, t.strides.data());
  d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  d.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
  d.finalize();
  return d;
}

// Cross-correlation (PyTorch's convolution), fp32 accumulation in every
// precision (autocast's).
Desc convolution(int64_t pad, int64_t stride) {
  Desc d(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const int64_t dims = 2, pads[2] = {pad, pad}, strides[2] = {stride, stride}, dilations[2] = {1, 1};
  const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  d.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims);
  d.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
  d.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  d.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pads);
  d.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pads);
  d.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilations);
  d.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, strides);
  d.finalize();
  return d;
}

// The backend's attribute names of each direction's operation.
struct OpAttrs {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};

OpAttrs op_attrs(ConvDirection d) {
  switch (d) {
    case ConvDirection::kForward:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
    case ConvDirection::kBackwardData:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
    case ConvDirection::kBackwardFilter: break;
  }
  return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
}

// What a finalised graph keeps alive: its tensors, convolution and
// operation descriptors, and the graph itself.
struct OpGraph {
  Desc x, w, y, conv, op, graph;
};

// What engines are chosen for: the GPU a handle works on, or a device
// described to cuDNN (Note [engines without a GPU], cudnn_graph.hpp); and
// whether only deterministic engines may run.
struct Target {
  cudnnHandle_t handle = nullptr;
  cudnnBackendDescriptor_t device = nullptr;
  bool deterministic = false;
};

// False (with the status in *why) where cuDNN will not take the graph.
bool make_graph(const Target& t, ConvDirection d, const ConvGraphSpec& s, OpGraph* g, std::string* why) {
  const cudnnDataType_t type = cudnn_data_type(s.precision);
  g->x = tensor(s.shapes.x, kX, type);
  g->w = tensor(s.shapes.w, kW, type);
  g->y = tensor(s.shapes.y, kY, type);
  g->conv = convolution(s.pad, s.stride);
  const OpAttrs a = op_attrs(d);
  g->op = Desc(a.type);
  const float alpha = 1.0f;
  g->op.set(a.x, g->x);
  g->op.set(a.w, g->w);
  g->op.set(a.y, g->y);
  g->op.set(a.conv, g->conv);
  g->op.set(a.alpha, CUDNN_TYPE_FLOAT, 1, &alpha);
  g->op.set(a.beta, CUDNN_TYPE_FLOAT, 1, &s.beta);
  g->op.finalize();
  g->graph = Desc(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  const cudnnBackendDescriptor_t ops[1] = {g->op.get()};
  g->graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, ops);
  if (t.handle) g->graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &t.handle);
  const cudnnStatus_t st = cudnnBackendFinalize(g->graph.get());
  if (st == CUDNN_STATUS_SUCCESS) return true;
  *why = detail::concat("the graph was refused (", cudnnGetErrorString(st), ")");
  return false;
}

// A descriptor's device (Note [engines without a GPU]) where t describes one.
void set_device(Desc& d, cudnnBackendAttributeName_t name, const Target& t) {
#if CUDNN_VERSION >= 90800
  if (t.device) d.set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t.device);
#else
  (void)name;
  DDP_CHECK(!t.device, "planning for a described device needs cuDNN 9.8 or later");
#endif
}

// The engine configurations cuDNN's heuristics offer in `mode`, best first.
std::vector<Desc> engine_configs(const Target& t, const OpGraph& g, cudnnBackendHeurMode_t mode) {
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g.graph);
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  set_device(heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, t);
  if (cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS) return {};
  int64_t count = 0;
  DDP_CUDNN_CHECK(
      cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  count = std::min(count, kMaxConfigs);
  std::vector<Desc> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  int64_t got = 0;
  if (count > 0)
    DDP_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                             count, &got, raw.data()));
  configs.resize(size_t(std::clamp<int64_t>(got, 0, count)));
  return configs;
}

// A configuration's engine, into `engine` (a created descriptor).
void engine_of(const Desc& config, const Desc& engine) {
  cudnnBackendDescriptor_t raw = engine.get();
  int64_t n = 0;
  DDP_CUDNN_CHECK(
      cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &raw));
}

// cuDNN's number for a configuration's engine (the same across graphs).
int64_t engine_index(const Desc& config) {
  const Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  engine_of(config, engine);
  int64_t n = 0, index = -1;
  DDP_CUDNN_CHECK(
      cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index));
  return index;
}

EngineNotes notes_of(const Desc& config) {
  const Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  engine_of(config, engine);
  const cudnnBackendDescriptor_t raw = engine.get();
  int64_t n = 0;
  EngineNotes out;
  cudnnBackendNumericalNote_t numerical[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  DDP_CUDNN_CHECK(cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                           CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, numerical));
  // The count may be all the engine has, more than were asked for and written.
  n = std::min<int64_t>(n, CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
  for (int64_t i = 0; i < n; ++i) {
    out.tensor_core |= numerical[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE;
    out.down_convert |= numerical[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS;
    out.reduced_reduction |= numerical[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION;
    out.nondeterministic |= numerical[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
  }
  cudnnBackendBehaviorNote_t behavior[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  DDP_CUDNN_CHECK(cudnnBackendGetAttribute(raw, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                           CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n, behavior));
  n = std::min<int64_t>(n, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT);
  for (int64_t i = 0; i < n; ++i) out.runtime_compilation |= behavior[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
  return out;
}

// An engine configuration's execution plan; false where cuDNN will not
// build it for this graph.
bool make_plan(const Target& t, const Desc& config, Desc* plan, size_t* workspace) {
  Desc p(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  if (t.handle) p.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &t.handle);
  set_device(p, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, t);
  p.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
  if (cudnnBackendFinalize(p.get()) != CUDNN_STATUS_SUCCESS) return false;
  int64_t n = 0, bytes = 0;
  DDP_CUDNN_CHECK(
      cudnnBackendGetAttribute(p.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &bytes));
  *plan = std::move(p);
  *workspace = size_t(std::max<int64_t>(bytes, 0));
  return true;
}

cudnnStatus_t execute(cuda::Context& ctx, const Desc& plan, const void* x, const void* w, const void* y, void* ws) {
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  void* ptrs[3] = {const_cast<void*>(x), const_cast<void*>(w), const_cast<void*>(y)};
  const int64_t uids[3] = {kX, kW, kY};
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  pack.finalize();
  return cudnnBackendExecute(ctx.dnn(), plan.get(), pack.get());
}

// One engine the heuristics offered, with its plan where its notes let it
// be built.
struct Engine {
  Desc config, plan;
  size_t workspace = 0;
  ConvAlgoCandidate candidate;
  EngineRefusal refusal = EngineRefusal::kNone;  // why not usable
  bool fallback = false;                         // from cuDNN's fallback list
  EngineNotes notes;                             // where they were read
};

std::vector<Engine> engines(const Target& t, const OpGraph& g, Precision p, size_t cap) {
  std::vector<Engine> out;
  std::vector<ConvAlgoCandidate> offered;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    int planned = 0;
    for (Desc& c : engine_configs(t, g, mode)) {
      if (planned == kMaxPlans) break;
      Engine e;
      e.config = std::move(c);
      e.fallback = mode == CUDNN_HEUR_MODE_FALLBACK;
      // An engine whose notes cannot be read is not run; the others may be.
      std::optional<EngineNotes> notes;
      try {
        notes = notes_of(e.config);
      } catch (const Error&) {
      }
      e.refusal = notes ? notes_refusal(*notes, p) : EngineRefusal::kNotesUnread;
      if (notes) e.notes = *notes;
      if (e.refusal == EngineRefusal::kNone) {
        ++planned;
        if (!make_plan(t, e.config, &e.plan, &e.workspace)) e.refusal = EngineRefusal::kNoPlan;
      }
      if (e.refusal == EngineRefusal::kNone) {
        e.candidate = graph_engine_candidate(*notes, p, e.workspace, cap);
        if (!e.candidate.usable) e.refusal = EngineRefusal::kWorkspace;
      }
      offered.push_back(e.candidate);
      out.push_back(std::move(e));
    }
    // The fallback list only where the heuristics offered nothing the run
    // may take (under --deterministic: no deterministic engine).
    if (graph_engines_enough(offered, t.deterministic)) break;
  }
  return out;
}

// A timing's event, destroyed however the timing ends.
struct TimingEvent {
  TimingEvent() { DDP_CUDA_CHECK(cudaEventCreate(&e)); }
  ~TimingEvent() { cudaEventDestroy(e); }
  TimingEvent(const TimingEvent&) = delete;
  TimingEvent& operator=(const TimingEvent&) = delete;
  cudaEvent_t e = nullptr;
};

// The engines time_engines runs: usable ones, under --deterministic
// deterministic ones only, the first kMaxTimed.
std::vector<size_t> engines_to_time(const cuda::Context& ctx, const std::vector<Engine>& es) {
  std::vector<size_t> out;
  for (size_t i = 0; i < es.size() && out.size() < size_t(kMaxTimed); ++i)
    if (es[i].candidate.usable && (!ctx.deterministic() || es[i].candidate.deterministic)) out.push_back(i);
  return out;
}

// n bytes of zeros (a beta of 1 reads the output), given back however the
// caller ends (a failed timing falls back to the legacy call:
// GraphConv::make).
cuda::DeviceBuffer zeros(cuda::Context& ctx, size_t n) {
  cuda::DeviceBuffer b(ctx, std::max<size_t>(cuda::DeviceBuffer::floats_for(n), 1));
  DDP_CUDA_CHECK(cudaMemsetAsync(b.data(), 0, n, ctx.compute()));
  return b;
}

// Zeros of the graph's shapes, and a workspace of `workspace` bytes.
struct Operands {
  Operands(cuda::Context& ctx, const ConvGraphSpec& s, size_t workspace)
      : x(zeros(ctx, bytes(s, s.shapes.x))),
        w(zeros(ctx, bytes(s, s.shapes.w))),
        y(zeros(ctx, bytes(s, s.shapes.y))),
        ws(zeros(ctx, workspace)) {}
  static size_t bytes(const ConvGraphSpec& s, const GraphTensor& t) {
    return size_t(t.dims[0] * t.strides[0]) * (is_half(s.precision) ? 2 : 4);
  }
  cudnnStatus_t run(cuda::Context& ctx, const Desc& plan) const {
    return execute(ctx, plan, x.data(), w.data(), y.data(), ws.data());
  }
  // The operand direction d writes (backward data x's place, backward
  // filter w's), and its bytes.
  std::pair<cuda::DeviceBuffer*, size_t> output(const ConvGraphSpec& s, ConvDirection d) {
    if (d == ConvDirection::kForward) return {&y, bytes(s, s.shapes.y)};
    if (d == ConvDirection::kBackwardData) return {&x, bytes(s, s.shapes.x)};
    return {&w, bytes(s, s.shapes.w)};
  }
  cuda::DeviceBuffer x, w, y, ws;
};

// Note [measured algorithms] for engines: each usable one (the first
// kMaxTimed; under --deterministic deterministic ones only, as no other may
// be chosen) run once to warm up, then three times between two events, on
// scratch operands of the graph's shapes.
std::vector<TimedAlgo> time_engines(cuda::Context& ctx, const ConvGraphSpec& s, const std::vector<Engine>& es) {
  const std::vector<size_t> timing = engines_to_time(ctx, es);
  size_t most = 0;  // the largest workspace of the engines run (each within the cap)
  for (const size_t i : timing) most = std::max(most, es[i].workspace);
  const Operands o(ctx, s, most);
  const TimingEvent start, stop;
  std::vector<TimedAlgo> timed(es.size());
  for (const size_t i : timing) {
    bool ok = o.run(ctx, es[i].plan) == CUDNN_STATUS_SUCCESS;
    DDP_CUDA_CHECK(cudaEventRecord(start.e, ctx.compute()));
    for (int r = 0; r < 3 && ok; ++r) ok = o.run(ctx, es[i].plan) == CUDNN_STATUS_SUCCESS;
    DDP_CUDA_CHECK(cudaEventRecord(stop.e, ctx.compute()));
    DDP_CUDA_CHECK(cudaEventSynchronize(stop.e));
    float ms = 0;
    DDP_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e, stop.e));
    timed[i] = {ok, es[i].candidate.deterministic, ms / 3};
  }
  return timed;
}

// An engine run once before a layer relies on it: the one the heuristics
// ranked first, on zeros (the timed ones have run), and any engine asked to
// add into its output (beta 1) on an output of ones, which zeros in must
// leave as it was: cuDNN's own frontend never asks for beta 1 (its weight
// gradient is always written), so it is checked here, not assumed. "" where
// it passed, else why not.
std::string trial_run(cuda::Context& ctx, ConvDirection d, const ConvGraphSpec& s, const Engine& e) {
  Operands o(ctx, s, e.workspace);
  const bool add = s.beta != 0.0f;
  if (add && is_half(s.precision)) return "adding into a 16-bit output (beta 1) is not checked";
  const auto [out, bytes] = o.output(s, d);
  const size_t n = bytes / sizeof(float);
  const std::vector<float> ones(add ? n : 0, 1.0f);
  if (add)
    DDP_CUDA_CHECK(cudaMemcpyAsync(out->data(), ones.data(), bytes, cudaMemcpyHostToDevice, ctx.compute()));
  const cudnnStatus_t st = o.run(ctx, e.plan);
  if (st != CUDNN_STATUS_SUCCESS)
    return detail::concat("its engine failed a trial run (", cudnnGetErrorString(st), ")");
  std::vector<float> back(ones.size());
  if (add)
    DDP_CUDA_CHECK(cudaMemcpyAsync(back.data(), out->data(), bytes, cudaMemcpyDeviceToHost, ctx.compute()));
  DDP_CUDA_CHECK(cudaStreamSynchronize(ctx.compute()));  // a fault of the run's own shows here
  if (back != ones) return "its engine does not add into its output (beta 1): it overwrote it";
  return "";
}

}  // namespace

struct GraphConv::Impl {
  OpGraph graph;
  Engine engine;
  float beta = 0;
};

GraphConv::GraphConv(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GraphConv::~GraphConv() = default;
size_t GraphConv::workspace() const { return impl_->engine.workspace; }
float GraphConv::beta() const { return impl_->beta; }

namespace {

// Without --cudnn-benchmark: the first usable deterministic engine in the
// heuristics' order, else (not under --deterministic) the first usable one;
// -1 where none may run.
int untimed_choice(const std::vector<Engine>& es, bool deterministic) {
  std::vector<ConvAlgoCandidate> ranked;
  for (const Engine& e : es) ranked.push_back(e.candidate);
  const ConvAlgoChoice c = choose_conv_algo(ranked);
  return (c.deterministic || !deterministic) ? c.index : -1;
}

// ": 3 convert their inputs to a narrower type, ...": why the engines es
// hold (from the fallback list too, or not) may not run, counted
// (engine_refusals); "" where none was refused.
std::string refusals(const std::vector<Engine>& es, bool deterministic, bool fallback_too) {
  std::vector<EngineRefusal> r;
  for (const Engine& e : es)
    if (fallback_too || !e.fallback)
      r.push_back(e.refusal == EngineRefusal::kNone && deterministic && !e.candidate.deterministic
                      ? EngineRefusal::kNondeterministic
                      : e.refusal);
  const std::string counted = engine_refusals(r);
  return counted.empty() ? "" : ": " + counted;
}

// GraphConv::make's work: the graph, its engines, the choice; nullptr (and
// *why) where no engine may run it.
std::unique_ptr<GraphConv::Impl> choose_engine(cuda::Context& ctx, ConvDirection d, const ConvGraphSpec& spec,
                                               size_t workspace_cap, std::string* why) {
  auto impl = std::make_unique<GraphConv::Impl>();
  impl->beta = spec.beta;
  const bool deterministic = ctx.deterministic();
  const Target target{ctx.dnn(), nullptr, deterministic};
  if (!make_graph(target, d, spec, &impl->graph, why)) return nullptr;
  std::vector<Engine> es = engines(target, impl->graph, spec.precision, workspace_cap);
  int index = -1;
  if (ctx.benchmark()) {
    // The timed choice by geometry, direction and beta (each its own graph
    // and engine list): a repeated layer is timed once.
    std::vector<int>& cached =
        ctx.timed_algorithms()[detail::concat("graph ", to_string(d), " beta ", spec.beta, ": ", spec.key)];
    if (cached.empty()) {
      const std::vector<TimedAlgo> timed = time_engines(ctx, spec, es);
      for (const size_t i : engines_to_time(ctx, es))
        if (!timed[i].usable) es[i].refusal = EngineRefusal::kTimingFailed;
      cached = {choose_timed_algo(timed, deterministic).index};
    }
    index = cached[0];
  } else {
    index = untimed_choice(es, deterministic);
  }
  if (index < 0 || size_t(index) >= es.size() || !es[size_t(index)].candidate.usable) {
    *why = detail::concat("none of the ", es.size(), " engines offered may run it",
                          deterministic ? " deterministically" : "", refusals(es, deterministic, true),
                          " (Note [graph engines])");
    return nullptr;
  }
  if (!ctx.benchmark() || spec.beta != 0.0f) {
    *why = trial_run(ctx, d, spec, es[size_t(index)]);
    if (!why->empty()) return nullptr;
  }
  if (es[size_t(index)].fallback)
    ctx.warn_once("graph-fallback-list",
                  detail::concat("the ", to_string(d), " convolution engine chosen for ", spec.key,
                                 " is from cuDNN's fallback list (made to work, not to be fast): none of the ",
                                 std::count_if(es.begin(), es.end(), [](const Engine& e) { return !e.fallback; }),
                                 " its heuristics ranked may run it", refusals(es, deterministic, false),
                                 " (said once)"));
  if (!es[size_t(index)].candidate.deterministic)
    ctx.warn_once("graph-nondeterministic",
                  detail::concat("the ", to_string(d), " convolution engine chosen for ", spec.key,
                                 " is not deterministic, so repeated and resumed runs may differ in the last bits"));
  impl->engine = std::move(es[size_t(index)]);
  return impl;
}

}  // namespace

// A descriptor cuDNN refuses on the way (an attribute this version does not
// take, say) is a reason to fall back, not an error of the run.
std::unique_ptr<GraphConv> GraphConv::make(cuda::Context& ctx, ConvDirection d, const ConvGraphSpec& spec,
                                           size_t workspace_cap, std::string* why) {
  try {
    std::unique_ptr<Impl> impl = choose_engine(ctx, d, spec, workspace_cap, why);
    if (!impl) return nullptr;
    return std::unique_ptr<GraphConv>(new GraphConv(std::move(impl)));
  } catch (const Error& e) {
    *why = e.what();
    // A failed runtime call (cudaMallocAsync out of memory, say) leaves its
    // error behind as the thread's last, where the next kernel launch's
    // check would find it; a sticky error stays whatever is done here.
    (void)cudaGetLastError();
    return nullptr;
  }
}

PlannedEngine plan_graph_engine(const std::string& device_json, ConvDirection d, const ConvGraphSpec& spec,
                                size_t workspace_cap, bool deterministic) {
#if CUDNN_VERSION >= 90800
  Desc device(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
  device.set(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, int64_t(device_json.size() + 1),
             device_json.c_str());
  device.finalize();
  const Target target{nullptr, device.get(), deterministic};
  OpGraph graph;
  std::string why;
  PlannedEngine out;
  if (!make_graph(target, d, spec, &graph, &why)) {
    out.refusals = why;
    return out;
  }
  const std::vector<Engine> es = engines(target, graph, spec.precision, workspace_cap);
  out.offered = es.size();
  const int index = untimed_choice(es, deterministic);
  out.refusals = refusals(es, deterministic, true);
  if (index < 0) return out;
  const Engine& e = es[size_t(index)];
  out.chosen = true;
  out.fallback = e.fallback;
  out.tensor_core = e.notes.tensor_core;
  out.deterministic = e.candidate.deterministic;
  out.engine = engine_index(e.config);
  out.workspace = e.workspace;
  return out;
#else
  (void)device_json, (void)d, (void)spec, (void)workspace_cap, (void)deterministic;
  DDP_FAIL("planning for a described device needs cuDNN 9.8 or later");
#endif
}

void GraphConv::run(cuda::Context& ctx, const void* x, const void* w, const void* y) const {
  void* ws = ctx.workspace(impl_->engine.workspace);
  const cudnnStatus_t st = execute(ctx, impl_->engine.plan, x, w, y, ws);
  if (st != CUDNN_STATUS_SUCCESS) DDP_FAIL("cuDNN graph execution: ", cudnnGetErrorString(st));
}

}  // namespace ddp::nn
