#include "ddp/plot/palette.hpp"

#include <array>

namespace ddp::plot {

const std::string& series_colour(size_t i) {
  static const std::array<std::string, 10> tab10 = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  return tab10[i % tab10.size()];
}

const std::string& series_dash(size_t i) {
  static const std::array<std::string, 4> dashes = {"", "8 4", "10 3 2 3", "2 3"};
  return dashes[i % dashes.size()];
}

}  // namespace ddp::plot
