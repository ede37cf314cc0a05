// Note [engines without a GPU] (nn/cuda/cudnn_graph.hpp): cuDNN plans for a
// described device on the host, so the engines Note [graph engines] chooses
// for an H100 (the GPUs this project is lent) are checked here, on machines
// without one: every convolution of ResNet-18, in each direction, layout
// and precision, gets an engine cuDNN's heuristics ranked (not one of its
// fallback list, made to work rather than to be fast), deterministic,
// within the workspace cap, never TF32 in strict fp32, and in TF32, bf16
// and fp16 each 3x3 convolution (nearly all of the network's arithmetic)
// one on tensor cores: the engines the legacy API did not reach (Note
// [graph engines]); where cuDNN ranks a tensor-core engine for the 1x1
// projections is its call. LeNet's convolutions, whose input channels (1
// and 20) are not multiples of 8, get ranked deterministic engines too. This runs
// without a GPU; timing and the trial run need one.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>
#include <tuple>

#include "ddp/nn/cuda/cudnn_graph.hpp"  // plan_graph_engine
#include "ddp/nn/graph.hpp"             // model_graph
#include "ddp/nn/layout.hpp"            // Layout

namespace ddp::nn {
namespace {

// An NVIDIA H100 80GB HBM3 as cuDNN's device-properties descriptor reads
// it (its CUDA device attributes).
const char* const kH100 =
    R"({"deviceName":"NVIDIA H100 80GB HBM3","cudaDeviceId":0,"deviceVer":900,"driverVer":13000,)"
    R"("regsPerBlock":65536,"multiProcessorCount":132,"warpSize":32,"maxSharedMemoryPerBlock":49152,)"
    R"("maxSharedMemoryPerBlockOptin":232448,"reservedSharedMemoryPerBlock":1024,"maxRegistersPerSM":65536,)"
    R"("maxCtasPerSM":32,"maxThreadsPerBlock":1024,"maxThreadsPerSM":2048,"pciDeviceId":8992,"isTccDriver":0,)"
    R"("supportCoopLaunch":1,"totalGlobalMem":85029158912,"smClockRateKHz":1980000,"memClockRateKHz":2619000,)"
    R"("l2CacheSize":52428800,"maxGridSize":[2147483647,65535,65535],"maxBlockSize":[1024,1024,64]})";

struct Conv {
  Shape in, out;
  int k, stride, pad;
  bool operator<(const Conv& o) const {
    return std::tie(in.c, in.h, in.w, out.c, out.h, out.w, k, stride, pad) <
           std::tie(o.in.c, o.in.h, o.in.w, o.out.c, o.out.h, o.out.w, o.k, o.stride, o.pad);
  }
};

// The model's convolutions (LeNet's in its fused blocks, whose op output
// is pooled: the convolution's own is the usual formula's).
std::set<Conv> convolutions(const std::string& model) {
  std::set<Conv> out;
  for (const Op& op : model_graph(model, {1, 28, 28}, 10).ops) {
    const Shape conv{op.out_c, (op.in.h + 2 * op.pad - op.k) / op.stride + 1,
                     (op.in.w + 2 * op.pad - op.k) / op.stride + 1};
    if (op.kind == OpKind::Conv2d) {
      EXPECT_EQ(conv, op.out) << op.name;
    }
    if (op.kind == OpKind::Conv2d || op.kind == OpKind::ConvReluPool)
      out.insert({op.in, conv, op.k, op.stride, op.pad});
  }
  return out;
}

// Each convolution of `model` at the benchmark's batch (256), each
// direction, the layouts given, every precision, planned as --deterministic
// plans it (and a plain run, which also takes the first deterministic
// engine) without --cudnn-benchmark; the table is printed.
void expect_ranked_engines(const std::string& model, std::initializer_list<Layout> layouts) {
  const std::set<Conv> convs = convolutions(model);
  ASSERT_FALSE(convs.empty());
  for (const Conv& c : convs)
    for (Layout layout : layouts)
      for (Precision p : {Precision::F32, Precision::TF32, Precision::BF16, Precision::F16})
        for (ConvDirection d :
             {ConvDirection::kForward, ConvDirection::kBackwardData, ConvDirection::kBackwardFilter}) {
          ConvGraphSpec spec;
          spec.shapes = conv_graph_shapes(c.in, c.out, c.k, 256, layout);
          spec.precision = p;
          spec.pad = c.pad;
          spec.stride = c.stride;
          const std::string what = to_string(c.in) + " -> " + to_string(c.out) + " k" + std::to_string(c.k) + " s" +
                                   std::to_string(c.stride) + " " + to_string(layout) + " " + to_string(p) + " " +
                                   to_string(d);
          SCOPED_TRACE(what);
          const PlannedEngine e = plan_graph_engine(kH100, d, spec, kConvWorkspaceCap, /*deterministic=*/true);
          std::printf("%-58s eng%-3lld %s%s%s %5.1f MiB, of %zu%s\n", what.c_str(), static_cast<long long>(e.engine),
                      e.fallback ? "fallback " : "", e.tensor_core ? "tensor-core " : "", e.deterministic ? "det" : "",
                      double(e.workspace) / (1 << 20), e.offered, e.refusals.c_str());
          ASSERT_TRUE(e.chosen) << e.refusals;
          EXPECT_FALSE(e.fallback) << "from cuDNN's fallback list" << e.refusals;
          EXPECT_TRUE(e.deterministic);
          EXPECT_LE(e.workspace, kConvWorkspaceCap);
          if (p == Precision::F32) {
            EXPECT_FALSE(e.tensor_core) << "TF32 in strict fp32";
          } else if (c.k > 1 && c.in.c % 8 == 0) {
            EXPECT_TRUE(e.tensor_core) << "not on tensor cores";
          }
        }
}

TEST(CudaEnginePlans, Resnet18sConvolutionsGetRankedDeterministicEnginesOnAnH100) {
  ASSERT_GE(convolutions("resnet18").size(), 10u);
  expect_ranked_engines("resnet18", {Layout::NCHW, Layout::NHWC});
}

TEST(CudaEnginePlans, LenetsConvolutionsGetRankedDeterministicEnginesOnAnH100) {
  expect_ranked_engines("lenet", {Layout::NCHW});
}

}  // namespace
}  // namespace ddp::nn
