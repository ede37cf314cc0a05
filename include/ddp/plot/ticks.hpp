// Axis ticks at "nice" values: 1, 2 or 5 times a power of ten apart, spanning
// the data (Heckbert, "Nice numbers for graph labels", Graphics Gems, 1990).
#pragma once

#include <string>
#include <vector>

namespace ddp::plot {

struct Ticks {
  double lo = 0, hi = 1;       // the axis range: the first and last tick
  double step = 1;
  std::vector<double> values;  // lo, lo + step, ..., hi
  int decimals = 0;            // enough to tell neighbouring ticks apart

  std::string label(double v) const;  // v with `decimals` digits, never "-0"
};

// Ticks covering [lo, hi] with about `target` intervals and at least min_step
// apart (1 for epochs and other counts). lo == hi is widened to a range around
// it. Throws ddp::Error for non-finite bounds.
Ticks nice_ticks(double lo, double hi, int target = 5, double min_step = 0);

}  // namespace ddp::plot
