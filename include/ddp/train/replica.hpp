// ddp::train::Replica: one rank's copy of the model on its device and the step
// around it, written once for every device:
//
//   stage the batch on the device -> zero grads -> for each micro-batch
//   (--accumulate): forward -> softmax cross-entropy -> backward; the last
//   micro-batch's backward hands each op's gradients to the reducer as they
//   become final, the others communicate nothing (no_sync) -> wait for the
//   buckets (averaged over ranks) -> check the gradients are finite -> the
//   optimizer (clipping included) over the flat buffer.
//
// What differs between devices is a Backend (replica_cpu.cpp,
// replica_cuda.cu): the nn::Device, the communicator the reducer uses, how a
// batch reaches the device, the loss and optimizer kernels, and where the
// loss and correct counts are kept until the trainer takes them.
//
// --deterministic's step is replica_exact.cpp's (its model runs in
// micro-shards, its gradients are summed as integers): the mode asks of a
// backend what train/exact_backend.hpp says.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/comm/communicator.hpp"  // Communicator
#include "ddp/comm/watchdog.hpp"      // Watchdog: the GPU communicator watched
#include "ddp/data/loader.hpp"        // Batch
#include "ddp/reducer/reducer.hpp"    // Reducer
#include "ddp/nn/model.hpp"           // Model, ModelState, Graph
#include "ddp/optim/grad_scaler.hpp"  // GradScaler: --precision fp16's loss scale
#include "ddp/optim/optimizer.hpp"    // Optimizer: SGD, AdamW, their state, clipping
#include "ddp/runtime/world.hpp"      // World
#include "ddp/train/config.hpp"       // Config
#include "ddp/train/step_graphs.hpp"  // StepGraphPlan, StepKey: Note [step graphs]
#include "ddp/train/sums.hpp"         // Sums: the loss, counts and waits taken by the trainer
#include "ddp/train/usage.hpp"        // DeviceUsage

namespace ddp::train {

// Where one step's time went on this rank, in seconds (host clock): staging
// the batch on the device, forward (with the loss), backward, waiting for the
// all-reduces after backward (exposed communication), the optimizer (with
// the finiteness check). comm_busy is the time some bucket was in flight,
// hidden the part of it during backward. On a device that queues work the
// parts are the host's: launches, and waits where the host waits.
struct StepTimes {
  double data = 0, forward = 0, backward = 0, comm = 0, optimizer = 0;
  double comm_busy = 0, hidden = 0;
  double total() const { return data + forward + backward + comm + optimizer; }
};

// Whether a step stayed finite. The averaged gradients are the same on every
// rank, so every rank gives the same grads_finite for a step; loss_finite is
// this rank's own loss.
struct StepHealth {
  bool grads_finite = true;
  bool loss_finite = true;
  // --precision fp16: the gradients were not finite and the loss scaler
  // skipped the step (every rank alike), halving its scale: this step, or
  // with the loss scale on the device the one `steps_ago` steps before
  // (Note [loss scale on the device], src/train/device_loss_scale.hpp).
  bool skipped = false;
  int steps_ago = 0;
  double loss = 0;  // this rank's mean loss of the step, where loss_known
  // Whether the host has the step's loss (a GPU keeps it on the device until
  // take_sums).
  bool loss_known = false;
  // One of the step's `parts` equal parts of the loss (a micro-batch's or a
  // micro-shard's).
  void add_loss(double part, int parts) {
    loss += part / parts;
    loss_finite = loss_finite && std::isfinite(part);
    loss_known = true;
  }
};

// Everything a checkpoint holds of a replica, on the host: the model's
// parameters, buffers and counters, and the optimizer's state.
struct TrainState {
  nn::ModelState model;
  optim::State optimizer;
  // --deterministic's fixed-point exponent per parameter (deterministic/exact_sum.hpp);
  // empty without it.
  std::vector<int64_t> grad_exponents;
  // --precision fp16's loss scaler: its scale (0: none) and its count of good
  // steps since it last changed.
  float loss_scale = 0;
  int64_t scaler_growth_tracker = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string device_name() const = 0;  // "cpu", "cuda:<index>"
  // The CPU threads this rank computes on (a GPU rank: World's share of the
  // cores, which its host side has).
  virtual int threads() const = 0;
  virtual nn::Device& device() = 0;
  // The communicator everything goes through: gradients on the device's
  // memory, the blocking collectives on host memory.
  virtual comm::Communicator& comm() = 0;
  // Blocks until the device has done what was issued, bounded by the
  // communicator's timeout.
  virtual void sync(const std::string& what) = 0;

  // The batch on the device (inputs, labels), valid until batch_done();
  // batch_done() is called once the work that reads it has been issued.
  virtual std::pair<const float*, const int32_t*> stage(const data::Batch& b) = 0;
  virtual void batch_done() = 0;

  // Softmax cross-entropy: writes d(mean loss)/d(logits), the mean over
  // grad_batch samples (the whole step's, of which this batch may be one
  // micro-batch), and adds the batch's loss sum and correct count to the
  // device's sums. Returns the batch's mean loss where the host has it at
  // once (CPU), else nullopt.
  virtual std::optional<double> loss(const float* logits, const int32_t* labels, int batch, int classes,
                                     float* dlogits, int grad_batch) = 0;
  // Adds the batch's correct predictions to the device's evaluation count.
  virtual void count_correct(const float* logits, const int32_t* labels, int batch, int classes) = 0;
  // The device's sums since the last call, reset: loss, correct and
  // eval_correct (the other fields are the replica's, zero here). Waits for
  // the device.
  virtual Sums take_sums() = 0;

  // Whether all_finite is cheap enough to run every step (it needs the host
  // to look at device memory).
  virtual bool checks_every_step() const = 0;
  virtual bool all_finite(const float* p, size_t n) = 0;
  // The optimizer's kernels on this device.
  virtual optim::Kernels& optim_kernels() = 0;
  // Note [loss scale on the device] (src/train/device_loss_scale.hpp):
  // whether --precision fp16's loss scaler decides on the device; a flag's
  // four bytes of device memory copied toward the host without waiting, and
  // the last one read there (waiting, bounded, only where the device has not
  // got there yet).
  virtual bool loss_scale_on_device() const = 0;
  virtual void flag_to_host(const unsigned* flag) = 0;
  virtual bool flag_on_host(const std::string& what) = 0;

  // What the start-up table says of the device beyond its name (GPUs:
  // model, memory, bus id, driver and NCCL versions); "" for none.
  virtual std::string describe() const { return ""; }
  // The device's own figures (GPUs); CPUs have none.
  virtual DeviceUsage usage() { return {}; }
  // --trace on a GPU: what the device itself runs (kernels, copies) is
  // recorded from begin_device_trace() on, and end_device_trace() puts it
  // on the trace's GPU tracks; CPUs have nothing beyond the host's spans.
  virtual void begin_device_trace() {}
  virtual void end_device_trace(Trace& /*trace*/) {}

  // Note [step graphs] (train/step_graphs.hpp): whether the run asked for
  // its steps to be captured and replayed (a GPU's --gpu-kernels next), and
  // why this backend cannot, with SyncBatchNorm where sync_bn ("" where it
  // can).
  virtual bool step_graphs_asked() const { return false; }
  virtual std::string step_graphs_refusal(bool /*sync_bn*/) const { return "the CPU runs each step as it is issued"; }
  // cuda::Context::generation: memory freed or moved so far.
  virtual uint64_t memory_generation() const { return 0; }
  // What is issued from begin_capture to end_capture on the compute stream
  // (and the streams it joins) is recorded, not run, as key's graph;
  // end_capture(key, true) throws ddp::Error where the capture failed, and
  // end_capture(key, false) ends a capture whose step failed, keeping
  // nothing. Memory asked for or freed through the device while capturing
  // is an error. replay(key) runs the graph, its collectives watched as `what`
  // of `bytes` (none: ""); drop_graph(key) destroys it.
  // restart_slots: the next batch goes to the first pinned slot.
  virtual void restart_slots() {}
  virtual void begin_capture() {}
  virtual void end_capture(const StepKey& /*key*/, bool /*keep*/) {}
  virtual void replay(const StepKey& /*key*/, const std::string& /*what*/, const std::string& /*bytes*/) {}
  virtual void drop_graph(const StepKey& /*key*/) {}
};

// The CPU backend: host memory, the MPI communicator, the kernels on
// `threads` threads (0: as many as World gave OpenBLAS, this rank's share of
// the cores). loss_scale_on_device: fp16's scaler decides as a GPU's with
// --gpu-kernels proven does (Note [loss scale on the device]), the GPU's flow
// on the host, which gains nothing from it; for its tests.
std::unique_ptr<Backend> make_cpu_backend(std::unique_ptr<comm::Communicator> comm, int threads = 0,
                                          bool loss_scale_on_device = false);

#if DDP_HAVE_CUDA
// The GPU backend on device index `gpu` (chosen by choose_gpu,
// runtime/device.hpp): binds it, gathers every rank's (host, bus id) over
// host_comm and refuses two nccl ranks on one GPU (backend auto: nccl when
// no GPU is shared, else mpi), then the communicator (nccl, or mpi staged
// through pinned memory) and batches through pinned buffers on the copy
// stream. With a watchdog, the device communicator is watched and aborted
// (ncclCommAbort) when the watchdog ends the job. Collective.
std::unique_ptr<Backend> make_cuda_backend(const World& world, const Config& cfg, int gpu,
                                           std::unique_ptr<comm::Communicator> host_comm,
                                           comm::Watchdog* watchdog);
#endif

class DeviceLossScale;  // src/train/device_loss_scale.hpp

class Replica {
 public:
  // With cfg.sync_bn, BatchNorm's statistics are summed over ranks; each
  // step takes cfg.accumulate micro-batches.
  Replica(const Config& cfg, const optim::Options& opt, std::unique_ptr<Backend> backend, nn::Graph graph);
  ~Replica();

  std::string device() const { return backend_->device_name(); }
  int threads() const { return backend_->threads(); }
  std::string device_description() const { return backend_->describe(); }
  DeviceUsage device_usage() { return backend_->usage(); }
  comm::Communicator& comm() { return backend_->comm(); }
  const Reducer& reducer() const { return *reducer_; }
  const nn::Graph& graph() const { return model_->graph(); }
  const optim::Optimizer& optimizer() const { return *optimizer_; }
  // --precision fp16's loss scaler, nullptr without it (with the loss
  // scale on the device, one step behind until settle()).
  const optim::GradScaler* scaler() const { return scaler_.get(); }

  // Host state: set (push) and read back (pull). pull waits for the device.
  void push(const TrainState& s);
  void pull(TrainState& s);
  // Buffers and counters only (the trainer's broadcasts of rank 0's).
  void push_buffers(const nn::ModelState& s);
  void pull_buffers(nn::ModelState& s);

  // One optimizer step at learning rate lr on this rank's part of the global
  // batch, in cfg.accumulate micro-batches. May return
  // before the device has finished it; batch may be reused on return. When
  // the averaged gradients hold a NaN or an infinity the parameters are left
  // as they were and grads_finite is false (checked every step where the
  // backend can afford it, the CPU, under --deterministic on any device,
  // whose sum sees it anyway, and under --precision fp16, whose scaler then
  // skips the step, the device deciding where the loss scale is on the
  // device and the step after reporting it; else a GPU's divergence shows
  // in the epoch's loss and in the parameters checked before each save).
  StepHealth train_step(const data::Batch& batch, double lr);
  // Note [loss scale on the device]: the last step's outcome where no
  // train_step has reported it yet (waits for the device); a finite,
  // unskipped health otherwise, and always where the scale is the host's.
  StepHealth settle();
  // Called at the start of each training epoch, on every rank (collective
  // where steps are replayed as CUDA graphs: Note [step graphs]).
  void begin_epoch();
  // The parts of the last train_step's time.
  const StepTimes& step_times() const { return times_; }
  // The step's parts, each op and each bucket's all-reduce as spans of
  // trace while it records (nullptr: none).
  void set_trace(Trace* trace);
  // The device's own activity on the trace's GPU tracks (Backend's).
  void begin_device_trace() { backend_->begin_device_trace(); }
  void end_device_trace(Trace& trace) { backend_->end_device_trace(trace); }
  // Evaluation (BatchNorm on its running statistics) of one batch, counted
  // in the sums' eval_samples and eval_correct.
  void eval_batch(const data::Batch& batch);
  // Everything train_step and eval_batch counted since the last call,
  // reset; waits for the device.
  Sums take_sums();

 private:
  class Stats;       // SyncBatchNorm's reducer over the backend's communicator
  class ExactStats;  // and its micro-shards' sums in shard order (replica_exact.cpp)
  struct Exact;      // --deterministic's part (replica_exact.cpp)
  // Forward and backward of the step's micro-batches (--accumulate), the
  // last one's gradients all-reduced by the reducer as backward makes them.
  void reduced_passes(const float* x, const int32_t* y, int batch, size_t sample, StepHealth& health,
                      const std::function<void(double&)>& lap);
  // --deterministic (replica_exact.cpp): its model and sums (exact_, the
  // model in model_); the forward and backward of a step in micro-shards,
  // each micro-shard's gradients into the fixed-point sum, then its
  // all-reduce; an evaluation forward in micro-shards.
  std::unique_ptr<nn::Model> make_exact(const Config& cfg, nn::Graph graph);
  void exact_passes(const float* x, const int32_t* y, int batch, StepHealth& health,
                    const std::function<void(double&)>& lap);
  const float* exact_eval_forward(const float* x, int batch);
  // The optimizer's step, the host checking the gradients first where it
  // does (and fp16's scaler on the host).
  void checked_step(double lr, StepHealth& health);
  // --precision fp16: d(loss)/d(logits) of `batch` samples times the loss
  // scale (the scaled loss's backward, optim/grad_scaler.hpp).
  void scale_dlogits(int batch);
  // Note [step graphs]: what a step advances on the host (the BatchNorm
  // counters, the reducer's launches and bytes), read now; a replay
  // advances them by what its capture did.
  struct HostCounts {
    std::vector<int64_t> counters;
    int64_t launches = 0, bytes = 0;
  };
  HostCounts host_counts();
  // Whether this step may be captured or replayed (said once where it may
  // not, on rank 0); the step's passes and optimizer captured as key's
  // graph and run; key's graph replayed.
  bool graphs_for_step();
  void capture_step(const StepKey& key, const float* x, const int32_t* y, int batch, size_t sample, double lr,
                    StepHealth& health, const std::function<void(double&)>& lap);
  void replay_step(const StepKey& key, double lr, StepHealth& health);
  // What `issue` issues captured as key's graph (a failure is an error
  // naming the flag that leaves graphs out); the host's turn between a
  // step's passes and its optimizer (fp16's last outcome, the scalars);
  // both of key's graphs dropped.
  void capture(const StepKey& key, const std::function<void()>& issue);
  void before_optimizer(double lr, StepHealth& health);
  void drop_graphs(const StepKey& key);
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Stats> stats_;
  std::unique_ptr<nn::Model> model_;
  std::unique_ptr<Reducer> reducer_;
  std::unique_ptr<Exact> exact_;  // --deterministic
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::GradScaler> scaler_;  // --precision fp16
  std::unique_ptr<DeviceLossScale> device_scale_;  // its decisions on the device
  std::unique_ptr<nn::Array> dlogits_;
  int classes_ = 0, accumulate_ = 1;
  StepTimes times_;
  Trace* trace_ = nullptr;
  Sums sums_;  // not taken yet: the host's counts, and what the backend handed over early
  // Note [step graphs]: whether steps may be captured at all, the plan, and
  // what each captured step advanced on the host.
  bool step_graphs_ = false;
  bool trace_said_ = false, capture_said_ = false;
  StepGraphPlan plan_;
  std::map<StepKey, HostCounts> captured_;
};

}  // namespace ddp::train
