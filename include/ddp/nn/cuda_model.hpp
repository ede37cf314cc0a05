// ddp::nn::CudaModel: the GPU twin of Model. The same layer specs
// (model_spec), the same parameter names, shapes and flat layout (Note [flat
// layout], plan_layout), on one device. Every op runs on the Context's
// compute stream; nothing here synchronises the host unless it says so.
//
// The GPU layers (src/nn/*_cuda.cu, one beside each *_cpu.cpp) keep the Layer
// contract (layer.hpp) on device pointers: backward ADDS parameter gradients
// (Note [gradient accumulation]), the CPU layer is the reference they must
// agree with to 1e-4.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddp/nn/model.hpp"                 // LayerSpec, FlatLayout, ParamInfo, Layer
#include "ddp/runtime/cuda_context.hpp"     // cuda::Context, DeviceBuffer

namespace ddp::nn {

// The GPU layer of a spec, issuing its work on ctx.compute().
std::unique_ptr<Layer> make_cuda_layer(const LayerSpec& spec, cuda::Context& ctx);

class CudaModel {
 public:
  CudaModel(std::string name, Shape input, const std::vector<LayerSpec>& specs, cuda::Context& ctx);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const std::string& name() const { return name_; }
  Shape input_shape() const { return input_; }
  Shape output_shape() const { return layout_.shapes.back(); }
  size_t num_params() const { return layout_.numel; }
  const std::vector<ParamInfo>& param_info() const { return layout_.params; }

  // Device buffers, num_params() floats each.
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }

  // Host <-> device copies of the parameters; both return when the copy is
  // done (the host buffer may be reused at once).
  void upload_params(const float* host);
  void download_params(float* host);
  void zero_grads();  // asynchronous

  // Logits (device, batch * classes floats, owned by the model, valid until
  // the next forward) of a device batch x. The caller may overwrite x once
  // the compute stream has passed this forward's backward.
  const float* forward(const float* x, int batch);
  // As Model::backward; on_ready(n) is called on the host after the layer's
  // work is ISSUED (not done): a collective on those gradients must be
  // ordered after it on the device (an event on the compute stream).
  void backward(const float* dlogits, int batch, const std::function<void(size_t)>& on_ready = {});

 private:
  std::string name_;
  Shape input_;
  cuda::Context& ctx_;
  std::vector<std::unique_ptr<Layer>> layers_;
  FlatLayout layout_;
  cuda::DeviceBuffer params_, grads_;
  std::vector<cuda::DeviceBuffer> acts_, dacts_;  // as Model's; acts_[0] unused (forward reads x)
  const float* input_ptr_ = nullptr;              // x of the last forward
  int last_batch_ = -1;
};

// Softmax cross-entropy on the device, one launch: writes d(mean loss)/d(logits)
// into dlogits and ADDS the batch's summed loss to sums[0] and its number of
// correct rows (arg-max == label) to sums[1] (device doubles), so a whole epoch
// runs without the host reading anything.
void softmax_cross_entropy_cuda(const float* logits, const int32_t* labels, int batch, int classes,
                                float* dlogits, double* sums, cudaStream_t stream);
// Adds the number of rows whose arg-max equals the label to *correct (device).
void count_correct_cuda(const float* logits, const int32_t* labels, int batch, int classes, double* correct,
                        cudaStream_t stream);

}  // namespace ddp::nn
