// StepStats (step_stats.hpp).
#include "ddp/train/step_stats.hpp"

#include <algorithm>
#include <cstdio>

namespace ddp::train {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t m = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(m), v.end());
  if (v.size() % 2) return v[m];
  const double hi = v[m];
  return 0.5 * (*std::max_element(v.begin(), v.begin() + std::ptrdiff_t(m)) + hi);
}

}  // namespace

void StepStats::add(double data_wait, const StepTimes& t) {
  const double data = data_wait + t.data;
  data_.push_back(data);
  forward_.push_back(t.forward);
  backward_.push_back(t.backward);
  comm_.push_back(t.comm);
  optimizer_.push_back(t.optimizer);
  total_.push_back(data_wait + t.total());
  busy_.push_back(t.comm_busy);
  hidden_sum_ += t.hidden;
  busy_sum_ += t.comm_busy;
}

void StepStats::clear() { *this = StepStats(); }

StepBreakdown StepStats::reduce(comm::Communicator& comm, const std::string& what) const {
  // [step, parts…, busy, hidden, busy, steps]: sums over ranks.
  double v[StepBreakdown::kParts + 5] = {median(total_), median(data_), median(forward_), median(backward_),
                                         median(comm_),  median(optimizer_), median(busy_), hidden_sum_, busy_sum_,
                                         double(steps())};
  comm.allreduce_doubles(v, std::size(v), /*max=*/false, what);
  StepBreakdown b;
  const double ranks = double(comm.size());
  b.empty = v[9] == 0;
  b.step = v[0] / ranks;
  for (int i = 0; i < StepBreakdown::kParts; ++i) b.parts[size_t(i)] = v[1 + i] / ranks;
  b.comm_busy = v[6] / ranks;
  b.hidden_frac = v[8] > 0 ? v[7] / v[8] : 0;
  return b;
}

std::string StepBreakdown::describe() const {
  char line[320];
  std::snprintf(line, sizeof(line),
                "step %.1f ms: data %.1f, forward %.1f, backward %.1f, comm %.1f, optimizer %.1f; "
                "all-reduce in flight %.1f ms, %.0f%% of it during backward",
                step * 1e3, parts[0] * 1e3, parts[1] * 1e3, parts[2] * 1e3, parts[3] * 1e3, parts[4] * 1e3,
                comm_busy * 1e3, hidden_frac * 100);
  return line;
}

}  // namespace ddp::train
