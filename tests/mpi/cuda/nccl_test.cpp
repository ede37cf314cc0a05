// The nccl backend on real ranks and GPUs: exact sums and means on device
// memory, the Reducer over a device gradient buffer, the host collectives it
// delegates to MPI. NCCL needs a GPU per rank, so at np 4 on a one-GPU node
// these skip (the staged mpi backend, staged_mpi_test.cpp, covers sharing).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "gpu_test_support.hpp"  // GpuRank, the shared checks

namespace ddp {
namespace {

using test::GpuRank;

constexpr std::chrono::seconds kInitTimeout{120};

// Skipped unless every rank has a GPU of its own; else this rank's GPU and an
// nccl communicator over the world.
class GpuNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    if (ddp::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    if (auto why = test::nccl_unfit_reason(test::gpu_world()); !why.empty()) GTEST_SKIP() << why;
    g_ = std::make_unique<GpuRank>();
    comm_ = comm::make_nccl_communicator(g_->world, g_->ctx, kInitTimeout, g_->host());
  }
  std::unique_ptr<GpuRank> g_;
  std::unique_ptr<comm::DeviceCommunicator> comm_;  // destroyed before g_'s context
};

TEST_F(GpuNccl, AllReducesSumAndMeanExactly) {
  EXPECT_STREQ(comm_->backend(), "nccl");
  EXPECT_EQ(comm_->rank(), g_->world.rank);
  EXPECT_EQ(comm_->size(), g_->world.size);
  test::check_sizes(*comm_, g_->ctx);
}

TEST_F(GpuNccl, SixteenBitAllReducesAreExactOnSmallIntegers) {
  if ((g_->world.size & (g_->world.size - 1)) != 0) GTEST_SKIP() << "the means are exact for 1, 2, 4... ranks";
  test::check_compressed(*comm_, g_->ctx);
}

TEST_F(GpuNccl, Int64SumsAreExact) {
  test::check_int64(*comm_, g_->ctx);
}

TEST_F(GpuNccl, DoubleSumsAreExact) {
  test::check_doubles(*comm_, g_->ctx);
}

// --gpu-kernels next: one rank issues no collective for its own sums; the
// results are the same.
TEST_F(GpuNccl, NextKernelsSumAsTheProvenOnes) {
  g_->ctx.set_next_kernels(true);
  test::check_sizes(*comm_, g_->ctx);
  test::check_int64(*comm_, g_->ctx);
  test::check_doubles(*comm_, g_->ctx);
  test::check_in_flight(*comm_, g_->ctx);
}

TEST_F(GpuNccl, SeveralInFlightCompleteInIssueOrder) {
  test::check_in_flight(*comm_, g_->ctx);
}

TEST_F(GpuNccl, ReducerAveragesDeviceGradients) {
  test::check_reducer(*comm_, g_->ctx);
}

TEST_F(GpuNccl, HostCollectivesGoThroughMpi) {
  test::check_host_collectives(*comm_);
}

TEST_F(GpuNccl, SynchronizeReturnsWhenStreamsAreDone) {
  comm_->synchronize(g_->ctx.compute(), "test: idle compute stream");
  cuda::DeviceBuffer buf(g_->ctx, 4096);
  test::upload(g_->ctx, buf.data(), test::rank_data(comm_->rank(), 4096));
  auto w = comm_->allreduce_async(buf.data(), 4096, comm::ReduceOp::Sum, "test all-reduce");
  // The comm stream holds the collective itself: synchronising it completes it.
  comm_->synchronize(g_->ctx.comm(), "test: comm stream");
  EXPECT_TRUE(w->done());
  w->wait();
  comm_->synchronize(g_->ctx.compute(), "test: compute stream");
  EXPECT_EQ(test::count_wrong(test::download(g_->ctx, buf.data(), 4096), comm_->size(),
                              comm::ReduceOp::Sum),
            0u);
}

}  // namespace
}  // namespace ddp
