// --gpu-kernels (runtime/gpu_kernels.hpp, Note [next kernels]): proven takes
// none of the kernels not yet proven on a GPU, next all of them, and
// next,-NAME,... all but those named, so that a failing run of next can be
// narrowed down to one; anything else is refused, naming what would do.
#include "ddp/runtime/gpu_kernels.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "ddp/core/error.hpp"

namespace ddp {
namespace {

TEST(GpuKernels, ProvenTakesNoneNextAllAndNamedOnesAreLeftOut) {
  const GpuKernels proven = GpuKernels::parse("proven"), next = GpuKernels::parse("next");
  const GpuKernels some = GpuKernels::parse("next,-graph-conv,-shard-streams");
  EXPECT_FALSE(proven.any());
  for (NextKernel k : next_kernels()) {
    SCOPED_TRACE(name_of(k));
    EXPECT_FALSE(proven.on(k));
    EXPECT_TRUE(next.on(k));
    EXPECT_EQ(some.on(k), k != NextKernel::GraphConv && k != NextKernel::ShardStreams);
    // Each piece can be left out alone.
    const GpuKernels one = GpuKernels::parse(std::string("next,-") + name_of(k));
    for (NextKernel other : next_kernels()) EXPECT_EQ(one.on(other), other != k) << name_of(other);
  }
  EXPECT_EQ(proven.describe(), "proven");
  EXPECT_EQ(next.describe(), "next");
  EXPECT_EQ(some.describe(), "next without graph-conv, shard-streams");
}

TEST(GpuKernels, EveryPieceHasANameOfItsOwn) {
  std::set<std::string> names;
  for (NextKernel k : next_kernels()) names.insert(name_of(k));
  EXPECT_EQ(names.size(), next_kernels().size());
  EXPECT_EQ(names.count("?"), 0u);
}

TEST(GpuKernels, AnythingElseIsRefusedNamingWhatWouldDo) {
  for (const char* bad : {"fast", "", "next,", "next,graph-conv", "next,-graph", "proven,-graph-conv", "nextx"}) {
    SCOPED_TRACE(bad);
    try {
      GpuKernels::parse(bad);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("--gpu-kernels"), std::string::npos) << what;
      EXPECT_TRUE(what.find("proven, next, or next,-NAME") != std::string::npos ||
                  what.find("(bn-split-sums, graph-conv, conv-bias-sums, bn-act, conv-bn, bias-in-bn, "
                            "sync-bn-on-device, one-rank, loss-scale-on-device, shard-sums, shards-together, "
                            "checked-runs, shard-streams, step-graphs, warp-run-sums)") !=
                      std::string::npos)
          << what;
    }
  }
}

}  // namespace
}  // namespace ddp
