#include "ddp/plot/line_chart.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "ddp/core/error.hpp"    // DDP_CHECK
#include "ddp/plot/axes.hpp"     // Frame, Scale, draw_*
#include "ddp/plot/legend.hpp"   // layout_legend, chart_top, draw_chart_top
#include "ddp/plot/palette.hpp"  // series_colour, series_dash
#include "ddp/plot/svg.hpp"      // Svg

namespace ddp::plot {

namespace {

// Geometry in px: two panels side by side under the title and legend.
constexpr double kWidth = 960;
constexpr double kLeft = 70, kRight = 24, kGap = 86;  // kGap leaves room for the second panel's tick labels
constexpr double kPanelHeight = 300, kBottom = 52;
// Beyond this many epochs a dot per epoch would hide the line.
constexpr size_t kMaxMarkers = 40;

struct Range {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
};

using Field = double EpochPoint::*;

// Runs often coincide (np 1, 2 and 4 agree to rounding over the first
// epochs), so each run is drawn narrower than the one before: a later run's
// line and dots sit inside the earlier ones' and every run stays visible.
double line_width(size_t i) { return std::max(1.5, 3.5 - 0.8 * double(i)); }
double marker_radius(size_t i) { return std::max(2.25, 4.5 - 0.9 * double(i)); }

void draw_series(Svg& svg, const Scale& s, const Run& run, size_t i, Field field, bool faint) {
  std::vector<std::pair<double, double>> pts;
  for (const EpochPoint& p : run.points) pts.emplace_back(s.px(p.epoch), s.py(p.*field));
  const std::string& colour = series_colour(i);
  const std::string who = "data-run=\"" + xml_escape(run.label) + "\"";
  svg.polyline(pts, Stroke{colour, faint ? 1.5 : line_width(i), series_dash(i), faint ? 0.6 : 1.0},
               std::string("class=\"series") + (faint ? " train-acc" : "") + "\" " + who);
  if (faint || (pts.size() > kMaxMarkers && pts.size() > 1)) return;
  for (const auto& [x, y] : pts) svg.circle(x, y, marker_radius(i), colour, "class=\"marker\" " + who);
}

}  // namespace

std::string line_chart_svg(const std::vector<Run>& runs, const LineChartOptions& opts) {
  DDP_CHECK(!runs.empty(), "no runs to plot");
  Range epochs, loss, acc;
  for (const Run& run : runs) {
    DDP_CHECK(!run.points.empty(), run.path, ": no records");
    for (const EpochPoint& p : run.points) {
      epochs.add(p.epoch);
      loss.add(p.train_loss);
      acc.add(p.test_acc);
      if (opts.train_acc) {
        DDP_CHECK(std::isfinite(p.train_acc), run.path, ": epoch ", p.epoch, " has no train_acc");
        acc.add(p.train_acc);
      }
    }
  }

  std::vector<LegendItem> items;
  for (size_t i = 0; i < runs.size(); ++i) items.push_back({runs[i].label, series_colour(i), series_dash(i)});
  const LegendLayout legend = layout_legend(std::move(items), SwatchKind::line, kWidth - kLeft - kRight);

  const ChartTop top = chart_top(opts.title, legend);
  const double y = top.panels_y;
  const double panel_w = (kWidth - kLeft - kRight - kGap) / 2;
  const Frame left{kLeft, y, panel_w, kPanelHeight};
  const Frame right{kLeft + panel_w + kGap, y, panel_w, kPanelHeight};

  Svg svg(kWidth, y + kPanelHeight + kBottom);
  draw_chart_top(svg, top, opts.title, legend, kWidth, kLeft);

  const Ticks x = nice_ticks(epochs.lo, epochs.hi, 5, 1);
  struct PanelSpec {
    const char* id;
    const char* title;
    Frame frame;
    Range range;
    Field field;
  };
  const PanelSpec panels[] = {
      {"train_loss", "train loss", left, loss, &EpochPoint::train_loss},
      {"test_acc", opts.train_acc ? "test accuracy (train: faint)" : "test accuracy", right, acc,
       &EpochPoint::test_acc},
  };
  for (const PanelSpec& p : panels) {
    const Scale s{p.frame, x, nice_ticks(p.range.lo, p.range.hi, 5)};
    svg.open_group(std::string("class=\"panel\" data-panel=\"") + p.id + "\"");
    draw_panel_title(svg, p.frame, p.title);
    draw_y_grid(svg, p.frame, s.y);
    draw_x_ticks(svg, p.frame, s.x);
    draw_x_label(svg, p.frame, "epoch");
    if (opts.train_acc && p.field == &EpochPoint::test_acc)
      for (size_t i = 0; i < runs.size(); ++i) draw_series(svg, s, runs[i], i, &EpochPoint::train_acc, true);
    for (size_t i = 0; i < runs.size(); ++i) draw_series(svg, s, runs[i], i, p.field, false);
    draw_frame(svg, p.frame);
    svg.close_group();
  }
  return svg.str();
}

}  // namespace ddp::plot
