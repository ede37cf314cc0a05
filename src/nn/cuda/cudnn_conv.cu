// The cuDNN convolution under CudaConv and CudaConvReluPool: descriptors
// made once, algorithms chosen once per batch size.
//
// Note [fma math]: in fp32 the convolution descriptor asks for
// CUDNN_FMA_MATH, not CUDNN_DEFAULT_MATH: on Ampere and newer the default lets
// cuDNN run fp32 convolutions as TF32 on tensor cores (inputs rounded to
// 10-bit mantissas, errors near 1e-3), where PyTorch's default
// (cudnn.allow_tf32) does. --precision tf32 asks for exactly that (Note
// [tf32] in nn/precision.hpp): CUDNN_DEFAULT_MATH, tensor-core algorithms
// among the candidates. The
// cuBLAS handle is pinned to fp32 the same way (CUBLAS_PEDANTIC_MATH,
// cuda_context.cu). cuDNN's transform algorithms (FFT, Winograd) still round
// more than a plain sum: on an H200 (2026-11-26) forward and dx agreed with the
// CPU layers to 1e-4, and LeNet's conv2 weight gradient at batch 64 to 1.2e-3
// of its largest (tests/unit/cuda/nn_layers_test.cpp).
//
// The algorithms: Note [conv algorithms] (nn/cuda/conv_algo.hpp), or with
// --cudnn-benchmark Note [measured algorithms], once per batch size (a run
// sees few: the training batch, a last partial batch), so steady-state
// steps never ask again.
//
// With --channels-last (Note [channels last], nn/layout.hpp) x, y and their
// gradients are NHWC and cuDNN takes a KRSC copy of the weights.
//
// In bf16 or fp16 (Note [half kernels], nn/cuda/half.cu) the tensors are 16-bit,
// the convolution accumulates in fp32 (cuDNN's PSEUDO_HALF and
// PSEUDO_BFLOAT16 configurations), and tensor cores may run it: that is
// what the 16-bit formats are for, and what autocast runs.
#include <algorithm>
#include <string>
#include <vector>

#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/core/error.hpp"           // DDP_CHECK, DDP_FAIL, ddp::Error, detail::concat
#include "ddp/nn/cuda/conv_algo.hpp"         // choose_conv_algo: Note [conv algorithms]
#include "ddp/nn/cuda/bn_plan.hpp"           // max_sum_runs: Note [batch norm sums]
#include "ddp/nn/cuda/cudnn_graph.hpp"       // GraphConv: Note [graph engines]
#include "ddp/runtime/cuda_check.hpp"   // DDP_CUDNN_CHECK

namespace ddp::nn {

namespace {

// Part k's db[k * stride + ch] += sums[k * c + ch], rounded to float once,
// then to p (a 16-bit bias gradient: channel_grad_from_half_cuda's
// rounding).
__global__ void add_sums_kernel(int c, int parts, const double* __restrict__ sums, Precision p, size_t stride,
                                float* __restrict__ db) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < c * parts; i += gridDim.x * blockDim.x) {
    const int k = i / c;
    db[size_t(k) * stride + size_t(i - k * c)] += round_to(p, float(sums[i]));
  }
}

cudnnTensorFormat_t cudnn_format(Layout l) { return l == Layout::NHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW; }

// Note [fma math] in fp32, TF32 tensor cores allowed in tf32; tensor cores
// in 16 bits.
cudnnMathType_t default_math(Precision p) {
  if (p == Precision::F32) return CUDNN_FMA_MATH;
  return p == Precision::TF32 ? CUDNN_DEFAULT_MATH : CUDNN_TENSOR_OP_MATH;
}

// The algorithm to run (Note [conv algorithms]); the fallback to a
// non-deterministic one is said once per rank, and refused under
// --deterministic (the caller's error names the layer). In fp32 tensor-core
// algorithms are out (Note [fma math]); in TF32 and 16 bits they are what is
// wanted.
// Whether an algorithm cuDNN ranked or timed may run: it works, fits the
// workspace cap, and in fp32 is not a tensor-op one (Note [fma math]).
template <typename Perf>
bool usable(const Perf& p, Precision prec) {
  const bool tensor_ops = p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
  return p.status == CUDNN_STATUS_SUCCESS && p.memory <= kConvWorkspaceCap && (prec != Precision::F32 || !tensor_ops);
}

template <typename Perf>
const Perf& pick(cuda::Context& ctx, const std::string& layer, const std::vector<Perf>& perf, int count,
                 const char* what, Precision prec) {
  std::vector<ConvAlgoCandidate> ranked(size_t(std::max(count, 0)));
  for (size_t i = 0; i < ranked.size(); ++i) {
    ranked[i].usable = usable(perf[i], prec);
    ranked[i].deterministic = perf[i].determinism == CUDNN_DETERMINISTIC;
  }
  const ConvAlgoChoice choice = choose_conv_algo(ranked);
  if (choice.index < 0)
    DDP_FAIL("cuDNN offers no ", to_string(prec), " ", what, " algorithm within ", kConvWorkspaceCap >> 20,
             " MiB of workspace for this geometry (", count, " candidates)");
  const Perf& p = perf[size_t(choice.index)];
  if (!choice.deterministic && ctx.deterministic())
    DDP_FAIL("--deterministic: cuDNN offers no deterministic ", to_string(prec), " ", what,
             " algorithm for this geometry (", count, " candidates); the only one that fits, algorithm ",
             int(p.algo), ", may add in another order from run to run");
  if (!choice.deterministic)
    ctx.warn_once("cudnn-nondeterministic",
                  detail::concat("op ", layer, ": cuDNN has no deterministic ", what,
                                 " algorithm for this geometry; running algorithm ", int(p.algo),
                                 ", so repeated and resumed runs may differ in the last bits"));
  return p;
}

}  // namespace

struct CudnnConv::Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnConvolutionFwdAlgo_t fwd{};
  cudnnConvolutionBwdDataAlgo_t bwd_data{};
  cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
  // Each algorithm's math type, which the convolution descriptor must carry
  // when it runs (cuDNN tells a tensor-core algorithm by both; run_math).
  cudnnMathType_t fwd_math{}, bwd_data_math{}, bwd_filter_math{};
  size_t fwd_bytes = 0, bwd_data_bytes = 0, bwd_filter_bytes = 0;
  // Whether the legacy API has algorithms for it: with --gpu-kernels proven
  // it may have none where the graph API runs every direction.
  bool legacy = true;
  // --gpu-kernels proven: each direction through cuDNN's graph API where an
  // engine may run it (Note [graph engines]); nullptr: the legacy call.
  std::unique_ptr<GraphConv> graph_fwd, graph_data, graph_filter;
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
  }
};

CudnnConv::CudnnConv(const std::string& op, Shape in, int out_c, int k, int stride, int pad, Shape out, Layout layout)
    : layer_(op), in_(in), out_(out), k_(k), stride_(stride), pad_(pad), layout_(layout) {
  DDP_CHECK(out.c == out_c, "op ", layer_, ": conv output ", to_string(out), " for ", out_c, " channels");
  describe();
}

CudnnConv::~CudnnConv() { release(); }

void CudnnConv::describe() {
  const cudnnDataType_t type = cudnn_data_type(precision_);
  try {
    DDP_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_desc_));
    // [out_c, in_c, k, k], PyTorch's weight layout, or with NHWC data the
    // KRSC copy (cuDNN's NHWC filter format).
    DDP_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_desc_, type, cudnn_format(layout_), out_.c, in_.c, k_, k_));
    DDP_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv_desc_));
    // fp32 accumulation in every precision (autocast's).
    DDP_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv_desc_, pad_, pad_, stride_, stride_, 1, 1,
                                                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DDP_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_, default_math(precision_)));
    DDP_CUDNN_CHECK(cudnnCreateTensorDescriptor(&bias_desc_));
    DDP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(bias_desc_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, out_.c, 1, 1));
  } catch (const Error& e) {
    release();  // the destructor does not run for a constructor that throws
    DDP_FAIL("op ", layer_, ": ", to_string(precision_), ": ", e.what());
  }
}

void CudnnConv::set_precision(Precision p) {
  if (p == precision_) return;
  release();  // the plans too: their tensors and algorithms are of one type
  precision_ = p;
  describe();
}

void CudnnConv::release() {
  plans_.clear();
  if (bias_desc_) cudnnDestroyTensorDescriptor(bias_desc_);
  if (conv_desc_) cudnnDestroyConvolutionDescriptor(conv_desc_);
  if (w_desc_) cudnnDestroyFilterDescriptor(w_desc_);
  bias_desc_ = nullptr;
  conv_desc_ = nullptr;
  w_desc_ = nullptr;
}

// The math type an algorithm runs with: in TF32 and 16 bits the one cuDNN
// ranked it with; in fp32 always CUDNN_FMA_MATH, never CUDNN_DEFAULT_MATH,
// which would let an Ampere or newer GPU run it as TF32 (Note [fma math]).
cudnnMathType_t CudnnConv::run_math(cudnnMathType_t ranked) const {
  return precision_ == Precision::F32 ? CUDNN_FMA_MATH : ranked;
}

CudnnConv::Plan& CudnnConv::plan(cuda::Context& ctx, int batch) {
  auto it = plans_.find(batch);
  if (it != plans_.end()) return *it->second;
  DDP_CHECK(batch > 0, "batch ", batch);
  // Making a plan times, tries and synchronises, which a captured step may
  // not; a step is captured only after it ran as issued (Note [step graphs]).
  DDP_CHECK(!ctx.capturing(), "a plan for batch ", batch, " made while the step is captured as a CUDA graph");
  auto p = std::make_unique<Plan>();
  const cudnnDataType_t type = cudnn_data_type(precision_);
  DDP_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->x));
  DDP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->x, cudnn_format(layout_), type, batch, in_.c, in_.h, in_.w));
  DDP_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->y));
  DDP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->y, cudnn_format(layout_), type, batch, out_.c, out_.h, out_.w));
  int n = 0, c = 0, h = 0, w = 0;
  DDP_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv_desc_, p->x, w_desc_, &n, &c, &h, &w));
  DDP_CHECK(n == batch && c == out_.c && h == out_.h && w == out_.w, "cuDNN's conv output ", c, "x", h, "x", w,
            " is not the layer's ", to_string(out_));

  if (ctx.next(NextKernel::GraphConv)) graph_plans(ctx, *p, batch);
  try {
    legacy_plan(ctx, *p, batch);
  } catch (const Error& e) {
    // Where the graph API runs every direction, the legacy API is only the
    // fallback for operands off its alignment (graph_fits).
    if (!p->graph_fwd || !p->graph_data || !p->graph_filter) {
      // The legacy API's NHWC algorithms are fewer than its NCHW ones.
      if (layout_ == Layout::NHWC)
        DDP_FAIL("op ", layer_, ": ", e.what(),
                 " (--channels-last: run without it, or without leaving graph-conv, cuDNN's graph API, out of "
                 "--gpu-kernels)");
      throw;
    }
    p->legacy = false;
    ctx.warn_once("legacy-none " + plan_key(ctx, batch),
                  detail::concat("op ", layer_, ": ", e.what(), "; cuDNN's graph API runs it"));
  }
  // 16-bit operands are copies in staging, whose pieces are aligned.
  if (p->legacy && ctx.deterministic() && !is_half(precision_) &&
      !graph_slices_aligned(batch, in_.numel(), out_.numel(), int64_t(sizeof(float))) &&
      (p->graph_fwd || p->graph_data || p->graph_filter)) {
    p->graph_fwd.reset();
    p->graph_data.reset();
    p->graph_filter.reset();
    ctx.warn_once("graph-shards " + plan_key(ctx, batch),
                  detail::concat("op ", layer_, ": --deterministic: calls of ", batch, " samples are not all ",
                                 kGraphAlignment, "-byte aligned where a buffer holds several, so the legacy "
                                 "convolution call runs every one (the same algorithm wherever a micro-shard sits)"));
  }
  // Grow the shared workspace now, the one step that may wait for the device,
  // rather than inside a later forward or backward.
  size_t bytes = std::max({p->fwd_bytes, p->bwd_data_bytes, p->bwd_filter_bytes});
  for (const auto* g : {p->graph_fwd.get(), p->graph_data.get(), p->graph_filter.get()})
    if (g) bytes = std::max(bytes, g->workspace());
  ctx.workspace(bytes);
  if (p->graph_filter && p->graph_filter->beta() == 0.0f && !is_half(precision_) && layout_ == Layout::NCHW)
    ctx.staging(staging_bytes({size_t(weight_numel()) * sizeof(float)}));  // backward_filter_add's
  Plan& ref = *p;
  plans_[batch] = std::move(p);
  return ref;
}

std::string CudnnConv::plan_key(const cuda::Context& ctx, int batch) const {
  return conv_plan_key(in_, out_.c, k_, stride_, pad_, batch, precision_, layout_, ctx.deterministic());
}

// The legacy API's algorithms (Note [conv algorithms], or timed: Note
// [measured algorithms]) and their workspaces.
void CudnnConv::legacy_plan(cuda::Context& ctx, Plan& p, int batch) {
  if (ctx.benchmark())
    time_algorithms(ctx, p, batch);
  else
    rank_algorithms(ctx, p);
  cudnnHandle_t dnn = ctx.dnn();
  DDP_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_, p.fwd_math));
  DDP_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(dnn, p.x, w_desc_, conv_desc_, p.y, p.fwd, &p.fwd_bytes));
  DDP_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_, p.bwd_data_math));
  DDP_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(dnn, w_desc_, p.y, conv_desc_, p.x, p.bwd_data,
                                                               &p.bwd_data_bytes));
  DDP_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_, p.bwd_filter_math));
  DDP_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn, p.x, p.y, conv_desc_, w_desc_, p.bwd_filter,
                                                                 &p.bwd_filter_bytes));
}

void CudnnConv::rank_algorithms(cuda::Context& ctx, Plan& p) {
  cudnnHandle_t dnn = ctx.dnn();
  int max_count = 0, count = 0;
  DDP_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(dnn, &max_count));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> fwd(size_t(std::max(max_count, 1)));
  // Each query sees the precision's own math type (tensor cores offered in 16
  // bits), whatever the previous algorithm left on the descriptor.
  DDP_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_, default_math(precision_)));
  DDP_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(dnn, p.x, w_desc_, conv_desc_, p.y, int(fwd.size()),
                                                         &count, fwd.data()));
  const cudnnConvolutionFwdAlgoPerf_t& f = pick(ctx, layer_, fwd, count, "forward", precision_);
  p.fwd = f.algo;
  p.fwd_math = run_math(f.mathType);

  DDP_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(dnn, &max_count));
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> bwd_data(size_t(std::max(max_count, 1)));
  DDP_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_, default_math(precision_)));
  DDP_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(dnn, w_desc_, p.y, conv_desc_, p.x,
                                                              int(bwd_data.size()), &count, bwd_data.data()));
  const cudnnConvolutionBwdDataAlgoPerf_t& d = pick(ctx, layer_, bwd_data, count, "backward-data", precision_);
  p.bwd_data = d.algo;
  p.bwd_data_math = run_math(d.mathType);

  DDP_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(dnn, &max_count));
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> bwd_filter(size_t(std::max(max_count, 1)));
  DDP_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_, default_math(precision_)));
  DDP_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(dnn, p.x, p.y, conv_desc_, w_desc_,
                                                                int(bwd_filter.size()), &count, bwd_filter.data()));
  const cudnnConvolutionBwdFilterAlgoPerf_t& wf =
      pick(ctx, layer_, bwd_filter, count, "backward-filter", precision_);
  p.bwd_filter = wf.algo;
  p.bwd_filter_math = run_math(wf.mathType);
}

// Note [measured algorithms]: each direction's candidates run on scratch
// operands of the plan's shapes (cuDNN times them), the choice kept in the
// context by geometry, so a layer of a geometry timed before takes its
// choice without running anything.
void CudnnConv::time_algorithms(cuda::Context& ctx, Plan& p, int batch) {
  const std::string key = plan_key(ctx, batch);
  std::vector<int>& timed = ctx.timed_algorithms()[key];
  if (timed.empty()) {
    const size_t elem = is_half(precision_) ? 2 : 4;
    const size_t nx = size_t(batch) * size_t(in_.numel()) * elem, ny = size_t(batch) * size_t(out_.numel()) * elem,
                 nw = size_t(weight_numel()) * elem;
    cudnnHandle_t dnn = ctx.dnn();
    // Scratch given back however the timing ends.
    const auto scratch = [&](size_t bytes) { return cuda::DeviceBuffer(ctx, cuda::DeviceBuffer::floats_for(bytes)); };
    const cuda::DeviceBuffer xb = scratch(nx), yb = scratch(ny), wb = scratch(nw), wsb = scratch(kConvWorkspaceCap);
    void *x = xb.data(), *y = yb.data(), *w = wb.data(), *ws = wsb.data();
    const bool deterministic = ctx.deterministic();
    auto choose = [&](const auto& perf, int count, const char* what) {
      std::vector<TimedAlgo> t(size_t(std::max(count, 0)));
      for (size_t i = 0; i < t.size(); ++i)
        t[i] = {usable(perf[i], precision_), perf[i].determinism == CUDNN_DETERMINISTIC, perf[i].time};
      const TimedChoice c = choose_timed_algo(t, deterministic);
      if (c.index < 0)
        DDP_FAIL(deterministic ? "--deterministic: " : "", "cuDNN ran no usable ",
                 deterministic ? "deterministic " : "", to_string(precision_), " ", what, " algorithm within ",
                 kConvWorkspaceCap >> 20, " MiB of workspace for this geometry (", count, " candidates timed)");
      if (!c.deterministic)
        ctx.warn_once("cudnn-timed-nondeterministic",
                      detail::concat("op ", layer_, ": the fastest ", what, " algorithm (", int(perf[c.index].algo),
                                     ") is not deterministic and no deterministic one is within ",
                                     int(kDeterministicSlack * 100), "% of it, so repeated and resumed runs may "
                                     "differ in the last bits (--deterministic takes deterministic ones only)"));
      return size_t(c.index);
    };
    int count = 0;
    cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    DDP_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_, default_math(precision_)));
    DDP_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(dnn, p.x, x, w_desc_, w, conv_desc_, p.y, y,
                                                           CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, fwd, ws,
                                                           kConvWorkspaceCap));
    const size_t f = choose(fwd, count, "forward");
    // Backward data writes x's scratch, backward filter w's: nothing kept.
    cudnnConvolutionBwdDataAlgoPerf_t bwd_data[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    DDP_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_, default_math(precision_)));
    DDP_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(dnn, w_desc_, w, p.y, y, conv_desc_, p.x, x,
                                                                CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count,
                                                                bwd_data, ws, kConvWorkspaceCap));
    const size_t d = choose(bwd_data, count, "backward-data");
    cudnnConvolutionBwdFilterAlgoPerf_t bwd_filter[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    DDP_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_, default_math(precision_)));
    DDP_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(dnn, p.x, x, p.y, y, conv_desc_, w_desc_, w,
                                                                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count,
                                                                  bwd_filter, ws, kConvWorkspaceCap));
    const size_t wf = choose(bwd_filter, count, "backward-filter");
    timed = {int(fwd[f].algo),         int(run_math(fwd[f].mathType)),
             int(bwd_data[d].algo),    int(run_math(bwd_data[d].mathType)),
             int(bwd_filter[wf].algo), int(run_math(bwd_filter[wf].mathType))};
  }
  p.fwd = cudnnConvolutionFwdAlgo_t(timed[0]);
  p.fwd_math = cudnnMathType_t(timed[1]);
  p.bwd_data = cudnnConvolutionBwdDataAlgo_t(timed[2]);
  p.bwd_data_math = cudnnMathType_t(timed[3]);
  p.bwd_filter = cudnnConvolutionBwdFilterAlgo_t(timed[4]);
  p.bwd_filter_math = cudnnMathType_t(timed[5]);
}

// Note [graph engines]: the three directions as graphs, each falling back,
// said once, to the legacy call where no engine may run it. Backward filter
// adds into fp32 NCHW gradients (beta 1) and writes 16-bit and KRSC ones
// (beta 0), as the legacy calls below do.
void CudnnConv::graph_plans(cuda::Context& ctx, Plan& p, int batch) {
  ConvGraphSpec spec;
  spec.shapes = conv_graph_shapes(in_, out_, k_, batch, layout_);
  spec.precision = precision_;
  spec.pad = pad_;
  spec.stride = stride_;
  spec.key = plan_key(ctx, batch);
  // Each direction with the first of its betas that an engine runs.
  auto make = [&](ConvDirection d, std::initializer_list<float> betas) {
    std::string why;
    std::unique_ptr<GraphConv> g;
    for (const float beta : betas) {
      spec.beta = beta;
      g = GraphConv::make(ctx, d, spec, kConvWorkspaceCap, &why);
      if (g) return g;
    }
    ctx.warn_once(detail::concat("graph-fallback ", spec.key, " ", to_string(d)),
                  detail::concat("op ", layer_, ": ", to_string(d), " convolution through cuDNN's graph API: ", why,
                                 "; the legacy call runs it"));
    return g;
  };
  p.graph_fwd = make(ConvDirection::kForward, {0.0f});
  p.graph_data = make(ConvDirection::kBackwardData, {0.0f});
  // fp32 NCHW adds the weight gradient in place (beta 1) where an engine
  // takes that, else writes it to staging (beta 0, as cuDNN's own frontend
  // always does) and adds it: backward_filter_add.
  p.graph_filter = make(ConvDirection::kBackwardFilter, is_half(precision_) || layout_ == Layout::NHWC
                                                            ? std::initializer_list<float>{0.0f}
                                                            : std::initializer_list<float>{1.0f, 0.0f});
}

void CudnnConv::backward_filter_add(cuda::Context& ctx, const Plan& p, const float* x, const float* dy, float* dw) {
  const GraphConv* g = p.graph_filter.get();
  if (g && g->beta() == 0.0f) {
    void* tmp = staging_pieces(ctx, {size_t(weight_numel()) * sizeof(float)})[0];
    if (graph_fits(ctx, g, {x, dy, tmp})) {
      g->run(ctx, x, tmp, dy);
      return add_rounded_cuda(dw, static_cast<const float*>(tmp), weight_numel(), precision_, ctx.compute());
    }
  }
  run_backward_filter(ctx, p, x, dy, 1.0f, dw);
}

// Whether a graph may run on these operands (Note [graph engines]): the
// alignment it promised cuDNN; otherwise the legacy call, said once.
bool CudnnConv::graph_fits(cuda::Context& ctx, const GraphConv* g, std::initializer_list<const void*> operands) const {
  if (!g) return false;
  for (const void* o : operands)
    if (!graph_aligned(o)) {
      ctx.warn_once("graph-alignment", detail::concat("op ", layer_, ": an operand is not ", kGraphAlignment,
                                                      "-byte aligned, so the legacy convolution call runs it"));
      return false;
    }
  return true;
}

void CudnnConv::run_forward(cuda::Context& ctx, const Plan& p, const void* x, const void* w, void* y) {
  if (graph_fits(ctx, p.graph_fwd.get(), {x, w, y})) return p.graph_fwd->run(ctx, x, w, y);
  DDP_CHECK(p.legacy, "cuDNN's legacy API has no forward algorithm for this geometry");
  const float one = 1.0f, zero = 0.0f;  // float in every precision (fp32 accumulation)
  void* ws = ctx.workspace(p.fwd_bytes);
  DDP_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_, p.fwd_math));
  DDP_CUDNN_CHECK(cudnnConvolutionForward(ctx.dnn(), &one, p.x, x, w_desc_, w, conv_desc_, p.fwd, ws, p.fwd_bytes,
                                          &zero, p.y, y));
}

void CudnnConv::run_backward_filter(cuda::Context& ctx, const Plan& p, const void* x, const void* dy, float beta,
                                    void* dw) {
  if (graph_fits(ctx, p.graph_filter.get(), {x, dy, dw}) && p.graph_filter->beta() == beta)
    return p.graph_filter->run(ctx, x, dw, dy);
  DDP_CHECK(p.legacy, "cuDNN's legacy API has no backward-filter algorithm for this geometry");
  const float one = 1.0f;
  void* ws = ctx.workspace(p.bwd_filter_bytes);
  DDP_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_, p.bwd_filter_math));
  DDP_CUDNN_CHECK(cudnnConvolutionBackwardFilter(ctx.dnn(), &one, p.x, x, p.y, dy, conv_desc_, p.bwd_filter, ws,
                                                 p.bwd_filter_bytes, &beta, w_desc_, dw));
}

void CudnnConv::run_backward_data(cuda::Context& ctx, const Plan& p, const void* w, const void* dy, void* dx) {
  if (graph_fits(ctx, p.graph_data.get(), {w, dy, dx})) return p.graph_data->run(ctx, dx, w, dy);
  DDP_CHECK(p.legacy, "cuDNN's legacy API has no backward-data algorithm for this geometry");
  // beta = 0 overwrites dx without reading it.
  const float one = 1.0f, zero = 0.0f;
  void* ws = ctx.workspace(p.bwd_data_bytes);
  DDP_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_, p.bwd_data_math));
  DDP_CUDNN_CHECK(cudnnConvolutionBackwardData(ctx.dnn(), &one, w_desc_, w, p.y, dy, conv_desc_, p.bwd_data, ws,
                                               p.bwd_data_bytes, &zero, p.x, dx));
}

void CudnnConv::forward(cuda::Context& ctx, int batch, const float* x, const float* w, const float* b, float* y) {
  try {
    if (is_half(precision_)) return forward_half(ctx, batch, x, w, b, y);
    if (layout_ == Layout::NHWC) return forward_nhwc(ctx, batch, x, w, b, y);
    const Plan& p = plan(ctx, batch);
    run_forward(ctx, p, x, w, y);
    // y += b, broadcast over batch and pixels (bias_desc_ is 1 x C x 1 x 1).
    const float one = 1.0f;
    if (b) DDP_CUDNN_CHECK(cudnnAddTensor(ctx.dnn(), &one, bias_desc_, b, &one, p.y, y));
  } catch (const Error& e) {
    DDP_FAIL("op ", layer_, ": forward: ", e.what());
  }
}

void CudnnConv::backward(cuda::Context& ctx, int batch, const float* x, const float* w, const float* dy, float* dw,
                         float* db, float* dx) {
  try {
    if (is_half(precision_)) return backward_half(ctx, batch, x, w, dy, dw, db, dx);
    if (layout_ == Layout::NHWC) return backward_nhwc(ctx, batch, x, w, dy, dw, db, dx);
    const Plan& p = plan(ctx, batch);
    // beta = 1 adds into the gradients (Note [gradient accumulation]).
    const float one = 1.0f;
    if (db && bias_by_sums(ctx))
      bias_grad(ctx, batch, dy, db);
    else if (db)
      DDP_CUDNN_CHECK(cudnnConvolutionBackwardBias(ctx.dnn(), &one, p.y, dy, &one, bias_desc_, db));
    if (dw) backward_filter_add(ctx, p, x, dy, dw);
    if (dx) run_backward_data(ctx, p, w, dy, dx);
  } catch (const Error& e) {
    DDP_FAIL("op ", layer_, ": backward: ", e.what());
  }
}

// --gpu-kernels proven: the bias's gradient as BatchNorm's sums are taken
// (Note [batch norm sums]: many blocks a channel, in double, the same bits
// every call), where cuDNN's bias pass took 6% of ResNet-18's fp32 step on
// an H100 (2026-11-26).
// NHWC: Note [channels last sums]. In 16 bits dy is the rounded 16-bit
// gradient, and its sum is rounded once to the precision, as
// channel_grad_from_half_cuda's (16-bit NCHW's bias gradient with
// --gpu-kernels reference: one block a channel).
void CudnnConv::bias_grad(cuda::Context& ctx, int images, const void* dy, float* db, int parts, size_t stride) {
  const int c = out_.c, hw = out_.h * out_.w;
  const size_t runs = size_t(max_sum_runs(c, ctx.sms()));
  // Each part's runs of each channel, then its c sums, in doubles: two floats each.
  bias_sums_.reserve(ctx, 2 * size_t(c) * (runs + 1) * size_t(parts));
  auto* partial = reinterpret_cast<double*>(bias_sums_.data());
  double* sums = partial + size_t(c) * runs * size_t(parts);
  const int64_t rows = int64_t(images) * hw;
  DDP_CHECK(!is_half(precision_) || parts == 1, "op ", layer_, ": a 16-bit bias gradient is summed one batch a call");
  if (is_half(precision_) && layout_ == Layout::NHWC)
    channel_sums_nhwc_half_cuda(ctx, static_cast<const uint16_t*>(dy), precision_, rows, c, partial, sums);
  else if (is_half(precision_))
    channel_sums_half_cuda(ctx, static_cast<const uint16_t*>(dy), precision_, images, c, hw, partial, sums);
  else if (layout_ == Layout::NHWC)
    channel_sums_nhwc_cuda(ctx, static_cast<const float*>(dy), /*mean=*/nullptr, rows, c, partial, sums, parts);
  else
    channel_sums_cuda(ctx, static_cast<const float*>(dy), /*mean=*/nullptr, images, c, hw, partial, sums, parts);
  add_bias_sums(ctx, sums, db, parts, stride);
}

void CudnnConv::add_bias_sums(cuda::Context& ctx, const double* sums, float* db, int parts, size_t stride) const {
  const int c = out_.c;
  add_sums_kernel<<<cuda_grid(int64_t(c) * parts), kCudaThreads, 0, ctx.compute()>>>(c, parts, sums, precision_,
                                                                                      stride, db);
  DDP_CUDA_CHECK_LAUNCH(add_sums_kernel);
}

bool CudnnConv::bias_grads_of_parts(cuda::Context& ctx, int images, int parts, const float* dy, float* db,
                                    size_t stride) {
  // Where backward sums the bias with bias_grad, in fp32 and TF32.
  if (is_half(precision_) || !bias_by_sums(ctx) || parts <= 0) return false;
  bias_grad(ctx, images, dy, db, parts, stride);
  return true;
}

// Note [channels last]: cuDNN on the KRSC copy of the weights, the weight
// gradient written KRSC (beta 0) and added into the KCRS one.
void CudnnConv::forward_nhwc(cuda::Context& ctx, int batch, const float* x, const float* w, const float* b,
                             float* y) {
  const Plan& p = plan(ctx, batch);
  const std::vector<void*> at = forward_staging(ctx, batch);
  weights_for_cudnn(ctx, w, at[0]);
  run_forward(ctx, p, x, at[0], y);
  if (b) add_channel_bias_cuda(y, b, int64_t(batch) * out_.numel(), out_.c, ctx.compute());
}

void CudnnConv::backward_nhwc(cuda::Context& ctx, int batch, const float* x, const float* w, const float* dy,
                              float* dw, float* db, float* dx) {
  const Plan& p = plan(ctx, batch);
  const std::vector<void*> at = staging_pieces(ctx, backward_pieces(batch));
  if (db) bias_grad(ctx, batch, dy, db);
  if (dw) {
    run_backward_filter(ctx, p, x, dy, 0.0f, at[1]);
    add_weight_grad(ctx, at[1], dw);
  }
  if (dx) {
    weights_for_cudnn(ctx, w, at[0]);
    run_backward_data(ctx, p, at[0], dy, dx);
  }
}

// Note [half kernels] (nn/cuda/half.cu): the operands as 16-bit copies in the
// context's staging memory, cuDNN on those, the results back in fp32.
// x, w, y; d(y), x, w, d(w), d(x): each 16 bits a value (w and d(w) KRSC in
// NHWC). In fp32 NHWC: w; w and d(w), KRSC floats.
std::vector<size_t> CudnnConv::forward_pieces(int batch) const {
  const size_t nx = size_t(batch) * size_t(in_.numel()), ny = size_t(batch) * size_t(out_.numel()),
               nw = size_t(weight_numel());
  if (is_half(precision_)) return {nx * 2, nw * 2, ny * 2};
  if (layout_ == Layout::NHWC) return {nw * 4};
  return {};
}

std::vector<size_t> CudnnConv::backward_pieces(int batch) const {
  const size_t nx = size_t(batch) * size_t(in_.numel()), ny = size_t(batch) * size_t(out_.numel()),
               nw = size_t(weight_numel());
  if (is_half(precision_)) return {ny * 2, nx * 2, nw * 2, nw * 2, nx * 2};
  if (layout_ == Layout::NHWC) return {nw * 4, nw * 4};
  return {};
}

// The forward's staging pieces, the memory sized for the backward's first
// (staging_pieces: growing it may wait for the device, which backward must
// not).
std::vector<void*> CudnnConv::forward_staging(cuda::Context& ctx, int batch) const {
  ctx.staging(staging_bytes(backward_pieces(batch)));
  return staging_pieces(ctx, forward_pieces(batch));
}

// The weights as cuDNN takes them where they are not w itself: with NHWC
// data a KRSC copy in the precision's type, else a 16-bit copy.
void CudnnConv::weights_for_cudnn(cuda::Context& ctx, const float* w, void* dst) const {
  if (layout_ == Layout::NHWC)
    weights_to_krsc_cuda(dst, w, out_.c, in_.c, k_ * k_, precision_, ctx.compute());
  else
    to_half_cuda(static_cast<uint16_t*>(dst), w, weight_numel(), precision_, ctx.compute());
}

// dw += the weight gradient cuDNN wrote into src, the inverse of
// weights_for_cudnn.
void CudnnConv::add_weight_grad(cuda::Context& ctx, const void* src, float* dw) const {
  if (layout_ == Layout::NHWC)
    add_weights_from_krsc_cuda(dw, src, out_.c, in_.c, k_ * k_, precision_, ctx.compute());
  else
    from_half_cuda(dw, static_cast<const uint16_t*>(src), weight_numel(), precision_, /*add=*/true, ctx.compute());
}

// x and w as 16-bit copies into the forward's staging pieces at (x into
// xh where given), convolved into yh (16 bits, no bias). The plan comes
// first: making it may use the staging memory.
void CudnnConv::convolve_half(cuda::Context& ctx, const Plan& p, int batch, const float* x, const float* w,
                              const std::vector<void*>& at, uint16_t* yh, uint16_t* xh) {
  if (!xh) xh = static_cast<uint16_t*>(at[0]);
  auto* wh = static_cast<uint16_t*>(at[1]);
  to_half_cuda(xh, x, int64_t(batch) * in_.numel(), precision_, ctx.compute());
  weights_for_cudnn(ctx, w, wh);
  run_forward(ctx, p, xh, wh, yh);
}

void CudnnConv::forward_half(cuda::Context& ctx, int batch, const float* x, const float* w, const float* b,
                             float* y) {
  const Plan& p = plan(ctx, batch);
  const std::vector<void*> at = forward_staging(ctx, batch);
  auto* yh = static_cast<uint16_t*>(at[2]);
  convolve_half(ctx, p, batch, x, w, at, yh);
  // NHWC: channel i % c, as NCHW of one pixel a plane.
  const int64_t hw = int64_t(out_.h) * out_.w;
  if (layout_ == Layout::NHWC)
    planes_from_half_cuda(y, yh, b, batch * hw, out_.c, 1, precision_, ctx.compute());
  else
    planes_from_half_cuda(y, yh, b, batch, out_.c, hw, precision_, ctx.compute());
}

void CudnnConv::forward_to_half(cuda::Context& ctx, int batch, const float* x, const float* w, uint16_t* yh,
                                uint16_t* xh) {
  try {
    DDP_CHECK(is_half(precision_), "a 16-bit output in ", to_string(precision_));
    const Plan& p = plan(ctx, batch);
    convolve_half(ctx, p, batch, x, w, forward_staging(ctx, batch), yh, xh);
  } catch (const Error& e) {
    DDP_FAIL("op ", layer_, ": forward: ", e.what());
  }
}

void CudnnConv::backward_half(cuda::Context& ctx, int batch, const float* x, const float* w, const float* dy,
                              float* dw, float* db, float* dx) {
  const Plan& p = plan(ctx, batch);
  const std::vector<void*> at = staging_pieces(ctx, backward_pieces(batch));
  auto* dyh = static_cast<uint16_t*>(at[0]);
  to_half_cuda(dyh, dy, int64_t(batch) * out_.numel(), precision_, ctx.compute());
  backward_half_at(ctx, p, batch, x, nullptr, w, dyh, dw, db, dx, at);
}

void CudnnConv::backward_from_half(cuda::Context& ctx, int batch, const float* x, const uint16_t* xh,
                                   const float* w, const uint16_t* dyh, float* dw, float* db, float* dx) {
  try {
    DDP_CHECK(is_half(precision_), "a 16-bit output gradient in ", to_string(precision_));
    const Plan& p = plan(ctx, batch);
    backward_half_at(ctx, p, batch, x, xh, w, dyh, dw, db, dx, staging_pieces(ctx, backward_pieces(batch)));
  } catch (const Error& e) {
    DDP_FAIL("op ", layer_, ": backward: ", e.what());
  }
}

// backward_half from the 16-bit d(y), with the backward's staging pieces at
// (the first, d(y)'s own, not read here), and x's 16-bit copy xh where
// given (else made into at[1]).
void CudnnConv::backward_half_at(cuda::Context& ctx, const Plan& p, int batch, const float* x, const uint16_t* xh,
                                 const float* w, const uint16_t* dyh, float* dw, float* db, float* dx,
                                 const std::vector<void*>& at) {
  const int64_t nx = int64_t(batch) * in_.numel();
  auto* wh = static_cast<uint16_t*>(at[2]);
  auto* dwh = static_cast<uint16_t*>(at[3]);
  auto* dxh = static_cast<uint16_t*>(at[4]);
  cudaStream_t s = ctx.compute();
  if (db && bias_by_sums(ctx))
    bias_grad(ctx, batch, dyh, db);
  else if (db)
    channel_grad_from_half_cuda(db, dyh, batch, out_.c, int64_t(out_.h) * out_.w, precision_, s);
  if (dw) {
    // The 16-bit gradient of this call, then added to the fp32 one.
    if (!xh) {
      to_half_cuda(static_cast<uint16_t*>(at[1]), x, nx, precision_, s);
      xh = static_cast<const uint16_t*>(at[1]);
    }
    run_backward_filter(ctx, p, xh, dyh, 0.0f, dwh);
    add_weight_grad(ctx, dwh, dw);
  }
  if (dx) {
    weights_for_cudnn(ctx, w, wh);
    run_backward_data(ctx, p, wh, dyh, dxh);
    from_half_cuda(dx, dxh, nx, precision_, /*add=*/false, s);
  }
}

}  // namespace ddp::nn
