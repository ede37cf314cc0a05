// A panel's frame, grid and tick labels, and the map from data to px.
#pragma once

#include <string>

#include "ddp/plot/svg.hpp"    // Svg
#include "ddp/plot/ticks.hpp"  // Ticks

namespace ddp::plot {

struct Frame {
  double x = 0, y = 0, w = 0, h = 0;  // the plotting area in px, y down
};

// Data coordinates to px within a frame; the ticks' ranges are the axes'.
struct Scale {
  Frame frame;
  Ticks x, y;
  double px(double v) const;
  double py(double v) const;
};

// A white plotting area (class "plot-area") with horizontal grid lines at
// y's ticks, labelled on the left.
void draw_y_grid(Svg& svg, const Frame& f, const Ticks& y);
// Tick marks and labels under the frame at x's ticks (x's range spans f.w).
void draw_x_ticks(Svg& svg, const Frame& f, const Ticks& x);
// The frame's outline, drawn last so that curves never cover it.
void draw_frame(Svg& svg, const Frame& f);
// A label centred under the x tick labels, and a panel title above the frame.
void draw_x_label(Svg& svg, const Frame& f, const std::string& text);
void draw_panel_title(Svg& svg, const Frame& f, const std::string& text);
// A rotated label left of the y tick labels.
void draw_y_label(Svg& svg, const Frame& f, const std::string& text);

}  // namespace ddp::plot
