// The cuDNN convolution under CudaConv and CudaConvReluPool: descriptors
// made once, algorithms chosen once per batch size.
//
// Note [fma math]: the convolution descriptor asks for CUDNN_FMA_MATH, not
// CUDNN_DEFAULT_MATH: on Ampere and newer the default lets cuDNN run fp32
// convolutions as TF32 on tensor cores (inputs rounded to 10-bit mantissas),
// which would break the 1e-4 agreement with the CPU layers. The cuBLAS handle is
// pinned to fp32 the same way (CUBLAS_PEDANTIC_MATH, cuda_context.cu).
//
// The algorithms: Note [conv algorithms] (nn/conv_algo.hpp), once per batch
// size (a run sees few: the training batch, a last partial batch), so
// steady-state steps never ask again.
#include <algorithm>
#include <string>
#include <vector>

#include "cuda_kernels.hpp"
#include "ddp/core/error.hpp"           // DDP_CHECK, DDP_FAIL, ddp::Error, detail::concat
#include "ddp/nn/conv_algo.hpp"         // choose_conv_algo: Note [conv algorithms]
#include "ddp/runtime/cuda_check.hpp"   // DDP_CUDNN_CHECK

namespace ddp::nn {

namespace {

constexpr size_t kMaxWorkspace = size_t(512) << 20;

// The algorithm to run (Note [conv algorithms]); the fallback to a
// non-deterministic one is said once per rank, and refused under
// --deterministic (the caller's error names the layer).
template <typename Perf>
const Perf& pick(cuda::Context& ctx, const std::string& layer, const std::vector<Perf>& perf, int count,
                 const char* what) {
  std::vector<ConvAlgoCandidate> ranked(size_t(std::max(count, 0)));
  for (size_t i = 0; i < ranked.size(); ++i) {
    const Perf& p = perf[i];
    ranked[i].usable = p.status == CUDNN_STATUS_SUCCESS && p.memory <= kMaxWorkspace &&
                       p.mathType != CUDNN_TENSOR_OP_MATH && p.mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    ranked[i].deterministic = p.determinism == CUDNN_DETERMINISTIC;
  }
  const ConvAlgoChoice choice = choose_conv_algo(ranked);
  if (choice.index < 0)
    DDP_FAIL("cuDNN offers no fp32 ", what, " algorithm within ", kMaxWorkspace >> 20,
             " MiB of workspace for this geometry (", count, " candidates)");
  const Perf& p = perf[size_t(choice.index)];
  if (!choice.deterministic && ctx.deterministic())
    DDP_FAIL("--deterministic: cuDNN offers no deterministic fp32 ", what, " algorithm for this geometry (",
             count, " candidates); the only one that fits, algorithm ", int(p.algo),
             ", may add in another order from run to run");
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
  size_t fwd_bytes = 0, bwd_data_bytes = 0, bwd_filter_bytes = 0;
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
  }
};

CudnnConv::CudnnConv(const std::string& op, Shape in, int out_c, int k, int stride, int pad, Shape out)
    : layer_(op), in_(in), out_(out) {
  DDP_CHECK(out.c == out_c, "op ", layer_, ": conv output ", to_string(out), " for ", out_c, " channels");
  try {
    DDP_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w_desc_));
    // [out_c, in_c, k, k], PyTorch's weight layout.
    DDP_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w_desc_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, out_c, in.c, k, k));
    DDP_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv_desc_));
    DDP_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv_desc_, pad, pad, stride, stride, 1, 1,
                                                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DDP_CUDNN_CHECK(cudnnSetConvolutionMathType(conv_desc_, CUDNN_FMA_MATH));  // Note [fma math]
    DDP_CUDNN_CHECK(cudnnCreateTensorDescriptor(&bias_desc_));
    DDP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(bias_desc_, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, out_c, 1, 1));
  } catch (const Error& e) {
    release();  // the destructor does not run for a constructor that throws
    DDP_FAIL("op ", layer_, ": ", e.what());
  }
}

CudnnConv::~CudnnConv() { release(); }

void CudnnConv::release() {
  plans_.clear();
  if (bias_desc_) cudnnDestroyTensorDescriptor(bias_desc_);
  if (conv_desc_) cudnnDestroyConvolutionDescriptor(conv_desc_);
  if (w_desc_) cudnnDestroyFilterDescriptor(w_desc_);
  bias_desc_ = nullptr;
  conv_desc_ = nullptr;
  w_desc_ = nullptr;
}

CudnnConv::Plan& CudnnConv::plan(cuda::Context& ctx, int batch) {
  auto it = plans_.find(batch);
  if (it != plans_.end()) return *it->second;
  DDP_CHECK(batch > 0, "batch ", batch);
  auto p = std::make_unique<Plan>();
  DDP_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->x));
  DDP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, batch, in_.c, in_.h, in_.w));
  DDP_CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->y));
  DDP_CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, batch, out_.c, out_.h, out_.w));
  int n = 0, c = 0, h = 0, w = 0;
  DDP_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv_desc_, p->x, w_desc_, &n, &c, &h, &w));
  DDP_CHECK(n == batch && c == out_.c && h == out_.h && w == out_.w, "cuDNN's conv output ", c, "x", h, "x", w,
            " is not the layer's ", to_string(out_));

  cudnnHandle_t dnn = ctx.dnn();
  int max_count = 0, count = 0;
  DDP_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(dnn, &max_count));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> fwd(size_t(std::max(max_count, 1)));
  DDP_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(dnn, p->x, w_desc_, conv_desc_, p->y, int(fwd.size()),
                                                         &count, fwd.data()));
  p->fwd = pick(ctx, layer_, fwd, count, "forward").algo;
  DDP_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(dnn, p->x, w_desc_, conv_desc_, p->y, p->fwd,
                                                          &p->fwd_bytes));

  DDP_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(dnn, &max_count));
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> bwd_data(size_t(std::max(max_count, 1)));
  DDP_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(dnn, w_desc_, p->y, conv_desc_, p->x,
                                                              int(bwd_data.size()), &count, bwd_data.data()));
  p->bwd_data = pick(ctx, layer_, bwd_data, count, "backward-data").algo;
  DDP_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(dnn, w_desc_, p->y, conv_desc_, p->x, p->bwd_data,
                                                               &p->bwd_data_bytes));

  DDP_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(dnn, &max_count));
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> bwd_filter(size_t(std::max(max_count, 1)));
  DDP_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(dnn, p->x, p->y, conv_desc_, w_desc_,
                                                                int(bwd_filter.size()), &count, bwd_filter.data()));
  p->bwd_filter = pick(ctx, layer_, bwd_filter, count, "backward-filter").algo;
  DDP_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn, p->x, p->y, conv_desc_, w_desc_,
                                                                 p->bwd_filter, &p->bwd_filter_bytes));

  // Grow the shared workspace now, the one step that may wait for the device,
  // rather than inside a later forward or backward.
  ctx.workspace(std::max({p->fwd_bytes, p->bwd_data_bytes, p->bwd_filter_bytes}));
  Plan& ref = *p;
  plans_[batch] = std::move(p);
  return ref;
}

void CudnnConv::forward(cuda::Context& ctx, int batch, const float* x, const float* w, const float* b, float* y) {
  try {
    const Plan& p = plan(ctx, batch);
    const float one = 1.0f, zero = 0.0f;
    void* ws = ctx.workspace(p.fwd_bytes);
    DDP_CUDNN_CHECK(cudnnConvolutionForward(ctx.dnn(), &one, p.x, x, w_desc_, w, conv_desc_, p.fwd, ws, p.fwd_bytes,
                                            &zero, p.y, y));
    // y += b, broadcast over batch and pixels (bias_desc_ is 1 x C x 1 x 1).
    if (b) DDP_CUDNN_CHECK(cudnnAddTensor(ctx.dnn(), &one, bias_desc_, b, &one, p.y, y));
  } catch (const Error& e) {
    DDP_FAIL("op ", layer_, ": forward: ", e.what());
  }
}

void CudnnConv::backward(cuda::Context& ctx, int batch, const float* x, const float* w, const float* dy, float* dw,
                         float* db, float* dx) {
  try {
    const Plan& p = plan(ctx, batch);
    // beta = 1 adds into the gradients (Note [gradient accumulation]); beta =
    // 0 overwrites dx without reading it.
    const float one = 1.0f, zero = 0.0f;
    if (db) DDP_CUDNN_CHECK(cudnnConvolutionBackwardBias(ctx.dnn(), &one, p.y, dy, &one, bias_desc_, db));
    if (dw) {
      void* ws = ctx.workspace(p.bwd_filter_bytes);
      DDP_CUDNN_CHECK(cudnnConvolutionBackwardFilter(ctx.dnn(), &one, p.x, x, p.y, dy, conv_desc_, p.bwd_filter, ws,
                                                     p.bwd_filter_bytes, &one, w_desc_, dw));
    }
    if (dx) {
      void* ws = ctx.workspace(p.bwd_data_bytes);
      DDP_CUDNN_CHECK(cudnnConvolutionBackwardData(ctx.dnn(), &one, w_desc_, w, p.y, dy, conv_desc_, p.bwd_data, ws,
                                                   p.bwd_data_bytes, &zero, p.x, dx));
    }
  } catch (const Error& e) {
    DDP_FAIL("op ", layer_, ": backward: ", e.what());
  }
}

}  // namespace ddp::nn
