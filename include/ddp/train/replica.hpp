// ddp::train::Replica: one rank's copy of the model on its device, with what a
// step needs around it: the optimizer, the reducer over its gradients and the
// way batches reach the device. The trainer's loop is device-blind; it sees
// the host Model and Sgd, which hold the state checkpoints and output files
// are made from: pull() makes them current, push() sends them to the device.
//
// Both devices run the same step:
//   zero grads -> forward -> softmax cross-entropy -> backward, each layer's
//   gradients handed to the reducer as they become final -> wait for the
//   buckets (averaged over ranks) -> SGD over the flat buffer.
#pragma once

#include <memory>
#include <string>

#include "ddp/comm/communicator.hpp"  // Communicator
#include "ddp/data/loader.hpp"        // Batch
#include "ddp/ddp/reducer.hpp"        // Reducer
#include "ddp/nn/model.hpp"           // Model
#include "ddp/optim/sgd.hpp"          // Sgd
#include "ddp/runtime/world.hpp"      // World
#include "ddp/train/config.hpp"       // Config

namespace ddp::train {

// Whether a step stayed finite. The averaged gradients are the same on every
// rank, so every rank gives the same grads_finite for a step; loss_finite is
// this rank's own loss.
struct StepHealth {
  bool grads_finite = true;
  bool loss_finite = true;
  double loss = 0;  // this rank's mean loss of the step
};

// What the training steps since the last take_sums() added up to on this rank.
struct StepSums {
  double loss = 0;       // sum over samples of the per-sample loss
  double correct = 0;    // samples whose arg-max was the label
  double comm_wait = 0;  // seconds the host waited for buckets
};

class Replica {
 public:
  virtual ~Replica() = default;
  // "cpu", or "cuda:<index>" of the GPU this rank drives.
  virtual std::string device() const = 0;
  // The one the trainer uses for everything: its host collectives (broadcast,
  // allgather, allreduce_doubles) work on host memory on every device.
  virtual comm::Communicator& comm() = 0;
  virtual const Reducer& reducer() const = 0;

  // Host state: parameters (and the optimizer's momentum) as of the last
  // pull(), or as set by the caller before push().
  nn::Model& model() { return *model_; }
  optim::Sgd& sgd() { return *sgd_; }
  virtual void push() = 0;  // host model and momentum -> device
  virtual void pull() = 0;  // device -> host model and momentum

  // One optimizer step on this rank's part of the global batch. May return
  // before the device has finished it; batch may be reused on return. When
  // the averaged gradients hold a NaN or an infinity the parameters are left
  // as they were and grads_finite is false (the CPU checks every step; a GPU
  // does not stop to look, and reports true: its divergence shows in the
  // epoch's loss and in the parameters checked before each save).
  virtual StepHealth train_step(const data::Batch& batch) = 0;
  // The sums of the steps since the last call (waits for them).
  virtual StepSums take_sums() = 0;

  // Evaluation: adds the batch's correct predictions to a count that
  // take_correct() returns (waiting for it) and resets.
  virtual void eval_batch(const data::Batch& batch) = 0;
  virtual double take_correct() = 0;

 protected:
  std::unique_ptr<nn::Model> model_;
  std::unique_ptr<optim::Sgd> sgd_;
};

// The CPU replica: layers on this rank's threads, comm (the MPI backend).
std::unique_ptr<Replica> make_cpu_replica(const Config& cfg, std::unique_ptr<comm::Communicator> comm,
                                          std::unique_ptr<nn::Model> model, std::unique_ptr<optim::Sgd> sgd);

#if DDP_HAVE_CUDA
// The GPU replica on device index `gpu` (chosen by choose_gpu,
// runtime/device.hpp): binds it, gathers every rank's (host, bus id) over
// host_comm (then the backend's communicator for host memory) and refuses two nccl ranks on one GPU (backend auto: nccl when
// no GPU is shared, else mpi), then cuDNN/cuBLAS layers, the backend (nccl,
// or mpi staged through pinned memory) and batches through pinned buffers on
// the copy stream. Collective.
std::unique_ptr<Replica> make_cuda_replica(const World& world, const Config& cfg, int gpu,
                                           std::unique_ptr<comm::Communicator> host_comm,
                                           std::unique_ptr<nn::Model> model, std::unique_ptr<optim::Sgd> sgd);
#endif

}  // namespace ddp::train
