// The benchmark's scaling numbers as grouped bars: samples/s per world size,
// one bar per system, one panel per model (their rates differ by orders of
// magnitude, so each gets its own axis).
#pragma once

#include <string>

#include "ddp/plot/bench.hpp"  // BenchTable

namespace ddp::plot {

struct BarChartOptions {
  std::string title;  // "" for none
};

// The SVG document: <g class="panel" data-panel=MODEL> per model holding one
// <rect class="bar" data-system=... data-np=...> per measured rate, and a
// legend naming the systems.
std::string bar_chart_svg(const BenchTable& table, const BarChartOptions& opts = {});

}  // namespace ddp::plot
