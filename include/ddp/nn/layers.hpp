// The layers models are built from (float, CPU kernels from cpu_ops.hpp).
//
// Each layer is built for one per-sample input shape; output_shape(in) checks
// that the model feeds it that shape, so a wrong wiring fails at construction
// with the layer's name, not as a buffer overrun in forward.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ddp/nn/cpu_ops.hpp"
#include "ddp/nn/layer.hpp"

namespace ddp::nn {

// "CxHxW", for error messages.
std::string to_string(const Shape& s);

// The pointers of a layer with a weight and a bias (param_specs() in that
// order), from Layer::bind's arguments; the error names the layer.
struct WeightBias {
  float *w = nullptr, *b = nullptr, *dw = nullptr, *db = nullptr;
  void bind(const std::string& layer, const std::vector<float*>& params, const std::vector<float*>& grads);
};

// A layer built for one input shape: its name, that shape and its output
// shape, and the check that the model feeds it that shape.
class ShapedLayer : public Layer {
 public:
  const std::string& name() const override { return name_; }
  // out_, once in is checked against the shape the layer was built for.
  Shape output_shape(const Shape& in) const override;

 protected:
  ShapedLayer(std::string name, Shape in, Shape out = {}) : name_(std::move(name)), in_(in), out_(out) {}
  std::string name_;
  Shape in_, out_;
};

// What a plain and a fused convolution share: geometry, the parameters
// "weight" [out_c, in.c, k, k] and "bias" [out_c], binding, the thread pool.
class ConvBase : public ShapedLayer {
 public:
  std::vector<ParamSpec> param_specs() const override;
  void bind(const std::vector<float*>& params, const std::vector<float*>& grads) override;
  void set_thread_pool(ThreadPool* pool) override { pool_ = pool; }

 protected:
  // Checks the geometry (the error names the layer); out_ is the subclass's.
  ConvBase(std::string name, Shape in, int out_c, int k, int stride, int pad);
  cpu::ConvGeom geom(int batch) const;
  int out_c_, k_, stride_, pad_;
  WeightBias p_;
  cpu::ConvScratch<float> scratch_;
  ThreadPool* pool_ = nullptr;
};

// Square-kernel convolution.
class Conv2d : public ConvBase {
 public:
  Conv2d(std::string name, Shape in, int out_c, int k, int stride = 1, int pad = 0);
  void forward(const float* x, int batch, float* y) override;
  void backward(const float* x, const float* y, const float* dy, int batch, float* dx) override;
};

// Conv2d -> ReLU -> AvgPool2d(2) as one layer (conv_relu_pool_cpu.cpp says
// why). Same parameters as the Conv2d it replaces, so state dicts match;
// output (out_c, oh/2, ow/2).
class ConvReluPool : public ConvBase {
 public:
  ConvReluPool(std::string name, Shape in, int out_c, int k, int stride = 1, int pad = 0);
  void forward(const float* x, int batch, float* y) override;
  void backward(const float* x, const float* y, const float* dy, int batch, float* dx) override;

 private:
  std::vector<uint8_t> relu_mask_;  // from the last forward, for backward
  int mask_batch_ = -1;             // the batch relu_mask_ was made for
};

// 2x2 average pooling with stride 2 (nn.AvgPool2d(2)).
class AvgPool2d : public ShapedLayer {
 public:
  AvgPool2d(std::string name, Shape in);
  void forward(const float* x, int batch, float* y) override;
  void backward(const float* x, const float* y, const float* dy, int batch, float* dx) override;
};

class ReLU : public ShapedLayer {
 public:
  ReLU(std::string name, Shape in);
  void forward(const float* x, int batch, float* y) override;
  void backward(const float* x, const float* y, const float* dy, int batch, float* dx) override;
};

// (c, h, w) -> (c*h*w, 1, 1), in NCHW order, as torch.flatten(x, 1).
class Flatten : public ShapedLayer {
 public:
  Flatten(std::string name, Shape in);
  void forward(const float* x, int batch, float* y) override;
  void backward(const float* x, const float* y, const float* dy, int batch, float* dx) override;
};

// y = x W^T + b; params "weight" [out, in] and "bias" [out]. Accepts any input
// shape with in_features elements (NCHW order).
class Linear : public Layer {
 public:
  Linear(std::string name, int in_features, int out_features);
  const std::string& name() const override { return name_; }
  Shape output_shape(const Shape& in) const override;
  std::vector<ParamSpec> param_specs() const override;
  void bind(const std::vector<float*>& params, const std::vector<float*>& grads) override;
  void forward(const float* x, int batch, float* y) override;
  void backward(const float* x, const float* y, const float* dy, int batch, float* dx) override;
  void set_thread_pool(ThreadPool* pool) override { pool_ = pool; }

 private:
  std::string name_;
  int in_, out_;
  WeightBias p_;
  ThreadPool* pool_ = nullptr;
};

}  // namespace ddp::nn
