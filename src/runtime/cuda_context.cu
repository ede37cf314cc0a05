// Devices, streams, handles and stream-ordered memory (runtime/cuda_context.hpp).
#include "ddp/runtime/cuda_context.hpp"

#include <algorithm>
#include <exception>
#include <iostream>
#include <utility>

#include "ddp/core/error.hpp"          // DDP_CHECK
#include "ddp/runtime/cuda_check.hpp"  // DDP_CUDA_CHECK, DDP_CUBLAS_CHECK, DDP_CUDNN_CHECK

namespace ddp::cuda {

const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
  }
}

int device_count(std::string* why) {
  int n = 0;  // not written on error
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
    cudaGetLastError();  // clear it: later calls must not report it as theirs
    return 0;
  }
  if (n <= 0 && why) *why = "cudaGetDeviceCount: 0 devices";
  return n > 0 ? n : 0;
}

DeviceInfo set_device(int index) {
  DDP_CUDA_CHECK(cudaSetDevice(index));
  cudaDeviceProp prop{};
  DDP_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  char bus[32] = {0};
  DDP_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), index));
  DeviceInfo d;
  d.index = index;
  d.name = prop.name;
  d.pci_bus_id = bus;
  d.memory = prop.totalGlobalMem;
  d.cc_major = prop.major;
  d.cc_minor = prop.minor;
  return d;
}

Context::Context(int device) : device_(device) {
  DDP_CUDA_CHECK(cudaSetDevice(device));
  DDP_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
  DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
  DDP_CUBLAS_CHECK(cublasCreate(&blas_));
  DDP_CUBLAS_CHECK(cublasSetStream(blas_, compute_));
  // Plain fp32 GEMMs: TF32 would break the 1e-4 agreement with the CPU path.
  DDP_CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_PEDANTIC_MATH));
  DDP_CUDNN_CHECK(cudnnCreate(&dnn_));
  DDP_CUDNN_CHECK(cudnnSetStream(dnn_, compute_));
  // Keep freed pool memory instead of returning it at each synchronisation.
  cudaMemPool_t pool = nullptr;
  DDP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t keep = UINT64_MAX;
  DDP_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
}

Context::~Context() {
  // Destructors do not throw: errors here come after the run's result.
  if (compute_) cudaStreamSynchronize(compute_);
  for (cudaStream_t s : sides_) cudaStreamSynchronize(s);
  for (const std::vector<Scratch>* all : {&workspaces_, &stagings_})
    for (const Scratch& s : *all)
      if (s.p) cudaFree(s.p);
  for (cudaEvent_t e : joins_) cudaEventDestroy(e);
  if (fork_) cudaEventDestroy(fork_);
  for (cudaStream_t s : sides_) cudaStreamDestroy(s);
  if (dnn_) cudnnDestroy(dnn_);
  if (blas_) cublasDestroy(blas_);
  if (blas_ws_) cudaFree(blas_ws_);
  for (cudaStream_t s : {compute_, copy_, comm_})
    if (s) cudaStreamDestroy(s);
}

// The scratch of the stream compute() names: only its own work uses it.
void* Context::workspace(size_t bytes) { return grow(workspaces_[size_t(issuing_to() + 1)], bytes); }

void* Context::staging(size_t bytes) { return grow(stagings_[size_t(issuing_to() + 1)], bytes); }

void* Context::grow(Scratch& s, size_t bytes) {
  if (bytes <= s.bytes) return s.p;
  DDP_CHECK(!capturing_, "a scratch buffer of ", s.bytes, " bytes grown to ", bytes,
            " while the step is captured as a CUDA graph");
  // Work already queued may still use the old buffer.
  DDP_CUDA_CHECK(cudaStreamSynchronize(compute()));
  moved();
  if (s.p) DDP_CUDA_CHECK(cudaFree(s.p));
  s.p = nullptr;
  s.bytes = 0;
  DDP_CUDA_CHECK(cudaMalloc(&s.p, bytes));
  s.bytes = bytes;
  return s.p;
}

void* Context::alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) return p;
  DDP_CHECK(!capturing_, bytes, " bytes of device memory asked for while the step is captured as a CUDA graph");
  DDP_CUDA_CHECK(cudaMallocAsync(&p, bytes, compute()));
  return p;
}

void Context::free(void* p) {
  if (!p) return;
  DDP_CHECK(!capturing_, "device memory freed while the step is captured as a CUDA graph");
  moved();
  DDP_CUDA_CHECK(cudaFreeAsync(p, compute()));
}

void Context::sync() { DDP_CUDA_CHECK(cudaStreamSynchronize(compute())); }

void Context::issue_on(int side) {
  side_ = side;
  spreading_ = std::this_thread::get_id();
  DDP_CUDNN_CHECK(cudnnSetStream(dnn_, compute()));
  DDP_CUBLAS_CHECK(cublasSetStream(blas_, compute()));  // back to cuBLAS's own workspace pool
  if (side < 0) set_blas_workspace();
}

// Note [cuBLAS under capture]: without a workspace of the caller's, cuBLAS
// takes one from a pool of its own, and in a captured step that may be an
// allocation inside the graph (a graph launched again while its last
// launch's allocation is unfreed fails). So where steps may be captured
// (step-graphs) the compute stream's cuBLAS calls get a workspace of the
// context's own, made at once (eager steps and captured ones then choose
// their GEMMs alike), of the size cuBLAS's documentation recommends (32 MiB
// on Hopper, 4 MiB before), and set again after every cublasSetStream,
// which resets it. Side streams (--deterministic's, never captured) keep
// cuBLAS's pool: one workspace may not serve two streams at once.
void Context::set_gpu_kernels(GpuKernels k) {
  kernels_ = k;
  if (!k.on(NextKernel::StepGraphs) || blas_ws_) return;
  int major = 0;
  DDP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_));
  blas_ws_bytes_ = size_t(major >= 9 ? 32 : 4) << 20;
  DDP_CUDA_CHECK(cudaMalloc(&blas_ws_, blas_ws_bytes_));
  if (issuing_to() < 0) set_blas_workspace();
}

void Context::set_blas_workspace() {
  if (blas_ws_) DDP_CUBLAS_CHECK(cublasSetWorkspace(blas_, blas_ws_, blas_ws_bytes_));
}

void Context::on_side_streams(int64_t n, const std::function<void(int64_t)>& body) {
  DDP_CHECK(side_ < 0, "on_side_streams within on_side_streams");
  if (n <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  if (sides_.empty()) {
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    for (int k = 0; k < kSideStreams; ++k) {
      sides_.push_back(nullptr);
      DDP_CUDA_CHECK(cudaStreamCreateWithFlags(&sides_.back(), cudaStreamNonBlocking));
      joins_.push_back(nullptr);
      DDP_CUDA_CHECK(cudaEventCreateWithFlags(&joins_.back(), cudaEventDisableTiming));
    }
  }
  const int used = int(std::min<int64_t>(n, kSideStreams));
  DDP_CUDA_CHECK(cudaEventRecord(fork_, compute_));
  for (int k = 0; k < used; ++k) DDP_CUDA_CHECK(cudaStreamWaitEvent(sides_[size_t(k)], fork_, 0));
  std::exception_ptr failed;
  try {
    for (int64_t i = 0; i < n; ++i) {
      issue_on(int(i % used));
      ++side_calls_;
      body(i);
    }
  } catch (...) {
    failed = std::current_exception();
  }
  // Back on the compute stream, after every call; where a call failed, its
  // error is the one reported.
  try {
    issue_on(-1);
    for (int k = 0; k < used; ++k) {
      DDP_CUDA_CHECK(cudaEventRecord(joins_[size_t(k)], sides_[size_t(k)]));
      DDP_CUDA_CHECK(cudaStreamWaitEvent(compute_, joins_[size_t(k)], 0));
    }
  } catch (...) {
    side_ = -1;
    if (!failed) throw;
  }
  if (failed) std::rethrow_exception(failed);
}

void Context::warn_once(const std::string& key, const std::string& what) {
  if (warned_.insert(key).second) std::cerr << "ddp_train: warning: " << what << "\n" << std::flush;
}

DeviceBuffer::DeviceBuffer(Context& ctx, size_t count) { reserve(ctx, count); }

DeviceBuffer::~DeviceBuffer() { release(); }

void DeviceBuffer::release() noexcept {
  if (!ctx_ || !data_) return;
  ctx_->moved();
  cudaFreeAsync(data_, ctx_->compute());
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ctx_(std::exchange(o.ctx_, nullptr)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    release();
    ctx_ = std::exchange(o.ctx_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

void DeviceBuffer::reserve(Context& ctx, size_t count) {
  if (count <= size_ && ctx_ == &ctx) return;
  if (ctx_ && data_) ctx_->free(data_);
  ctx_ = &ctx;
  data_ = static_cast<float*>(ctx.alloc(count * sizeof(float)));
  size_ = count;
}

}  // namespace ddp::cuda
