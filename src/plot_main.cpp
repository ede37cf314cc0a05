// ddp_plot: learning curves of ddp_train runs, or the benchmark's scaling
// numbers, as an SVG and a PNG rasterised from it. Its own executable, so that
// ddp_train never links the graphics libraries. Every failure is one line,
// "ddp_plot: error: <what>", and exit status 1.
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>

#include "ddp/core/error.hpp"        // DDP_CHECK
#include "ddp/plot/bar_chart.hpp"    // bar_chart_svg
#include "ddp/plot/bench.hpp"        // read_bench
#include "ddp/plot/line_chart.hpp"   // line_chart_svg
#include "ddp/plot/metrics.hpp"      // read_metrics
#include "ddp/plot/options.hpp"      // parse_plot_options
#include "ddp/plot/png.hpp"          // write_png

namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  DDP_CHECK(out, path, ": cannot open for writing: ", std::strerror(errno));
  out << text;
  out.close();
  DDP_CHECK(out, path, ": cannot write: ", std::strerror(errno));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const ddp::plot::PlotOptions o = ddp::plot::parse_plot_options(argc, argv);
    if (o.help) {
      std::cout << *o.help;
      return 0;
    }
    std::string svg;
    if (!o.bench.empty()) {
      svg = ddp::plot::bar_chart_svg(ddp::plot::read_bench(o.bench), {o.title});
    } else {
      std::vector<ddp::plot::Run> runs;
      for (const auto& arg : o.runs) runs.push_back(ddp::plot::read_metrics(arg, o.train_acc));
      svg = ddp::plot::line_chart_svg(runs, {o.title, o.train_acc});
    }
    write_text(o.prefix + ".svg", svg);
    if (o.png) ddp::plot::write_png(svg, o.prefix + ".png", o.scale);
    std::cout << "ddp_plot: wrote " << o.prefix << ".svg" << (o.png ? " and " + o.prefix + ".png" : "") << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ddp_plot: error: " << e.what() << "\n";
    return 1;
  }
}
