// What the layer contract needs out of line: ParamSpec::numel, Shape printing,
// the input-shape check, weight-and-bias binding.
#include <sstream>

#include "ddp/core/error.hpp"
#include "ddp/nn/layer.hpp"
#include "ddp/nn/layers.hpp"

namespace ddp::nn {

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string to_string(const Shape& s) {
  std::ostringstream os;
  os << s.c << "x" << s.h << "x" << s.w;
  return os.str();
}

Shape ShapedLayer::output_shape(const Shape& in) const {
  DDP_CHECK(in == in_, "layer ", name_, ": built for input ", to_string(in_), ", fed ", to_string(in));
  return out_;
}

void WeightBias::bind(const std::string& layer, const std::vector<float*>& params,
                      const std::vector<float*>& grads) {
  DDP_CHECK(params.size() == 2 && grads.size() == 2, "layer ", layer, ": bind expects 2 tensors, got ",
            params.size(), " and ", grads.size());
  w = params[0];
  b = params[1];
  dw = grads[0];
  db = grads[1];
}

}  // namespace ddp::nn
