// place_rank (train/placement.hpp).
#include "ddp/train/placement.hpp"

#include "ddp/core/error.hpp"
#include "ddp/runtime/device.hpp"  // choose_gpu
#if DDP_HAVE_CUDA
#include "ddp/runtime/cuda_context.hpp"  // cuda::device_count
#endif

namespace ddp::train {

Placement place_rank(comm::Communicator& comm, const World& world, const Config& cfg) {
  std::string why = "this build of ddp_train has no CUDA backend";
  int visible = 0;
#if DDP_HAVE_CUDA
  // Counting devices creates no CUDA context: cudaSetDevice is still the
  // first call that does (make_cuda_backend).
  if (cfg.device != "cpu") visible = cuda::device_count(&why);
#endif
  Placement p;
  p.device = cfg.device;
  if (p.device == "auto") {
    // Both in one all-reduce of maxima: (some rank has a GPU, some has none).
    double has[2] = {visible > 0 ? 1.0 : 0.0, visible > 0 ? 0.0 : 1.0};
    comm.allreduce_doubles(has, 2, /*max=*/true, "device choice");
    const bool everyone = has[1] == 0;
    p.device = everyone ? "cuda" : "cpu";
    if (!everyone && has[0] > 0)
      p.note = "some ranks see GPUs and others do not: every rank runs on the CPU (--device cuda insists)";
    DDP_CHECK(cfg.backend != "nccl" || everyone, "--backend nccl needs a GPU on every rank, and ",
              visible > 0 ? std::string("another rank") : detail::concat("host ", world.host, " (", why, ")"),
              " has none; use --backend mpi or --device cpu");
  }
  // On GPUs, auto stays open until the GPUs are bound: it is nccl when every
  // rank has a GPU of its own, which only their bus ids tell
  // (make_cuda_backend).
  p.backend = cfg.backend == "auto" && p.device == "cpu" ? "mpi" : cfg.backend;
  if (p.device == "cuda") p.gpu = choose_gpu(world, visible, p.backend != "nccl", why);
  return p;
}

}  // namespace ddp::train
