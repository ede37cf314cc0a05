// plan_layout: Note [channels last] (nn/layout.hpp).
#include "ddp/nn/layout.hpp"

#include "ddp/core/error.hpp"  // detail::concat

namespace ddp::nn {

const char* to_string(Layout l) { return l == Layout::NHWC ? "NHWC" : "NCHW"; }

bool runs_nhwc(const Graph& g, const Op& op) {
  switch (op.kind) {
    case OpKind::Conv2d:
    case OpKind::BatchNorm2d:
    case OpKind::ReLU:
    case OpKind::Add:
    case OpKind::GlobalAvgPool: return true;
    default: break;
  }
  bool spatial = !layout_free(op.out);
  for (int v : op.inputs) spatial = spatial || !layout_free(g.values[size_t(v)]);
  return !spatial;
}

LayoutPlan plan_layout(const Graph& g, bool channels_last) {
  LayoutPlan plan;
  if (!channels_last) return plan;
  if (!layout_free(g.input)) {
    plan.why = detail::concat("the model's input ", to_string(g.input), " comes NCHW from the loader");
    return plan;
  }
  for (const Op& op : g.ops) {
    if (runs_nhwc(g, op)) continue;
    plan.why = detail::concat("op ", op.name, " (", to_string(op.kind), ") has no channels-last kernel");
    return plan;
  }
  if (!layout_free(g.output_shape())) {
    plan.why = detail::concat("the model's output ", to_string(g.output_shape()), " is read NCHW by the loss");
    return plan;
  }
  plan.layout = Layout::NHWC;
  return plan;
}

}  // namespace ddp::nn
