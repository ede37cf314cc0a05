// What the layer contract needs out of line: ParamSpec::numel, Shape printing.
#include <sstream>

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

}  // namespace ddp::nn
