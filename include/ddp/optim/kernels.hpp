// ddp::optim::Kernels: what an optimizer runs on the device its parameters
// live on. One implementation per device (kernels_cpu.cpp, kernels_cuda.cu),
// both over update_math.hpp's arithmetic, chosen once by the replica's
// backend.
#pragma once

#include <cstddef>
#include <memory>

#include "ddp/optim/grad_scaler.hpp"  // LossScaleState, ScalerOptions
#include "ddp/optim/update_math.hpp"  // StepScalars

#if DDP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ddp::optim {

// One update of elements [0, n) of the flat buffers (device memory).
struct StepArgs {
  StepScalars s;
  size_t n = 0;
  float* p = nullptr;
  const float* g = nullptr;
  float* a = nullptr;  // SGD: momentum buffer (nullptr without momentum); AdamW: exp_avg
  float* b = nullptr;  // AdamW: exp_avg_sq
  bool decay = true;   // whether these elements' group has weight decay
  // Clipping: the gradients' squared L2 norm where sq_norm() left it (the
  // device's memory), and the largest norm allowed; nullptr: no clipping.
  const double* sq_norm = nullptr;
  float max_norm = 0;
  // Multiplies every gradient before anything else (the inverse of
  // --precision fp16's loss scale: GradScaler's unscale), clipping's norm
  // being of the unscaled gradients.
  float unscale = 1.0f;
  // Note [loss scale on the device] (train/device_loss_scale.hpp): where
  // set, unscale is 1 / loss_scale->scale, read where the step runs (the
  // host's 1.0f / scale), and where *skip is nonzero the step leaves every
  // element as it was.
  const LossScaleState* loss_scale = nullptr;
  const unsigned* skip = nullptr;
  // Note [step graphs] (train/step_graphs.hpp): where set, the step's
  // scalars are read there where the step runs (set_scalars' memory), s
  // only telling the host which buffers the step needs; a step captured in
  // a CUDA graph then takes each replay's learning rate and step count.
  const StepScalars* scalars = nullptr;
};

class Kernels {
 public:
  virtual ~Kernels() = default;
  virtual void step(const StepArgs& a) = 0;
  // The squared L2 norm of unscale * g[0, n), summed in an order fixed by n
  // alone (so every rank, holding the same averaged gradients, gets the same
  // bits), left in device memory this object owns, valid until the next
  // call. The norm is also added to a running sum (take_norm_sum). With
  // loss_scale and skip, as StepArgs': unscale from loss_scale, and a
  // skipped step's norm not added.
  virtual const double* sq_norm(const float* g, size_t n, float unscale = 1.0f,
                                const LossScaleState* loss_scale = nullptr, const unsigned* skip = nullptr) = 0;
  // The norms summed since the last call; waits for the device.
  virtual double take_norm_sum() = 0;
  // Whether g[0, n) holds a NaN or an infinity (fp16's loss scaler's
  // found_inf): a flag, nonzero where it does, left in memory this object
  // owns (the device's), valid until the next call. On a GPU the host then
  // reads four bytes, not the gradients.
  virtual const unsigned* non_finite(const float* g, size_t n) = 0;

  // Note [loss scale on the device]: fp16's loss scaler's state in memory
  // this object owns (the device's), set from the host, multiplying d(loss)
  // and moved after each step by update_loss_scale's rule, found_inf being
  // *found != 0 (non_finite's flag), all in the device's order.
  virtual const LossScaleState* loss_scale() = 0;
  virtual void set_loss_scale(const LossScaleState& s) = 0;
  virtual void scale_by_loss_scale(float* x, size_t n) = 0;
  virtual void update_loss_scale(const unsigned* found, const ScalerOptions& o) = 0;

  // Note [step graphs]: s into memory this object owns (the device's, in
  // its stream's order; s may be reused at once), for StepArgs::scalars.
  // Not to be called while a stream capture is under way.
  virtual const StepScalars* set_scalars(const StepScalars& s) = 0;
};

std::unique_ptr<Kernels> make_cpu_kernels();

#if DDP_HAVE_CUDA
// On `stream`: one grid-stride launch per step() call; sq_norm in two
// launches of fixed shape (partial sums per block, then one block adds them
// in order), so its bits depend on n only; non_finite in one launch after
// clearing its flag.
std::unique_ptr<Kernels> make_cuda_kernels(cudaStream_t stream);
#endif

}  // namespace ddp::optim
