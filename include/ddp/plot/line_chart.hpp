// Runs' learning curves, in the manner of d2l's Animator: train loss and test
// accuracy against the epoch, side by side, one colour per run and a legend
// naming the runs.
#pragma once

#include <string>
#include <vector>

#include "ddp/plot/metrics.hpp"  // Run

namespace ddp::plot {

struct LineChartOptions {
  std::string title;       // "" for none
  bool train_acc = false;  // also train accuracy, faint, in the accuracy panel
};

// The SVG document: <g class="panel" data-panel="train_loss|test_acc"> each
// holding one <polyline class="series" data-run=LABEL> per run (and one more,
// class "series train-acc", per run with train_acc). Throws ddp::Error when
// runs is empty.
std::string line_chart_svg(const std::vector<Run>& runs, const LineChartOptions& opts = {});

}  // namespace ddp::plot
