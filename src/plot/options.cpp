#include "ddp/plot/options.hpp"

#include <cmath>
#include <cxxopts.hpp>

#include "ddp/core/error.hpp"  // UsageError

namespace ddp::plot {

namespace {

// -o names the pair by its stem; a name given with either extension means the
// same pair.
std::string strip_extension(std::string prefix) {
  for (const char* ext : {".svg", ".png"}) {
    const std::string e = ext;
    if (prefix.size() > e.size() && prefix.compare(prefix.size() - e.size(), e.size(), e) == 0)
      return prefix.substr(0, prefix.size() - e.size());
  }
  return prefix;
}

}  // namespace

PlotOptions parse_plot_options(int argc, const char* const* argv) {
  cxxopts::Options spec("ddp_plot",
                        "Learning curves of ddp_train runs (their --metrics-out files), or the benchmark's\n"
                        "scaling numbers as bars (--bench), to PREFIX.svg and PREFIX.png. A run's legend\n"
                        "label is its file's name without the extension, or LABEL.");
  spec.custom_help("-o PREFIX [options]");
  spec.positional_help("[LABEL=]METRICS.jsonl...  |  --bench FILE");
  // clang-format off
  spec.add_options()
      ("o,output", "write PREFIX.svg and PREFIX.png", cxxopts::value<std::string>(), "PREFIX")
      ("bench", "a bar chart of bench/compare_pytorch.sh's DDP_BENCH_JSON file instead of runs",
       cxxopts::value<std::string>(), "FILE")
      ("title", "a title above the chart", cxxopts::value<std::string>(), "TEXT")
      ("train-acc", "also train accuracy (faint) beside test accuracy")
      ("no-png", "write the SVG only")
      ("scale", "PNG pixels per SVG pixel", cxxopts::value<double>()->default_value("2"), "S")
      ("h,help", "print this help")
      ("runs", "metrics files", cxxopts::value<std::vector<std::string>>());
  // clang-format on
  spec.parse_positional({"runs"});

  cxxopts::ParseResult r;
  try {
    r = spec.parse(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(e.what());
  }
  PlotOptions o;
  if (r.count("help")) {
    o.help = spec.help({""});
    return o;
  }
  if (r.count("runs"))
    for (const std::string& arg : r["runs"].as<std::vector<std::string>>()) o.runs.push_back(parse_run_arg(arg));
  // The legend must tell the runs apart: a/metrics.jsonl beside b/metrics.jsonl
  // needs labels.
  for (size_t i = 0; i < o.runs.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (o.runs[i].label == o.runs[j].label)
        throw UsageError(detail::concat("two runs are labelled '", o.runs[i].label, "' (", o.runs[j].path, " and ",
                                        o.runs[i].path, "): name them with LABEL=PATH"));
  if (r.count("bench")) o.bench = r["bench"].as<std::string>();
  if (r.count("title")) o.title = r["title"].as<std::string>();
  o.train_acc = r.count("train-acc") > 0;
  o.png = r.count("no-png") == 0;
  o.scale = r["scale"].as<double>();

  if (!o.bench.empty()) {
    if (!o.runs.empty()) throw UsageError("--bench draws the benchmark's file alone: give it no metrics files");
    if (o.train_acc) throw UsageError("--train-acc is for metrics files, not --bench");
  } else if (o.runs.empty()) {
    throw UsageError("no metrics files given (ddp_plot -o PREFIX FILE..., or --bench FILE; --help)");
  }
  if (!r.count("output")) throw UsageError("-o PREFIX is required: where to write PREFIX.svg and PREFIX.png");
  o.prefix = strip_extension(r["output"].as<std::string>());
  if (o.prefix.empty() || o.prefix.back() == '/')
    throw UsageError(detail::concat("-o '", o.prefix, "': a file name prefix is needed"));
  if (!(std::isfinite(o.scale) && o.scale > 0 && o.scale <= 16))
    throw UsageError(detail::concat("--scale ", o.scale, " is out of range: it must be above 0 and at most 16"));
  return o;
}

}  // namespace ddp::plot
