// One direction of one convolution as a graph of cuDNN's graph (backend)
// API, with the engine Note [graph engines] (nn/cuda/conv_algo.hpp) chose:
// what CudnnConv runs with --gpu-kernels proven. For .cu files only.
#pragma once

#include <cudnn.h>

#include <memory>
#include <string>

#include "ddp/nn/cuda/conv_algo.hpp"     // ConvGraphShapes, Note [graph engines]
#include "ddp/nn/precision.hpp"          // Precision
#include "ddp/runtime/cuda_context.hpp"  // cuda::Context

namespace ddp::nn {

// The type of a convolution's tensors in cuDNN (legacy and graph API
// alike): fp32 for fp32 and TF32, else the 16-bit format.
cudnnDataType_t cudnn_data_type(Precision p);

enum class ConvDirection { kForward, kBackwardData, kBackwardFilter };
const char* to_string(ConvDirection d);  // "forward", "backward-data", "backward-filter"

// What a convolution graph is made of: the geometry, its precision, and the
// beta its output is written with (backward filter: dw = beta * dw + ...).
struct ConvGraphSpec {
  ConvGraphShapes shapes;
  Precision precision = Precision::F32;
  int64_t pad = 0, stride = 1;
  float beta = 0;
  std::string key;  // conv_plan_key: the timed choice's cache key
};

// Note [engines without a GPU]: cuDNN (9.8 on) plans for a device
// described to it in JSON (a device-properties descriptor) as it plans for
// the GPU it runs on: the heuristics' lists, the engines' notes, their
// plans and workspace sizes are all host-side. So the engine Note [graph
// engines] chooses without timing (GraphConv::make, less its trial run) is
// known on machines without a GPU; tests/unit/cuda/graph_engines_test.cpp
// asks it for an H100. What timing and the trial run add needs the GPU.
struct PlannedEngine {
  bool chosen = false;       // an engine may run it
  bool fallback = false;     // from cuDNN's fallback list
  bool tensor_core = false;  // on tensor cores (TF32 for fp32 data)
  bool deterministic = false;
  int64_t engine = -1;       // cuDNN's number for it
  size_t workspace = 0;      // bytes
  size_t offered = 0;        // engines looked at
  std::string refusals;      // ": 3 convert their inputs ...": why the others may not run; or why no graph
};
PlannedEngine plan_graph_engine(const std::string& device_json, ConvDirection d, const ConvGraphSpec& spec,
                                size_t workspace_cap, bool deterministic);

class GraphConv {
 public:
  // The direction's graph and execution plan; nullptr where no engine may
  // run it, with the reason in *why (the caller falls back to the legacy
  // API and says so). Under --cudnn-benchmark the usable engines are timed
  // once per geometry and direction (Note [measured algorithms]).
  static std::unique_ptr<GraphConv> make(cuda::Context& ctx, ConvDirection d, const ConvGraphSpec& spec,
                                         size_t workspace_cap, std::string* why);
  ~GraphConv();
  GraphConv(const GraphConv&) = delete;
  GraphConv& operator=(const GraphConv&) = delete;

  size_t workspace() const;
  float beta() const;
  // The convolution on the context's compute stream; x, w, y are the input,
  // filters and output of the forward convolution or, as the direction
  // reads and writes them, their gradients (backward data writes x's
  // place, backward filter w's). Each kGraphAlignment-aligned.
  void run(cuda::Context& ctx, const void* x, const void* w, const void* y) const;

  struct Impl;

 private:
  explicit GraphConv(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::nn
