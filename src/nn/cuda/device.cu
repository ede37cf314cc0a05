// The GPU device (nn/cuda/device.hpp): its memory, its element-wise helpers, and
// the kernel of each op kind.
#include "ddp/nn/cuda/device.hpp"

#include <string>

#include "ddp/nn/cuda/kernels.hpp"
#include "ddp/nn/cuda/bn_runs.hpp"     // bn_act_run, conv_bn_run: Note [claimed runs]
#include "ddp/core/error.hpp"          // DDP_FAIL
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUDA_CHECK, DDP_CUDA_CHECK_LAUNCH

namespace ddp::nn {

namespace {

__global__ void fill_kernel(int64_t n, float value, float* __restrict__ p) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = value;
}

__global__ void add_kernel(int64_t n, float* __restrict__ dst, const float* __restrict__ src) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] += src[i];
}

__global__ void scale_kernel(int64_t n, float s, float* __restrict__ p) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] *= s;
}

class CudaArray final : public Array {
 public:
  CudaArray(cuda::Context& ctx, size_t n) : buf_(ctx, n) {
    if (n) DDP_CUDA_CHECK(cudaMemsetAsync(buf_.data(), 0, n * sizeof(float), ctx.compute()));
  }
  float* data() override { return buf_.data(); }
  size_t size() const override { return buf_.size(); }

 private:
  cuda::DeviceBuffer buf_;
};

}  // namespace

std::string CudaDevice::name() const { return "cuda:" + std::to_string(ctx_.device()); }

Layout CudaDevice::layout(const Graph& g) {
  return options_.layout ? *options_.layout : plan_layout(g, ctx_.channels_last()).layout;
}

std::unique_ptr<Kernel> CudaDevice::kernel(const Graph& g, size_t i, StatsReducer* stats) {
  const Op& op = g.ops[i];
  const Layout l = layout(g);
  if (l == Layout::NHWC && !runs_nhwc(g, op)) DDP_FAIL("op ", op.name, ": no NHWC kernel for ", to_string(op.kind));
  switch (op.kind) {
    case OpKind::Conv2d:
      if (options_.claim_runs && ctx_.next(NextKernel::ConvBn))
        if (const size_t n = conv_bn_run(g, i, ctx_.next(NextKernel::BnAct)); n > 1)
          return std::make_unique<CudaConvBn>(g, i, n, ctx_, stats, l, run_grads());
      return std::make_unique<CudaConv>(op, ctx_, l);
    case OpKind::ConvReluPool: return std::make_unique<CudaConvReluPool>(op, ctx_);
    case OpKind::BatchNorm2d:
      if (options_.claim_runs && ctx_.next(NextKernel::BnAct) && bn_act_run(g, i))
        return std::make_unique<CudaBatchNormAct>(g, i, ctx_, stats, l);
      return std::make_unique<CudaBatchNorm>(op, ctx_, stats, l);
    case OpKind::ReLU: return std::make_unique<CudaRelu>(op, ctx_);
    case OpKind::Add: return std::make_unique<CudaAdd>(op, ctx_);
    case OpKind::AvgPool2d: return std::make_unique<CudaAvgPool>(op, ctx_);
    case OpKind::GlobalAvgPool: return std::make_unique<CudaGlobalAvgPool>(op, ctx_, l);
    case OpKind::Flatten: return std::make_unique<CudaFlatten>(op, ctx_);
    case OpKind::Linear: return std::make_unique<CudaLinear>(op, ctx_);
  }
  DDP_FAIL("no GPU kernel for ", to_string(op.kind));
}

std::shared_ptr<cuda::DeviceBuffer> CudaDevice::run_grads() {
  if (!run_grads_) run_grads_ = std::make_shared<cuda::DeviceBuffer>();
  return run_grads_;
}

std::unique_ptr<Array> CudaDevice::alloc(size_t n) { return std::make_unique<CudaArray>(ctx_, n); }

void CudaDevice::fill(float* p, size_t n, float value) {
  if (n == 0) return;
  if (value == 0.0f) {
    DDP_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), ctx_.compute()));
    return;
  }
  fill_kernel<<<cuda_grid(int64_t(n)), kCudaThreads, 0, ctx_.compute()>>>(int64_t(n), value, p);
  DDP_CUDA_CHECK_LAUNCH(fill_kernel);
}

void CudaDevice::add(float* dst, const float* src, size_t n) {
  if (n == 0) return;
  add_kernel<<<cuda_grid(int64_t(n)), kCudaThreads, 0, ctx_.compute()>>>(int64_t(n), dst, src);
  DDP_CUDA_CHECK_LAUNCH(add_kernel);
}

void CudaDevice::scale(float* p, size_t n, float s) {
  if (n == 0) return;
  scale_kernel<<<cuda_grid(int64_t(n)), kCudaThreads, 0, ctx_.compute()>>>(int64_t(n), s, p);
  DDP_CUDA_CHECK_LAUNCH(scale_kernel);
}

void CudaDevice::round(float* dst, const float* src, size_t n, Precision prec) {
  round_cuda(dst, src, int64_t(n), prec, ctx_.compute());
}

void CudaDevice::to_host(float* host, const float* dev, size_t n) {
  if (n == 0) return;
  DDP_CUDA_CHECK(cudaMemcpyAsync(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost, ctx_.compute()));
  ctx_.sync();
}

void CudaDevice::from_host(float* dev, const float* host, size_t n) {
  if (n == 0) return;
  DDP_CUDA_CHECK(cudaMemcpyAsync(dev, host, n * sizeof(float), cudaMemcpyHostToDevice, ctx_.compute()));
  ctx_.sync();  // the caller may reuse host at once
}

void CudaDevice::sync() { ctx_.sync(); }

std::unique_ptr<Device> make_cuda_device(cuda::Context& ctx, CudaDeviceOptions options) {
  return std::make_unique<CudaDevice>(ctx, std::move(options));
}

}  // namespace ddp::nn
