// The GPU layers, internal to src/nn: one *_cuda.cu beside each *_cpu.cpp,
// built by make_cuda_layer (cuda_model.cu) and used through the Layer
// interface on device pointers.
//
// Note [cpu twin]: every GPU layer keeps the CPU layer of its spec
// (make_layer) and takes its name, shape rules and parameter specs from it,
// never running it. So the GPU model's flat layout (Note [flat layout] in
// model.hpp) and the wirings it rejects cannot drift from the CPU model's.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t
#include <cudnn.h>             // descriptors and algorithms of CudnnConv

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ddp/nn/layers.hpp"              // WeightBias
#include "ddp/nn/model.hpp"               // Layer, LayerSpec, make_layer
#include "ddp/runtime/cuda_context.hpp"   // cuda::Context, cuda::DeviceBuffer

namespace ddp::nn {

// Element-wise kernels: 256 threads a block, grid-stride loops, and a grid
// capped well above what fills an H200 (132 SMs x 2048 threads) so huge
// tensors do not ask for absurd grids.
constexpr int kCudaThreads = 256;
inline unsigned cuda_grid(int64_t n) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((n + kCudaThreads - 1) / kCudaThreads, 8192)));
}

// The base of the GPU layers: Note [cpu twin].
class CudaLayer : public Layer {
 public:
  const std::string& name() const override { return ref_->name(); }
  Shape output_shape(const Shape& in) const override { return ref_->output_shape(in); }
  std::vector<ParamSpec> param_specs() const override { return ref_->param_specs(); }

 protected:
  CudaLayer(const LayerSpec& spec, cuda::Context& ctx);
  LayerSpec spec_;
  cuda::Context& ctx_;
  std::unique_ptr<Layer> ref_;  // the CPU twin: never run
  Shape out_;                   // per-sample output shape
};

// 2x2 / stride-2 average pooling kernels (pool_cuda.cu), floor on odd sizes
// as the CPU's: shared by AvgPool2d and ConvReluPool. With relu, forward
// pools max(x, 0); backward with a mask (the pooled input, nullptr: none)
// passes the gradient only where mask > 0. dx is written everywhere (zeros
// where an odd row or column fed no output).
void avgpool2_forward_cuda(int64_t planes, int h, int w, const float* x, bool relu, float* y,
                           cudaStream_t stream);
void avgpool2_backward_cuda(int64_t planes, int h, int w, const float* dy, const float* mask, float* dx,
                            cudaStream_t stream);

// A cuDNN convolution of one geometry (cudnn_conv.cu): the descriptors, and
// per batch size the algorithms chosen once (Note [conv algorithms]).
class CudnnConv {
 public:
  // out: the conv output shape the layer computed; checked against cuDNN's.
  CudnnConv(const std::string& layer, Shape in, int out_c, int k, int stride, int pad, Shape out);
  ~CudnnConv();
  CudnnConv(const CudnnConv&) = delete;
  CudnnConv& operator=(const CudnnConv&) = delete;

  // y = conv(x, w) + b (b may be nullptr).
  void forward(cuda::Context& ctx, int batch, const float* x, const float* w, const float* b, float* y);
  // dw += dconv/dw, db += sum of dy (if db), dx = dconv/dx (if dx): Note
  // [gradient accumulation] in layer.hpp.
  void backward(cuda::Context& ctx, int batch, const float* x, const float* w, const float* dy, float* dw,
                float* db, float* dx);

 private:
  struct Plan;
  Plan& plan(cuda::Context& ctx, int batch);
  void release();  // destroys the descriptors
  std::string layer_;
  Shape in_, out_;
  cudnnFilterDescriptor_t w_desc_ = nullptr;
  cudnnConvolutionDescriptor_t conv_desc_ = nullptr;
  cudnnTensorDescriptor_t bias_desc_ = nullptr;
  std::map<int, std::unique_ptr<Plan>> plans_;  // by batch size
};

class CudaConv2d : public CudaLayer {
 public:
  CudaConv2d(const LayerSpec& spec, cuda::Context& ctx);
  void bind(const std::vector<float*>& params, const std::vector<float*>& grads) override;
  void forward(const float* x, int batch, float* y) override;
  void backward(const float* x, const float* y, const float* dy, int batch, float* dx) override;

 private:
  CudnnConv conv_;
  WeightBias p_;
};

// conv -> relu -> 2x2 average pooling, as ConvReluPool on the CPU.
class CudaConvReluPool : public CudaLayer {
 public:
  CudaConvReluPool(const LayerSpec& spec, cuda::Context& ctx);
  void bind(const std::vector<float*>& params, const std::vector<float*>& grads) override;
  void forward(const float* x, int batch, float* y) override;
  void backward(const float* x, const float* y, const float* dy, int batch, float* dx) override;

 private:
  Shape conv_;  // per-sample conv output, before pooling
  CudnnConv conv_op_;
  WeightBias p_;
  // conv + bias of the last forward (the relu mask backward needs: > 0), and
  // d(conv output) in backward; sized for the largest batch seen.
  cuda::DeviceBuffer pre_, dpre_;
  int fwd_batch_ = -1;  // batch of the last forward
};

class CudaAvgPool2d : public CudaLayer {
 public:
  CudaAvgPool2d(const LayerSpec& spec, cuda::Context& ctx) : CudaLayer(spec, ctx) {}
  void forward(const float* x, int batch, float* y) override;
  void backward(const float* x, const float* y, const float* dy, int batch, float* dx) override;
};

class CudaReLU : public CudaLayer {
 public:
  CudaReLU(const LayerSpec& spec, cuda::Context& ctx) : CudaLayer(spec, ctx) {}
  void forward(const float* x, int batch, float* y) override;
  void backward(const float* x, const float* y, const float* dy, int batch, float* dx) override;
};

class CudaFlatten : public CudaLayer {
 public:
  CudaFlatten(const LayerSpec& spec, cuda::Context& ctx) : CudaLayer(spec, ctx) {}
  void forward(const float* x, int batch, float* y) override;
  void backward(const float* x, const float* y, const float* dy, int batch, float* dx) override;
};

// y = x W^T + b on cuBLAS; W [out, in] row-major as the CPU's.
class CudaLinear : public CudaLayer {
 public:
  CudaLinear(const LayerSpec& spec, cuda::Context& ctx);
  void bind(const std::vector<float*>& params, const std::vector<float*>& grads) override;
  void forward(const float* x, int batch, float* y) override;
  void backward(const float* x, const float* y, const float* dy, int batch, float* dx) override;

 private:
  int in_, outf_;
  WeightBias p_;
};

}  // namespace ddp::nn
