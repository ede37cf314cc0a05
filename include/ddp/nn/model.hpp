// ddp::nn::Model: a sequence of layers whose parameters live in one flat
// buffer and whose gradients live in another.
//
// Note [flat layout]: tensors are laid out in BACKWARD order: the last layer's
// parameters first, the first layer's last (within a layer, in param_specs()
// order). Backward visits layers last to first, so after each layer the
// gradients that are final form a growing PREFIX of the gradient buffer. The
// reducer relies on this: a bucket is a contiguous slice, and it is complete
// as soon as the ready prefix covers it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/nn/layer.hpp"

namespace ddp::nn {

struct ParamInfo {
  std::string name;            // "conv1.weight"
  std::vector<int64_t> shape;
  size_t offset = 0;           // in elements, into params() and grads()
  size_t numel = 0;
};

class ThreadPool;  // thread_pool.hpp

// Where a layer sequence's tensors live in the flat buffers (Note [flat
// layout]), computed once for the CPU model and its GPU twin alike.
struct FlatLayout {
  std::vector<Shape> shapes;                      // shapes[i] = input of layer i; back() = output
  std::vector<ParamInfo> params;                  // in flat order
  std::vector<Init> inits;                        // parallel to params
  std::vector<std::vector<size_t>> layer_params;  // per layer: indices into params, spec order
  std::vector<size_t> ready_after;                // per layer: prefix final after its backward
  size_t numel = 0;
};
// Checks the wiring (errors name the model and layer) and lays the tensors out.
FlatLayout plan_layout(const std::string& model, Shape input, const std::vector<std::unique_ptr<Layer>>& layers);
// Layer::bind for every layer, with its slices of the flat buffers (host or
// device alike: only pointer arithmetic).
void bind_layers(const FlatLayout& layout, const std::vector<std::unique_ptr<Layer>>& layers, float* params,
                 float* grads);

class Model {
 public:
  // Runs on default_threads() threads (OpenBLAS's count, which World sets to
  // this rank's share of the cores); set_threads changes that.
  Model(std::string name, Shape input, std::vector<std::unique_ptr<Layer>> layers);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const std::string& name() const { return name_; }
  Shape input_shape() const { return input_; }
  Shape output_shape() const;   // (classes, 1, 1) for a classifier

  size_t num_params() const { return params_.size(); }
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }
  // In flat-buffer order (Note [flat layout]).
  const std::vector<ParamInfo>& param_info() const { return layout_.params; }

  // Weights per ParamSpec::init from a deterministic stream of seed.
  void init_params(uint64_t seed);
  void zero_grads();

  // Logits for a batch: batch * output_shape().numel() floats, owned by the model
  // and valid until the next forward.
  const float* forward(const float* x, int batch);

  // Backward from d(loss)/d(logits) of the last forward. After each layer's
  // backward, on_ready(n) says the first n elements of grads() are final
  // (Note [flat layout]); n never decreases within one backward.
  void backward(const float* dlogits, int batch,
                const std::function<void(size_t)>& on_ready = {});

  // Threads the layers split a batch over (>= 1); OpenBLAS runs
  // single-threaded on each of them (Note [serial OpenBLAS] in gemm.hpp).
  void set_threads(int threads);
  int threads() const;

 private:
  std::string name_;
  Shape input_;
  std::unique_ptr<ThreadPool> pool_;
  std::vector<std::unique_ptr<Layer>> layers_;
  FlatLayout layout_;
  std::vector<float> params_, grads_;
  // acts_[i] = input of layer i (acts_[0] a copy of the caller's batch, so the
  // caller may reuse its buffer before backward); back() = logits. Sized for
  // the largest batch seen: steps after the first allocate nothing.
  std::vector<std::vector<float>> acts_;
  std::vector<std::vector<float>> dacts_;  // dacts_[i] = d(loss)/d(acts_[i]), 0 < i < layers
  int last_batch_ = -1;                    // batch of the last forward; -1: none yet
};

// A model's architecture as data: each device builds its own layers from it
// (make_layer here, the GPU twins in nn/cuda_model.hpp), so both run the same
// layers with the same parameters in the same flat layout.
enum class LayerKind { Conv2d, ConvReluPool, AvgPool2d, ReLU, Flatten, Linear };
struct LayerSpec {
  LayerKind kind = LayerKind::ReLU;
  std::string name;
  Shape in;         // per-sample input shape
  int out = 0;      // output channels (convolutions) or features (Linear)
  int k = 0, stride = 1, pad = 0;  // convolutions: square kernel
};
// The layers of a known model, for this input and number of classes.
// Throws ddp::Error naming an unknown model and the known ones.
std::vector<LayerSpec> model_spec(const std::string& name, Shape input, int classes);
// The CPU layer of a spec.
std::unique_ptr<Layer> make_layer(const LayerSpec& spec);

// "lenet" (d2l's variant, DESIGN.md) or "mlp" (784-256-10 with ReLU).
// Throws ddp::Error naming the unknown model and the known ones.
std::unique_ptr<Model> make_model(const std::string& name, Shape input, int classes);
std::vector<std::string> known_models();

// Mean softmax cross-entropy over the batch; writes d(mean loss)/d(logits).
float softmax_cross_entropy(const float* logits, const int32_t* labels, int batch, int classes,
                            float* dlogits);
// Number of rows whose arg-max equals the label.
int64_t count_correct(const float* logits, const int32_t* labels, int batch, int classes);

}  // namespace ddp::nn
