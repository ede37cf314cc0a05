// The GPU backend (train/replica.hpp): one GPU per rank (or several ranks on
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
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "ddp/comm/device_communicator.hpp"  // nccl, staged mpi
#include "ddp/core/error.hpp"                // DDP_CHECK, UsageError
#include "ddp/core/finite.hpp"               // first_non_finite
#include "ddp/core/trace.hpp"                // Trace: --trace's GPU tracks
#include "ddp/deterministic/devices.hpp"     // make_cuda_device: --deterministic's
#include "ddp/deterministic/exact_sum.hpp"   // make_cuda_exact_sum
#include "ddp/nn/cuda/device.hpp"            // make_cuda_device, loss kernels
#include "ddp/optim/kernels.hpp"             // make_cuda_kernels
#include "ddp/runtime/cuda_check.hpp"        // DDP_CUDA_CHECK
#include "ddp/runtime/cuda_context.hpp"      // Context, set_device
#include "ddp/runtime/device.hpp"            // find_shared_gpu
#include "ddp/runtime/gpu_monitor.hpp"       // GpuMonitor: the start-up table's GPU, memory, utilisation
#include "ddp/runtime/gpu_trace.hpp"         // GpuTracer: --trace's GPU tracks
#include "ddp/train/exact_backend.hpp"       // ExactBackend
#include "ddp/train/replica.hpp"

namespace ddp::train {

namespace {

// Every rank's (host, bus id, NCCL_HOSTID); two nccl ranks on one GPU of one
// NCCL host are refused here, with the numbers, before NCCL's own "Duplicate
// GPU detected".
// Returns the backend: backend auto becomes nccl when no two ranks share a
// GPU, else mpi (said once, on rank 0's stderr).
std::string check_gpus_distinct(comm::Communicator& host_comm, const World& world, const cuda::DeviceInfo& dev,
                                const std::string& backend) {
  struct Id {
    char host[64];
    char bus[32];
    char nccl_hostid[128];
  } mine{};
  std::snprintf(mine.host, sizeof(mine.host), "%s", world.host.c_str());
  std::snprintf(mine.bus, sizeof(mine.bus), "%s", dev.pci_bus_id.c_str());
  const char* hostid = std::getenv("NCCL_HOSTID");
  std::snprintf(mine.nccl_hostid, sizeof(mine.nccl_hostid), "%s", hostid ? hostid : "");
  const std::vector<char> all = host_comm.allgather(&mine, sizeof(mine), "GPU bus ids");
  std::vector<GpuId> ids(world.size);
  for (int r = 0; r < world.size; ++r) {
    Id id;
    std::memcpy(&id, all.data() + r * sizeof(Id), sizeof(Id));
    ids[r] = {id.host, id.bus, id.nccl_hostid};
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

class CudaBackend final : public Backend, public ExactBackend {
 public:
  CudaBackend(const World& world, const Config& cfg, int gpu, std::unique_ptr<comm::Communicator> host_comm,
              comm::Watchdog* watchdog)
      : info_(cuda::set_device(gpu)), threads_(world.threads) {
    const std::string backend = check_gpus_distinct(*host_comm, world, info_, cfg.backend);
    ctx_ = std::make_unique<cuda::Context>(gpu);
    ctx_->set_benchmark(cfg.cudnn_benchmark);
    ctx_->set_gpu_kernels(GpuKernels::parse(cfg.gpu_kernels));
    ctx_->set_channels_last(cfg.channels_last);
    if (backend == "nccl") {
      comm_ = comm::make_nccl_communicator(world, *ctx_, std::chrono::milliseconds(
                                                             static_cast<int64_t>(cfg.preflight_timeout_sec * 1000)),
                                             std::move(host_comm));
    } else {
      comm_ = comm::make_staged_mpi_communicator(world, *ctx_, std::move(host_comm));
    }
    if (watchdog) comm_ = watchdog->watch(std::move(comm_));
    comm_->set_timeout(std::chrono::milliseconds(static_cast<int64_t>(cfg.timeout_sec * 1000)));
    device_ = nn::make_cuda_device(*ctx_);
    monitor_ = std::make_unique<cuda::GpuMonitor>(info_);
    kernels_ = optim::make_cuda_kernels(ctx_->compute());
    sums_ = static_cast<double*>(ctx_->alloc(kDeviceSums * sizeof(double)));
    DDP_CUDA_CHECK(cudaMemsetAsync(sums_, 0, kDeviceSums * sizeof(double), ctx_->compute()));
    for (PinnedSlot& s : slots_) {
      DDP_CUDA_CHECK(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming));
      DDP_CUDA_CHECK(cudaEventCreateWithFlags(&s.free, cudaEventDisableTiming));
    }
    DDP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&flag_host_), sizeof(unsigned)));
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&flag_copied_, cudaEventDisableTiming));
    // Last: a constructor that throws destroys comm_, which the hook must
    // not outlive.
    if (watchdog) watchdog->on_abort([c = comm_.get()] { c->abort_now(); });
  }

  ~CudaBackend() override {
    // An error on its way to main's MPI_Abort: tear nothing down. Finalising
    // NCCL or synchronising the compute stream could wait on a collective
    // stuck on a dead peer and delay (or, unbounded, stop) the error report;
    // the process ends in a moment and takes the GPU state with it.
    if (std::uncaught_exceptions() > 0) {
      static_cast<void>(comm_.release());
      static_cast<void>(kernels_.release());
      static_cast<void>(device_.release());
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
        sync("releasing the GPU backend");
        idle = true;
      } catch (...) {
      }
    }
    if (!idle) {
      // The context's destructor would wait for the compute stream without
      // a bound, and the device and kernels work on it.
      static_cast<void>(kernels_.release());
      static_cast<void>(device_.release());
      static_cast<void>(ctx_.release());
      return;
    }
    for (PinnedSlot& s : slots_) {
      if (s.host) cudaFreeHost(s.host);
      if (s.dev) cudaFree(s.dev);
      if (s.copied) cudaEventDestroy(s.copied);
      if (s.free) cudaEventDestroy(s.free);
    }
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    if (flag_host_) cudaFreeHost(flag_host_);
    if (flag_copied_) cudaEventDestroy(flag_copied_);
    if (sums_ && ctx_) cudaFreeAsync(sums_, ctx_->compute());
  }

  std::string device_name() const override { return "cuda:" + std::to_string(info_.index); }
  // --deterministic: cuDNN's deterministic algorithms only.
  void use_shard_device() override {
    ctx_->set_deterministic(true);
    device_ = deterministic::make_cuda_device(*ctx_);
  }
  std::unique_ptr<ExactGradientSum> make_exact_sum(std::vector<size_t> param_numels, int shards) override {
    return make_cuda_exact_sum(std::move(param_numels), shards, *ctx_,
                               [this](const std::string& what) { sync(what); });
  }
  void set_exact_loss() override { exact_loss_ = true; }
  // --gpu-kernels proven (shards-together): one launch, each micro-shard's
  // blocks summing as its own launch's would.
  bool shard_losses(const float* logits, const int32_t* labels, int batch, int shard, int classes, float* dlogits,
                    int grad_batch) override {
    if (!ctx_->next(NextKernel::ShardsTogether)) return false;
    nn::softmax_cross_entropy_cuda(logits, labels, batch, classes, dlogits, sums_ + kLoss, ctx_->compute(),
                                   grad_batch, exact_loss_, shard);
    return true;
  }
  int threads() const override { return threads_; }
  std::string describe() const override { return device_name() + " " + monitor_->describe(); }
  DeviceUsage usage() override { return {monitor_->mem_peak_mib(), monitor_->util_pct()}; }
  void begin_device_trace() override {
    std::string why;
    tracer_ = cuda::GpuTracer::start(&why);
    if (!tracer_) ctx_->warn_once("trace-gpu", "--trace: the GPU's own kernels and copies are not recorded: " + why);
  }
  // Once every stream is done, so that each recorded activity has ended.
  void end_device_trace(Trace& trace) override {
    if (!tracer_) return;
    sync("--trace: the GPU's activity");  // bounded (Note [bounded copies to the host])
    DDP_CUDA_CHECK(cudaDeviceSynchronize());
    const auto at = [](int64_t ns) {
      return Trace::Clock::time_point(std::chrono::duration_cast<Trace::Clock::duration>(std::chrono::nanoseconds(ns)));
    };
    cuda::GpuTracer::Recorded recorded = tracer_->stop();
    if (recorded.activities.empty() || recorded.untimed > 0 || recorded.dropped > 0)
      ctx_->warn_once("trace-gpu-lost", "--trace: the GPU tracks hold " + std::to_string(recorded.activities.size()) +
                                            " activities; CUPTI could not time " + std::to_string(recorded.untimed) +
                                            " (left out) and dropped " + std::to_string(recorded.dropped));
    for (cuda::GpuActivity& a : recorded.activities) {
      const bool kernel = a.kind == cuda::GpuActivity::Kind::kKernel;
      const char* category = kernel ? "gpu kernel" : a.kind == cuda::GpuActivity::Kind::kMemcpy ? "gpu memcpy" : "gpu memset";
      Trace::Args args;
      if (!kernel) args.push_back({"bytes", int64_t(a.bytes)});
      trace.device_span(a.stream, category, std::move(a.name), at(a.start_ns), at(a.end_ns), std::move(args));
    }
    tracer_.reset();
  }
  nn::Device& device() override { return *device_; }
  comm::Communicator& comm() override { return *comm_; }
  void sync(const std::string& what) override {
    comm_->synchronize(ctx_->compute(), what);
    complete_replays(true);
  }

  // The batch into the next pinned slot, then onto the device on the copy
  // stream; the compute stream waits for it.
  std::pair<const float*, const int32_t*> stage(const data::Batch& b) override {
    PinnedSlot& s = slots_[next_slot_];
    current_ = next_slot_;
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
    return {reinterpret_cast<const float*>(s.dev), reinterpret_cast<const int32_t*>(s.dev + x_bytes)};
  }

  // The step that read the slot is issued: its device copy is free once the
  // compute stream passes this point.
  void batch_done() override { DDP_CUDA_CHECK(cudaEventRecord(slots_[current_].free, ctx_->compute())); }

  std::optional<double> loss(const float* logits, const int32_t* labels, int batch, int classes,
                             float* dlogits, int grad_batch) override {
    nn::softmax_cross_entropy_cuda(logits, labels, batch, classes, dlogits, sums_ + kLoss, ctx_->compute(),
                                   grad_batch, exact_loss_);
    return std::nullopt;  // on the device until take_sums
  }
  void count_correct(const float* logits, const int32_t* labels, int batch, int classes) override {
    nn::count_correct_cuda(logits, labels, batch, classes, sums_ + kEvalCorrect, ctx_->compute());
  }

  // The device's sums, then zeroed.
  Sums take_sums() override {
    double h[kDeviceSums];
    sync("reading the step metrics");
    DDP_CUDA_CHECK(cudaMemcpy(h, sums_, sizeof h, cudaMemcpyDeviceToHost));
    DDP_CUDA_CHECK(cudaMemsetAsync(sums_, 0, sizeof h, ctx_->compute()));
    Sums s;
    s.loss = h[kLoss];
    s.correct = h[kCorrect];
    s.eval_correct = h[kEvalCorrect];
    return s;
  }

  // Looking at the gradients would stop the host every step (replica.hpp).
  bool checks_every_step() const override { return false; }
  // With --gpu-kernels proven the check runs on the device and the host
  // reads its flag; else the host reads the values.
  bool all_finite(const float* p, size_t n) override {
    if (!ctx_->next(NextKernel::LossScaleOnDevice)) {
      std::vector<float> h(n);
      sync("reading values to check");
      device_->to_host(h.data(), p, n);
      return first_non_finite(h.data(), n) == n;
    }
    const unsigned* flag = kernels_->non_finite(p, n);
    sync("checking that the gradients are finite");  // Note [bounded copies to the host]
    unsigned h = 0;
    DDP_CUDA_CHECK(cudaMemcpy(&h, flag, sizeof h, cudaMemcpyDeviceToHost));
    return h == 0;
  }

  optim::Kernels& optim_kernels() override { return *kernels_; }

  // Note [step graphs]: with --gpu-kernels next (opt-in: Note [next kernels]).
  bool step_graphs_asked() const override { return ctx_->next(NextKernel::StepGraphs); }
  std::string step_graphs_refusal(bool sync_bn) const override {
    if (std::string(comm_->backend()) != "nccl") return "the mpi backend's all-reduces are the host's";
    if (sync_bn && !ctx_->next(NextKernel::SyncBnOnDevice))
      return "--sync-bn's statistics go through the host without sync-bn-on-device";
    return "";
  }
  uint64_t memory_generation() const override { return ctx_->generation(); }
  void restart_slots() override { next_slot_ = 0; }
  // Thread-local: the watchdog's thread goes on asking its events.
  void begin_capture() override {
    DDP_CUDA_CHECK(cudaStreamBeginCapture(ctx_->compute(), cudaStreamCaptureModeThreadLocal));
    comm_->capturing(true);
    ctx_->set_capturing(true);
  }
  void end_capture(const StepKey& key, bool keep) override {
    comm_->capturing(false);
    ctx_->set_capturing(false);
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(ctx_->compute(), &graph);
    if (!keep || e != cudaSuccess) {
      if (graph) cudaGraphDestroy(graph);
      static_cast<void>(cudaGetLastError());  // the capture's error, reported here
      if (!keep) return;
      DDP_FAIL("capturing the training step as a CUDA graph (--gpu-kernels next: step-graphs) failed: ",
               cudaGetErrorName(e), ": ", cudaGetErrorString(e),
               "; --gpu-kernels next,-step-graphs runs each step as issued");
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t ie = cudaGraphInstantiateWithFlags(&exec, graph, 0);
    cudaGraphDestroy(graph);  // the executable graph is its own
    if (ie != cudaSuccess)
      DDP_FAIL("instantiating the training step's CUDA graph (--gpu-kernels next: step-graphs) failed: ",
               cudaGetErrorName(ie), ": ", cudaGetErrorString(ie),
               "; --gpu-kernels next,-step-graphs runs each step as issued");
    drop_graph(key);
    graphs_[key] = exec;
  }
  // Each replay's all-reduces as one Work, completed once done (here, or
  // at the next wait for the device), so the watchdog sees them end.
  void replay(const StepKey& key, const std::string& what, const std::string& bytes) override {
    complete_replays(false);
    DDP_CUDA_CHECK(cudaGraphLaunch(graphs_.at(key), ctx_->compute()));
    if (what.empty()) return;
    if (auto w = comm_->issued_on(ctx_->compute(), what, bytes)) replays_.push_back(std::move(w));
  }
  // A launch in flight completes; the graph's resources go once it has.
  void drop_graph(const StepKey& key) override {
    const auto it = graphs_.find(key);
    if (it == graphs_.end()) return;
    DDP_CUDA_CHECK(cudaGraphExecDestroy(it->second));
    graphs_.erase(it);
  }

  // Note [loss scale on the device]: by default (loss-scale-on-device).
  bool loss_scale_on_device() const override { return ctx_->next(NextKernel::LossScaleOnDevice); }
  // Note [step graphs]: in a captured step the event is recorded as the
  // graph runs (an external record), so the host can wait for it.
  void flag_to_host(const unsigned* flag) override {
    DDP_CUDA_CHECK(cudaMemcpyAsync(flag_host_, flag, sizeof(unsigned), cudaMemcpyDeviceToHost, ctx_->compute()));
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    DDP_CUDA_CHECK(cudaStreamIsCapturing(ctx_->compute(), &capture));
    DDP_CUDA_CHECK(cudaEventRecordWithFlags(flag_copied_, ctx_->compute(),
                                            capture == cudaStreamCaptureStatusActive ? cudaEventRecordExternal
                                                                                     : cudaEventRecordDefault));
  }
  bool flag_on_host(const std::string& what) override {
    wait_event(flag_copied_, what.c_str());
    return *flag_host_ != 0;
  }

 private:
  // Note [step graphs]: the replays' Works that are done (all: the device
  // is known to be past them) waited for, which completes them.
  void complete_replays(bool all) {
    while (!replays_.empty() && (all || replays_.front()->done())) {
      replays_.front()->wait();
      replays_.pop_front();
    }
  }
  // A bounded host wait on one event: the copy stream's, which has no
  // collectives for the communicator to watch, or the compute stream's
  // flag_copied_, whose collectives the watchdog watches; the timeout and
  // the watchdog's grace bound both (wait_limit), so that the watchdog names
  // a stopped peer first.
  void wait_event(cudaEvent_t ev, const char* what) {
    const auto limit = comm_->wait_limit();
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (int spins = 0;; ++spins) {
      const cudaError_t e = cudaEventQuery(ev);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) DDP_CUDA_CHECK(e);
      comm_->check_errors(what);  // a replayed step's collectives have no other watcher on this thread
      DDP_CHECK(std::chrono::steady_clock::now() < deadline, what, ": the GPU did not finish within ",
                comm::format_duration(limit), " (--timeout",
                limit > comm_->timeout() ? " and the watchdog's grace" : "", ")");
      if (spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  cuda::DeviceInfo info_;
  int threads_;
  std::unique_ptr<cuda::Context> ctx_;
  std::unique_ptr<cuda::GpuMonitor> monitor_;
  std::unique_ptr<cuda::GpuTracer> tracer_;  // --trace's GPU tracks, while the window records
  std::unique_ptr<comm::DeviceCommunicator> comm_;
  std::unique_ptr<nn::Device> device_;
  std::unique_ptr<optim::Kernels> kernels_;
  // The device's sums, doubles at these indices: softmax_cross_entropy_cuda
  // adds the loss at its sums[0] and the correct count at sums[1], so kLoss
  // and kCorrect must follow one another.
  enum DeviceSum { kLoss, kCorrect, kEvalCorrect, kDeviceSums };
  static_assert(kCorrect == kLoss + 1, "the loss kernel's layout");
  double* sums_ = nullptr;
  std::array<PinnedSlot, 2> slots_;
  unsigned* flag_host_ = nullptr;  // pinned: flag_to_host's four bytes
  cudaEvent_t flag_copied_ = nullptr;
  size_t next_slot_ = 0, current_ = 0;
  bool exact_loss_ = false;  // --deterministic
  std::map<StepKey, cudaGraphExec_t> graphs_;  // Note [step graphs]
  std::deque<std::shared_ptr<comm::Work>> replays_;  // their all-reduces, not yet seen done
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const World& world, const Config& cfg, int gpu,
                                           std::unique_ptr<comm::Communicator> host_comm,
                                           comm::Watchdog* watchdog) {
  return std::make_unique<CudaBackend>(world, cfg, gpu, std::move(host_comm), watchdog);
}

}  // namespace ddp::train
