// The mpi backend on GPU memory (staged through pinned host buffers): the
// same results as nccl, with any number of ranks sharing a GPU, and several
// all-reduces in flight at once on its staging thread.
#include <gtest/gtest.h>

#include "gpu_test_support.hpp"  // GpuRank, the shared checks

namespace ddp {
namespace {

using test::GpuRank;

TEST(GpuStagedMpi, AllReducesSumAndMeanExactly) {
  if (ddp::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  GpuRank g;
  auto comm = comm::make_staged_mpi_communicator(g.world, g.ctx, g.host());
  EXPECT_STREQ(comm->backend(), "mpi");
  EXPECT_EQ(comm->rank(), g.world.rank);
  EXPECT_EQ(comm->size(), g.world.size);
  test::check_sizes(*comm, g.ctx);
}

TEST(GpuStagedMpi, SeveralInFlightCompleteInIssueOrder) {
  if (ddp::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  GpuRank g;
  auto comm = comm::make_staged_mpi_communicator(g.world, g.ctx, g.host());
  test::check_in_flight(*comm, g.ctx);
}

TEST(GpuStagedMpi, ReducerAveragesDeviceGradients) {
  if (ddp::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  GpuRank g;
  auto comm = comm::make_staged_mpi_communicator(g.world, g.ctx, g.host());
  test::check_reducer(*comm, g.ctx);
}

TEST(GpuStagedMpi, HostCollectivesAndSynchronize) {
  if (ddp::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  GpuRank g;
  auto comm = comm::make_staged_mpi_communicator(g.world, g.ctx, g.host());
  test::check_host_collectives(*comm);
  comm->synchronize(g.ctx.compute(), "test: idle compute stream");
}

// A Work may outlive its communicator (a reducer torn down after it): it
// keeps what it needs, and destroying the communicator ends its threads.
TEST(GpuStagedMpi, WorkOutlivesTheCommunicator) {
  if (ddp::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  GpuRank g;
  cuda::DeviceBuffer buf(g.ctx, 1000);
  test::upload(g.ctx, buf.data(), test::rank_data(g.world.rank, 1000));
  std::shared_ptr<comm::Work> w;
  {
    auto comm = comm::make_staged_mpi_communicator(g.world, g.ctx, g.host());
    comm->barrier("test: every rank has its communicator");
    w = comm->allreduce_async(buf.data(), 1000, comm::ReduceOp::Sum, "test all-reduce");
    w->wait();  // complete on every rank: none abandons a collective its peers finish
  }
  EXPECT_TRUE(w->done());
  g.ctx.sync();
}

}  // namespace
}  // namespace ddp
