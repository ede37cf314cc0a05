// CudaModel: Model's twin on one GPU (cuda_model.hpp). The same specs, the
// same flat layout (plan_layout), the same order of work as model.cpp; the
// differences are where the buffers live and that nothing waits for the
// device except the host copies that say they do.
#include "ddp/nn/cuda_model.hpp"

#include <utility>

#include "cuda_layers.hpp"
#include "ddp/core/error.hpp"          // DDP_CHECK, DDP_FAIL
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUDA_CHECK

namespace ddp::nn {

CudaLayer::CudaLayer(const LayerSpec& spec, cuda::Context& ctx)
    : spec_(spec), ctx_(ctx), ref_(make_layer(spec)), out_(ref_->output_shape(spec.in)) {}

std::unique_ptr<Layer> make_cuda_layer(const LayerSpec& s, cuda::Context& ctx) {
  switch (s.kind) {
    case LayerKind::Conv2d: return std::make_unique<CudaConv2d>(s, ctx);
    case LayerKind::ConvReluPool: return std::make_unique<CudaConvReluPool>(s, ctx);
    case LayerKind::AvgPool2d: return std::make_unique<CudaAvgPool2d>(s, ctx);
    case LayerKind::ReLU: return std::make_unique<CudaReLU>(s, ctx);
    case LayerKind::Flatten: return std::make_unique<CudaFlatten>(s, ctx);
    case LayerKind::Linear: return std::make_unique<CudaLinear>(s, ctx);
  }
  DDP_FAIL("layer ", s.name, ": unknown kind");
}

namespace {

std::vector<std::unique_ptr<Layer>> cuda_layers(const std::vector<LayerSpec>& specs, cuda::Context& ctx) {
  std::vector<std::unique_ptr<Layer>> layers;
  for (const LayerSpec& s : specs) layers.push_back(make_cuda_layer(s, ctx));
  return layers;
}

}  // namespace

CudaModel::CudaModel(std::string name, Shape input, const std::vector<LayerSpec>& specs, cuda::Context& ctx)
    : name_(std::move(name)), input_(input), ctx_(ctx), layers_(cuda_layers(specs, ctx)),
      layout_(plan_layout(name_, input_, layers_)), params_(ctx, layout_.numel), grads_(ctx, layout_.numel) {
  const size_t n_layers = layers_.size();
  // Zeros, not whatever the pool hands back: a caller that reads before
  // uploading sees a defined model.
  if (layout_.numel > 0) {
    DDP_CUDA_CHECK(cudaMemsetAsync(params_.data(), 0, sizeof(float) * layout_.numel, ctx_.compute()));
    DDP_CUDA_CHECK(cudaMemsetAsync(grads_.data(), 0, sizeof(float) * layout_.numel, ctx_.compute()));
  }
  bind_layers(layout_, layers_, params_.data(), grads_.data());
  acts_.resize(n_layers + 1);
  dacts_.resize(n_layers + 1);
}

CudaModel::~CudaModel() = default;

void CudaModel::upload_params(const float* host) {
  DDP_CHECK(host, "model ", name_, ": upload_params from null");
  if (layout_.numel == 0) return;
  DDP_CUDA_CHECK(cudaMemcpyAsync(params_.data(), host, sizeof(float) * layout_.numel, cudaMemcpyHostToDevice,
                                 ctx_.compute()));
  ctx_.sync();  // the caller may reuse host at once
}

void CudaModel::download_params(float* host) {
  DDP_CHECK(host, "model ", name_, ": download_params to null");
  if (layout_.numel == 0) return;
  DDP_CUDA_CHECK(cudaMemcpyAsync(host, params_.data(), sizeof(float) * layout_.numel, cudaMemcpyDeviceToHost,
                                 ctx_.compute()));
  ctx_.sync();
}

void CudaModel::zero_grads() {
  if (layout_.numel == 0) return;
  DDP_CUDA_CHECK(cudaMemsetAsync(grads_.data(), 0, sizeof(float) * layout_.numel, ctx_.compute()));
}

const float* CudaModel::forward(const float* x, int batch) {
  DDP_CHECK(batch > 0, "model ", name_, ": forward with batch ", batch);
  DDP_CHECK(x, "model ", name_, ": forward with null input");
  // acts_[0] stays empty: layer 0 reads x itself, no copy as Model makes,
  // since the header asks the caller to keep x until this backward has run.
  for (size_t i = 1; i < acts_.size(); ++i)
    acts_[i].reserve(ctx_, size_t(batch) * size_t(layout_.shapes[i].numel()));
  for (size_t i = 0; i < layers_.size(); ++i)
    layers_[i]->forward(i == 0 ? x : acts_[i].data(), batch, acts_[i + 1].data());
  input_ptr_ = x;
  last_batch_ = batch;
  return acts_.back().data();
}

void CudaModel::backward(const float* dlogits, int batch, const std::function<void(size_t)>& on_ready) {
  DDP_CHECK(last_batch_ == batch, "model ", name_, ": backward for batch ", batch, " after forward of batch ",
            last_batch_);
  DDP_CHECK(dlogits, "model ", name_, ": backward with null dlogits");
  const size_t n_layers = layers_.size();
  // As Model: no gradient for the input, the last layer reads dlogits.
  for (size_t i = 1; i < n_layers; ++i)
    dacts_[i].reserve(ctx_, size_t(batch) * size_t(layout_.shapes[i].numel()));
  for (size_t i = n_layers; i-- > 0;) {
    const float* x = i == 0 ? input_ptr_ : acts_[i].data();
    const float* dy = i + 1 == n_layers ? dlogits : dacts_[i + 1].data();
    float* dx = i == 0 ? nullptr : dacts_[i].data();
    layers_[i]->backward(x, acts_[i + 1].data(), dy, batch, dx);
    if (on_ready) on_ready(layout_.ready_after[i]);
  }
}

}  // namespace ddp::nn
