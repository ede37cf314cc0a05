// Batches between NCHW and the other layout (Note [channels last],
// nn/layout.hpp), on the host: what the layout tests and the GPU tests
// transpose at their edges with.
#pragma once

#include <cstddef>
#include <vector>

#include "ddp/nn/graph.hpp"   // Shape
#include "ddp/nn/layout.hpp"  // Layout, nchw_at, nhwc_at

namespace ddp::nn::test {

// A batch of `batch` samples of shape s, NCHW, in `layout` (to), or a batch
// in `layout` back in NCHW (not to).
inline std::vector<float> relayout(const std::vector<float>& v, int batch, Shape s, Layout layout, bool to) {
  if (layout == Layout::NCHW) return v;
  std::vector<float> out(v.size());
  for (int n = 0; n < batch; ++n)
    for (int c = 0; c < s.c; ++c)
      for (int y = 0; y < s.h; ++y)
        for (int x = 0; x < s.w; ++x) {
          const size_t a = size_t(nchw_at(n, c, y, x, s.c, s.h, s.w)), b = size_t(nhwc_at(n, c, y, x, s.c, s.h, s.w));
          if (to)
            out[b] = v[a];
          else
            out[a] = v[b];
        }
  return out;
}
inline std::vector<float> to_layout(const std::vector<float>& v, int batch, Shape s, Layout layout) {
  return relayout(v, batch, s, layout, true);
}
inline std::vector<float> from_layout(const std::vector<float>& v, int batch, Shape s, Layout layout) {
  return relayout(v, batch, s, layout, false);
}

}  // namespace ddp::nn::test
