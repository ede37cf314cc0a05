// What the SVGs say: the legend names every run as text, each panel holds one
// curve per run (bars per system and world size), input text is escaped, and
// the document's groups are balanced.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ddp/plot/bar_chart.hpp"
#include "ddp/plot/line_chart.hpp"
#include "ddp/plot/palette.hpp"
#include "ddp/plot/svg.hpp"
#include "plot_test_util.hpp"

namespace ddp::plot {
namespace {

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

// The text of the element that starts with `open` (up to its matching </g>).
std::string group(const std::string& svg, const std::string& open) {
  const size_t start = svg.find(open);
  if (start == std::string::npos) return "";
  int depth = 0;
  for (size_t at = start; at < svg.size(); ++at) {
    if (svg.compare(at, 2, "<g") == 0 && (svg[at + 2] == ' ' || svg[at + 2] == '>')) ++depth;
    if (svg.compare(at, 4, "</g>") == 0 && --depth == 0) return svg.substr(start, at + 4 - start);
  }
  return "";
}

Run run(const std::string& label, int epochs, double shift) {
  Run r{label, label + ".jsonl", {}};
  for (int e = 1; e <= epochs; ++e) r.points.push_back({e, 2.3 / e + shift, 0.1 + 0.07 * e + shift, 0.08 * e});
  return r;
}

TEST(LineChart, LegendNamesEveryRunAsText) {
  const std::string svg = line_chart_svg({run("np1", 10, 0), run("np2", 10, 0.01), run("np4", 10, 0.02)});
  const std::string legend = group(svg, "<g class=\"legend\">");
  ASSERT_FALSE(legend.empty()) << svg;
  for (const char* label : {"np1", "np2", "np4"}) {
    EXPECT_HAS(legend, std::string(">") + label + "</text>");
    EXPECT_HAS(legend, std::string("data-label=\"") + label + "\"");
  }
  EXPECT_EQ(count(legend, "class=\"swatch\""), 3u);
  // Each entry in its run's colour, in the order given.
  for (size_t i = 0; i < 3; ++i) EXPECT_HAS(legend, "fill=\"" + series_colour(i) + "\" class=\"swatch\"");
  EXPECT_LT(legend.find("np1"), legend.find("np2"));
  EXPECT_LT(legend.find("np2"), legend.find("np4"));
}

TEST(LineChart, OnePolylinePerRunPerPanel) {
  const std::vector<ddp::plot::Run> runs = {run("a", 5, 0), run("b", 5, 0.1)};
  const std::string svg = line_chart_svg(runs);
  for (const char* panel : {"train_loss", "test_acc"}) {
    const std::string g = group(svg, std::string("<g class=\"panel\" data-panel=\"") + panel + "\"");
    ASSERT_FALSE(g.empty()) << panel;
    EXPECT_EQ(count(g, "<polyline"), 2u) << panel;
    for (size_t i = 0; i < runs.size(); ++i) {
      EXPECT_EQ(count(g, "class=\"series\" data-run=\"" + runs[i].label + "\""), 1u) << panel;
      EXPECT_HAS(g, "stroke=\"" + series_colour(i) + "\"");
      // A dot per epoch, in the run's colour.
      EXPECT_EQ(count(g, "class=\"marker\" data-run=\"" + runs[i].label + "\""), 5u) << panel;
    }
    EXPECT_HAS(g, ">epoch</text>");
  }
  EXPECT_HAS(svg, ">train loss</text>");
  EXPECT_HAS(svg, ">test accuracy</text>");
  EXPECT_EQ(count(svg, "<g"), count(svg, "</g>"));
  EXPECT_EQ(svg.find("class=\"title\""), std::string::npos);  // no --title, no title
}

TEST(LineChart, PolylineHasAPointPerEpoch) {
  const std::string svg = line_chart_svg({run("a", 7, 0)});
  const std::string g = group(svg, "<g class=\"panel\" data-panel=\"train_loss\"");
  const size_t at = g.find("<polyline points=\"");
  ASSERT_NE(at, std::string::npos);
  const std::string points = g.substr(at, g.find('"', at + 18) - at);
  EXPECT_EQ(count(points, ","), 7u) << points;
}

TEST(LineChart, TitleAndTrainAccuracy) {
  LineChartOptions opts;
  opts.title = "d2l's <LeNet> & co";
  opts.train_acc = true;
  const std::string svg = line_chart_svg({run("a", 3, 0), run("b", 3, 0)}, opts);
  EXPECT_HAS(svg, "class=\"title\">d2l&apos;s &lt;LeNet&gt; &amp; co</text>");
  const std::string acc = group(svg, "<g class=\"panel\" data-panel=\"test_acc\"");
  EXPECT_EQ(count(acc, "<polyline"), 4u);
  EXPECT_EQ(count(acc, "class=\"series train-acc\""), 2u);
  EXPECT_EQ(count(group(svg, "<g class=\"panel\" data-panel=\"train_loss\""), "<polyline"), 2u);
}

TEST(LineChart, LabelsAreEscaped) {
  const std::string svg = line_chart_svg({run("a<b & \"c\"", 2, 0)});
  EXPECT_HAS(svg, ">a&lt;b &amp; &quot;c&quot;</text>");
  EXPECT_HAS(svg, "data-run=\"a&lt;b &amp; &quot;c&quot;\"");
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
}

TEST(LineChart, ManyRunsWrapTheLegendAndCycleColours) {
  std::vector<ddp::plot::Run> runs;
  for (int i = 0; i < 14; ++i) runs.push_back(run("a rather long run label " + std::to_string(i), 3, 0.01 * i));
  const std::string svg = line_chart_svg(runs);
  const std::string legend = group(svg, "<g class=\"legend\">");
  EXPECT_EQ(count(legend, "class=\"legend-label\""), 14u);
  // More than one row: more than one baseline among the labels.
  std::vector<std::string> ys;
  for (size_t at = legend.find("class=\"legend-label\""); at != std::string::npos;
       at = legend.find("class=\"legend-label\"", at + 1)) {
    const size_t y = legend.rfind(" y=\"", at);
    ys.push_back(legend.substr(y, legend.find('"', y + 4) - y));
  }
  std::sort(ys.begin(), ys.end());
  EXPECT_GT(std::unique(ys.begin(), ys.end()) - ys.begin(), 1);
  EXPECT_EQ(series_colour(10), series_colour(0));
}

TEST(LineChart, NoRunsIsAnError) { EXPECT_HAS(testing::error_of([] { line_chart_svg({}); }), "no runs"); }

TEST(LineChart, SingleEpochStillDrawsItsPoint) {
  const std::string svg = line_chart_svg({run("a", 1, 0)});
  EXPECT_EQ(count(group(svg, "<g class=\"panel\" data-panel=\"test_acc\""), "class=\"marker\""), 1u);
}

BenchTable bench() {
  BenchTable t;
  t.path = "b.jsonl";
  t.systems = {"ddp_train", "PyTorch 2.15.0 (pip)", "PyTorch 1.13.1 (Debian)"};
  t.models = {"lenet", "resnet18"};
  t.rows = {{"lenet", 1, {10736.0, 3752.0, 3264.0}},
            {"lenet", 2, {10166.0, 3661.0, 3450.0}},
            {"resnet18", 1, {73.2, 52.8, std::nullopt}}};
  return t;
}

TEST(BarChart, BarsPerSystemAndWorldSizeWithLegend) {
  const std::string svg = bar_chart_svg(bench(), {"scaling"});
  const std::string legend = group(svg, "<g class=\"legend\">");
  for (const auto& s : bench().systems) EXPECT_HAS(legend, ">" + xml_escape(s) + "</text>");
  EXPECT_EQ(count(legend, "class=\"swatch\""), 3u);
  const std::string lenet = group(svg, "<g class=\"panel\" data-panel=\"lenet\"");
  EXPECT_EQ(count(lenet, "class=\"bar\""), 6u);
  EXPECT_HAS(lenet, "class=\"bar\" data-system=\"ddp_train\" data-np=\"2\"");
  EXPECT_HAS(lenet, ">np 1</text>");
  EXPECT_HAS(lenet, ">np 2</text>");
  EXPECT_HAS(lenet, ">10736</text>");
  EXPECT_HAS(lenet, ">lenet</text>");
  const std::string resnet = group(svg, "<g class=\"panel\" data-panel=\"resnet18\"");
  EXPECT_EQ(count(resnet, "class=\"bar\""), 2u);  // one system not measured
  EXPECT_HAS(resnet, ">73.2</text>");
  EXPECT_HAS(svg, "class=\"title\">scaling</text>");
  // The same system, the same colour in every panel.
  for (const std::string& g : {lenet, resnet})
    EXPECT_HAS(g, "fill=\"" + series_colour(0) + "\" class=\"bar\" data-system=\"ddp_train\"");
}

TEST(Svg, EscapesAndBalances) {
  EXPECT_EQ(xml_escape("a<b>&\"c'\x01"), "a&lt;b&gt;&amp;&quot;c&apos; ");
  Svg svg(10, 10);
  svg.open_group("class=\"x\"");
  EXPECT_HAS(testing::error_of([&] { svg.str(); }), "1 groups left open");
  svg.close_group();
  EXPECT_HAS(svg.str(), "width=\"10\" height=\"10\"");
  EXPECT_HAS(testing::error_of([&] { svg.close_group(); }), "without an open group");
}

}  // namespace
}  // namespace ddp::plot
