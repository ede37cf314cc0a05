#include "ddp/plot/ticks.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "ddp/core/error.hpp"  // DDP_CHECK

namespace ddp::plot {

namespace {

// The nice number (1, 2 or 5 times a power of ten) nearest x, rounding as
// Heckbert does so that a range gets about the number of intervals asked for.
double nice_step(double x) {
  const double e = std::floor(std::log10(x));
  const double f = x / std::pow(10.0, e);
  const double nice = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
  return nice * std::pow(10.0, e);
}

}  // namespace

std::string Ticks::label(double v) const {
  // Ticks are multiples of step: round away float noise before printing.
  if (std::abs(v) < step * 1e-6) v = 0;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

Ticks nice_ticks(double lo, double hi, int target, double min_step) {
  DDP_CHECK(std::isfinite(lo) && std::isfinite(hi), "axis range [", lo, ", ", hi, "] is not finite");
  DDP_CHECK(target >= 1, "ticks: target ", target, " intervals is not >= 1");
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) {  // one value: a range around it
    const double pad = std::max({std::abs(lo) * 0.1, min_step, 1e-9});
    lo -= pad;
    hi += pad;
  }
  Ticks t;
  t.step = std::max(nice_step((hi - lo) / target), min_step);
  // The 1e-9 keeps a bound that sits on a tick (up to float noise) from
  // adding an empty interval.
  const double first = std::floor(lo / t.step + 1e-9), last = std::ceil(hi / t.step - 1e-9);
  for (double k = first; k <= last; ++k) t.values.push_back(k * t.step);
  t.lo = t.values.front();
  t.hi = t.values.back();
  t.decimals = std::max(0, -static_cast<int>(std::floor(std::log10(t.step) + 1e-9)));
  return t;
}

}  // namespace ddp::plot
