// A minimal SVG writer: the elements the charts need, coordinates in px with
// two decimals, text XML-escaped. Text stays real <text> elements so that a
// browser's DOM (and a test) can read the legend.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddp::plot {

std::string xml_escape(std::string_view s);

struct Stroke {
  std::string colour = "#000000";
  double width = 1;
  std::string dash;  // SVG stroke-dasharray; "" for solid
  double opacity = 1;
};

enum class Anchor { start, middle, end };

struct Font {
  double size = 13;
  Anchor anchor = Anchor::start;
  bool bold = false;
  std::string colour = "#222222";
  double rotate = 0;  // degrees about the text's anchor point
};

class Svg {
 public:
  Svg(double width, double height);

  double width() const { return width_; }
  double height() const { return height_; }

  // attrs: extra attributes, written as given (class, data-*): callers pass
  // escaped text (xml_escape) for anything that comes from input.
  void rect(double x, double y, double w, double h, const std::string& fill, const std::string& attrs = "");
  void line(double x1, double y1, double x2, double y2, const Stroke& s, const std::string& attrs = "");
  void polyline(const std::vector<std::pair<double, double>>& pts, const Stroke& s, const std::string& attrs = "");
  void circle(double cx, double cy, double r, const std::string& fill, const std::string& attrs = "");
  void text(double x, double y, std::string_view s, const Font& f, const std::string& attrs = "");
  void open_group(const std::string& attrs);
  void close_group();

  // The document; every group opened is closed.
  std::string str() const;

 private:
  double width_, height_;
  std::string body_;
  int depth_ = 0;
};

// Roughly how wide s is in DejaVu Sans (the font the charts ask for) at size
// px: for laying out legends without a font engine. Errs on the wide side.
double text_width(std::string_view s, double size);

}  // namespace ddp::plot
