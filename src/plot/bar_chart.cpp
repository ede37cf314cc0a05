#include "ddp/plot/bar_chart.hpp"

#include <algorithm>
#include <cstdio>
#include <set>

#include "ddp/core/error.hpp"    // DDP_CHECK
#include "ddp/plot/axes.hpp"     // Frame, draw_*
#include "ddp/plot/legend.hpp"   // layout_legend, chart_top, draw_chart_top
#include "ddp/plot/palette.hpp"  // series_colour
#include "ddp/plot/svg.hpp"      // Svg
#include "ddp/plot/ticks.hpp"    // nice_ticks

namespace ddp::plot {

namespace {

// Geometry in px: one panel per model, side by side.
constexpr double kLeft = 84, kRight = 24, kGap = 110;  // kLeft, kGap: tick labels and the rotated y label
constexpr double kPanelHeight = 300, kBottom = 52;
constexpr double kMaxBar = 56;

std::string rate_label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, v >= 100 ? "%.0f" : "%.3g", v);
  return buf;
}

}  // namespace

std::string bar_chart_svg(const BenchTable& table, const BarChartOptions& opts) {
  DDP_CHECK(!table.rows.empty() && !table.systems.empty(), table.path, ": no rows to plot");
  const size_t n_panels = table.models.size(), n_sys = table.systems.size();
  const double panel_w = n_panels == 1 ? 600 : 420;
  const double width = kLeft + n_panels * panel_w + (n_panels - 1) * kGap + kRight;

  std::vector<LegendItem> items;
  for (size_t s = 0; s < n_sys; ++s) items.push_back({table.systems[s], series_colour(s), ""});
  const LegendLayout legend = layout_legend(std::move(items), SwatchKind::bar, width - kLeft - kRight);

  const ChartTop top = chart_top(opts.title, legend);
  const double y = top.panels_y;

  Svg svg(width, y + kPanelHeight + kBottom);
  draw_chart_top(svg, top, opts.title, legend, width, kLeft);

  for (size_t m = 0; m < n_panels; ++m) {
    const std::string& model = table.models[m];
    const Frame f{kLeft + m * (panel_w + kGap), y, panel_w, kPanelHeight};
    std::vector<const BenchRow*> rows;  // this model's, by np (read_bench sorts them)
    double top = 0;
    for (const BenchRow& r : table.rows) {
      if (r.model != model) continue;
      rows.push_back(&r);
      for (const auto& v : r.rate)
        if (v) top = std::max(top, *v);
    }
    // Room above the tallest bar for its value.
    const Ticks yt = nice_ticks(0, top > 0 ? top * 1.1 : 1, 5);
    auto py = [&](double v) { return f.y + f.h - (v - yt.lo) / (yt.hi - yt.lo) * f.h; };

    svg.open_group("class=\"panel\" data-panel=\"" + xml_escape(model) + "\"");
    if (!model.empty()) draw_panel_title(svg, f, model);
    draw_y_grid(svg, f, yt);
    draw_y_label(svg, f, "samples/s");
    draw_x_label(svg, f, "world size");
    const double slot = f.w / rows.size();
    const double bar = std::min(kMaxBar, slot * 0.8 / n_sys);
    Font tick;
    tick.size = 12;
    tick.anchor = Anchor::middle;
    tick.colour = "#444444";
    Font value;
    value.size = 11;
    value.anchor = Anchor::middle;
    for (size_t g = 0; g < rows.size(); ++g) {
      const BenchRow& r = *rows[g];
      const double centre = f.x + (g + 0.5) * slot;
      svg.text(centre, f.y + f.h + 19, "np " + std::to_string(r.np), tick, "class=\"tick\"");
      for (size_t s = 0; s < n_sys; ++s) {
        if (!r.rate[s]) continue;
        const double x = centre - n_sys * bar / 2 + s * bar;
        const double top_y = py(*r.rate[s]);
        svg.rect(x + 1, top_y, bar - 2, f.y + f.h - top_y, series_colour(s),
                 "class=\"bar\" data-system=\"" + xml_escape(table.systems[s]) + "\" data-np=\"" +
                     std::to_string(r.np) + "\"");
        svg.text(x + bar / 2, top_y - 4, rate_label(*r.rate[s]), value, "class=\"value\"");
      }
    }
    draw_frame(svg, f);
    svg.close_group();
  }
  return svg.str();
}

}  // namespace ddp::plot
