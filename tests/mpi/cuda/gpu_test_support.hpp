// What the GPU communicator tests share: a World with its node (local rank,
// host) as the trainer sees it, one CUDA context per rank, copies between
// host and device on the compute stream, and the checks every device backend
// must pass (nccl_test.cpp, staged_mpi_test.cpp).
//
// The copies are on ctx.compute() on purpose: Note [device all-reduce order]
// says an all-reduce sees what compute wrote before it was issued, and
// compute sees the result after wait(), with no host synchronisation between.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "../test_world.hpp"             // test_world, rank_value, sum_over_ranks, expect_contains
#include "ddp/comm/device_communicator.hpp"  // DeviceCommunicator, ReduceOp
#include "ddp/reducer/reducer.hpp"               // Reducer
#include "ddp/runtime/cuda_check.hpp"        // DDP_CUDA_CHECK
#include "ddp/runtime/cuda_context.hpp"      // cuda::Context, DeviceBuffer, device_count
#include "ddp/runtime/device.hpp"            // find_shared_gpu, nccl_host: NCCL's idea of one GPU
#include "ddp/train/replica.hpp"             // make_cuda_backend: the replica tests' GPU backend

namespace ddp::test {

// test_world plus the node: local rank and size, host name.
inline World gpu_world() {
  World w = test_world();
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &w.local_rank);
  MPI_Comm_size(local, &w.local_size);
  MPI_Comm_free(&local);
  char host[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(host, &len);
  w.host.assign(host, len);
  return w;
}

// True on every rank when cond holds on every rank: a test that some ranks
// skip and others run would leave the runners waiting in a collective.
inline bool on_every_rank(bool cond) {
  int mine = cond ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

// Empty when every rank has a GPU of its own, as NCCL sees it, else why NCCL
// cannot run. Ranks share a node's GPUs round-robin (GpuRank); ranks with
// their own NCCL_HOSTID are other hosts to NCCL even on one GPU (the
// product's rule, runtime/device.hpp), so one GPU runs the NCCL tests at any
// world size that way.
inline std::string nccl_unfit_reason(const World& w) {
  const int gpus = cuda::device_count();
  struct Id {
    char host[64];
    char nccl_hostid[128];
    int device;
  } mine{};
  std::snprintf(mine.host, sizeof(mine.host), "%s", w.host.c_str());
  const char* hostid = std::getenv("NCCL_HOSTID");
  std::snprintf(mine.nccl_hostid, sizeof(mine.nccl_hostid), "%s", hostid ? hostid : "");
  mine.device = gpus > 0 ? w.local_rank % gpus : -1;
  std::vector<Id> all(size_t(w.size));
  MPI_Allgather(&mine, sizeof(Id), MPI_BYTE, all.data(), sizeof(Id), MPI_BYTE, MPI_COMM_WORLD);
  std::vector<GpuId> ids;
  for (const Id& id : all) ids.push_back({id.host, std::to_string(id.device), id.nccl_hostid});
  const auto pair = find_shared_gpu(ids);
  if (!pair) return "";
  return detail::concat("NCCL needs one GPU per rank: ranks ", pair->first, " and ", pair->second, " share GPU ",
                        all[size_t(pair->first)].device, " of host ", nccl_host(ids[size_t(pair->first)]), " (", gpus,
                        " GPUs there; give each rank its own NCCL_HOSTID to share one)");
}

// A replica test's GPU backend (train/make_backend.hpp's MakeBackend): ranks
// on a node share its GPUs round-robin, through NCCL where each has its own,
// else the staged mpi backend.
inline std::unique_ptr<train::Backend> gpu_backend(const World& w, const train::Config& cfg) {
  return train::make_cuda_backend(w, cfg, w.local_rank % cuda::device_count(), comm::make_mpi_communicator(w),
                                  nullptr);
}

// One rank's device: ranks on a node share its GPUs round-robin.
struct GpuRank {
  World world = gpu_world();
  cuda::Context ctx{world.local_rank % cuda::device_count()};
  // The MPI communicator a GPU backend takes for its host collectives.
  std::unique_ptr<comm::Communicator> host() const { return comm::make_mpi_communicator(world); }
};

inline void upload(cuda::Context& ctx, float* dst, const std::vector<float>& src) {
  DDP_CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), src.size() * sizeof(float),
                                 cudaMemcpyHostToDevice, ctx.compute()));
}

inline std::vector<float> download(cuda::Context& ctx, const float* src, size_t n) {
  std::vector<float> h(n);
  DDP_CUDA_CHECK(cudaMemcpyAsync(h.data(), src, n * sizeof(float), cudaMemcpyDeviceToHost,
                                 ctx.compute()));
  DDP_CUDA_CHECK(cudaStreamSynchronize(ctx.compute()));
  return h;
}

// This rank's values for buffer `k`: small integers, so sums are exact.
inline std::vector<float> rank_data(int rank, size_t n, size_t k = 0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = rank_value(rank, i + 7 * k);
  return v;
}

// Elements of got that are not `times` the sum (or mean) over ranks.
inline size_t count_wrong(const std::vector<float>& got, int size, comm::ReduceOp op, size_t k = 0,
                          float times = 1) {
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    float want = times * sum_over_ranks(size, i + 7 * k);
    if (op == comm::ReduceOp::Avg) {
      want /= float(size);
      bad += std::abs(got[i] - want) > 1e-5f * std::max(1.f, std::abs(want));
    } else {
      bad += got[i] != want;  // integers well inside float's exact range
    }
  }
  return bad;
}

// One all-reduce of n floats on device memory, checked on the host.
inline void check_allreduce(comm::DeviceCommunicator& comm, cuda::Context& ctx, size_t n,
                            comm::ReduceOp op) {
  cuda::DeviceBuffer buf(ctx, n);
  upload(ctx, buf.data(), rank_data(comm.rank(), n));
  auto w = comm.allreduce_async(buf.data(), n, op, "test all-reduce");
  w->wait();
  const std::vector<float> got = download(ctx, buf.data(), n);
  EXPECT_EQ(count_wrong(got, comm.size(), op), 0u)
      << n << " floats, " << (op == comm::ReduceOp::Avg ? "avg" : "sum") << ", first " << got[0];
}

inline void check_sizes(comm::DeviceCommunicator& comm, cuda::Context& ctx) {
  for (size_t n : {size_t(1), size_t(1000), size_t(1) << 20})
    for (comm::ReduceOp op : {comm::ReduceOp::Sum, comm::ReduceOp::Avg}) check_allreduce(comm, ctx, n, op);
}

// --grad-compression on device memory: small integers, their means over a
// power-of-two world and every partial sum are exact in both 16-bit
// formats, so the result must equal the fp32 one.
inline void check_compressed(comm::DeviceCommunicator& comm, cuda::Context& ctx) {
  for (comm::Wire wire : {comm::Wire::F16, comm::Wire::BF16})
    for (size_t n : {size_t(1), size_t(1000), size_t(1) << 20})
      for (comm::ReduceOp op : {comm::ReduceOp::Sum, comm::ReduceOp::Avg}) {
        cuda::DeviceBuffer buf(ctx, n);
        upload(ctx, buf.data(), rank_data(comm.rank(), n));
        comm.allreduce_compressed_async(buf.data(), n, op, wire, "test all-reduce")->wait();
        const std::vector<float> got = download(ctx, buf.data(), n);
        EXPECT_EQ(count_wrong(got, comm.size(), op), 0u)
            << n << " values as " << comm::wire_name(wire) << ", " << (op == comm::ReduceOp::Avg ? "avg" : "sum");
      }
}

// An in-place sum of T on device memory (sum(data, n), then waited for)
// against the host's sum over ranks of value(rank, i), which the values
// make exact in any order; the compute stream reads the result after wait().
template <class T>
void check_exact_sums(comm::DeviceCommunicator& comm, cuda::Context& ctx, const char* what,
                      const std::function<T(int rank, size_t i)>& value,
                      const std::function<std::shared_ptr<comm::Work>(T*, size_t)>& sum) {
  for (size_t n : {size_t(1), size_t(1000), size_t(1) << 20}) {
    std::vector<T> mine(n);
    for (size_t i = 0; i < n; ++i) mine[i] = value(comm.rank(), i);
    T* d = static_cast<T*>(ctx.alloc(n * sizeof(T)));
    DDP_CUDA_CHECK(cudaMemcpyAsync(d, mine.data(), n * sizeof(T), cudaMemcpyHostToDevice, ctx.compute()));
    sum(d, n)->wait();
    std::vector<T> got(n);
    DDP_CUDA_CHECK(cudaMemcpyAsync(got.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, ctx.compute()));
    comm.synchronize(ctx.compute(), std::string("test: reading the ") + what);
    ctx.free(d);
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) {
      T want = 0;
      for (int r = 0; r < comm.size(); ++r) want += value(r, i);
      wrong += got[i] != want;
    }
    EXPECT_EQ(wrong, 0u) << n << " " << what;
  }
}

// --deterministic's integer sums: values beyond float's and double's exact
// range (2^60 apart from small terms), so only an integer sum gets them right.
inline void check_int64(comm::DeviceCommunicator& comm, cuda::Context& ctx) {
  const int w = comm.size();
  check_exact_sums<int64_t>(
      comm, ctx, "int64 sums",
      [w](int rank, size_t i) { return (int64_t(1) << 60) / w * (i % 2 ? -1 : 1) + int64_t(rank + 1) * int64_t(i % 977); },
      [&](int64_t* d, size_t n) { return comm.allreduce_int64_async(d, n, "test int64 sum"); });
}

// SyncBatchNorm's sums: doubles beyond float's precision (2^20 apart from
// multiples of 2^-30), whose sums are exact in any order.
inline void check_doubles(comm::DeviceCommunicator& comm, cuda::Context& ctx) {
  check_exact_sums<double>(
      comm, ctx, "double sums",
      [](int rank, size_t i) { return 0x1p20 * (i % 2 ? -1 : 1) + double(rank + 1) * double(i % 977) * 0x1p-30; },
      [&](double* d, size_t n) { return comm.allreduce_doubles_async(d, n, "test double sum"); });
}

// Several all-reduces issued before any wait, one buffer twice: they complete
// in issue order (the second sum sees the first's result), waited in reverse.
inline void check_in_flight(comm::DeviceCommunicator& comm, cuda::Context& ctx) {
  const std::vector<size_t> sizes = {size_t(1) << 20, 1, 1000, 4097, 300001};
  std::vector<cuda::DeviceBuffer> bufs;
  bufs.reserve(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) {
    bufs.emplace_back(ctx, sizes[k]);
    upload(ctx, bufs[k].data(), rank_data(comm.rank(), sizes[k], k));
  }
  std::vector<std::shared_ptr<comm::Work>> work;
  for (size_t k = 0; k < sizes.size(); ++k)
    work.push_back(comm.allreduce_async(bufs[k].data(), sizes[k], comm::ReduceOp::Sum,
                                        detail::concat("test all-reduce ", k)));
  work.push_back(comm.allreduce_async(bufs[0].data(), sizes[0], comm::ReduceOp::Sum,
                                      "test all-reduce 0 again"));
  for (auto it = work.rbegin(); it != work.rend(); ++it) (*it)->wait();
  for (size_t k = 0; k < sizes.size(); ++k) {
    const std::vector<float> got = download(ctx, bufs[k].data(), sizes[k]);
    EXPECT_EQ(count_wrong(got, comm.size(), comm::ReduceOp::Sum, k, k == 0 ? float(comm.size()) : 1.f),
              0u)
        << "buffer " << k << " of " << sizes[k] << " floats";
  }
  // Compute waited for every one of them; synchronising it completes them all.
  comm.synchronize(ctx.compute(), "test: compute after the all-reduces");
  for (size_t k = 0; k < work.size(); ++k) EXPECT_TRUE(work[k]->done()) << "work " << k;
}

// The Reducer on a device gradient buffer: several buckets, each launched as
// backward (here: copies on compute) makes its parameters ready.
inline void check_reducer(comm::DeviceCommunicator& comm, cuda::Context& ctx) {
  const std::vector<size_t> numels = {10, 1280, 128, 102400, 50, 22500, 20, 180, 300001, 3};
  const size_t total = std::accumulate(numels.begin(), numels.end(), size_t(0));
  cuda::DeviceBuffer grads(ctx, total);
  Reducer red(comm, grads.data(), numels, /*bucket_cap_mb=*/0.25);
  ASSERT_GE(red.buckets().size(), 3u);
  const std::vector<float> mine = rank_data(comm.rank(), total);
  for (int step = 0; step < 2; ++step) {
    DDP_CUDA_CHECK(cudaMemsetAsync(grads.data(), 0, total * sizeof(float), ctx.compute()));
    red.begin_backward();
    size_t ready = 0;
    for (size_t n : numels) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(grads.data() + ready, mine.data() + ready, n * sizeof(float),
                                     cudaMemcpyHostToDevice, ctx.compute()));
      ready += n;
      red.grads_ready(ready);
    }
    red.finish();
    const std::vector<float> got = download(ctx, grads.data(), total);
    EXPECT_EQ(count_wrong(got, comm.size(), comm::ReduceOp::Avg), 0u)
        << "step " << step << ", " << red.buckets().size() << " buckets";
  }
}

// broadcast, allgather, allreduce_doubles and barrier work on host memory.
inline void check_host_collectives(comm::DeviceCommunicator& comm) {
  comm.set_timeout(std::chrono::seconds(120));
  const int root = comm.size() - 1;
  int value[3] = {0, 0, 0};
  if (comm.rank() == root) {
    value[0] = 7;
    value[1] = -3;
    value[2] = 1 << 20;
  }
  comm.broadcast(value, sizeof value, root, "test broadcast");
  EXPECT_EQ(value[0], 7);
  EXPECT_EQ(value[1], -3);
  EXPECT_EQ(value[2], 1 << 20);

  const int me = comm.rank() * 10;
  const std::vector<char> all = comm.allgather(&me, sizeof me, "test allgather");
  ASSERT_EQ(all.size(), sizeof(int) * comm.size());
  for (int r = 0; r < comm.size(); ++r) {
    int theirs = 0;
    std::memcpy(&theirs, all.data() + r * sizeof(int), sizeof(int));
    EXPECT_EQ(theirs, r * 10);
  }

  double sum[2] = {double(comm.rank()), 1.0};
  comm.allreduce_doubles(sum, 2, /*max=*/false, "test sum");
  EXPECT_EQ(sum[0], comm.size() * (comm.size() - 1) / 2.0);
  EXPECT_EQ(sum[1], double(comm.size()));
  double max = comm.rank();
  comm.allreduce_doubles(&max, 1, /*max=*/true, "test max");
  EXPECT_EQ(max, comm.size() - 1.0);

  comm.barrier("test barrier");
}

}  // namespace ddp::test
