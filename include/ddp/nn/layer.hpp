// ddp::nn::Layer: the contract every layer keeps. A layer's CPU path is the
// reference; a GPU twin (later) must agree with it.
//
// Note [gradient accumulation]: backward ADDS parameter gradients into the
// bound gradient slices (beta = 1 in GEMM terms), as PyTorch does; the trainer
// zeroes the flat gradient buffer once per optimizer step. That is what makes
// gradient accumulation (no_sync) free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::nn {

class ThreadPool;  // thread_pool.hpp

// Per-sample activation shape (channels, height, width); a vector is (n, 1, 1).
struct Shape {
  int c = 1, h = 1, w = 1;
  int64_t numel() const { return int64_t(c) * h * w; }
  bool operator==(const Shape& o) const { return c == o.c && h == o.h && w == o.w; }
};

enum class Init { Normal001, Zero, One };

struct ParamSpec {
  std::string name;            // within the layer: "weight", "bias"
  std::vector<int64_t> shape;  // PyTorch's shape for this tensor, e.g. {out, in, k, k}
  Init init = Init::Zero;
  int64_t numel() const;
};

class Layer {
 public:
  virtual ~Layer() = default;
  // Name as in the model's state dict prefix: "conv1", "fc2", "relu1".
  virtual const std::string& name() const = 0;
  virtual Shape output_shape(const Shape& in) const = 0;
  virtual std::vector<ParamSpec> param_specs() const { return {}; }
  // Pointers into the model's flat buffers, one per param_specs() entry.
  virtual void bind(const std::vector<float*>& /*params*/, const std::vector<float*>& /*grads*/) {}
  // y = f(x) for a batch; x has batch * in.numel() floats, y batch * out.numel().
  virtual void forward(const float* x, int batch, float* y) = 0;
  // Adds parameter gradients (Note [gradient accumulation]) and writes dx
  // (dx may be nullptr: nothing needs the input gradient of the first layer).
  virtual void backward(const float* x, const float* y, const float* dy, int batch, float* dx) = 0;
  // Threads a layer may split its work over (the model's; nullptr: the
  // calling thread only). Layers that do not parallelise ignore it.
  virtual void set_thread_pool(ThreadPool* /*pool*/) {}
};

}  // namespace ddp::nn
