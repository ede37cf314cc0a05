// GpuTracer (runtime/gpu_trace.hpp): CUPTI's activity API, loaded with
// dlopen; its records land in buffers CUPTI asks us for and hands back full
// (on its own thread, or at a flush), which are read into GpuActivity.
#include "ddp/runtime/gpu_trace.hpp"

#include <cuda_runtime_api.h>  // cudaGetDeviceCount: where the runtime was loaded from
#include <cupti.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ddp::cuda {

namespace {

constexpr size_t kBufferBytes = size_t(8) << 20;

// Guards GpuTracer::Cupti::active, the running tracer, which CUPTI's
// callbacks (they take no user data) read into.
std::mutex g_mutex;

const char* copy_kind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    default: return "memcpy";
  }
}

}  // namespace

// The entry points used, looked up in CUPTI's library by their C names.
struct GpuTracer::Cupti {
  void* lib = nullptr;
  CUptiResult (*get_version)(uint32_t*) = nullptr;
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*timestamp)(uint64_t*) = nullptr;
  CUptiResult (*dropped)(CUcontext, uint32_t, size_t*) = nullptr;  // may be missing: then not counted
  int64_t host_minus_cupti_ns = 0;  // steady clock - CUPTI's clock, measured at start
  bool enabled = false;
  GpuTracer::Recorded recorded;

  static constexpr CUpti_ActivityKind kKinds[3] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                                    CUPTI_ACTIVITY_KIND_MEMSET};

  // CUPTI stays loaded: once enabled it is attached to the CUDA driver,
  // which may still call into it until the process ends.
  ~Cupti() {
    stop();
    detach();
  }
  void stop() {
    if (!enabled) return;
    enabled = false;
    for (CUpti_ActivityKind k : kKinds) disable(k);
    flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    size_t n = 0;
    if (dropped && dropped(nullptr, 0, &n) == CUPTI_SUCCESS) recorded.dropped += n;
    detach();
  }
  // The completion callback no longer reads into this one's records.
  void detach() {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (active == this) active = nullptr;
  }

  static Cupti* active;  // recording: the completion callback reads into its records

  static void CUPTIAPI requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    *size = *buffer ? kBufferBytes : 0;
    *max_records = 0;
  }

  // On CUPTI's thread, from C: nothing may be thrown out of it (a record
  // that cannot be kept is lost, and counted as such when none is kept).
  static void CUPTIAPI completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    try {
      std::lock_guard<std::mutex> lock(g_mutex);
      if (Cupti* c = active) {
        CUpti_Activity* r = nullptr;
        while (c->next_record(buffer, valid, &r) == CUPTI_SUCCESS) c->read(r, c->recorded);
      }
    } catch (...) {
    }
    std::free(buffer);
  }

  void read(const CUpti_Activity* r, GpuTracer::Recorded& out) const {
    GpuActivity a;
    uint64_t start = 0, end = 0;
    const auto transfer = [&](const auto* m, GpuActivity::Kind kind, const char* name) {
      a.kind = kind;
      a.name = name;
      a.stream = m->streamId;
      a.bytes = m->bytes;
      start = m->start;
      end = m->end;
    };
    switch (r->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
        a.kind = GpuActivity::Kind::kKernel;
        a.name = kernel_display_name(k->name);
        a.stream = k->streamId;
        start = k->start;
        end = k->end;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
        transfer(m, GpuActivity::Kind::kMemcpy, copy_kind(m->copyKind));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET:
        transfer(reinterpret_cast<const CUpti_ActivityMemset4*>(r), GpuActivity::Kind::kMemset, "memset");
        break;
      default: return;
    }
    if (!activity_timed(start, end)) {
      ++out.untimed;
      return;
    }
    a.start_ns = int64_t(start) + host_minus_cupti_ns;
    a.end_ns = int64_t(end) + host_minus_cupti_ns;
    out.activities.push_back(std::move(a));
  }
};

GpuTracer::Cupti* GpuTracer::Cupti::active = nullptr;

GpuTracer::GpuTracer(std::unique_ptr<Cupti> cupti) : cupti_(std::move(cupti)) {}

GpuTracer::~GpuTracer() = default;  // Cupti's stops recording

std::unique_ptr<GpuTracer> GpuTracer::start(std::string* why) {
  auto c = std::make_unique<Cupti>();
  const std::string lib = "libcupti.so." + std::to_string(CUPTI_API_VERSION / 10000);
  // On the library path, else beside the CUDA runtime this program loaded
  // (Python's CUDA packages keep the two in one folder).
  std::vector<std::string> names = {lib, "libcupti.so"};
  Dl_info runtime{};
  if (dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &runtime) && runtime.dli_fname) {
    const std::string at = runtime.dli_fname;
    if (const size_t slash = at.rfind('/'); slash != std::string::npos) names.push_back(at.substr(0, slash + 1) + lib);
  }
  std::string error;
  for (const std::string& name : names) {
    c->lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (c->lib) break;
    if (const char* e = dlerror(); e && error.empty()) error = e;
  }
  if (!c->lib) {
    *why = "CUPTI's library (" + lib + ") is not on the library path nor beside the CUDA runtime (" + error + ")";
    return nullptr;
  }
  auto sym = [&](auto& fn, const char* name) { fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(c->lib, name)); };
  sym(c->get_version, "cuptiGetVersion");
  sym(c->register_callbacks, "cuptiActivityRegisterCallbacks");
  sym(c->enable, "cuptiActivityEnable");
  sym(c->disable, "cuptiActivityDisable");
  sym(c->flush_all, "cuptiActivityFlushAll");
  sym(c->next_record, "cuptiActivityGetNextRecord");
  sym(c->timestamp, "cuptiGetTimestamp");
  sym(c->dropped, "cuptiActivityGetNumDroppedRecords");
  if (!c->get_version || !c->register_callbacks || !c->enable || !c->disable || !c->flush_all || !c->next_record ||
      !c->timestamp) {
    *why = "CUPTI's library lacks an entry point of the activity API";
    return nullptr;
  }
  uint32_t version = 0;
  // The records are read as this CUDA major's CUPTI lays them out.
  if (c->get_version(&version) != CUPTI_SUCCESS || version / 10000 != CUPTI_API_VERSION / 10000) {
    *why = "CUPTI's API version " + std::to_string(version) + " is not this program's (" +
           std::to_string(CUPTI_API_VERSION) + ")";
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (Cupti::active) {
      *why = "another GPU trace is being recorded";
      return nullptr;
    }
    Cupti::active = c.get();
  }
  // The clocks' offset from the tightest of a few readings, after one that
  // lets CUPTI start up.
  const auto host_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  uint64_t cupti_now = 0;
  CUptiResult e = c->timestamp(&cupti_now);
  std::vector<ClockReading> readings;
  for (int i = 0; i < 5 && e == CUPTI_SUCCESS; ++i) {
    ClockReading r;
    r.host_before_ns = host_ns();
    e = c->timestamp(&cupti_now);
    r.host_after_ns = host_ns();
    r.other_ns = int64_t(cupti_now);
    readings.push_back(r);
  }
  const auto refused = [&](const std::string& what) {
    *why = what + " (CUptiResult " + std::to_string(int(e)) + ")";
    c->detach();
    return nullptr;
  };
  if (e != CUPTI_SUCCESS) return refused("CUPTI's clock could not be read");
  c->host_minus_cupti_ns = clock_offset_ns(readings);
  e = c->register_callbacks(&Cupti::requested, &Cupti::completed);
  for (CUpti_ActivityKind k : Cupti::kKinds) {
    if (e != CUPTI_SUCCESS) break;
    e = c->enable(k);
    c->enabled = true;
  }
  if (e != CUPTI_SUCCESS) {
    c->stop();
    return refused("CUPTI refused to record kernel and copy activity (another profiler attached?)");
  }
  return std::unique_ptr<GpuTracer>(new GpuTracer(std::move(c)));
}

GpuTracer::Recorded GpuTracer::stop() {
  cupti_->stop();
  std::lock_guard<std::mutex> lock(g_mutex);
  return std::exchange(cupti_->recorded, Recorded{});
}

}  // namespace ddp::cuda
