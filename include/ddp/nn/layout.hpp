// ddp::nn::Layout: how a device lays out a batch of activations, and which
// layout a graph runs in on the GPU (Note [channels last]). Plain host code,
// so the rule is checked on machines without a GPU
// (tests/unit/nn/layout_test.cpp).
//
// Note [channels last]: the model is described once, in PyTorch's NCHW
// terms (nn/graph.hpp); the layout is the device's business. With
// --channels-last the GPU keeps activations and their gradients as NHWC
// (torch.channels_last): cuDNN's tensor-core convolutions read and write it
// without the transposes they wrap around NCHW. Parameters keep PyTorch's
// layout in the flat buffer (checkpoints, the reducer and the optimizer see
// no difference); a convolution transposes its weights to KRSC for cuDNN and
// its weight gradient back. A graph runs channels-last only as a whole, and
// only where no op would need the other layout: every op with a spatial
// input or output is a Conv2d, BatchNorm2d, ReLU, Add or GlobalAvgPool,
// and the model's input and output are the same in both layouts (one
// channel, or one pixel: the loader writes the one, the loss reads the
// other). A value of one pixel or one channel is the same bytes in both
// layouts, so Flatten and Linear after the global pool need nothing.
// ResNet-18 qualifies; LeNet (its fused conv-ReLU-pool, its pooling and the
// flatten of 50x4x4 in the state dict's order) stays NCHW, said once.
#pragma once

#include <string>

#include "ddp/core/host_device.hpp"  // DDP_HOST_DEVICE
#include "ddp/nn/graph.hpp"          // Graph, Shape

namespace ddp::nn {

enum class Layout { NCHW, NHWC };
const char* to_string(Layout l);  // "NCHW", "NHWC"

struct LayoutPlan {
  Layout layout = Layout::NCHW;
  std::string why;  // channels-last asked for and refused: the op, input or output that needs NCHW
};

// The layout g runs in on a GPU: NHWC where channels_last asks for it and
// Note [channels last] allows it, else NCHW (with the reason when asked).
LayoutPlan plan_layout(const Graph& g, bool channels_last);

// Whether op of g has an NHWC kernel, or needs none (its values are all
// layout_free).
bool runs_nhwc(const Graph& g, const Op& op);

// Whether a per-sample shape is the same bytes in both layouts.
inline bool layout_free(const Shape& s) { return s.c == 1 || int64_t(s.h) * s.w == 1; }

// Element (n, c, y, x) of a batch of shape s, in each layout.
DDP_HOST_DEVICE inline int64_t nchw_at(int64_t n, int c, int y, int x, int C, int H, int W) {
  return ((n * C + c) * H + y) * int64_t(W) + x;
}
DDP_HOST_DEVICE inline int64_t nhwc_at(int64_t n, int c, int y, int x, int C, int H, int W) {
  return ((n * H + y) * int64_t(W) + x) * C + c;
}

}  // namespace ddp::nn
