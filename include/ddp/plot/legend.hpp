// The legend: one entry per series (a line sample or a bar swatch, then its
// label), in centred rows that wrap to the width given.
#pragma once

#include <string>
#include <vector>

#include "ddp/plot/svg.hpp"  // Svg

namespace ddp::plot {

enum class SwatchKind { line, bar };

struct LegendItem {
  std::string label;
  std::string colour;
  std::string dash;  // line swatches only
};

struct LegendLayout {
  std::vector<LegendItem> items;
  SwatchKind kind = SwatchKind::line;
  std::vector<double> x, y;  // each item's left edge and baseline, relative to the legend's origin
  double height = 0;
};

LegendLayout layout_legend(std::vector<LegendItem> items, SwatchKind kind, double width);

// Draws the legend at (x0, y0) as <g class="legend">, one
// <g class="legend-item" data-label=...> per entry holding its swatch
// (class "swatch") and its label as <text>.
void draw_legend(Svg& svg, const LegendLayout& legend, double x0, double y0);

// What sits above a chart's panels, top down: its title (when there is
// one), the legend, then the panels' own titles from panels_y.
struct ChartTop {
  double title_y, legend_y, panels_y;
};
ChartTop chart_top(const std::string& title, const LegendLayout& legend);
// Draws the title (class "title", bold, centred over width) and the legend
// (from x0) where top says.
void draw_chart_top(Svg& svg, const ChartTop& top, const std::string& title, const LegendLayout& legend,
                    double width, double x0);

}  // namespace ddp::plot
