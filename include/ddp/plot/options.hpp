// Command-line flags of ddp_plot.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ddp/plot/metrics.hpp"  // RunArg

namespace ddp::plot {

struct PlotOptions {
  std::vector<RunArg> runs;  // metrics files, in legend order
  std::string bench;         // --bench FILE: a bar chart instead of curves
  std::string prefix;        // -o: PREFIX.svg and PREFIX.png
  std::string title;
  bool train_acc = false;
  bool png = true;
  double scale = 2;
  std::optional<std::string> help;  // set when --help was asked for: print it and exit 0
};

// Throws ddp::UsageError naming the flag or argument at fault.
PlotOptions parse_plot_options(int argc, const char* const* argv);

}  // namespace ddp::plot
