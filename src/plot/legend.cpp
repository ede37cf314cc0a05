#include "ddp/plot/legend.hpp"

#include <algorithm>

namespace ddp::plot {

namespace {

constexpr double kFont = 13;
constexpr double kRow = 22;        // px between baselines
constexpr double kSwatch = 28;     // a line sample's length; a bar swatch is kFont square
constexpr double kGap = 7;         // swatch to label
constexpr double kItemGap = 22;    // label to the next swatch

double swatch_width(SwatchKind kind) { return kind == SwatchKind::line ? kSwatch : kFont; }

}  // namespace

LegendLayout layout_legend(std::vector<LegendItem> items, SwatchKind kind, double width) {
  LegendLayout l;
  l.kind = kind;
  l.items = std::move(items);
  // Rows are filled left to right, then each row is centred in the width.
  std::vector<std::vector<size_t>> rows(1);
  std::vector<double> row_width(1, 0);
  std::vector<double> item_width;
  for (size_t i = 0; i < l.items.size(); ++i) {
    const double w = swatch_width(kind) + kGap + text_width(l.items[i].label, kFont);
    item_width.push_back(w);
    const double needed = row_width.back() + (rows.back().empty() ? 0 : kItemGap) + w;
    if (!rows.back().empty() && needed > width) {
      rows.emplace_back();
      row_width.push_back(0);
    }
    row_width.back() += (rows.back().empty() ? 0 : kItemGap) + w;
    rows.back().push_back(i);
  }
  l.x.resize(l.items.size());
  l.y.resize(l.items.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    double x = std::max(0.0, (width - row_width[r]) / 2);
    for (const size_t i : rows[r]) {
      l.x[i] = x;
      l.y[i] = kFont + r * kRow;
      x += item_width[i] + kItemGap;
    }
  }
  l.height = l.items.empty() ? 0 : kFont + (rows.size() - 1) * kRow + 5;
  return l;
}

void draw_legend(Svg& svg, const LegendLayout& l, double x0, double y0) {
  svg.open_group("class=\"legend\"");
  Font font;
  font.size = kFont;
  for (size_t i = 0; i < l.items.size(); ++i) {
    const LegendItem& it = l.items[i];
    const double x = x0 + l.x[i], base = y0 + l.y[i];
    const double mid = base - kFont * 0.35;  // the label's visual middle
    svg.open_group("class=\"legend-item\" data-label=\"" + xml_escape(it.label) + "\"");
    if (l.kind == SwatchKind::line) {
      svg.line(x, mid, x + kSwatch, mid, Stroke{it.colour, 2.5, it.dash, 1});
      // A solid dot in the middle: the run's colour over a fixed area, however
      // the dashes fall.
      svg.circle(x + kSwatch / 2, mid, 4, it.colour, "class=\"swatch\"");
    } else {
      svg.rect(x, mid - kFont / 2, kFont, kFont, it.colour, "class=\"swatch\"");
    }
    svg.text(x + swatch_width(l.kind) + kGap, base, it.label, font, "class=\"legend-label\"");
    svg.close_group();
  }
  svg.close_group();
}

ChartTop chart_top(const std::string& title, const LegendLayout& legend) {
  constexpr double kTop = 14, kTitle = 30, kPanelTitle = 26;
  ChartTop t;
  t.title_y = kTop;
  t.legend_y = kTop + (title.empty() ? 0 : kTitle);
  t.panels_y = t.legend_y + legend.height + 12 + kPanelTitle;
  return t;
}

void draw_chart_top(Svg& svg, const ChartTop& top, const std::string& title, const LegendLayout& legend,
                    double width, double x0) {
  if (!title.empty()) {
    Font font;
    font.size = 16;
    font.bold = true;
    font.anchor = Anchor::middle;
    svg.text(width / 2, top.title_y + 17, title, font, "class=\"title\"");
  }
  draw_legend(svg, legend, x0, top.legend_y);
}

}  // namespace ddp::plot
