// The nccl backend on real ranks and GPUs: exact sums and means on device
// memory, the Reducer over a device gradient buffer, the host collectives it
// delegates to MPI. NCCL needs a GPU per rank, so at np 4 on a one-GPU node
// these skip (the staged mpi backend, staged_mpi_test.cpp, covers sharing).
#include <gtest/gtest.h>

#include <chrono>

#include "gpu_test_support.hpp"  // GpuRank, the shared checks

namespace ddp {
namespace {

using test::GpuRank;

constexpr std::chrono::seconds kInitTimeout{120};

TEST(GpuNccl, AllReducesSumAndMeanExactly) {
  if (ddp::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (auto why = test::nccl_unfit_reason(test::gpu_world()); !why.empty()) GTEST_SKIP() << why;
  GpuRank g;
  auto comm = comm::make_nccl_communicator(g.world, g.ctx, kInitTimeout, g.host());
  EXPECT_STREQ(comm->backend(), "nccl");
  EXPECT_EQ(comm->rank(), g.world.rank);
  EXPECT_EQ(comm->size(), g.world.size);
  test::check_sizes(*comm, g.ctx);
}

TEST(GpuNccl, SeveralInFlightCompleteInIssueOrder) {
  if (ddp::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (auto why = test::nccl_unfit_reason(test::gpu_world()); !why.empty()) GTEST_SKIP() << why;
  GpuRank g;
  auto comm = comm::make_nccl_communicator(g.world, g.ctx, kInitTimeout, g.host());
  test::check_in_flight(*comm, g.ctx);
}

TEST(GpuNccl, ReducerAveragesDeviceGradients) {
  if (ddp::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (auto why = test::nccl_unfit_reason(test::gpu_world()); !why.empty()) GTEST_SKIP() << why;
  GpuRank g;
  auto comm = comm::make_nccl_communicator(g.world, g.ctx, kInitTimeout, g.host());
  test::check_reducer(*comm, g.ctx);
}

TEST(GpuNccl, HostCollectivesGoThroughMpi) {
  if (ddp::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (auto why = test::nccl_unfit_reason(test::gpu_world()); !why.empty()) GTEST_SKIP() << why;
  GpuRank g;
  auto comm = comm::make_nccl_communicator(g.world, g.ctx, kInitTimeout, g.host());
  test::check_host_collectives(*comm);
}

TEST(GpuNccl, SynchronizeReturnsWhenStreamsAreDone) {
  if (ddp::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  if (auto why = test::nccl_unfit_reason(test::gpu_world()); !why.empty()) GTEST_SKIP() << why;
  GpuRank g;
  auto comm = comm::make_nccl_communicator(g.world, g.ctx, kInitTimeout, g.host());
  comm->synchronize(g.ctx.compute(), "test: idle compute stream");
  cuda::DeviceBuffer buf(g.ctx, 4096);
  test::upload(g.ctx, buf.data(), test::rank_data(comm->rank(), 4096));
  auto w = comm->allreduce_async(buf.data(), 4096, comm::ReduceOp::Sum, "test all-reduce");
  // The comm stream holds the collective itself: synchronising it completes it.
  comm->synchronize(g.ctx.comm(), "test: comm stream");
  EXPECT_TRUE(w->done());
  w->wait();
  comm->synchronize(g.ctx.compute(), "test: compute stream");
  EXPECT_EQ(test::count_wrong(test::download(g.ctx, buf.data(), 4096), comm->size(),
                              comm::ReduceOp::Sum),
            0u);
}

}  // namespace
}  // namespace ddp
