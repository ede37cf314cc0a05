// The scaling numbers of bench/compare_pytorch.sh (DDP_BENCH_JSON=FILE): one
// JSON line per model and world size,
//   {"model": "lenet", "np": 2, "samples_per_sec": {"ddp_train": 10166.0, "PyTorch 2.15.0 (pip)": 3661.0}}
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ddp::plot {

struct BenchRow {
  std::string model;  // "" when the line names none
  int np = 0;
  std::vector<std::optional<double>> rate;  // samples/s per BenchTable::systems entry; none: not measured
};

struct BenchTable {
  std::string path;
  std::vector<std::string> systems;  // in order of first appearance
  std::vector<std::string> models;   // likewise
  std::vector<BenchRow> rows;        // by model (first appearance), then np
};

// A later line for the same model and np replaces an earlier one: the
// benchmark appends, so a file can hold several sittings and the newest wins.
// Throws ddp::Error naming the file and line at fault, or the file when it
// holds no rows.
BenchTable read_bench(const std::string& path);

}  // namespace ddp::plot
