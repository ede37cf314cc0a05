// The mpi backend on GPU memory (staged through pinned host buffers): the
// same results as nccl, with any number of ranks sharing a GPU, and several
// all-reduces in flight at once on its staging thread.
#include <gtest/gtest.h>

#include <memory>

#include "gpu_test_support.hpp"  // GpuRank, the shared checks

namespace ddp {
namespace {

using test::GpuRank;

// Skipped without a GPU; else this rank's GPU (shared with the node's other
// ranks).
class GpuStagedMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    if (ddp::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    g_ = std::make_unique<GpuRank>();
  }
  std::unique_ptr<comm::DeviceCommunicator> make_comm() {
    return comm::make_staged_mpi_communicator(g_->world, g_->ctx, g_->host());
  }
  std::unique_ptr<GpuRank> g_;
};

TEST_F(GpuStagedMpi, AllReducesSumAndMeanExactly) {
  auto comm = make_comm();
  EXPECT_STREQ(comm->backend(), "mpi");
  EXPECT_EQ(comm->rank(), g_->world.rank);
  EXPECT_EQ(comm->size(), g_->world.size);
  test::check_sizes(*comm, g_->ctx);
}

TEST_F(GpuStagedMpi, Int64SumsAreExact) {
  auto comm = make_comm();
  test::check_int64(*comm, g_->ctx);
}

TEST_F(GpuStagedMpi, DoubleSumsAreExact) {
  auto comm = make_comm();
  test::check_doubles(*comm, g_->ctx);
}

TEST_F(GpuStagedMpi, SixteenBitAllReducesAreExactOnSmallIntegers) {
  if ((g_->world.size & (g_->world.size - 1)) != 0) GTEST_SKIP() << "the means are exact for 1, 2, 4... ranks";
  auto comm = make_comm();
  test::check_compressed(*comm, g_->ctx);
}

TEST_F(GpuStagedMpi, SeveralInFlightCompleteInIssueOrder) {
  auto comm = make_comm();
  test::check_in_flight(*comm, g_->ctx);
}

TEST_F(GpuStagedMpi, ReducerAveragesDeviceGradients) {
  auto comm = make_comm();
  test::check_reducer(*comm, g_->ctx);
}

TEST_F(GpuStagedMpi, HostCollectivesAndSynchronize) {
  auto comm = make_comm();
  test::check_host_collectives(*comm);
  comm->synchronize(g_->ctx.compute(), "test: idle compute stream");
}

// A Work may outlive its communicator (a reducer torn down after it): it
// keeps what it needs, and destroying the communicator ends its threads.
TEST_F(GpuStagedMpi, WorkOutlivesTheCommunicator) {
  cuda::DeviceBuffer buf(g_->ctx, 1000);
  test::upload(g_->ctx, buf.data(), test::rank_data(g_->world.rank, 1000));
  std::shared_ptr<comm::Work> w;
  {
    auto comm = make_comm();
    comm->barrier("test: every rank has its communicator");
    w = comm->allreduce_async(buf.data(), 1000, comm::ReduceOp::Sum, "test all-reduce");
    w->wait();  // complete on every rank: none abandons a collective its peers finish
  }
  EXPECT_TRUE(w->done());
  g_->ctx.sync();
}

}  // namespace
}  // namespace ddp
