#include "ddp/plot/svg.hpp"

#include <cstdio>

#include "ddp/core/error.hpp"  // DDP_CHECK

namespace ddp::plot {

namespace {

// Two decimals are finer than any device pixel; the C locale (never changed
// here) writes '.' as the decimal point, as SVG requires.
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  std::string s = buf;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s == "-0" ? "0" : s;
}

std::string stroke_attrs(const Stroke& s) {
  std::string a = " stroke=\"" + s.colour + "\" stroke-width=\"" + num(s.width) + "\"";
  if (!s.dash.empty()) a += " stroke-dasharray=\"" + s.dash + "\"";
  if (s.opacity < 1) a += " stroke-opacity=\"" + num(s.opacity) + "\"";
  return a;
}

std::string extra(const std::string& attrs) { return attrs.empty() ? "" : " " + attrs; }

}  // namespace

std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // XML 1.0 allows no control characters but tab, newline and return.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') out += ' ';
        else out += c;
    }
  }
  return out;
}

double text_width(std::string_view s, double size) {
  // DejaVu Sans averages about 0.6 em per character over digits and
  // lower-case letters; bytes of a UTF-8 sequence after the first add nothing.
  double n = 0;
  for (const char c : s)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) n += 1;
  return n * 0.62 * size;
}

Svg::Svg(double width, double height) : width_(width), height_(height) {}

void Svg::rect(double x, double y, double w, double h, const std::string& fill, const std::string& attrs) {
  body_ += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(w) + "\" height=\"" + num(h) +
           "\" fill=\"" + fill + "\"" + extra(attrs) + "/>\n";
}

void Svg::line(double x1, double y1, double x2, double y2, const Stroke& s, const std::string& attrs) {
  body_ += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" + num(y2) + "\"" +
           stroke_attrs(s) + extra(attrs) + "/>\n";
}

void Svg::polyline(const std::vector<std::pair<double, double>>& pts, const Stroke& s, const std::string& attrs) {
  std::string points;
  for (const auto& [x, y] : pts) points += (points.empty() ? "" : " ") + num(x) + "," + num(y);
  body_ += "<polyline points=\"" + points + "\" fill=\"none\"" + stroke_attrs(s) +
           " stroke-linejoin=\"round\" stroke-linecap=\"round\"" + extra(attrs) + "/>\n";
}

void Svg::circle(double cx, double cy, double r, const std::string& fill, const std::string& attrs) {
  body_ += "<circle cx=\"" + num(cx) + "\" cy=\"" + num(cy) + "\" r=\"" + num(r) + "\" fill=\"" + fill + "\"" +
           extra(attrs) + "/>\n";
}

void Svg::text(double x, double y, std::string_view s, const Font& f, const std::string& attrs) {
  static const char* const anchors[] = {"start", "middle", "end"};
  std::string a = "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" font-size=\"" + num(f.size) + "\" fill=\"" +
                  f.colour + "\"";
  if (f.anchor != Anchor::start) a += std::string(" text-anchor=\"") + anchors[int(f.anchor)] + "\"";
  if (f.bold) a += " font-weight=\"bold\"";
  if (f.rotate != 0) a += " transform=\"rotate(" + num(f.rotate) + " " + num(x) + " " + num(y) + ")\"";
  body_ += a + extra(attrs) + ">" + xml_escape(s) + "</text>\n";
}

void Svg::open_group(const std::string& attrs) {
  body_ += "<g" + extra(attrs) + ">\n";
  ++depth_;
}

void Svg::close_group() {
  DDP_CHECK(depth_ > 0, "svg: close_group without an open group");
  body_ += "</g>\n";
  --depth_;
}

std::string Svg::str() const {
  DDP_CHECK(depth_ == 0, "svg: ", depth_, " groups left open");
  // A white background of our own: a PNG and a browser then agree on it.
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
         "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width_) + "\" height=\"" + num(height_) +
         "\" viewBox=\"0 0 " + num(width_) + " " + num(height_) +
         "\" font-family=\"DejaVu Sans, Verdana, sans-serif\">\n"
         "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n" +
         body_ + "</svg>\n";
}

}  // namespace ddp::plot
