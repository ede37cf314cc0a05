// tensorboard_write LOGDIR: writes scalars into LOGDIR with TensorBoardWriter
// the way a training run does (per-step tags every step, per-epoch tags at
// epoch ends, a flush per epoch), plus what a reader could get wrong: steps
// past 2^53 (a step read through a double would move), tiny, negative,
// huge and non-finite values, a UTF-8 tag, enough records for many buffer
// writes, and a second writer (a resumed run) in the same directory. Prints
// what it wrote as JSON {tag: [[step, value], ...]}, each value as the float
// stored, for tensorboard_dump.py --expect.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"              // ddp::Error
#include "ddp/observe/tensorboard.hpp"     // TensorBoardWriter

namespace {

using Points = std::map<std::string, std::vector<std::pair<int64_t, float>>>;

struct Recorder {
  ddp::observe::TensorBoardWriter& w;
  Points& wrote;
  void scalar(const std::string& tag, int64_t step, double value) {
    w.scalar(tag, step, value);
    wrote[tag].emplace_back(step, static_cast<float>(value));
  }
};

// Python's json reads Infinity and NaN; %.17g of the float widened to double
// is that float exactly.
std::string number(float f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", static_cast<double>(f));
  return buf;
}

void print_json(const Points& wrote) {
  std::printf("{");
  const char* sep = "";
  for (const auto& [tag, points] : wrote) {
    std::printf("%s\n  \"%s\": [", sep, tag.c_str());  // our tags need no escapes
    for (size_t i = 0; i < points.size(); ++i)
      std::printf("%s[%" PRId64 ", %s]", i ? ", " : "", points[i].first, number(points[i].second).c_str());
    std::printf("]");
    sep = ",";
  }
  std::printf("\n}\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s LOGDIR\n", argv[0]);
    return 2;
  }
  try {
    const std::string dir = argv[1];
    Points wrote;
    constexpr int64_t kSteps = 4000;  // per run: 4 tags a step, 16,000 records
    {
      ddp::observe::TensorBoardWriter w(dir);
      Recorder r{w, wrote};
      for (int64_t step = 0; step < kSteps; ++step) {
        r.scalar("train/loss", step, 2.3 * std::exp(-1e-3 * static_cast<double>(step)));
        r.scalar("train/lr", step, 0.1 * std::pow(0.5, static_cast<double>(step / 1000)));
        r.scalar("time/step_ms/backward", step, 3.0 + 1e-3 * static_cast<double>(step % 7));
        r.scalar("train/grad_norm", step, step % 2 ? -1e-3 * static_cast<double>(step) : 1e-38);
        if ((step + 1) % 1000 == 0) {
          r.scalar("epoch/test_acc", step, 0.5 + 1e-4 * static_cast<double>(step));
          r.scalar("epoch/samples_per_sec", step, 12345.678);
          w.flush();
        }
      }
      // Values at the edges of float and steps at the edges of int64.
      const int64_t big[] = {int64_t(1) << 40, (int64_t(1) << 53) + 1, std::numeric_limits<int64_t>::max()};
      const double edge[] = {1e-45, -1e-45, -3.0e38, 1e-30, -0.0};
      for (int i = 0; i < 3; ++i) r.scalar("edge/large_step", big[i], edge[i]);
      r.scalar("edge/values", 1, 1e-45);   // the smallest float (subnormal)
      r.scalar("edge/values", 2, -2.5e-39);
      r.scalar("edge/values", 3, 3.0e38);
      r.scalar("edge/values", 4, 0.1);      // rounded to float
      r.scalar("edge/values", 5, 1e300);    // past float: +inf
      r.scalar("edge/values", 6, -1e300);   // -inf
      r.scalar("edge/values", 7, std::nan(""));
      r.scalar("edge/values", 8, -0.0);
      r.scalar("edge/ünïcödé λ", 0, 42.0);
      w.flush();
    }
    {  // a resumed run: a second file, the same tags, later steps
      ddp::observe::TensorBoardWriter w(dir);
      Recorder r{w, wrote};
      for (int64_t step = kSteps; step < kSteps + 500; ++step) {
        r.scalar("train/loss", step, 1.0 / static_cast<double>(step));
        r.scalar("train/lr", step, 1e-4);
      }
      r.scalar("epoch/test_acc", kSteps + 499, 0.9);
      // Not flushed: the destructor writes the rest.
    }
    print_json(wrote);
  } catch (const ddp::Error& e) {
    std::fprintf(stderr, "tensorboard_write: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
