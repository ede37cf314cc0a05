#include "ddp/plot/axes.hpp"

namespace ddp::plot {

namespace {

constexpr double kTickFont = 12;
const char* const kAxisColour = "#444444";
const char* const kGridColour = "#e3e3e3";

}  // namespace

double Scale::px(double v) const { return frame.x + (v - x.lo) / (x.hi - x.lo) * frame.w; }
double Scale::py(double v) const { return frame.y + frame.h - (v - y.lo) / (y.hi - y.lo) * frame.h; }

void draw_y_grid(Svg& svg, const Frame& f, const Ticks& y) {
  svg.rect(f.x, f.y, f.w, f.h, "#ffffff", "class=\"plot-area\"");
  Font font;
  font.size = kTickFont;
  font.anchor = Anchor::end;
  font.colour = kAxisColour;
  for (const double v : y.values) {
    const double py = f.y + f.h - (v - y.lo) / (y.hi - y.lo) * f.h;
    svg.line(f.x, py, f.x + f.w, py, Stroke{kGridColour, 1, "", 1});
    svg.line(f.x - 4, py, f.x, py, Stroke{kAxisColour, 1, "", 1});
    svg.text(f.x - 7, py + kTickFont * 0.35, y.label(v), font, "class=\"tick\"");
  }
}

void draw_x_ticks(Svg& svg, const Frame& f, const Ticks& x) {
  Font font;
  font.size = kTickFont;
  font.anchor = Anchor::middle;
  font.colour = kAxisColour;
  const double bottom = f.y + f.h;
  for (const double v : x.values) {
    const double px = f.x + (v - x.lo) / (x.hi - x.lo) * f.w;
    svg.line(px, bottom, px, bottom + 4, Stroke{kAxisColour, 1, "", 1});
    svg.text(px, bottom + 7 + kTickFont, x.label(v), font, "class=\"tick\"");
  }
}

void draw_frame(Svg& svg, const Frame& f) {
  svg.rect(f.x, f.y, f.w, f.h, "none", "stroke=\"" + std::string(kAxisColour) + "\" stroke-width=\"1\"");
}

void draw_x_label(Svg& svg, const Frame& f, const std::string& text) {
  Font font;
  font.anchor = Anchor::middle;
  svg.text(f.x + f.w / 2, f.y + f.h + 38, text, font, "class=\"axis-label\"");
}

void draw_panel_title(Svg& svg, const Frame& f, const std::string& text) {
  Font font;
  font.size = 14;
  font.anchor = Anchor::middle;
  font.bold = true;
  svg.text(f.x + f.w / 2, f.y - 9, text, font, "class=\"panel-title\"");
}

void draw_y_label(Svg& svg, const Frame& f, const std::string& text) {
  Font font;
  font.anchor = Anchor::middle;
  font.rotate = -90;
  svg.text(f.x - 58, f.y + f.h / 2, text, font, "class=\"axis-label\"");
}

}  // namespace ddp::plot
