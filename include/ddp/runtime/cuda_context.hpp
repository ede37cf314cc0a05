// ddp::cuda::Context: what every GPU op of one rank shares: its device, the
// streams, the cuBLAS and cuDNN handles and one workspace. One per rank,
// made after the device is bound (runtime/device.hpp) and before any other
// CUDA call of the run.
//
// Note [streams]: compute runs on `compute`; the loader's host-to-device
// copies on `copy`; collectives on `comm`. Ordering between them is by CUDA
// events (cudaStreamWaitEvent), never by host synchronisation: the host only
// waits where it must read a result (the epoch's metrics) or reuse a pinned
// buffer.
//
// Note [side streams]: work whose calls are independent of one another and
// each too small to fill the GPU (--deterministic's micro-shards' weight
// gradients: Note [shard streams] in deterministic/shards.hpp) may be spread
// over a few side streams (on_side_streams). Every call there sees what was
// issued on the compute stream before, and what is issued on it afterwards
// sees every call. While a call is issued, compute() is its side stream,
// for the thread that spreads them: everything the call issues through the
// context (cuDNN and cuBLAS included) goes there, with a workspace and
// staging memory of that stream's own, grown when a call first needs more
// (a wait for that stream: the first spread steps only). A call's
// arithmetic is what it is on the compute stream: only when it runs
// changes. Not cuBLAS's: its handle keeps one workspace for every stream,
// and cuBLAS promises the same bits only while one stream uses it, so
// calls that use cuBLAS are not to be spread.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ddp/runtime/gpu_kernels.hpp"  // GpuKernels, NextKernel

namespace ddp::cuda {

// Visible CUDA devices; 0 when there is none or no driver (any error counts
// as none: cudaGetDeviceCount does not write the count on error). Never
// throws. why (if given) gets the reason when the count is 0.
int device_count(std::string* why = nullptr);

struct DeviceInfo {
  int index = 0;
  std::string name;        // "NVIDIA H200"
  std::string pci_bus_id;  // "0000:19:00.0": what tells two GPUs apart across ranks
  size_t memory = 0;       // bytes
  int cc_major = 0, cc_minor = 0;
};

// cudaSetDevice(index), then its properties. The first CUDA call of a rank.
DeviceInfo set_device(int index);

class Context {
 public:
  explicit Context(int device);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const { return device_; }
  int sms() const { return sms_; }  // the device's streaming multiprocessors
  // The compute stream; during on_side_streams, for the thread that called
  // it, the side stream of the call being issued (Note [side streams]).
  cudaStream_t compute() const {
    const int side = issuing_to();
    return side >= 0 ? sides_[size_t(side)] : compute_;
  }
  cudaStream_t copy() const { return copy_; }
  cudaStream_t comm() const { return comm_; }
  cublasHandle_t blas() const { return blas_; }
  cudnnHandle_t dnn() const { return dnn_; }

  // Note [side streams]: body(i) for every i in [0, n), call i issued on
  // side stream i mod kSideStreams, after everything issued on the compute
  // stream so far and before everything issued on it afterwards. The host
  // does not wait. Not nested.
  static constexpr int kSideStreams = 4;
  void on_side_streams(int64_t n, const std::function<void(int64_t)>& body);
  // The calls issued on side streams so far.
  int64_t side_calls() const { return side_calls_; }

  // One scratch buffer for cuDNN, grown to the largest request and reused
  // (ops on the compute stream run one after another, so they may share it;
  // each side stream has its own).
  void* workspace(size_t bytes);
  // A second one, grown and shared the same way, for what an op converts
  // before a cuDNN or cuBLAS call that also takes the workspace: the 16-bit
  // copies of Note [half kernels] (src/nn/cuda/half.cu).
  void* staging(size_t bytes);

  // Stream-ordered memory on the compute stream (cudaMallocAsync): freed
  // memory returns to the pool, so steady-state steps allocate nothing.
  void* alloc(size_t bytes);
  void free(void* p);

  // Note [step graphs] (train/step_graphs.hpp): how many times memory that
  // issued work may have held was freed or moved (free, a workspace or
  // staging buffer grown, a DeviceBuffer released or regrown). A CUDA graph
  // captured at another generation may read freed memory.
  uint64_t generation() const { return generation_; }
  void moved() noexcept { ++generation_; }
  // While set, alloc, free and a scratch buffer's growth are errors: a
  // captured allocation would belong to the graph, and a growth waits for
  // the stream, which a capture does not allow.
  void set_capturing(bool on) { capturing_ = on; }
  bool capturing() const { return capturing_; }

  // Blocks until the compute stream has finished what was issued so far.
  void sync();

  // "ddp_train: warning: <what>" on stderr, the first time this rank's
  // context is given `key`; later calls with the same key say nothing.
  void warn_once(const std::string& key, const std::string& what);

  // --deterministic: only deterministic cuDNN algorithms may run; where a
  // geometry has none, the layer's first call is an error naming it (without
  // it, a warning: Note [conv algorithms]).
  void set_deterministic(bool on) { deterministic_ = on; }
  bool deterministic() const { return deterministic_; }

  // --cudnn-benchmark (Note [measured algorithms], nn/cuda/conv_algo.hpp):
  // convolution algorithms chosen by timing them, and the choices made so
  // far, by geometry (each convolution's three algorithms and math types).
  // --gpu-kernels: which pieces written after the first kernels run instead
  // of them (Note [next kernels], runtime/gpu_kernels.hpp; docs/gpus.md,
  // "Kernels not yet run"); a context takes none until told (the reference
  // its tests compare each piece with); set_next_kernels: all or none.
  void set_gpu_kernels(GpuKernels k);
  void set_next_kernels(bool on) { set_gpu_kernels(on ? GpuKernels::next() : GpuKernels::reference()); }
  bool next(NextKernel k) const { return kernels_.on(k); }
  // --channels-last: graphs that allow it run NHWC on this device (Note
  // [channels last], nn/layout.hpp).
  void set_channels_last(bool on) { channels_last_ = on; }
  bool channels_last() const { return channels_last_; }

  void set_benchmark(bool on) { benchmark_ = on; }
  bool benchmark() const { return benchmark_; }
  std::map<std::string, std::vector<int>>& timed_algorithms() { return timed_; }

 private:
  int device_;
  int sms_ = 1;
  cudaStream_t compute_ = nullptr, copy_ = nullptr, comm_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  // Note [cuBLAS under capture] (cuda_context.cu): the compute stream's
  // cuBLAS workspace where step-graphs is on, else nullptr (cuBLAS's pool).
  void* blas_ws_ = nullptr;
  size_t blas_ws_bytes_ = 0;
  void set_blas_workspace();  // on the compute stream, where there is one
  cudnnHandle_t dnn_ = nullptr;
  struct Scratch {
    void* p = nullptr;
    size_t bytes = 0;
  };
  void* grow(Scratch& s, size_t bytes);  // s, at least `bytes` long
  // The stream compute() names (-1: the compute stream) for cuDNN and cuBLAS.
  void issue_on(int side);
  // The side stream this thread issues to, or -1 (the compute stream).
  int issuing_to() const { return side_ >= 0 && std::this_thread::get_id() == spreading_ ? side_ : -1; }
  // The compute stream's scratch, then each side stream's.
  std::vector<Scratch> workspaces_ = std::vector<Scratch>(1 + kSideStreams),
                       stagings_ = std::vector<Scratch>(1 + kSideStreams);
  std::vector<cudaStream_t> sides_;  // made at the first on_side_streams
  std::vector<cudaEvent_t> joins_;   // each side stream's last call
  cudaEvent_t fork_ = nullptr;       // the compute stream before the calls
  // The side stream being issued to, and the thread issuing to it: set
  // and read by that thread alone (other threads see the compute stream).
  int side_ = -1;
  std::thread::id spreading_;
  int64_t side_calls_ = 0;
  std::set<std::string> warned_;
  bool deterministic_ = false;
  bool benchmark_ = false;
  GpuKernels kernels_;
  bool channels_last_ = false;
  std::map<std::string, std::vector<int>> timed_;
  uint64_t generation_ = 0;
  bool capturing_ = false;
};

// A device buffer of floats from a Context's pool, released on destruction.
class DeviceBuffer {
 public:
  // The floats that hold `bytes` bytes (of another type).
  static constexpr size_t floats_for(size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); }
  DeviceBuffer() = default;
  DeviceBuffer(Context& ctx, size_t count);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  float* data() const { return data_; }
  size_t size() const { return size_; }
  // Grows (contents not kept) to hold at least count floats.
  void reserve(Context& ctx, size_t count);

 private:
  // The memory back to the pool, counted as moved (Context::generation).
  void release() noexcept;
  Context* ctx_ = nullptr;
  float* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ddp::cuda
