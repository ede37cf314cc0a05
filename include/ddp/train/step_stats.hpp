// ddp::train::StepStats: where the steps' time went, for the epoch line,
// the metrics records, the summary and TensorBoard: the median step and the
// median of each of its parts (data wait, forward, backward, exposed
// communication, optimizer), and how much of the all-reduce time the
// backward hid. Each rank keeps its own steps; the figures reported are the
// mean over ranks of each rank's medians.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "ddp/comm/communicator.hpp"  // Communicator: the mean over ranks
#include "ddp/train/replica.hpp"      // StepTimes

namespace ddp::train {

// The median step, in seconds, and the part of the communication hidden.
struct StepBreakdown {
  static constexpr int kParts = 5;
  static constexpr std::array<const char*, kParts> kNames = {"data", "forward", "backward", "comm", "optimizer"};
  double step = 0;                   // median of the steps' totals
  std::array<double, kParts> parts{};  // median of each part, in kNames' order
  double comm_busy = 0;              // median time some bucket was in flight
  double hidden_frac = 0;            // all-reduce time during backward / all-reduce time (0 without any)
  bool empty = true;                 // no step was timed

  // "step 45.1 ms: data 0.2, forward 15.0, backward 25.1, comm 2.3, optimizer 1.9;
  //  all-reduce in flight 8.0 ms, 88% of it during backward"
  std::string describe() const;
  // {"step_ms": …, "data_ms": …, …, "comm_hidden_frac": …}: into a record.
  template <typename Json>
  void add_to(Json& record) const {
    record["step_ms"] = step * 1e3;
    for (int i = 0; i < kParts; ++i) record[std::string(kNames[size_t(i)]) + "_ms"] = parts[size_t(i)] * 1e3;
    record["comm_busy_ms"] = comm_busy * 1e3;
    record["comm_hidden_frac"] = hidden_frac;
  }
};

class StepStats {
 public:
  // One step: the trainer's wait for the batch and the replica's parts.
  void add(double data_wait, const StepTimes& t);
  size_t steps() const { return data_.size(); }
  // This rank's medians (collective: the mean over the ranks of comm).
  StepBreakdown reduce(comm::Communicator& comm, const std::string& what) const;
  void clear();

 private:
  std::vector<double> data_, forward_, backward_, comm_, optimizer_, total_, busy_;
  double hidden_sum_ = 0, busy_sum_ = 0;
};

}  // namespace ddp::train
