// --gpu-kernels (runtime/gpu_kernels.hpp, Note [next kernels]): reference
// takes none of the pieces written after the first kernels, proven (the
// default) those a GPU has run, every piece but step-graphs, next all of
// them, and proven,-NAME,... and next,-NAME,... all but those named, so that
// a failing run can be narrowed down to one; anything else is refused,
// naming what would do.
#include "ddp/runtime/gpu_kernels.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "ddp/core/error.hpp"

namespace ddp {
namespace {

TEST(GpuKernels, ReferenceTakesNoneProvenAllButStepGraphsNextAllAndNamedOnesAreLeftOut) {
  const GpuKernels reference = GpuKernels::parse("reference"), proven = GpuKernels::parse("proven"),
                   next = GpuKernels::parse("next");
  const GpuKernels some = GpuKernels::parse("next,-graph-conv,-shard-streams");
  const GpuKernels fewer = GpuKernels::parse("proven,-bn-act");
  EXPECT_FALSE(reference.any());
  EXPECT_FALSE(reference.beyond_proven());
  EXPECT_FALSE(proven.beyond_proven());
  EXPECT_TRUE(next.beyond_proven());
  for (NextKernel k : next_kernels()) {
    SCOPED_TRACE(name_of(k));
    EXPECT_FALSE(reference.on(k));
    EXPECT_EQ(proven.on(k), k != NextKernel::StepGraphs);
    EXPECT_TRUE(next.on(k));
    EXPECT_EQ(some.on(k), k != NextKernel::GraphConv && k != NextKernel::ShardStreams);
    EXPECT_EQ(fewer.on(k), k != NextKernel::StepGraphs && k != NextKernel::BnAct);
    // Each piece can be left out alone.
    const GpuKernels one = GpuKernels::parse(std::string("next,-") + name_of(k));
    for (NextKernel other : next_kernels()) EXPECT_EQ(one.on(other), other != k) << name_of(other);
  }
  EXPECT_EQ(reference.describe(), "reference");
  EXPECT_EQ(proven.describe(), "proven");
  EXPECT_EQ(next.describe(), "next");
  EXPECT_EQ(GpuKernels::parse("next,-step-graphs").describe(), "proven");
  EXPECT_EQ(some.describe(), "next without graph-conv, shard-streams");
  EXPECT_EQ(fewer.describe(), "proven without bn-act");
  // What the default is, and what a GPU run's start-up line adds to it.
  EXPECT_EQ(GpuKernels::proven().describe(), "proven");
  EXPECT_EQ(proven.startup_note(), "");
  EXPECT_EQ(next.startup_note(), "; --gpu-kernels next: also kernels not yet proven on a GPU (docs/gpus.md)");
  EXPECT_EQ(some.startup_note(),
            "; --gpu-kernels next without graph-conv, shard-streams: also kernels not yet proven on a GPU "
            "(docs/gpus.md)");
  EXPECT_EQ(fewer.startup_note(), "; --gpu-kernels proven without bn-act: some of the proven kernels left out "
                                  "(docs/gpus.md)");
  EXPECT_EQ(reference.startup_note(),
            "; --gpu-kernels reference: the first kernels alone, none of the pieces since (docs/gpus.md)");
}

TEST(GpuKernels, EveryPieceHasANameOfItsOwn) {
  std::set<std::string> names;
  for (NextKernel k : next_kernels()) names.insert(name_of(k));
  EXPECT_EQ(names.size(), next_kernels().size());
  EXPECT_EQ(names.count("?"), 0u);
}

TEST(GpuKernels, AnythingElseIsRefusedNamingWhatWouldDo) {
  for (const char* bad : {"fast", "", "next,", "next,graph-conv", "next,-graph", "reference,-graph-conv", "nextx",
                          "proven,-step-graphs", "proven,-graph"}) {
    SCOPED_TRACE(bad);
    try {
      GpuKernels::parse(bad);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("--gpu-kernels"), std::string::npos) << what;
      EXPECT_TRUE(what.find("proven, next, reference, or proven,-NAME,... or next,-NAME") != std::string::npos ||
                  what.find("step-graphs is not one of proven's kernels (next,-step-graphs is next without it)") !=
                      std::string::npos ||
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
