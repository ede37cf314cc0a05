// The GPU replica (train/replica.hpp): one GPU per rank (or several ranks on
// one GPU with the staged mpi backend).
//
// A step, as issued (Note [streams] in runtime/cuda_context.hpp):
//   host:    batch -> pinned slot k (memcpy)
//   copy:    wait "slot k free" -> H2D into device slot k -> record "copied k"
//   compute: wait "copied k" -> zero grads -> forward -> loss (sums stay on
//            the device) -> backward, each bucket all-reduced as its
//            gradients are issued (Note [device all-reduce order]) -> wait for
//            the buckets -> SGD (one kernel) -> record "slot k free"
// The host blocks only to reuse pinned slot k (its previous copy must be done)
// and when the trainer reads the sums, so it runs a step or two ahead of the
// GPU and the next batch's copy overlaps the current step's compute.
#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/comm/device_communicator.hpp"  // nccl, staged mpi
#include "ddp/core/error.hpp"                // DDP_CHECK, UsageError
#include "ddp/nn/cuda_model.hpp"             // CudaModel, loss kernels
#include "ddp/optim/sgd_cuda.hpp"            // sgd_step_cuda
#include "ddp/runtime/cuda_check.hpp"        // DDP_CUDA_CHECK
#include "ddp/runtime/cuda_context.hpp"      // Context, set_device
#include "ddp/runtime/device.hpp"            // find_shared_gpu
#include "ddp/train/replica.hpp"

namespace ddp::train {

namespace {

// Every rank's (host, bus id); two nccl ranks on one GPU are refused here,
// with the numbers, before NCCL's own "Duplicate GPU detected".
// Returns the backend: backend auto becomes nccl when no two ranks share a
// GPU, else mpi (said once, on rank 0's stderr).
std::string check_gpus_distinct(comm::Communicator& host_comm, const World& world, const cuda::DeviceInfo& dev,
                                const std::string& backend) {
  struct Id {
    char host[64];
    char bus[32];
  } mine{};
  std::snprintf(mine.host, sizeof(mine.host), "%s", world.host.c_str());
  std::snprintf(mine.bus, sizeof(mine.bus), "%s", dev.pci_bus_id.c_str());
  const std::vector<char> all = host_comm.allgather(&mine, sizeof(mine), "GPU bus ids");
  std::vector<GpuId> ids(world.size);
  for (int r = 0; r < world.size; ++r) {
    Id id;
    std::memcpy(&id, all.data() + r * sizeof(Id), sizeof(Id));
    ids[r] = {id.host, id.bus};
  }
  const auto pair = find_shared_gpu(ids);
  if (backend == "auto") {
    if (!pair) return "nccl";
    if (world.rank == 0)
      std::fprintf(stderr, "ddp_train: note: ranks %d and %d share GPU %s on host %s: backend auto uses mpi, "
                   "staged through host memory (NCCL needs one GPU per rank)\n",
                   pair->first, pair->second, ids[pair->first].pci_bus_id.c_str(), ids[pair->first].host.c_str());
    return "mpi";
  }
  if (backend == "nccl" && pair) throw UsageError(shared_gpu_message(ids, *pair, cuda::device_count()));
  return backend;
}

// One batch in flight: pinned host memory and its device twin, inputs then
// labels in both, allocated at the first batch (plain cudaMalloc: the copy
// stream writes it, so it must not come from the compute stream's pool).
struct PinnedSlot {
  char* host = nullptr;
  char* dev = nullptr;
  size_t bytes = 0;
  cudaEvent_t copied = nullptr;  // the H2D copy out of host is done
  cudaEvent_t free = nullptr;    // the step that read dev is done
  bool used = false;
};

class CudaReplica final : public Replica {
 public:
  CudaReplica(const World& world, const Config& cfg, int gpu, std::unique_ptr<comm::Communicator> host_comm,
              std::unique_ptr<nn::Model> model, std::unique_ptr<optim::Sgd> sgd)
      : info_(cuda::set_device(gpu)) {
    model_ = std::move(model);
    sgd_ = std::move(sgd);
    const std::string backend = check_gpus_distinct(*host_comm, world, info_, cfg.backend);
    ctx_ = std::make_unique<cuda::Context>(gpu);
    if (backend == "nccl") {
      comm_ = comm::make_nccl_communicator(world, *ctx_, std::chrono::milliseconds(
                                                             static_cast<int64_t>(cfg.preflight_timeout_sec * 1000)),
                                             std::move(host_comm));
    } else {
      comm_ = comm::make_staged_mpi_communicator(world, *ctx_, std::move(host_comm));
    }
    comm_->set_timeout(std::chrono::milliseconds(static_cast<int64_t>(cfg.timeout_sec * 1000)));
    const nn::Shape in = model_->input_shape();
    classes_ = static_cast<int>(model_->output_shape().numel());
    const std::vector<nn::LayerSpec> specs = nn::model_spec(model_->name(), in, classes_);
    gpu_model_ = std::make_unique<nn::CudaModel>(model_->name(), in, specs, *ctx_);
    DDP_CHECK(gpu_model_->num_params() == model_->num_params(), "model ", model_->name(),
              ": the GPU model has ", gpu_model_->num_params(), " parameters, the CPU one ", model_->num_params());
    const size_t n = model_->num_params();
    if (sgd_->options().momentum != 0) momentum_ = cuda::DeviceBuffer(*ctx_, n);
    sums_ = static_cast<double*>(ctx_->alloc(3 * sizeof(double)));
    DDP_CUDA_CHECK(cudaMemsetAsync(sums_, 0, 3 * sizeof(double), ctx_->compute()));
    std::vector<size_t> numels;
    for (const auto& p : gpu_model_->param_info()) numels.push_back(p.numel);
    reducer_ = std::make_unique<Reducer>(*comm_, gpu_model_->grads(), numels, cfg.bucket_cap_mb, cfg.overlap);
    for (PinnedSlot& s : slots_) {
      DDP_CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
      DDP_CUDA_CHECK(cudaEventCreateWithFlags(&s.free, cudaEventDisableTiming));
    }
    dlogits_ = cuda::DeviceBuffer(*ctx_, static_cast<size_t>(cfg.batch_size) * classes_);
  }

  ~CudaReplica() override {
    // An error on its way to main's MPI_Abort: tear nothing down. Finalising
    // NCCL or synchronising the compute stream could wait on a collective
    // stuck on a dead peer and delay (or, unbounded, stop) the error report;
    // the process ends in a moment and takes the GPU state with it.
    if (std::uncaught_exceptions() > 0) {
      static_cast<void>(comm_.release());
      static_cast<void>(ctx_.release());
      return;
    }
    // Nothing may still read what is freed below. Bounded: compute may wait
    // on a collective stuck on a dead peer; synchronize gives up after the
    // timeout (aborting NCCL), and the buffers are then left to the
    // process's end.
    bool idle = false;
    if (ctx_ && comm_) {
      try {
        comm_->synchronize(ctx_->compute(), "releasing the GPU replica");
        idle = true;
      } catch (...) {
      }
    }
    if (!idle) return;
    for (PinnedSlot& s : slots_) {
      if (s.host) cudaFreeHost(s.host);
      if (s.dev) cudaFree(s.dev);
      if (s.copied) cudaEventDestroy(s.copied);
      if (s.free) cudaEventDestroy(s.free);
    }
    if (sums_ && ctx_) cudaFreeAsync(sums_, ctx_->compute());
  }

  std::string device() const override { return "cuda:" + std::to_string(info_.index); }
  comm::Communicator& comm() override { return *comm_; }
  const Reducer& reducer() const override { return *reducer_; }

  void push() override {
    gpu_model_->upload_params(model_->params());
    momentum_started_ = sgd_->has_momentum_state();
    if (momentum_.data() && momentum_started_) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(momentum_.data(), sgd_->momentum_buffer().data(),
                                     sizeof(float) * model_->num_params(), cudaMemcpyHostToDevice, ctx_->compute()));
      comm_->synchronize(ctx_->compute(), "momentum upload");
    }
  }

  void pull() override {
    comm_->synchronize(ctx_->compute(), "parameter download");
    gpu_model_->download_params(model_->params());
    if (momentum_.data() && momentum_started_) {
      DDP_CUDA_CHECK(cudaMemcpy(sgd_->momentum_buffer().data(), momentum_.data(),
                                sizeof(float) * model_->num_params(), cudaMemcpyDeviceToHost));
      sgd_->set_started(true);
    }
  }

  StepHealth train_step(const data::Batch& b) override {
    const PinnedSlot& s = stage(b);
    gpu_model_->zero_grads();
    const float* logits = gpu_model_->forward(inputs(s), b.size);
    nn::softmax_cross_entropy_cuda(logits, labels(s, b), b.size, classes_, dlogits_.data(), sums_, ctx_->compute());
    reducer_->begin_backward();
    gpu_model_->backward(dlogits_.data(), b.size, [this](size_t n) { reducer_->grads_ready(n); });
    comm_wait_ += reducer_->finish().wait_sec;
    optim::sgd_step_cuda(sgd_->options(), !momentum_started_, model_->num_params(), gpu_model_->params(),
                         gpu_model_->grads(), momentum_.data(), ctx_->compute());
    if (momentum_.data()) momentum_started_ = true;
    DDP_CUDA_CHECK(cudaEventRecord(s.free, ctx_->compute()));
    return {};  // not looked at per step (replica.hpp)
  }

  StepSums take_sums() override {
    const auto h = read_sums();
    StepSums out;
    out.loss = h[0];
    out.correct = h[1];
    out.comm_wait = std::exchange(comm_wait_, 0.0);
    return out;
  }

  void eval_batch(const data::Batch& b) override {
    const PinnedSlot& s = stage(b);
    const float* logits = gpu_model_->forward(inputs(s), b.size);
    nn::count_correct_cuda(logits, labels(s, b), b.size, classes_, sums_ + 2, ctx_->compute());
    DDP_CUDA_CHECK(cudaEventRecord(s.free, ctx_->compute()));
  }

  double take_correct() override { return read_sums()[2]; }

 private:
  static const float* inputs(const PinnedSlot& s) { return reinterpret_cast<const float*>(s.dev); }
  static const int32_t* labels(const PinnedSlot& s, const data::Batch& b) {
    return reinterpret_cast<const int32_t*>(s.dev + b.x.size() * sizeof(float));
  }

  // The batch into the next pinned slot, then onto the device on the copy
  // stream; the compute stream waits for it.
  const PinnedSlot& stage(const data::Batch& b) {
    PinnedSlot& s = slots_[next_slot_];
    next_slot_ = (next_slot_ + 1) % slots_.size();
    const size_t x_bytes = b.x.size() * sizeof(float);
    const size_t bytes = x_bytes + b.y.size() * sizeof(int32_t);
    if (s.used) wait_event(s.copied, "reuse of a pinned batch buffer");
    if (s.bytes < bytes) {
      // Only at the first batch (later ones are never larger).
      if (s.used) wait_event(s.free, "reuse of a device batch buffer");
      if (s.host) DDP_CUDA_CHECK(cudaFreeHost(s.host));
      if (s.dev) DDP_CUDA_CHECK(cudaFree(s.dev));
      s.host = s.dev = nullptr;
      DDP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&s.host), bytes));
      DDP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&s.dev), bytes));
      s.bytes = bytes;
    }
    std::memcpy(s.host, b.x.data(), x_bytes);
    std::memcpy(s.host + x_bytes, b.y.data(), bytes - x_bytes);
    if (s.used) DDP_CUDA_CHECK(cudaStreamWaitEvent(ctx_->copy(), s.free, 0));
    DDP_CUDA_CHECK(cudaMemcpyAsync(s.dev, s.host, bytes, cudaMemcpyHostToDevice, ctx_->copy()));
    DDP_CUDA_CHECK(cudaEventRecord(s.copied, ctx_->copy()));
    DDP_CUDA_CHECK(cudaStreamWaitEvent(ctx_->compute(), s.copied, 0));
    s.used = true;
    return s;
  }

  // A bounded host wait on one event (the copy stream has no collectives, so
  // the communicator has nothing to watch; the timeout still bounds it).
  void wait_event(cudaEvent_t ev, const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + comm_->timeout();
    for (int spins = 0;; ++spins) {
      const cudaError_t e = cudaEventQuery(ev);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) DDP_CUDA_CHECK(e);
      DDP_CHECK(std::chrono::steady_clock::now() < deadline, what, ": the GPU did not finish within ",
                comm::format_duration(comm_->timeout()), " (--timeout)");
      if (spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // The device sums (loss, correct, eval correct), then zeroed.
  std::vector<double> read_sums() {
    std::vector<double> h(3, 0.0);
    comm_->synchronize(ctx_->compute(), "reading the step metrics");
    DDP_CUDA_CHECK(cudaMemcpy(h.data(), sums_, 3 * sizeof(double), cudaMemcpyDeviceToHost));
    DDP_CUDA_CHECK(cudaMemsetAsync(sums_, 0, 3 * sizeof(double), ctx_->compute()));
    return h;
  }

  cuda::DeviceInfo info_;
  std::unique_ptr<cuda::Context> ctx_;
  std::unique_ptr<comm::DeviceCommunicator> comm_;
  std::unique_ptr<nn::CudaModel> gpu_model_;
  std::unique_ptr<Reducer> reducer_;
  cuda::DeviceBuffer momentum_, dlogits_;
  double* sums_ = nullptr;  // device: loss sum, correct (training), correct (evaluation)
  bool momentum_started_ = false;
  int classes_ = 0;
  double comm_wait_ = 0;
  std::array<PinnedSlot, 2> slots_;
  size_t next_slot_ = 0;
};

}  // namespace

std::unique_ptr<Replica> make_cuda_replica(const World& world, const Config& cfg, int gpu,
                                           std::unique_ptr<comm::Communicator> host_comm,
                                           std::unique_ptr<nn::Model> model, std::unique_ptr<optim::Sgd> sgd) {
  return std::make_unique<CudaReplica>(world, cfg, gpu, std::move(host_comm), std::move(model), std::move(sgd));
}

}  // namespace ddp::train
